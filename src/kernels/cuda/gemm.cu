// GEMM y = x @ W^T with W in its stored format (f32, bf16, FP8 e4m3 + E8M0 128x128 block scales,
// MXFP4 e2m1 + E8M0 per-32 scales), fp32 accumulation, exact dequantization (every stored value
// and every product with its power-of-two scale is an fp32 value, as on the CPU).
//
// Shape: GEMV-style, built for decode and verify (m = 1..64). A CTA owns kRows = 4 consecutive
// weight rows and an m-tile of MT (1, 2, 4 or 8) rows of x; its 4 (narrow weights: 16) warps split
// K, each lane loading 16 bytes of every one of the 4 weight rows per step and accumulating MT x 4
// dot products in registers; warp shuffles, then a fixed-order cross-warp sum in shared memory, finish the dots.
// Consecutive CTAs walk the m-tiles of one weight tile, so with m > 8 the tile comes from L2 and
// weights are still read from DRAM about once per call (prefill-size m uses the same kernel for
// now). Unaligned shapes (k not a multiple of the 16-byte element count, odd strides) take a scalar
// path with the same structure.
//
// quantize_x_block: x is first quantized (act_quant_fp8) into a private per-device scratch buffer
// (ScratchSlot::kGemmX, grown outside graph capture only), then multiplied.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/check.h"
#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kRows = 4;    // weight rows per CTA
// Warps per CTA, splitting K: 4, or 16 for narrow weights (few CTAs) with enough 16-byte chunks per
// row to keep 16 warps busy. Picked from (format, n, k) only, never from m, so a row's summation
// order (and result) does not depend on how many rows the call has.
constexpr int kWarpsWide = 16;

struct GemmArgs {
  const float* x;         // [batch][m, ldx], batch stride xbs
  int64_t ldx, xbs;
  const void* w;          // stored weight, full matrix (all batches)
  const uint8_t* scale;   // E8M0 scales of the full matrix
  int64_t scale_ld;       // kFp8Block: row stride of the scale grid
  int64_t w_batch_rows;
  float* y;               // [batch][m, ldy], batch stride ybs
  int64_t ldy, ybs;
  int64_t m, n, k;
  int64_t m_tiles;
  bool accumulate, round;
};

template <WeightFormat F>
struct Fmt;
// Elements per lane per step (one 16-byte load per weight row).
template <>
struct Fmt<WeightFormat::kF32> {
  static constexpr int kEl = 4;
};
template <>
struct Fmt<WeightFormat::kBf16> {
  static constexpr int kEl = 8;
};
template <>
struct Fmt<WeightFormat::kFp8Block> {
  static constexpr int kEl = 16;
};
template <>
struct Fmt<WeightFormat::kMxfp4> {
  static constexpr int kEl = 32;
};

// e2m1 nibble -> fp32 (exact): exponent/mantissa bits moved into fp32 position, subnormal 0.5*m.
__device__ __forceinline__ float e2m1_val(uint32_t nib) {
  const uint32_t mag = nib & 7u;
  const float normal = num::bits_f32((mag << 22) + (126u << 23));
  const float v = mag < 2u ? 0.5f * static_cast<float>(mag) : normal;
  return (nib & 8u) ? -v : v;
}

// Group g (4 consecutive elements) of a lane's 16-byte chunk, dequantized and scaled.
template <WeightFormat F>
__device__ __forceinline__ void dequant4(const uint4& raw, int g, float scale, float out[4]) {
  if constexpr (F == WeightFormat::kF32) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else if constexpr (F == WeightFormat::kBf16) {
    const uint32_t a = g == 0 ? raw.x : raw.z, b = g == 0 ? raw.y : raw.w;
    out[0] = __uint_as_float(a << 16);
    out[1] = __uint_as_float(a & 0xffff0000u);
    out[2] = __uint_as_float(b << 16);
    out[3] = __uint_as_float(b & 0xffff0000u);
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const uint32_t word = g == 0 ? raw.x : g == 1 ? raw.y : g == 2 ? raw.z : raw.w;
    // e4m3 -> f16 is exact (hardware cvt on sm_89+); f16 -> f32 exact.
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
    const float2 l = __half22float2(__half2(lo)), h = __half22float2(__half2(hi));
    out[0] = mul_rn(l.x, scale);
    out[1] = mul_rn(l.y, scale);
    out[2] = mul_rn(h.x, scale);
    out[3] = mul_rn(h.y, scale);
  } else {
    const uint32_t word = (g >> 1) == 0 ? raw.x : (g >> 1) == 1 ? raw.y : (g >> 1) == 2 ? raw.z : raw.w;
    const uint32_t bits = (g & 1) ? word >> 16 : word & 0xffffu;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = mul_rn(e2m1_val(bits >> (4 * i)), scale);
  }
}

// One weight element (scalar path), exactly as the CPU's weight_at.
template <WeightFormat F>
__device__ __forceinline__ float weight_at(const GemmArgs& a, int64_t row, int64_t k) {
  if constexpr (F == WeightFormat::kF32) {
    return static_cast<const float*>(a.w)[row * a.k + k];
  } else if constexpr (F == WeightFormat::kBf16) {
    return num::bf16_to_f32(static_cast<const uint16_t*>(a.w)[row * a.k + k]);
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const float s = num::e8m0_to_f32(a.scale[(row / kFp8WeightBlock) * a.scale_ld + k / kFp8WeightBlock]);
    return mul_rn(num::e4m3_decode(static_cast<const uint8_t*>(a.w)[row * a.k + k]), s);
  } else {
    const uint8_t b = static_cast<const uint8_t*>(a.w)[row * (a.k / 2) + k / 2];
    const float s = num::e8m0_to_f32(a.scale[row * (a.k / kMxfp4WeightGroup) + k / kMxfp4WeightGroup]);
    return mul_rn(num::e2m1_decode((k & 1) ? (b >> 4) : (b & 0xf)), s);
  }
}

template <WeightFormat F>
__device__ __forceinline__ const uint8_t* row_bytes(const GemmArgs& a, int64_t row) {
  constexpr int64_t kNum = F == WeightFormat::kF32 ? 4 : F == WeightFormat::kBf16 ? 2 : 1;
  if constexpr (F == WeightFormat::kMxfp4) return static_cast<const uint8_t*>(a.w) + row * (a.k / 2);
  return static_cast<const uint8_t*>(a.w) + row * a.k * kNum;
}

template <WeightFormat F>
__device__ __forceinline__ float chunk_scale(const GemmArgs& a, int64_t row, int64_t kc) {
  if constexpr (F == WeightFormat::kFp8Block)
    return num::e8m0_to_f32(__ldg(a.scale + (row / kFp8WeightBlock) * a.scale_ld + kc / kFp8WeightBlock));
  if constexpr (F == WeightFormat::kMxfp4)
    return num::e8m0_to_f32(__ldg(a.scale + row * (a.k / kMxfp4WeightGroup) + kc / kMxfp4WeightGroup));
  return 1.0f;
}

template <WeightFormat F, int MT, bool kVec, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarp) gemm_kernel(GemmArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t mt = blockIdx.x % a.m_tiles, nblk = blockIdx.x / a.m_tiles;
  const int64_t b = blockIdx.y;
  const int64_t m0 = mt * MT, n0 = nblk * kRows;
  const float* xb = a.x + b * a.xbs;
  const float* xr[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) xr[i] = xb + (m0 + i < a.m ? m0 + i : a.m - 1) * a.ldx;  // clamp: read, never written
  int64_t wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wrow[r] = b * a.w_batch_rows + (n0 + r < a.n ? n0 + r : a.n - 1);

  float acc[MT][kRows];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[i][r] = 0.0f;

  if constexpr (kVec) {
    constexpr int kEl = Fmt<F>::kEl;
    for (int64_t kc = (static_cast<int64_t>(warp) * kWarp + lane) * kEl; kc < a.k; kc += kWarps * kWarp * kEl) {
      uint4 raw[kRows];
      float sc[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* base = row_bytes<F>(a, wrow[r]);
        const int64_t off = F == WeightFormat::kF32 ? kc * 4 : F == WeightFormat::kBf16 ? kc * 2
                                                     : F == WeightFormat::kFp8Block ? kc : kc / 2;
        raw[r] = __ldg(reinterpret_cast<const uint4*>(base + off));
        sc[r] = chunk_scale<F>(a, wrow[r], kc);
      }
#pragma unroll
      for (int g = 0; g < kEl / 4; ++g) {
        float wv[kRows][4];
#pragma unroll
        for (int r = 0; r < kRows; ++r) dequant4<F>(raw[r], g, sc[r], wv[r]);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const float4 xv = __ldg(reinterpret_cast<const float4*>(xr[i] + kc + 4 * g));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            acc[i][r] = fmaf(xv.x, wv[r][0], acc[i][r]);
            acc[i][r] = fmaf(xv.y, wv[r][1], acc[i][r]);
            acc[i][r] = fmaf(xv.z, wv[r][2], acc[i][r]);
            acc[i][r] = fmaf(xv.w, wv[r][3], acc[i][r]);
          }
        }
      }
    }
  } else {
    for (int64_t kk = static_cast<int64_t>(warp) * kWarp + lane; kk < a.k; kk += kWarps * kWarp) {
      float wv[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = weight_at<F>(a, wrow[r], kk);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const float xv = xr[i][kk];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[i][r] = fmaf(xv, wv[r], acc[i][r]);
      }
    }
  }

  __shared__ float red[kWarps][MT * kRows];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float v = warp_sum(acc[i][r]);
      if (lane == 0) red[warp][i * kRows + r] = v;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < MT * kRows; t += blockDim.x) {
    const int i = t / kRows, r = t % kRows;
    if (m0 + i >= a.m || n0 + r >= a.n) continue;
    float v = red[0][t];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = add_rn(v, red[w][t]);
    float* yp = a.y + b * a.ybs + (m0 + i) * a.ldy + n0 + r;
    if (a.accumulate) v = add_rn(*yp, v);
    *yp = a.round ? round_bf16(v) : v;
  }
}

template <WeightFormat F, int MT, bool kVec, int kWarps = 4>
void launch_mt(const GemmArgs& a, int64_t batch, cudaStream_t s) {
  const int64_t nblk = (a.n + kRows - 1) / kRows;
  GemmArgs g = a;
  g.m_tiles = (a.m + MT - 1) / MT;
  const int64_t blocks = g.m_tiles * nblk;
  TANDEM_CHECK_MSG(blocks < (int64_t{1} << 31) && batch <= 65535, "gemm: problem too large for one launch");
  gemm_kernel<F, MT, kVec, kWarps><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(batch)), kWarps * kWarp, 0, s>>>(g);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <WeightFormat F>
void launch_format(const GemmArgs& a, int64_t batch, cudaStream_t s) {
  constexpr int kEl = Fmt<F>::kEl;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = a.k % kEl == 0 && a.ldx % 4 == 0 && (batch == 1 || a.xbs % 4 == 0) && aligned(a.x) && aligned(a.w);
  if (!vec) return launch_mt<F, 4, false>(a, batch, s);
  const int64_t chunks = a.k / (kWarp * kEl), nblk = (a.n + kRows - 1) / kRows;
  if (chunks >= kWarpsWide && nblk <= 256) {
    if (a.m <= 1) return launch_mt<F, 1, true, kWarpsWide>(a, batch, s);
    if (a.m <= 4) return launch_mt<F, 4, true, kWarpsWide>(a, batch, s);
    return launch_mt<F, 8, true, kWarpsWide>(a, batch, s);
  }
  if (a.m <= 1) return launch_mt<F, 1, true>(a, batch, s);
  if (a.m <= 2) return launch_mt<F, 2, true>(a, batch, s);
  if (a.m <= 4) return launch_mt<F, 4, true>(a, batch, s);
  launch_mt<F, 8, true>(a, batch, s);
}

}  // namespace

void gemm(const GemmParams& p, cudaStream_t s) {
  validate(p);
  if (p.m == 0 || p.n == 0) return;
  GemmArgs a{};
  a.x = p.x;
  a.ldx = p.ldx > 0 ? p.ldx : p.k;
  a.xbs = p.x_batch_stride;
  a.w = p.w.data;
  a.scale = p.w.scale;
  a.scale_ld = p.w.scale_ld > 0 ? p.w.scale_ld : (p.k + kFp8WeightBlock - 1) / kFp8WeightBlock;
  a.w_batch_rows = p.w_batch_rows;
  a.y = p.y;
  a.ldy = p.ldy > 0 ? p.ldy : p.n;
  a.ybs = p.y_batch_stride;
  a.m = p.m;
  a.n = p.n;
  a.k = p.k;
  a.accumulate = p.accumulate;
  a.round = p.round_bf16;
  if (p.quantize_x_block > 0) {
    const int64_t rows = p.batch * p.m;
    float* xq = static_cast<float*>(scratch(ScratchSlot::kGemmX, static_cast<size_t>(rows * p.k) * sizeof(float), s));
    act_quant_fp8_rows({a.x, a.ldx, p.m, p.x_batch_stride, xq, p.k, rows, p.k, p.quantize_x_block, nullptr, nullptr}, s);
    a.x = xq;
    a.ldx = p.k;
    a.xbs = p.m * p.k;
  }
  switch (p.w.format) {
    case WeightFormat::kF32: return launch_format<WeightFormat::kF32>(a, p.batch, s);
    case WeightFormat::kBf16: return launch_format<WeightFormat::kBf16>(a, p.batch, s);
    case WeightFormat::kFp8Block: return launch_format<WeightFormat::kFp8Block>(a, p.batch, s);
    case WeightFormat::kMxfp4: return launch_format<WeightFormat::kMxfp4>(a, p.batch, s);
  }
}

}  // namespace tandem::kernels::cuda
