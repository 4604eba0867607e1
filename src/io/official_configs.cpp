// The official DeepSeek-V4-Flash configurations built in (the root config.json of each release,
// verbatim in content), so `--synthetic NAME` needs no files: the full-size model's shapes for
// synthetic weights (src/model/cuda/synthetic_weights.cpp) and for planning a deployment.
#include "io/official_configs.h"

#include "io/tiny_checkpoint.h"

namespace tandem {
namespace {

// deepseek-ai/DeepSeek-V4-Flash-0731 config.json (spec section 2.1; tests/io/data holds the file).
constexpr const char* k0731 = R"json({"architectures":["DeepseekV4ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":0,"eos_token_id":1,"hc_eps":1e-06,"hc_mult":4,"hc_sinkhorn_iters":20,"head_dim":512,"hidden_act":"silu","hidden_size":4096,"index_head_dim":128,"index_n_heads":64,"index_topk":512,"initializer_range":0.02,"max_position_embeddings":1048576,"model_type":"deepseek_v4","moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":64,"num_experts_per_tok":6,"num_hidden_layers":43,"num_hash_layers":3,"num_key_value_heads":1,"num_nextn_predict_layers":1,"o_groups":8,"o_lora_rank":1024,"q_lora_rank":1024,"qk_rope_head_dim":64,"quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","scale_fmt":"ue8m0","weight_block_size":[128,128]},"rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":16,"original_max_position_embeddings":65536,"type":"yarn"},"rope_theta":10000,"routed_scaling_factor":1.5,"scoring_func":"sqrtsoftplus","sliding_window":128,"swiglu_limit":10.0,"tie_word_embeddings":false,"topk_method":"noaux_tc","torch_dtype":"bfloat16","transformers_version":"4.57.1","use_cache":true,"vocab_size":129280,"compress_rope_theta":160000,"compress_ratios":[0,0,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,0,0,0],"expert_dtype":"fp4","dspark_block_size":5,"dspark_noise_token_id":128799,"dspark_target_layer_ids":[40,41,42],"dspark_markov_rank":256})json";

// deepseek-ai/DeepSeek-V4-Flash (preview) config.json: one classic MTP stage, no DSpark keys.
constexpr const char* kPreview = R"json({"architectures":["DeepseekV4ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":0,"eos_token_id":1,"hc_eps":1e-06,"hc_mult":4,"hc_sinkhorn_iters":20,"head_dim":512,"hidden_act":"silu","hidden_size":4096,"index_head_dim":128,"index_n_heads":64,"index_topk":512,"initializer_range":0.02,"max_position_embeddings":1048576,"model_type":"deepseek_v4","moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":64,"num_experts_per_tok":6,"num_hidden_layers":43,"num_hash_layers":3,"num_key_value_heads":1,"num_nextn_predict_layers":1,"o_groups":8,"o_lora_rank":1024,"q_lora_rank":1024,"qk_rope_head_dim":64,"quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","scale_fmt":"ue8m0","weight_block_size":[128,128]},"rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":16,"original_max_position_embeddings":65536,"type":"yarn"},"rope_theta":10000,"routed_scaling_factor":1.5,"scoring_func":"sqrtsoftplus","sliding_window":128,"swiglu_limit":10.0,"tie_word_embeddings":false,"topk_method":"noaux_tc","torch_dtype":"bfloat16","transformers_version":"4.57.1","use_cache":true,"vocab_size":129280,"compress_rope_theta":160000,"compress_ratios":[0,0,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,0]})json";

}  // namespace

const std::vector<std::string>& official_config_names() {
  static const std::vector<std::string> names = {"deepseek-v4-flash-0731", "deepseek-v4-flash-preview"};
  return names;
}

Result<ModelConfig> official_config(const std::string& name) {
  if (name == "deepseek-v4-flash-0731") return parse_model_config(k0731);
  if (name == "deepseek-v4-flash-preview") return parse_model_config(kPreview);
  return invalid_argument("unknown model '{}' (built in: deepseek-v4-flash-0731, deepseek-v4-flash-preview)", name);
}

Result<ModelConfig> synthetic_config(const std::string& name) {
  const std::string tiny = "tiny:";
  if (name.rfind(tiny, 0) != 0) return official_config(name);
  TinyVocab v;
  v.vocab_size = 16384;
  v.noise_token_id = 16000;
  auto c = tiny_preset_config(name.substr(tiny.size()), v);
  if (!c.ok()) return c.status().with_context("--synthetic " + name);
  return c;
}

}  // namespace tandem
