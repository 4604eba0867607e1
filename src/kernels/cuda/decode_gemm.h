// Decode-size GEMV on the tensor cores (decode_gemm.cu): y[m, n] = x[m, k] . W[n, k]^T for the
// 1..96 rows of decode and speculative verify (any m works: rows past 96 run in further 96-row
// chunks), with every weight tile read from DRAM once per call whatever m is. One launch serves up
// to kMaxDecodeSegments projections that read the same activation (wq_a + wkv, wq_b + the
// indexer's wq_b, the compressors' wkv/wgate + weights_proj, the wo_a groups).
//
// Weight / activation kinds (DecodeGemmArgs says which by the pointers it gets):
//  * FP8 128x128-block weight, activation in act_quant(x, 128) stored form (e4m3 codes + E8M0 scale
//    per 128 columns, from decode_act_pack): f16 mma on the codes, scales applied per 128-k block.
//    Equals the reference linear() (act_quant, then fp8_gemm) up to summation order.
//  * bf16 weight, fp32 activation holding bf16 values (the model's normed activations): bf16 mma.
//  * FP8 weight, fp32 activation holding bf16 values (wo_a's bf16 einsum): bf16 mma on the codes,
//    the weight scale applied per 128-k block.
// An activation that is not bf16-valued is rounded to bf16 (RN) by the last two kinds.
//
// Accumulation (one scheme for every m, so decode, verify and padded graph batches give the same
// bits for a row, and a projection gives the same bits alone or grouped with others): each
// weight's k range is cut into `units` consecutive units (decode_gemm_units: picked from the
// weight's format, rows and k; never from m or the rest of the launch); within a unit the tensor
// core accumulates 16 k at a time in k order (FP8: in the current 128-k block's scale, the
// accumulator rescaled by an exact power of two between blocks); the units' fp32 partials are
// then added in unit order. At most 8 rows the call's rows are the mma's B columns and the weight
// rows its A rows (decode_gemm_body.cuh's HALF), elsewhere the other way round: the same products
// and k order per output, and the tensor core's sum does not depend on the orientation (the row
// count tests compare both bit for bit).
// Error bound (tests/cuda/decode_gemm_test.cpp). Tensor-core model: a k16 step adds its 16 exact
// products to the accumulator aligned to the largest term and truncated to fp32's 24 bits, no
// guard bits: its error is below 16 * 2^-23 of the largest term, so below 2^-19 * sum_i |x_i w_i|
// (the accumulator is bounded by the sum so far). With S = k/16 steps, exact power-of-two scaling
// and units + 2 fp32 roundings after it:
// |y - y_exact| <= (S * 2^-19 + (units + 2) * 2^-24) * sum_i |x_i w_i|, before the bf16 rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/hc_mix.h"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {

constexpr int kMaxDecodeSegments = 8;
constexpr int kDecodeRowsPerCall = 96;  // rows per chunk (6 m-tiles of 16)

// One projection of a grouped launch.
struct DecodeSegment {
  WeightRef w;             // [n, k] stored weight: kFp8Block or kBf16 (n = w.n rows are computed)
  float* y = nullptr;      // [m, ldy]: columns [0, w.n) of each row are written
  int64_t ldy = 0;         // 0 = w.n
  int64_t x_col0 = 0;      // first activation column this projection reads (k columns from there)
  bool round_bf16 = false; // store bf16(y) (the reference's bf16 linear outputs)
  bool accumulate = false; // y += x . W^T (before the rounding)
};

struct DecodeGemmArgs {
  // Activation, one of:
  const uint8_t* x_codes = nullptr;   // [m, ldx] e4m3 codes of act_quant(x, 128) (FP8 weights)
  const uint8_t* x_scales = nullptr;  // [m, ld_scales] E8M0, one per 128 columns
  int64_t ld_scales = 0;              // 0 = ldx / 128
  const float* x = nullptr;           // [m, ldx] fp32 holding bf16 values (bf16 weights, wo_a)
  int64_t ldx = 0;
  int64_t m = 0;                      // rows (tokens)
  int64_t k = 0;                      // columns read per segment (== every segment's w.k)
  int num_segments = 0;
  DecodeSegment seg[kMaxDecodeSegments];
  bool pdl = true;                    // launch with programmatic dependent launch (launch.cuh)
  // Instrument (bench-kernels): per-CTA phase timestamps (timeline.cuh; decode_gemm_body.cuh names
  // the marks) into timeline::kCtas records; null: none.
  uint64_t* timeline = nullptr;
};

// True when decode_gemm handles weight `w` with an FP8-code activation (fp8_act) or an fp32 one:
// kFp8Block (k % 128 == 0) or kBf16 (k % 64 == 0, fp32 activation only), 16-byte aligned data.
// Depends on the weight alone, so a projection takes the same path at every row count.
bool decode_gemm_supports(const WeightRef& w, bool fp8_act);

// Units of k of weight `w` (see Accumulation above), and the largest over a launch's segments
// (what the tests' error bound uses).
int decode_gemm_units(const WeightRef& w, bool fp8_act);
int decode_gemm_k_split(const DecodeGemmArgs& a);

// The device's launch limits the decode kernels size themselves by (cached per device): SMs, the
// opt-in shared memory of one block, of one SM, and the share of a CTA that leaves room for a CTA
// of the next kernel on the same SM (programmatic dependent launch overlaps the two).
struct DecodeLaunchLimits {
  int sms = 0;
  int smem_per_block = 0;
  int smem_per_sm = 0;
  int smem_half = 0;
};
const DecodeLaunchLimits& decode_launch_limits();
// The most CTAs a persistent decode grid launches: as many as reside at once, two per SM where a
// CTA's shared memory (dynamic + static) and the runtime's 1 KB per CTA leave room for two (8 warps
// per SM leave the weight stream latency-bound), else one.
int64_t decode_max_ctas(const DecodeLaunchLimits& lim, int64_t smem_bytes);
// The limits of a device with `sms` multiprocessors and this much shared memory one block may opt
// in to and one SM has (decode_launch_limits() reads them from the current device).
DecodeLaunchLimits decode_limits_of(int sms, int smem_per_block, int smem_per_sm);
// Raises `kernel`'s dynamic shared memory limit to the most one block may have beside its static
// shared memory (call once per kernel, outside stream capture).
void decode_allow_smem(const void* kernel);

void decode_gemm(const DecodeGemmArgs& a, cudaStream_t s);

// ---- activation preparation (decode_act.cu) ----
// Per row r of x: optionally v = rms_norm(x[r]) with an fp32 weight, rounded to bf16 (exactly the
// rms_norm op with round_bf16, bit for bit with the CUDA op), stored to y when given; then
// act_quant(v, 128) in stored form into codes/scales (bit for bit with the act_quant op's codes and
// scales). Without a norm weight v = x[r] (quantization only). y may equal x.
struct DecodeActPackArgs {
  const float* x = nullptr;       // [rows, ldx]
  int64_t ldx = 0;                // 0 = dim
  int64_t rows = 0;
  int64_t dim = 0;                // multiple of 128, <= kMaxPackDim
  const float* norm_weight = nullptr;  // optional [dim] fp32: rms-normalize first
  float eps = 1e-6f;
  float* y = nullptr;             // optional [rows, ldy] the normalized row (bf16 values)
  int64_t ldy = 0;                // 0 = dim
  uint8_t* codes = nullptr;       // [rows, ldc] e4m3 codes
  int64_t ldc = 0;                // 0 = dim
  uint8_t* scales = nullptr;      // [rows, lds] E8M0, one per 128 columns
  int64_t lds = 0;                // 0 = dim / 128
  bool pdl = true;
};
constexpr int64_t kMaxPackDim = 12288;
void decode_act_pack(const DecodeActPackArgs& a, cudaStream_t s);

// comb (the Sinkhorn of the mixes' last hc * hc rows: 20 dependent rounds of sums and divisions, the
// finishing kernel's longest chain) on a second stream: the op records `fork` on its stream after
// the mix, makes `stream` wait for it, runs the comb there (same bits) and records `join`. The
// finishing kernel then writes x, codes, scales and post only, and the kernels after it do not wait
// for the Sinkhorn; comb is written once `join` completes: the caller makes its stream wait for
// `join` before anything reads comb (and before the mix's next launch on its stream, which
// rewrites the partials the comb reads). Works eagerly and under stream capture (a graph branch).
struct HcCombSide {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

// hc_pre (cuda_ops.h) with decode_act_pack of its output fused into the kernel that finishes it
// (hc_pre.cu), for the decode path's layer halves: the CTA that collapses a token's streams into
// x[t] then normalizes x[t] in place and quantizes it. Bit for bit hc_pre followed by
// decode_act_pack(x, norm_weight, y = x); p.x, p.post and p.comb as hc_pre's.
struct HcPrePackArgs {
  const float* norm_weight = nullptr;  // [dim] fp32 RMSNorm weight (required)
  float eps = 1e-6f;                   // the RMSNorm's (p.norm_eps is the mixes')
  uint8_t* codes = nullptr;            // [tokens, dim] e4m3 codes of the normed x (row stride dim)
  uint8_t* scales = nullptr;           // [tokens, dim / 128] E8M0 (row stride dim / 128)
  HcFinishShape finish = HcFinishShape::kAuto;  // the finishing kernel's shape (hc_mix.h), for tests
  // Optional: the mix's partials of these tokens (hc_mix_partials with hc_mix_ksplit(hc * dim, nmix)),
  // already computed: only the finishing kernel runs (the bench times it alone).
  const double* partials = nullptr;
  // Optional: comb off the finishing kernel's path (HcCombSide). Null: the finishing kernel writes it.
  const HcCombSide* comb_side = nullptr;
};
// p.dim a multiple of 128, <= kMaxPackDim; p.hc <= 16.
void hc_pre_pack(const HcPreParams& p, const HcPrePackArgs& pack, cudaStream_t s);

}  // namespace tandem::kernels::cuda
