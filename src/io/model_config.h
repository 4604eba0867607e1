// ModelConfig: the typed, validated form of a DeepSeek-V4 checkpoint's config.json (preview,
// -DSpark and 0731 releases). Field names follow config.json; every consumer reads this struct,
// never the JSON. Implementation: model_config.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem {

enum class DraftKind { kNone, kMtp, kDSpark };  // preview: one classic MTP layer; 0731/-DSpark: DSpark

struct ModelConfig {
  // ---- backbone ----
  std::string model_type = "deepseek_v4";
  int64_t vocab_size = 129280;
  int64_t hidden_size = 4096;              // dim
  int num_hidden_layers = 43;
  int num_attention_heads = 64;
  int num_key_value_heads = 1;
  int head_dim = 512;
  int qk_rope_head_dim = 64;               // rope on the LAST qk_rope_head_dim dims
  int q_lora_rank = 1024;
  int o_lora_rank = 1024;
  int o_groups = 8;
  int sliding_window = 128;
  std::vector<int> compress_ratios;        // one entry per main layer, then one per draft stage
  double rope_theta = 10000.0;             // ratio-0 layers, no YaRN
  double compress_rope_theta = 160000.0;   // ratio != 0 layers, with YaRN
  // rope_scaling (YaRN), applied only where compress_ratio != 0
  std::string rope_scaling_type = "yarn";
  double rope_factor = 16.0;
  int64_t rope_original_max_position = 65536;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  int64_t max_position_embeddings = 1048576;
  // ---- CSA lightning indexer ----
  int index_n_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  // ---- MoE ----
  int n_routed_experts = 256;
  int n_shared_experts = 1;
  int num_experts_per_tok = 6;
  int moe_intermediate_size = 2048;
  int num_hash_layers = 3;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;
  // ---- mHC ----
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  // ---- tokens ----
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  bool tie_word_embeddings = false;
  // ---- quantization ----
  std::string quant_method = "fp8";        // quantization_config.quant_method ("" if absent: bf16 weights)
  std::string quant_fmt = "e4m3";
  std::string quant_scale_fmt = "ue8m0";
  int weight_block_n = 128;                // quantization_config.weight_block_size
  int weight_block_k = 128;
  std::string expert_dtype = "fp4";        // "fp4" (MXFP4, per-32 E8M0) or "fp8"
  // ---- speculative draft ----
  DraftKind draft_kind = DraftKind::kNone;
  int num_draft_stages = 0;                // 1 for preview MTP, 3 for DSpark (config may say 1: stale)
  int dspark_block_size = 0;               // 5
  int64_t dspark_noise_token_id = -1;      // 128799
  std::vector<int> dspark_target_layer_ids;  // [40, 41, 42]
  int dspark_markov_rank = 0;              // 256

  // ---- carried for a faithful config.json round trip (not used by the forward) ----
  std::vector<std::string> architectures = {"DeepseekV4ForCausalLM"};
  int num_nextn_predict_layers = 1;        // as written (stale in 0731); use num_draft_stages
  std::string hidden_act = "silu";
  std::string torch_dtype = "bfloat16";
  std::string quant_activation_scheme = "dynamic";
  std::string transformers_version = "4.57.1";
  double initializer_range = 0.02;
  double attention_dropout = 0.0;
  bool attention_bias = false;
  bool use_cache = true;
  bool has_expert_dtype_key = true;        // the preview config omits "expert_dtype"

  // ---- derived helpers ----
  int compress_ratio(int layer) const { return compress_ratios[layer]; }
  bool is_hash_layer(int layer) const { return layer < num_hash_layers; }
  int rope_nope_dim() const { return head_dim - qk_rope_head_dim; }
  int hc_dim() const { return static_cast<int>(hidden_size) * hc_mult; }   // 16384
  int hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }              // 24
  bool has_dspark() const { return draft_kind == DraftKind::kDSpark; }
};

// Parses config.json text. Unknown architectures, missing required keys and inconsistent values
// (e.g. compress_ratios length, head_dim < rope dim, topk > experts) are InvalidArgument errors
// naming the key.
Result<ModelConfig> parse_model_config(const std::string& json_text);
Result<ModelConfig> load_model_config(const std::string& path);
// Writes config.json in the official key layout (used by make-tiny and the trainer's export).
std::string model_config_to_json(const ModelConfig& config);
// Writes inference/config.json: the same model under the official reference's ModelArgs names
// (dim, n_layers, n_mtp_layers, rope_head_dim, window_size, ...), which the official
// `inference/generate.py --config` loads with ModelArgs(**json): only keys ModelArgs knows.
std::string model_config_to_inference_json(const ModelConfig& config);

}  // namespace tandem
