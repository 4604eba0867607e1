// In-memory weights of DeepSeek-V4 for the forward pass, named like the official checkpoint. Matrices
// (linears, embedding, LM head, Markov head) stay in their stored format (FP8 128x128 block, MXFP4
// per-32, BF16) as kernels::WeightRef views into the tensor data, which must outlive the Weights;
// only small vectors (norms, mHC, ape, biases) are copied to fp32. The loader checks every tensor
// against the catalog derived from the config: a missing, unexpected, wrong-dtype or mis-shaped
// tensor is an error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"
#include "kernels/ops.h"

namespace tandem {
struct TensorView;
}

namespace tandem::model {

// A linear layer W[out, in] (y = x W^T). act_quant: the file stores it as FP8/FP4, so the
// reference quantizes the activation to FP8 (block 128) before the GEMM.
// Move-only: `w` may point into `owned`.
struct LinearW {
  int64_t out = 0, in = 0;
  bool act_quant = false;
  kernels::WeightRef w;          // [out, in] as stored (points into the checkpoint or into `owned`)
  std::vector<uint16_t> owned;   // bf16 copy, only when the stored form cannot serve (see wo_a)
  // A tensor-parallel column slice (or a row slice off the FP8 128-row grid) cannot be a view: its
  // bytes are copied here in the stored format (data + scales), or as exact fp32 when the slice
  // cuts the format's scale blocks.
  std::vector<uint8_t> owned_data, owned_scale;

  LinearW() = default;
  LinearW(LinearW&&) = default;
  LinearW& operator=(LinearW&&) = default;
  LinearW(const LinearW&) = delete;
  LinearW& operator=(const LinearW&) = delete;

  // Row r (< out) converted to fp32 (embedding / Markov lookups). Dense formats only.
  void row(int64_t r, float* dst) const;
  size_t bytes() const { return w.bytes(); }
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
  int64_t n_local_heads = 0;  // index heads of this rank (index_n_heads / tp_size)
  LinearW wq_b;           // [n_local_heads*head_dim, q_lora] (column-parallel)
  LinearW weights_proj;   // [n_local_heads, dim] bf16 GEMM (column-parallel)
  CompressorW compressor;
};

// Tensor parallelism as the reference shards it: wq_b, wo_a and attn_sink by heads / output groups
// (column-parallel), wo_b by its input (row-parallel: partial sums, all-reduced); wq_a, wkv, the
// norms and the compressor are whole on every rank (one KV head: every rank keeps the whole KV).
struct AttentionW {
  int64_t n_local_heads = 0;    // heads of this rank (num_attention_heads / tp_size)
  int64_t n_local_groups = 0;   // output groups of this rank (o_groups / tp_size)
  LinearW wq_a, wq_b, wkv, wo_a, wo_b;  // wo_a used as a bf16 grouped einsum (no act quant)
  std::vector<float> q_norm, kv_norm, attn_sink;  // attn_sink: [n_local_heads]
  bool has_compressor = false, has_indexer = false;
  CompressorW compressor;
  IndexerW indexer;
};

struct ExpertW {
  LinearW w1, w2, w3;
};

// Routed experts are split across ranks (rank r owns [expert_begin, expert_end)); the gate and
// the shared expert are whole on every rank, as in the reference (its MoE all-reduces the routed
// sum, then adds the shared expert).
struct MoEW {
  bool hash = false;
  LinearW gate;                   // fp32 GEMM
  std::vector<float> bias;        // [n_routed] (non-hash)
  std::vector<int32_t> tid2eid;   // [vocab, topk] (hash)
  int64_t expert_begin = 0, expert_end = 0;
  std::vector<ExpertW> experts;   // [expert_end - expert_begin]: expert e at experts[e - expert_begin]
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
  LinearW markov_w1;              // [vocab, rank] (row lookups)
  LinearW markov_w2;              // [vocab, rank] (GEMM)
  std::vector<float> confidence;  // [dim + rank]
};

// Which slice of the model one rank binds (tp_size 1: all of it).
struct Shard {
  int rank = 0;
  int size = 1;
};

struct Weights {
  Shard shard;
  // Vocab-parallel embedding and LM head: this rank's rows [vocab_begin, vocab_end) (ceil(V/size)
  // per rank, the last one shorter when V does not divide).
  int64_t vocab_begin = 0, vocab_end = 0;
  LinearW embed;                  // [vocab_end - vocab_begin, dim] (row lookups)
  LinearW head;                   // [vocab_end - vocab_begin, dim] (fp32 GEMM); tied: a view of embed
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
  int64_t other_ranks = 0;  // tensors (routed experts) that belong to other tensor-parallel ranks
};

// The config shapes the DeepSeek-V4 model code supports (the CPU oracle and the CUDA model alike);
// InvalidArgument names the field.
Status validate_config(const ModelConfig& config);
// The shapes tensor parallelism over `size` ranks needs (heads, groups, index heads and experts
// divisible; whole FP8 activation blocks per rank); InvalidArgument names the field.
Status validate_shard(const ModelConfig& config, const Shard& shard);

// Bytes of the weight matrices as held (views + owned copies) and of the fp32 copies of vectors.
size_t weight_bytes(const Weights& w);

Result<Weights> load_weights(const ModelConfig& config, const std::vector<const TensorView*>& tensors,
                             bool load_draft, LoadCounts& counts, const Shard& shard = Shard());

}  // namespace tandem::model
