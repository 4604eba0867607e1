// Internal fp32 building blocks of the CPU forward pass, written to reproduce the reference's
// dtype behaviour (bf16 storage points, FP8/FP4 activation round trips, RoPE tables). Every
// function computes each output element with a fixed summation order that does not depend on how
// many rows are processed together, so chunked and one-at-a-time forwards agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::model {

// Rounds every element to the nearest bf16 value (the reference keeps these tensors in bf16).
void round_bf16(float* x, size_t n);

// y[m, n] = sum_k x[m, k] * w[n, k]  (fp32 accumulate, fixed order). Parallel over n.
void matmul(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, int threads);
float dot(const float* a, const float* b, int64_t n);

// FP8 e4m3 activation round trip per `block` elements along rows of length n (UE8M0 power-of-two
// scales, amax floor 1e-4), in place: act_quant(x, block, "ue8m0", inplace=True).
void act_quant_fp8(float* x, int64_t rows, int64_t n, int64_t block, int64_t row_stride);
// FP4 e2m1 round trip per 32 elements (amax floor 6*2^-126), in place: fp4_act_quant(x, 32, True).
void act_quant_fp4(float* x, int64_t rows, int64_t n, int64_t row_stride);

// y = weight * x * rsqrt(mean(x^2) + eps), fp32 compute, rounded to bf16. weight may be null.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y);
// Per-head weightless RMS normalisation computed in bf16 (spec errata 4).
void head_rms_norm_bf16(float* q, int64_t heads, int64_t dim, float eps);

// Sylvester-ordered Hadamard transform of n (power of two) values scaled by n^-0.5, in place,
// result rounded to bf16 (rotate_activation).
void hadamard_bf16(float* x, int64_t n);

// RoPE frequencies; cos/sin per (position, pair) computed like precompute_freqs_cis (fp32 freqs, fp32
// angle). YaRN when original_seq_len > 0.
struct RopeTable {
  int rope_dim = 0;
  std::vector<float> freqs;       // [rope_dim/2]
  void build(int rope_dim, int64_t original_seq_len, double base, double factor,
             double beta_fast, double beta_slow);
  // Rotates x[0..rope_dim) (interleaved pairs) at `pos`; inverse = conjugate. Result rounded bf16.
  void apply(float* x, int64_t pos, bool inverse) const;
};

float silu(float x);
float softplus(float x);  // torch threshold 20

}  // namespace tandem::model
