// The fp32 pieces the CPU forward pass keeps outside kernels/ops.h: bf16 rounding, the fixed-order
// dot product of the mHC mixes / attention scores / confidence head (see forward.cpp for why those
// stay), the RoPE inverse-frequency table (filled by kernels::rope_inv_freq), and the per-row jobs
// that the CUDA runner implements as its own kernels (attention with the sink, mHC pre/head, the
// compressor rows and pooled entries, the taps, the indexer weight scaling): free functions so that
// the CPU model and tests/cuda call the same code (the CPU is the oracle the kernels are tested against).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/ops.h"

namespace tandem::model {

// Rounds every element to the nearest bf16 value (the reference keeps these tensors in bf16).
void round_bf16(float* x, size_t n);

// Fixed summation order (8 lane sums, pairwise), independent of how many rows are processed.
float dot(const float* a, const float* b, int64_t n);

// Attention of `heads` query heads q[heads, hd] over nk keys (pointers to hd floats; each key is
// also its value) with the per-head sink: s_i = dot(q, k_i) * fl(1/sqrt(hd)), a global max,
// p_i = exp(s_i - m) in fp32, o = bf16(sum_i p_i k_i / (sum_i p_i + exp(sink - m))), keys in the
// given order (sums in that order). o[heads, hd]; scores: scratch of nk floats.
void attend(const float* q, int64_t heads, int64_t hd, const float* const* keys, size_t nk, const float* sink,
            float* o, float* scores);
// Test-only (model_testing.h, cpu_set_softmax_jitter): while on, attend moves every softmax weight
// exp(s_i - m) with s_i != m, and the sink's, by one ulp down, not at all or up, in a fixed pattern
// of the weight's bits, head and key index (the same run gives the same bits at any thread count).
void set_softmax_jitter(bool on);

// mHC shapes and constants of one call (Block.hc_pre / hc_head).
struct HcShape {
  int hc = 4;
  int64_t dim = 4096;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
};
// hc_pre of n tokens (kernels::HcPreParams' formulas, the mixes formed by model::dot): h[n, hc, dim]
// -> x[n, dim] (bf16), post[n, hc], comb[n, hc, hc]. mixes: scratch of (2+hc)*hc floats.
void hc_pre(const HcShape& sh, const float* h, int64_t n, const float* fn, const float* scale, const float* base,
            float* x, float* post, float* comb, float* mixes);
// hc_head of n tokens (kernels::HcHeadParams' formulas, mixes by model::dot): y[n, dim] (bf16).
void hc_head(const HcShape& sh, const float* h, int64_t n, const float* fn, const float* scale, const float* base,
             float* y);

// Compressor rows of n tokens at positions start_pos..: rows[t] = [kv[t] (chans), gate[t] +
// ape[(start_pos + t) % ratio] (chans)] (fp32; kv, gate: the wkv / wgate outputs [n, chans]).
void compressor_rows(const float* kv, const float* gate, const float* ape, int64_t n, int64_t chans, int ratio,
                     int64_t start_pos, float* rows);

// The gated pooling of compressed entry j (kernels::cpu::compress_pool, bf16 result in out[d]) over
// the compressor rows of the entry's positions [lo, ratio*j + ratio) (lo = ratio*(j-1) with overlap
// and j > 0), row_at(p) giving the row [2*chans] of position p (this step's or the slot ring's);
// they are gathered into `gather` first.
template <class RowAt>
void pool_entry(RowAt&& row_at, int64_t j, int ratio, int64_t d, int64_t chans, bool overlap,
                std::vector<float>& gather, float* out) {
  const int64_t lo = (overlap && j > 0) ? ratio * (j - 1) : ratio * j, hi = ratio * j + ratio;
  if (gather.size() < static_cast<size_t>((hi - lo) * 2 * chans)) gather.resize((hi - lo) * 2 * chans);
  for (int64_t q = lo; q < hi; ++q) std::memcpy(&gather[(q - lo) * 2 * chans], row_at(q), sizeof(float) * 2 * chans);
  kernels::CompressPoolParams cp;
  cp.kv = gather.data();
  cp.score = gather.data() + chans;
  cp.rows = hi - lo;
  cp.ld = 2 * chans;
  cp.first_pos = lo;
  cp.ratio = ratio;
  cp.d = d;
  cp.overlap = overlap;
  cp.first_entry = j;
  cp.num_entries = 1;
  cp.out = out;
  cp.round_bf16 = true;
  kernels::cpu::compress_pool(cp);
}

// One row of DSpark's taps: dst[d] = bf16((sum_k h[k][d]) / hc), the streams summed in order.
void taps_mean(const float* h, int hc, int64_t dim, float* dst);

// x[i] = bf16(x[i] * scale) (the indexer head weights times 128^-0.5 * heads^-0.5).
void scale_round_bf16(float* x, int64_t n, float scale);

// RoPE inverse frequencies as precompute_freqs_cis (YaRN when original_seq_len > 0); applied by
// kernels::Ops::rope.
struct RopeTable {
  int rope_dim = 0;
  std::vector<float> freqs;       // [rope_dim/2]
  void build(int rope_dim, int64_t original_seq_len, double base, double factor,
             double beta_fast, double beta_slow);
};

}  // namespace tandem::model
