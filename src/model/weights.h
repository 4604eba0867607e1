// In-memory weights of DeepSeek-V4 for the CPU forward: every tensor dequantized to fp32 at load
// (FP8 128x128 block / MXFP4 per-32 / BF16), named like the official checkpoint. The loader checks
// every tensor against the catalog derived from the config: a missing, unexpected, wrong-dtype or
// mis-shaped tensor is an error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"

namespace tandem {
struct TensorView;
}

namespace tandem::model {

// A linear layer W[out, in] (y = x W^T). act_quant: the file stores it as FP8/FP4, so the
// reference quantizes the activation to FP8 (block 128) before the GEMM.
struct LinearW {
  int64_t out = 0, in = 0;
  bool act_quant = false;
  std::vector<float> w;   // [out, in]
};

struct CompressorW {
  int ratio = 0;
  int head_dim = 0;
  bool overlap = false;   // ratio 4: 2*head_dim channels, split-channel overlap
  bool rotate = false;    // indexer keys: Hadamard + FP4 instead of FP8 nope
  LinearW wkv, wgate;     // fp32 GEMMs (BF16 in file)
  std::vector<float> ape; // [ratio, coff*head_dim]
  std::vector<float> norm;
};

struct IndexerW {
  LinearW wq_b;           // [n_heads*head_dim, q_lora]
  LinearW weights_proj;   // [n_heads, dim] bf16 GEMM
  CompressorW compressor;
};

struct AttentionW {
  LinearW wq_a, wq_b, wkv, wo_a, wo_b;  // wo_a used as a bf16 grouped einsum (no act quant)
  std::vector<float> q_norm, kv_norm, attn_sink;
  bool has_compressor = false, has_indexer = false;
  CompressorW compressor;
  IndexerW indexer;
};

struct ExpertW {
  LinearW w1, w2, w3;
};

struct MoEW {
  bool hash = false;
  LinearW gate;                   // fp32 GEMM
  std::vector<float> bias;        // [n_routed] (non-hash)
  std::vector<int32_t> tid2eid;   // [vocab, topk] (hash)
  std::vector<ExpertW> experts;
  ExpertW shared;
};

struct BlockW {
  int layer_id = 0;
  int compress_ratio = 0;
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> hc_attn_fn, hc_attn_base, hc_attn_scale;
  std::vector<float> hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  AttentionW attn;
  MoEW ffn;
};

struct DraftW {
  std::vector<BlockW> stages;
  LinearW main_proj;              // [dim, dim * n_target_layers]
  std::vector<float> main_norm;
  std::vector<float> norm;
  std::vector<float> hc_head_fn, hc_head_base, hc_head_scale;
  std::vector<float> markov_w1;   // [vocab, rank] (bf16 values)
  std::vector<float> markov_w2;   // [vocab, rank]
  std::vector<float> confidence;  // [dim + rank]
};

struct Weights {
  std::vector<float> embed;       // [vocab, dim]
  std::vector<float> head;        // [vocab, dim]
  std::vector<float> norm;
  std::vector<float> hc_head_fn, hc_head_base, hc_head_scale;
  std::vector<BlockW> layers;
  bool has_draft = false;
  DraftW draft;
};

struct LoadCounts {
  int64_t target_loaded = 0, target_expected = 0;
  int64_t draft_loaded = 0, draft_expected = 0;
  int64_t skipped = 0;
};

// Validates the config for the CPU forward (supported shapes); InvalidArgument names the field.
Status validate_config_for_cpu(const ModelConfig& config);

Result<Weights> load_weights(const ModelConfig& config, const std::vector<const TensorView*>& tensors,
                             bool load_draft, LoadCounts& counts);

}  // namespace tandem::model
