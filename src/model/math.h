// The few fp32 helpers the CPU forward pass still keeps outside kernels/ops.h: bf16 rounding, the
// fixed-order dot product of the mHC mixes / attention scores / confidence head (see forward.cpp for
// why those stay), and the RoPE inverse-frequency table (filled by kernels::rope_inv_freq).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::model {

// Rounds every element to the nearest bf16 value (the reference keeps these tensors in bf16).
void round_bf16(float* x, size_t n);

// Fixed summation order (8 lane sums, pairwise), independent of how many rows are processed.
float dot(const float* a, const float* b, int64_t n);

// RoPE inverse frequencies as precompute_freqs_cis (YaRN when original_seq_len > 0); applied by
// kernels::Ops::rope.
struct RopeTable {
  int rope_dim = 0;
  std::vector<float> freqs;       // [rope_dim/2]
  void build(int rope_dim, int64_t original_seq_len, double base, double factor,
             double beta_fast, double beta_slow);
};

}  // namespace tandem::model
