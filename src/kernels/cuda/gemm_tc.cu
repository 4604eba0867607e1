// The dense prefill GEMMs on the tensor cores: back-end choice, the portable kernels (tc_gemm.cuh's
// main loop: mma.sync, or wgmma on sm_90a) for block-scaled FP8 and bf16, dispatch to the sm_90
// warp-specialized kernels (gemm_ws.cu), the activation quantization that feeds FP8, the linear()
// entries (quantize or copy to bf16, then multiply) the CUDA forward calls for prefill rows, and the
// element-wise conversions (fp32 -> bf16 activations, E8M0 -> fp32 scale grids, FP8 -> bf16 weights).
// Portable CTA tile: 128 rows of x by 128 weight rows (= one FP8 weight scale block), K in blocks of
// 128 bytes.
#include <mutex>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/cuda/gemm_ws.h"
#include "kernels/cuda/smem_bounds.h"
#include "kernels/cuda/tc_gemm.cuh"
#include "kernels/cuda/tma.h"

namespace tandem::kernels::cuda {
namespace {

// ---------------------------------------------------------------- activation quantization
// One warp per (row, up to kQuantBlocks 128-column blocks): each block's loads are issued before
// any is used (one warp had one 512-byte load in flight behind the src_rows gather: latency-bound),
// then per block: 4 elements per lane, the warp's max is the block's amax.
constexpr int kQuantWarps = 8;
constexpr int kQuantBlocks = 4;

__global__ void __launch_bounds__(kQuantWarps * 32) quant_kernel(Fp8QuantArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t nb = a.cols / 128, ng = (nb + kQuantBlocks - 1) / kQuantBlocks;
  const int64_t rows = a.rows_limit ? min(a.rows, static_cast<int64_t>(*a.rows_limit)) : a.rows;
  const int64_t total = rows * ng;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kQuantWarps;
  for (int64_t gw = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5); gw < total; gw += warps) {
    const int64_t r = gw / ng, b0 = (gw % ng) * kQuantBlocks;
    const int64_t xr = a.src_rows ? static_cast<int64_t>(a.src_rows[r] / a.src_div) : r;
    float v[kQuantBlocks][4];
#pragma unroll
    for (int j = 0; j < kQuantBlocks; ++j) {
      const int64_t c = (b0 + j) * 128 + lane * 4;
      if (b0 + j >= nb) {
        v[j][0] = v[j][1] = v[j][2] = v[j][3] = 0.0f;
      } else if (a.xb) {
        const uint2 raw = *reinterpret_cast<const uint2*>(a.xb + xr * a.ldx + c);
        v[j][0] = __uint_as_float(raw.x << 16);
        v[j][1] = __uint_as_float(raw.x & 0xffff0000u);
        v[j][2] = __uint_as_float(raw.y << 16);
        v[j][3] = __uint_as_float(raw.y & 0xffff0000u);
      } else {
        const float4 f = *reinterpret_cast<const float4*>(a.x + xr * a.ldx + c);
        v[j][0] = f.x;
        v[j][1] = f.y;
        v[j][2] = f.z;
        v[j][3] = f.w;
      }
    }
#pragma unroll
    for (int j = 0; j < kQuantBlocks; ++j) {
      const int64_t b = b0 + j;
      if (b >= nb) break;  // the same for the whole warp
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float m = fabsf(v[j][i]);
        amax = m > amax ? m : amax;  // NaN compares false: ignored, as the CPU op
      }
      amax = warp_max(amax);
      const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float s = num::pow2_int(e);
      // v / s as v * (1 / s), one division per block instead of one per element: s = 2^e with e in
      // [-22, 127] (the amax floor 1e-4 / 448 and the cap), so 1 / s = 2^-e is exact (subnormal at
      // e = 127) and both round the same exact quotient (no overflow: |v| <= amax).
      const float inv = div_rn(1.0f, s);
      // The codes by the branch-free encoder (num::e4m3_from_clamped, f32_to_e4m3's codes on every
      // clamped float; the branchy encoder made this loop issue-bound, ~4x its bytes' time); NaN
      // keeps f32_to_e4m3's code (0x7f with its sign).
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float q = clamp_std(mul_rn(v[j][i], inv), -num::kE4m3Max, num::kE4m3Max);
        const uint32_t code = is_nan(v[j][i]) ? ((__float_as_uint(v[j][i]) >> 24) & 0x80u) | 0x7fu
                                              : num::e4m3_from_clamped(q);
        word |= code << (8 * i);
      }
      *reinterpret_cast<uint32_t*>(a.codes + r * a.ldc + b * 128 + lane * 4) = word;
      if (lane == 0) a.scales[a.scale_rows_major ? r * nb + b : b * a.scale_ld + r] = s;
    }
  }
}

// ---------------------------------------------------------------- dense FP8 GEMM
struct DenseArgs {
  const uint8_t* a;        // [m, k]
  const float* a_scale;    // [k/128, a_scale_ld]
  int64_t a_scale_ld;
  const uint8_t* w;        // [n, k]
  const uint8_t* w_scale;  // [ceil(n/128), w_scale_ld]
  int64_t w_scale_ld;
  float* y;
  int64_t ldy, m, n, k;
  bool accumulate, round;
};

// Operand source of one CTA tile (tc::mainloop's Op): 16-byte chunk c of tile rows r0 + 32 i
// (i < 4) of A and of W, valid for i < na / nw (rows past m or n are zero-filled), and, for
// threads < 128, the scale of A row threadIdx.x.
template <int kStages>
struct DenseOp {
  using L = tc::Smem<false, kStages>;
  const uint8_t* abase;    // A row r0 of the tile
  const uint8_t* wbase;    // W row r0 of the tile
  int64_t k;
  int na, nw;
  const float* ascale;     // this thread's A row scale (k block 0)
  int64_t ascale_ld;
  bool ascale_valid;
  const uint8_t* wscale;   // the tile's weight scale row (k block 0)
  int r0, c;

  __device__ void load(uint8_t* smem, int stage, int kb) const {
    const uint32_t sa = tc::smem_u32(smem + L::kA + stage * tc::kTileBytes);
    const uint32_t sb = tc::smem_u32(smem + L::kB + stage * tc::kTileBytes);
    const int64_t off = static_cast<int64_t>(kb) * tc::kBK + c * 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t d = tc::swz(r0 + 32 * i, c);
      tc::cp_async16(sa + d, abase + (i < na ? 32 * i * k + off : 0), i < na);
      tc::cp_async16(sb + d, wbase + (i < nw ? 32 * i * k + off : 0), i < nw);
    }
    if (threadIdx.x < tc::kTileRows) {
      const uint32_t ss = tc::smem_u32(smem + L::kAScale + stage * tc::kTileRows * 4) + threadIdx.x * 4;
      tc::cp_async4(ss, ascale + (ascale_valid ? kb * ascale_ld : 0), ascale_valid);
    }
  }
  __device__ float b_scale(int kb) const { return num::e8m0_to_f32(__ldg(wscale + kb)); }
};

// Rows r0 + 32 i (i < 4) below `limit`, counted from the tile's first row `base`.
__device__ __forceinline__ int rows_below(int64_t base, int r0, int64_t limit) {
  int n = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) n += base + r0 + 32 * i < limit ? 1 : 0;
  return n;
}

// One output tile (tc_gemm.cuh's accumulator layout) into y: columns n, n+1 of a row per pair of
// elements, one 8-byte store when both exist and y allows it; y += first when accumulating (fp32
// add), then the bf16 rounding when asked.
template <bool kWgmma>
__device__ __forceinline__ void store_tile(const float (&acc)[64], float* y, int64_t ldy, int64_t m0, int64_t n0,
                                           int64_t m, int64_t n, bool accumulate, bool round) {
  const bool pairs = (ldy & 1) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
#pragma unroll
  for (int i = 0; i < 64; i += 2) {
    const int64_t r = m0 + tc::acc_row<kWgmma>(i), c = n0 + tc::acc_col<kWgmma>(i);
    if (r >= m) continue;
    float* yp = y + r * ldy + c;
    float v0 = acc[i], v1 = acc[i + 1];
    if (pairs && c + 1 < n) {
      if (accumulate) {
        const float2 old = *reinterpret_cast<const float2*>(yp);
        v0 = add_rn(old.x, v0);
        v1 = add_rn(old.y, v1);
      }
      *reinterpret_cast<float2*>(yp) = round ? make_float2(round_bf16(v0), round_bf16(v1)) : make_float2(v0, v1);
      continue;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (c + q >= n) continue;
      float v = q ? v1 : v0;
      if (accumulate) v = add_rn(yp[q], v);
      yp[q] = round ? round_bf16(v) : v;
    }
  }
}

template <bool kWgmma, int kStages, bool kOverlap = false>
__global__ void __launch_bounds__(tc::kThreads, 1) dense_kernel(DenseArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * tc::kTileRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * tc::kTileRows;
  DenseOp<kStages> op;
  op.r0 = threadIdx.x >> 3;
  op.c = threadIdx.x & 7;
  op.k = a.k;
  op.na = rows_below(m0, op.r0, a.m);
  op.nw = rows_below(n0, op.r0, a.n);
  op.abase = a.a + (op.na > 0 ? (m0 + op.r0) * a.k : 0);
  op.wbase = a.w + (op.nw > 0 ? (n0 + op.r0) * a.k : 0);
  const int64_t sr = m0 + threadIdx.x;
  op.ascale_valid = threadIdx.x < tc::kTileRows && sr < a.m;
  op.ascale = a.a_scale + (op.ascale_valid ? sr : 0);
  op.ascale_ld = a.a_scale_ld;
  op.wscale = a.w_scale + (n0 / 128) * a.w_scale_ld;

  float acc[64];
  if constexpr (kOverlap) {
    static_assert(kWgmma, "the overlapped main loop is wgmma's");
    tc::mainloop_overlap<kStages>(smem, op, static_cast<int>(a.k / tc::kBK), acc);
  } else {
    tc::mainloop<kWgmma, tc::Elem::kE4m3, kStages>(smem, op, static_cast<int>(a.k / tc::kBK), acc);
  }
  store_tile<kWgmma>(acc, a.y, a.ldy, m0, n0, a.m, a.n, a.accumulate, a.round);
}

// ---------------------------------------------------------------- dense bf16 GEMM (portable)
struct Bf16Args {
  const uint16_t* x;  // [m, ldx]
  int64_t ldx;
  const uint16_t* w;  // [rows, k]
  float* y;
  int64_t ldy, m, n, k;
  int64_t x_batch_stride, w_batch_rows, y_batch_stride;
  bool accumulate, round;
};

// tc::mainloop's Op for bf16 (no scales): chunk c of tile rows r0 + 32 i of x and of W, 64 elements
// (128 bytes) of K per block.
template <int kStages>
struct Bf16Op {
  using L = tc::Smem<false, kStages>;
  const uint16_t* abase;  // x row r0 of the tile, this batch's column 0
  const uint16_t* wbase;  // W row r0 of the tile (this batch)
  int64_t lda, k;
  int na, nw, r0, c;

  __device__ void load(uint8_t* smem, int stage, int kb) const {
    const uint32_t sa = tc::smem_u32(smem + L::kA + stage * tc::kTileBytes);
    const uint32_t sb = tc::smem_u32(smem + L::kB + stage * tc::kTileBytes);
    const int64_t off = static_cast<int64_t>(kb) * 64 + c * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t d = tc::swz(r0 + 32 * i, c);
      tc::cp_async16(sa + d, abase + (i < na ? 32 * i * lda + off : 0), i < na);
      tc::cp_async16(sb + d, wbase + (i < nw ? 32 * i * k + off : 0), i < nw);
    }
  }
};

template <bool kWgmma, int kStages>
__global__ void __launch_bounds__(tc::kThreads, 1) bf16_kernel(Bf16Args a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * tc::kTileRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * tc::kTileRows;
  const int64_t b = blockIdx.z;
  Bf16Op<kStages> op;
  op.r0 = threadIdx.x >> 3;
  op.c = threadIdx.x & 7;
  op.k = a.k;
  op.lda = a.ldx;
  op.na = rows_below(m0, op.r0, a.m);
  op.nw = rows_below(n0, op.r0, a.n);
  op.abase = a.x + b * a.x_batch_stride + (op.na > 0 ? (m0 + op.r0) * a.ldx : 0);
  op.wbase = a.w + (b * a.w_batch_rows + (op.nw > 0 ? n0 + op.r0 : 0)) * a.k;
  float acc[64];
  tc::mainloop<kWgmma, tc::Elem::kBf16, kStages>(smem, op, static_cast<int>(a.k / 64), acc);
  store_tile<kWgmma>(acc, a.y + b * a.y_batch_stride, a.ldy, m0, n0, a.m, a.n, a.accumulate, a.round);
}

template <bool kWgmma, int kStages, bool kOverlap = false>
void set_dense_attr() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(dense_kernel<kWgmma, kStages, kOverlap>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, tc::Smem<false, kStages>::kAlloc));
}
template <bool kWgmma, int kStages>
void set_bf16_attr() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(bf16_kernel<kWgmma, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         tc::Smem<false, kStages>::kAlloc));
}

int max_optin_smem() {
  int dev = 0, v = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v;
}
bool deep_pipeline() { return max_optin_smem() >= tc::Smem<false, 4>::kAlloc; }

std::once_flag g_init_once;

// ---------------------------------------------------------------- conversions
__global__ void f32_to_bf16_kernel(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                                   int64_t ldd) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = num::f32_to_bf16(src[r * lds + c]);
  }
}
// Four columns per thread (cols % 4 == 0, 16-byte aligned rows). A CTA row covers qpb column quads
// (qpb <= blockDim.x; short rows: several rows per CTA): thread (threadIdx.x / qpb, threadIdx.x % qpb)
// converts quad blockIdx.x * qpb + threadIdx.x % qpb of rows (blockIdx.y * rpb + threadIdx.x / qpb),
// + gridDim.y * rpb, ... (no per-element index division).
__global__ void f32_to_bf16_vec_kernel(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                                       int64_t ldd, int qpb) {
  const int rpb = blockDim.x / qpb, tr = threadIdx.x / qpb;
  if (tr >= rpb) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * qpb + threadIdx.x % qpb) * 4;
  if (c >= cols) return;
  const int64_t rstep = static_cast<int64_t>(gridDim.y) * rpb;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * rpb + tr; r < rows; r += rstep) {
    const float4 v = *reinterpret_cast<const float4*>(src + r * lds + c);
    uint2 o;
    o.x = num::f32_to_bf16(v.x) | (static_cast<uint32_t>(num::f32_to_bf16(v.y)) << 16);
    o.y = num::f32_to_bf16(v.z) | (static_cast<uint32_t>(num::f32_to_bf16(v.w)) << 16);
    *reinterpret_cast<uint2*>(dst + r * ldd + c) = o;
  }
}

// E8M0 scales [rows, nb] (row-major) -> the quantizer's fp32 grid [nb, ld].
__global__ void e8m0_rows_to_grid_kernel(const uint8_t* src, int64_t rows, int64_t nb, float* dst, int64_t ld) {
  const int64_t total = rows * nb;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / nb, b = i % nb;
    dst[b * ld + r] = num::e8m0_to_f32(src[i]);
  }
}

__global__ void e8m0_grid_kernel(const uint8_t* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                 int64_t ldd) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = num::e8m0_to_f32(src[r * lds + c]);
  }
}

// W[n, k] = e4m3(code) * 2^(scale - 127) -> bf16, exact products in fp32 then one rounding.
__global__ void fp8_block_to_bf16_kernel(const uint8_t* w, const uint8_t* scale, int64_t scale_ld, int64_t n,
                                         int64_t k, uint16_t* dst) {
  const int64_t total = n * k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / k, c = i % k;
    const float v = mul_rn(num::e4m3_decode(w[i]), num::e8m0_to_f32(scale[(r / 128) * scale_ld + c / 128]));
    dst[i] = num::f32_to_bf16(v);
  }
}

// Per-device facts the launchers need on every call, read once (cudaGetDeviceProperties is slow).
struct DeviceFacts {
  std::once_flag once;
  int sm_count = 0;
  bool wgmma = false;
};
DeviceFacts g_facts[64];

const DeviceFacts& device_facts() {
  int dev = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CHECK(dev >= 0 && dev < 64);
  DeviceFacts& f = g_facts[dev];
  std::call_once(f.once, [&f, dev] {
    int major = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, dev));
    f.wgmma = major == 9 && binary_supports_device(dev);
  });
  return f;
}

}  // namespace

bool tc_device_has_wgmma() { return device_facts().wgmma; }

TcBackend tc_backend_for_device() {
  return tc_device_has_wgmma() && tma_available() ? TcBackend::kWgmmaWs : TcBackend::kMmaSync;
}

TcBackend tc_resolve(TcBackend b) {
  if (b == TcBackend::kAuto) return tc_backend_for_device();
  if (b != TcBackend::kMmaSync) TANDEM_CHECK_MSG(tc_device_has_wgmma(), "wgmma needs an sm_90 device (sm_90a code)");
  if (b == TcBackend::kWgmmaWs) TANDEM_CHECK_MSG(tma_available(), "the TMA kernels need cuTensorMapEncodeTiled");
  return b;
}

const char* tc_backend_name(TcBackend b) {
  switch (b) {
    case TcBackend::kAuto: return "auto";
    case TcBackend::kMmaSync: return "mma.sync";
    case TcBackend::kWgmma: return "wgmma";
    case TcBackend::kWgmmaOverlap: return "wgmma-overlap";
    case TcBackend::kWgmmaWs: return "wgmma-ws";
  }
  return "?";
}

int tc_sm_count() { return device_facts().sm_count; }

void tc_init() {
  std::call_once(g_init_once, [] {
    set_dense_attr<false, 2>();
    set_dense_attr<true, 2>();
    set_bf16_attr<false, 2>();
    set_bf16_attr<true, 2>();
    if (deep_pipeline()) {
      set_dense_attr<false, 4>();
      set_dense_attr<true, 4>();
      set_dense_attr<true, 4, true>();
      set_bf16_attr<false, 4>();
      set_bf16_attr<true, 4>();
    }
    if (tc_device_has_wgmma()) ws_init();
  });
}

void quantize_fp8_act(const Fp8QuantArgs& a, cudaStream_t s) {
  if (a.rows == 0 || a.cols == 0) return;
  TANDEM_CHECK(a.cols % 128 == 0);
  Fp8QuantArgs q = a;
  if (q.ldc == 0) q.ldc = q.cols;
  if (q.scale_ld == 0) q.scale_ld = q.rows;
  if (q.ldx == 0) q.ldx = q.cols;
  TANDEM_CHECK(q.scale_ld >= q.rows && q.ldc % 4 == 0 && q.ldx % 4 == 0 && q.src_div >= 1);
  const uintptr_t xp = reinterpret_cast<uintptr_t>(q.xb ? static_cast<const void*>(q.xb) : q.x);
  TANDEM_CHECK((xp & (q.xb ? 7 : 15)) == 0);
  TANDEM_CHECK((reinterpret_cast<uintptr_t>(q.codes) & 3) == 0);
  const int64_t groups = (q.cols / 128 + kQuantBlocks - 1) / kQuantBlocks;
  quant_kernel<<<grid_for(q.rows * groups, kQuantWarps), kQuantWarps * 32, 0, s>>>(q);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void fp8_gemm_tc(const Fp8GemmArgs& g, TcBackend backend, cudaStream_t s) {
  if (g.m == 0 || g.n == 0) return;
  TANDEM_CHECK(g.k > 0 && g.k % 128 == 0);
  TANDEM_CHECK((reinterpret_cast<uintptr_t>(g.a) & 15) == 0 && (reinterpret_cast<uintptr_t>(g.w) & 15) == 0);
  TANDEM_CHECK((reinterpret_cast<uintptr_t>(g.a_scale) & 3) == 0 && g.a_scale_ld >= g.m);
  tc_init();
  backend = tc_resolve(backend);
  if (backend == TcBackend::kWgmmaWs) {
    fp8_gemm_ws(g, s);
    return;
  }
  DenseArgs a{};
  a.a = g.a;
  a.a_scale = g.a_scale;
  a.a_scale_ld = g.a_scale_ld;
  a.w = g.w;
  a.w_scale = g.w_scale;
  a.w_scale_ld = g.w_scale_ld > 0 ? g.w_scale_ld : g.k / 128;
  a.y = g.y;
  a.ldy = g.ldy > 0 ? g.ldy : g.n;
  a.m = g.m;
  a.n = g.n;
  a.k = g.k;
  a.accumulate = g.accumulate;
  a.round = g.round_bf16;
  const int64_t mt = (g.m + tc::kTileRows - 1) / tc::kTileRows, nt = (g.n + tc::kTileRows - 1) / tc::kTileRows;
  TANDEM_CHECK_MSG(mt <= 65535 && nt < (int64_t{1} << 31), "fp8_gemm_tc: problem too large for one launch");
  const dim3 grid(static_cast<unsigned>(nt), static_cast<unsigned>(mt));
  const bool deep = deep_pipeline();
  const bool wg = backend == TcBackend::kWgmma || backend == TcBackend::kWgmmaOverlap;
  if (backend == TcBackend::kWgmmaOverlap) {
    TANDEM_CHECK_MSG(deep, "the overlapped wgmma loop needs 4 pipeline stages");
    dense_kernel<true, 4, true><<<grid, tc::kThreads, tc::Smem<false, 4>::kAlloc, s>>>(a);
  } else if (deep) {
    if (wg) dense_kernel<true, 4><<<grid, tc::kThreads, tc::Smem<false, 4>::kAlloc, s>>>(a);
    else dense_kernel<false, 4><<<grid, tc::kThreads, tc::Smem<false, 4>::kAlloc, s>>>(a);
  } else {
    if (wg) dense_kernel<true, 2><<<grid, tc::kThreads, tc::Smem<false, 2>::kAlloc, s>>>(a);
    else dense_kernel<false, 2><<<grid, tc::kThreads, tc::Smem<false, 2>::kAlloc, s>>>(a);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

const char* bf16_gemm_problem(const Bf16GemmArgs& g) {
  const int64_t ldx = g.ldx > 0 ? g.ldx : g.k, ldy = g.ldy > 0 ? g.ldy : g.n;
  if (g.m < 0 || g.n < 1 || g.k < 64 || g.k % 64) return "k must be a positive multiple of 64";
  if ((g.m + tc::kTileRows - 1) / tc::kTileRows > 65535) return "more than 65535 row tiles for one launch";
  if (g.batch < 1 || g.batch > 65535) return "batch";
  if (ldx % 8) return "x row stride not a multiple of 8 elements (16 bytes)";
  if ((reinterpret_cast<uintptr_t>(g.x) & 15) || (reinterpret_cast<uintptr_t>(g.w) & 15))
    return "x or W not 16-byte aligned";
  if (g.batch > 1 && (g.x_batch_stride % 8 || g.x_batch_stride < 0 || g.w_batch_rows < 0 || g.y_batch_stride < 0))
    return "batch strides";
  if ((g.batch - 1) * g.x_batch_stride + g.k > ldx) return "a batch's columns run past x's row";
  if ((g.batch - 1) * g.y_batch_stride + g.n > ldy) return "a batch's columns run past y's row";
  const uint64_t need = static_cast<uint64_t>((g.batch - 1) * g.w_batch_rows + g.n);
  if (g.w_rows != 0 && g.w_rows < need) return "W has fewer rows than the batches use";
  return nullptr;
}

void bf16_gemm_tc(const Bf16GemmArgs& g, TcBackend backend, cudaStream_t s) {
  if (g.m == 0 || g.n == 0) return;
  const char* why = bf16_gemm_problem(g);
  TANDEM_CHECK_MSG(why == nullptr, why ? why : "");
  tc_init();
  backend = tc_resolve(backend);
  if (backend == TcBackend::kWgmmaWs) {
    bf16_gemm_ws(g, s);
    return;
  }
  Bf16Args a{};
  a.x = g.x;
  a.ldx = g.ldx > 0 ? g.ldx : g.k;
  a.w = g.w;
  a.y = g.y;
  a.ldy = g.ldy > 0 ? g.ldy : g.n;
  a.m = g.m;
  a.n = g.n;
  a.k = g.k;
  a.x_batch_stride = g.x_batch_stride;
  a.w_batch_rows = g.w_batch_rows;
  a.y_batch_stride = g.y_batch_stride;
  a.accumulate = g.accumulate;
  a.round = g.round_bf16;
  const int64_t mt = (g.m + tc::kTileRows - 1) / tc::kTileRows, nt = (g.n + tc::kTileRows - 1) / tc::kTileRows;
  TANDEM_CHECK_MSG(mt <= 65535 && nt < (int64_t{1} << 31), "bf16_gemm_tc: problem too large for one launch");
  const dim3 grid(static_cast<unsigned>(nt), static_cast<unsigned>(mt), static_cast<unsigned>(g.batch));
  const bool wg = backend != TcBackend::kMmaSync;  // kWgmma; kWgmmaOverlap runs kWgmma for bf16
  if (deep_pipeline()) {
    if (wg) bf16_kernel<true, 4><<<grid, tc::kThreads, tc::Smem<false, 4>::kAlloc, s>>>(a);
    else bf16_kernel<false, 4><<<grid, tc::kThreads, tc::Smem<false, 4>::kAlloc, s>>>(a);
  } else {
    if (wg) bf16_kernel<true, 2><<<grid, tc::kThreads, tc::Smem<false, 2>::kAlloc, s>>>(a);
    else bf16_kernel<false, 2><<<grid, tc::kThreads, tc::Smem<false, 2>::kAlloc, s>>>(a);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

bool fp8_linear_supported(const GemmParams& p, const TcLinearScratch& s) {
  return p.w.format == WeightFormat::kFp8Block && p.quantize_x_block == 128 && p.k % 128 == 0 && p.batch == 1 &&
         p.m <= s.rows && (p.m + tc::kTileRows - 1) / tc::kTileRows <= 65535 && p.k <= s.max_k && s.codes && s.scales && p.w.k == p.k &&
         (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 && (p.ldx == 0 || p.ldx % 4 == 0) &&
         (reinterpret_cast<uintptr_t>(p.w.data) & 15) == 0;
}

namespace {
// The GEMM of gemm_fp8_linear on codes [m, k] with their fp32 scale grid in s.scales (ld sld).
void fp8_linear_gemm(const GemmParams& p, const uint8_t* codes, const TcLinearScratch& s, int64_t sld,
                     TcBackend backend, cudaStream_t st) {
  Fp8GemmArgs g;
  g.a = codes;
  g.a_scale = s.scales;
  g.a_scale_ld = sld;
  g.w = static_cast<const uint8_t*>(p.w.data);
  g.w_scale = p.w.scale;
  g.w_scale_ld = p.w.scale_ld;
  g.y = p.y;
  g.ldy = p.ldy;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.accumulate = p.accumulate;
  g.round_bf16 = p.round_bf16;
  fp8_gemm_tc(g, backend, st);
}
}  // namespace

void gemm_fp8_linear(const GemmParams& p, const TcLinearScratch& s, TcBackend backend, cudaStream_t st,
                     bool x_ready) {
  if (p.m == 0 || p.n == 0) return;
  TANDEM_CHECK(fp8_linear_supported(p, s));
  const int64_t sld = (p.m + 3) / 4 * 4;
  if (!x_ready) {  // else an earlier linear on the same x left its codes and scales in s
    Fp8QuantArgs q;
    q.x = p.x;
    q.ldx = p.ldx > 0 ? p.ldx : p.k;
    q.rows = p.m;
    q.cols = p.k;
    q.codes = s.codes;
    q.ldc = p.k;
    q.scales = s.scales;
    q.scale_ld = sld;
    quantize_fp8_act(q, st);
  }
  fp8_linear_gemm(p, s.codes, s, sld, backend, st);
}

void gemm_fp8_linear_packed(const GemmParams& p, const uint8_t* codes, const uint8_t* e8m0_scales,
                            const TcLinearScratch& s, TcBackend backend, cudaStream_t st) {
  if (p.m == 0 || p.n == 0) return;
  TANDEM_CHECK(fp8_linear_supported(p, s) && codes && e8m0_scales && (reinterpret_cast<uintptr_t>(codes) & 15) == 0);
  const int64_t sld = (p.m + 3) / 4 * 4, nb = p.k / 128;
  e8m0_rows_to_grid_kernel<<<grid_for(p.m * nb, 256), 256, 0, st>>>(e8m0_scales, p.m, nb, s.scales, sld);
  TANDEM_CUDA_LAUNCH_CHECK();
  fp8_linear_gemm(p, codes, s, sld, backend, st);
}

namespace {
// The bf16 copy of x: row r, batch b's k columns at xb[r * (batch * k) + b * k] (batches side by side).
Bf16GemmArgs bf16_linear_args(const GemmParams& p, const TcLinearScratch& s) {
  Bf16GemmArgs g;
  g.x = s.xb;
  g.ldx = p.batch * p.k;
  g.w = static_cast<const uint16_t*>(p.w.data);
  g.w_rows = static_cast<uint64_t>(p.w.n);
  g.y = p.y;
  g.ldy = p.ldy;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.batch = p.batch;
  g.x_batch_stride = p.k;
  g.w_batch_rows = p.w_batch_rows;
  g.y_batch_stride = p.y_batch_stride;
  g.accumulate = p.accumulate;
  g.round_bf16 = p.round_bf16;
  return g;
}
}  // namespace

bool bf16_linear_supported(const GemmParams& p, const TcLinearScratch& s) {
  if (p.w.format != WeightFormat::kBf16 || p.quantize_x_block != 0 || p.w.k != p.k || !s.xb) return false;
  if (p.m > s.rows || p.batch * p.k > s.bf16_cols) return false;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.k;
  if (p.batch > 1 && (p.x_batch_stride != p.k || ldx < p.batch * p.k)) return false;
  return bf16_gemm_problem(bf16_linear_args(p, s)) == nullptr;
}

void gemm_bf16_linear(const GemmParams& p, const TcLinearScratch& s, TcBackend backend, cudaStream_t st,
                      bool x_ready) {
  if (p.m == 0 || p.n == 0) return;
  TANDEM_CHECK(bf16_linear_supported(p, s));
  const int64_t cols = p.batch * p.k;
  if (!x_ready) f32_to_bf16_rows(p.x, p.ldx > 0 ? p.ldx : p.k, p.m, cols, s.xb, cols, st);
  bf16_gemm_tc(bf16_linear_args(p, s), backend, st);
}

void f32_to_bf16_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldd,
                      cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  const bool vec = cols % 4 == 0 && lds % 4 == 0 && ldd % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
  if (vec) {
    const int64_t quads = cols / 4;
    const int qpb = static_cast<int>(quads < 256 ? quads : 256), rpb = 256 / qpb;
    const int64_t rblocks = (rows + rpb - 1) / rpb;
    const dim3 grid(ceil_div(quads, qpb), static_cast<unsigned>(rblocks < 65535 ? rblocks : 65535));
    f32_to_bf16_vec_kernel<<<grid, 256, 0, s>>>(src, lds, rows, cols, dst, ldd, qpb);
  } else {
    f32_to_bf16_kernel<<<grid_for(rows * cols, 256 * 4), 256, 0, s>>>(src, lds, rows, cols, dst, ldd);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

void e8m0_grid_to_f32(const uint8_t* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd,
                      cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  e8m0_grid_kernel<<<grid_for(rows * cols, 256), 256, 0, s>>>(src, lds, rows, cols, dst, ldd);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void fp8_block_to_bf16(const WeightRef& w, uint16_t* dst, cudaStream_t s) {
  TANDEM_CHECK(w.format == WeightFormat::kFp8Block && w.scale);
  if (w.n == 0 || w.k == 0) return;
  const int64_t sld = w.scale_ld > 0 ? w.scale_ld : (w.k + 127) / 128;
  fp8_block_to_bf16_kernel<<<grid_for(w.n * w.k, 256 * 4), 256, 0, s>>>(static_cast<const uint8_t*>(w.data), w.scale,
                                                                         sld, w.n, w.k, dst);
  TANDEM_CUDA_LAUNCH_CHECK();
}

std::vector<SmemBound> gemm_tc_smem_bounds() {
  // Two stages everywhere; four where the device has room (deep_pipeline()); the wgmma variants
  // only on sm_90 (tc_resolve refuses them elsewhere).
  const int64_t s2 = tc::Smem<false, 2>::kAlloc, s4 = tc::Smem<false, 4>::kAlloc;
  const std::string shape = "128 x 128 tile, ";
  const std::string deep = "launched only where deep_pipeline() sees the room";
  std::vector<SmemBound> out;
  for (const char* k : {"dense_kernel", "bf16_kernel"}) {
    const std::string tail = std::string(k) == "dense_kernel" ? ", false>" : ">";
    out.push_back({std::string(k) + "<false, 2" + tail, s2, shape + "2 stages", ""});
    out.push_back({std::string(k) + "<false, 4" + tail, s4, shape + "4 stages", deep, s4});
    out.push_back({std::string(k) + "<true, 2" + tail, s2, shape + "2 stages (wgmma)", "", 0, {90}});
    out.push_back({std::string(k) + "<true, 4" + tail, s4, shape + "4 stages (wgmma)", deep, s4, {90}});
  }
  out.push_back({"dense_kernel<true, 4, true>", s4, shape + "4 stages (wgmma, overlapped)", deep, s4, {90}});
  return out;
}

}  // namespace tandem::kernels::cuda
