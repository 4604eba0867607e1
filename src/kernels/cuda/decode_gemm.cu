// Decode GEMV on the tensor cores (see decode_gemm.h for the contract and the numerics).
//
// Work split. A warp owns 16 weight rows (two n8 tiles) over one k unit and every row of the
// chunk (up to 6 m16 tiles = 96 tokens): the weight tile is loaded once and multiplied with all
// tokens, so DRAM sees each weight byte once per call. A CTA is `row_warps` x `k_split` warps:
// warps of the same k unit share the activation through L1; the k_split partials meet in shared
// memory and are added in unit order. Grid: x = 96-token chunks, y = 16-row tiles / row_warps (all
// segments' tiles in a row).
//
// Per lane: weight row g of each n8 tile, 16 bytes per load (FP8: 16 k, bf16: 8 k), kept two to
// four 128-k (FP8) / 64-k (bf16) stages ahead in registers; the first stages are loaded before the
// grid-dependency wait so the fetch overlaps the previous kernel's tail.
#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

enum class Kind : int { kFp8Codes = 0, kBf16F32 = 1, kFp8F32 = 2 };

constexpr int kNT = 2;               // n8 tiles per warp
constexpr int kTileRows = 8 * kNT;   // weight rows per warp
constexpr int kMaxKSplit = 8;
constexpr int kMaxSmem = 64 * 1024;  // k-split partials
// At most 8 warps per CTA: 255 registers per thread (the weight stages in flight and the
// accumulators of up to 96 tokens), one CTA per SM at the largest tiles.
constexpr int kMaxThreads = 256;

template <Kind K>
struct Traits;
template <>
struct Traits<Kind::kFp8Codes> {
  static constexpr int kStageK = 128;  // one scale block
  static constexpr int kSubK = 64;     // k covered by one 16-byte load per lane (x4 lanes)
  static constexpr int kElemBytes = 1;
};
template <>
struct Traits<Kind::kFp8F32> : Traits<Kind::kFp8Codes> {};
template <>
struct Traits<Kind::kBf16F32> {
  static constexpr int kStageK = 64;
  static constexpr int kSubK = 32;
  static constexpr int kElemBytes = 2;
};

struct KernelArgs {
  const uint8_t* x_codes;
  const uint8_t* x_scales;
  int64_t ld_scales;
  const float* x;
  int64_t ldx;
  int64_t m, k;
  int num_segments;
  int k_split, row_warps;
  int64_t ku;  // k per unit
  int64_t total_tiles;
  int64_t tile_start[kMaxDecodeSegments + 1];
  DecodeSegment seg[kMaxDecodeSegments];
};

__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

template <Kind KIND, int MT, int D, int MAXT>
__global__ void __launch_bounds__(MAXT) decode_gemm_kernel(const __grid_constant__ KernelArgs a) {
  using T = Traits<KIND>;
  constexpr int kSubs = T::kStageK / T::kSubK;  // 2
  constexpr bool kFp8W = KIND != Kind::kBf16F32;
  extern __shared__ float red[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kw = warp % a.k_split, rw = warp / a.k_split;
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * a.row_warps + rw;
  const bool tile_ok = tile < a.total_tiles;
  const int64_t tc = tile_ok ? tile : a.total_tiles - 1;
  int s = 0;
  while (s + 1 < a.num_segments && tc >= a.tile_start[s + 1]) ++s;
  const DecodeSegment& seg = a.seg[s];
  const int64_t n = seg.w.n, row0 = (tc - a.tile_start[s]) * kTileRows;
  const int64_t k0 = kw * a.ku;  // this warp's unit
  const int nst = static_cast<int>(a.ku / T::kStageK);

  // Weight rows of this lane (clamped: rows past n are computed from row n-1 and not stored).
  const uint8_t* wrow[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int64_t r = min(row0 + nt * 8 + g, n - 1);
    wrow[nt] = static_cast<const uint8_t*>(seg.w.data) + (r * a.k + k0) * T::kElemBytes;
  }
  auto load_stage = [&](uint4 (&b)[kNT][kSubs], int st) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int h = 0; h < kSubs; ++h)
        b[nt][h] = mma::ld_stream(wrow[nt] + (static_cast<int64_t>(st) * T::kStageK + h * T::kSubK) * T::kElemBytes +
                                  t * 16);
  };

  uint4 buf[D][kNT][kSubs];
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < nst) load_stage(buf[d], d);

  // Everything above reads only weights; the activation is the previous kernel's output.
  pdl_trigger();
  pdl_wait();

  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kDecodeRowsPerCall;
  const int64_t mt_left = (a.m - m0 + 15) / 16;
  const int mt_act = mt_left < MT ? static_cast<int>(mt_left) : MT;
  int64_t tok[MT][2];  // clamped token rows of this lane's A rows g and g+8
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) tok[mt][hh] = min(m0 + mt * 16 + g + hh * 8, a.m - 1);

  float acc[MT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  // FP8 scales: the combined exponent of the current block per A row (codes) or for the warp.
  const uint8_t* wscale = nullptr;
  if constexpr (kFp8W) {
    const int64_t sld = seg.w.scale_ld > 0 ? seg.w.scale_ld : (a.k + 127) / 128;
    wscale = seg.w.scale + (row0 / 128) * sld + k0 / 128;
  }
  int prev_e[MT][2] = {};
  bool nan_scale = false;
  const int64_t xk0 = seg.x_col0 + k0;  // activation column of the unit's first k

  auto compute_stage = [&](const uint4 (&b)[kNT][kSubs], int st) {
    const int64_t kst = static_cast<int64_t>(st) * T::kStageK;
    if constexpr (kFp8W) {
      const int ew = wscale[st];
      nan_scale |= ew == 255;
      if constexpr (KIND == Kind::kFp8Codes) {
        const int64_t kb = (xk0 + kst) / 128;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int e = ew + a.x_scales[tok[mt][hh] * a.ld_scales + kb];
            if (st > 0) {
              const float r = mma::exp2i(prev_e[mt][hh] - e);
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) {
                acc[mt][nt][2 * hh] *= r;
                acc[mt][nt][2 * hh + 1] *= r;
              }
            }
            prev_e[mt][hh] = e;
          }
        }
      } else {
        if (st > 0) {
          const float r = mma::exp2i(prev_e[0][0] - ew);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][nt][i] *= r;
        }
        prev_e[0][0] = ew;
      }
    }
#pragma unroll
    for (int h = 0; h < kSubs; ++h) {
      // B fragments of both n8 tiles for the sub-step's mmas (FP8: 4 of 16 k, bf16: 2).
      constexpr int kJ = T::kSubK / 16;
      uint32_t bf[kNT][kJ][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          if constexpr (KIND == Kind::kFp8Codes) {
            const uint32_t w4 = word(b[nt][h], j);
            bf[nt][j][0] = mma::e4m3x2_to_f16x2(w4);
            bf[nt][j][1] = mma::e4m3x2_to_f16x2(w4 >> 16);
          } else if constexpr (KIND == Kind::kFp8F32) {
            const uint32_t w4 = word(b[nt][h], j);
            bf[nt][j][0] = mma::e4m3x2_to_bf16x2(w4);
            bf[nt][j][1] = mma::e4m3x2_to_bf16x2(w4 >> 16);
          } else {
            bf[nt][j][0] = word(b[nt][h], 2 * j);
            bf[nt][j][1] = word(b[nt][h], 2 * j + 1);
          }
        }
      // This lane's k columns of the sub-step: 16 (FP8) or 8 (bf16) from lane offset t.
      const int64_t kl = xk0 + kst + h * T::kSubK + t * (16 / T::kElemBytes);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (mt >= mt_act) break;
        if constexpr (KIND == Kind::kFp8Codes) {
          const uint4 c0 = mma::ld_act16(a.x_codes + tok[mt][0] * a.ldx + kl);
          const uint4 c1 = mma::ld_act16(a.x_codes + tok[mt][1] * a.ldx + kl);
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const uint32_t w0 = word(c0, j), w1 = word(c1, j);
            const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1),
                                    mma::e4m3x2_to_f16x2(w0 >> 16), mma::e4m3x2_to_f16x2(w1 >> 16)};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) mma::mma_f16(acc[mt][nt], af, bf[nt][j][0], bf[nt][j][1]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const float4 x0 = mma::ld_act_f4(a.x + tok[mt][0] * a.ldx + kl + 4 * j);
            const float4 x1 = mma::ld_act_f4(a.x + tok[mt][1] * a.ldx + kl + 4 * j);
            const uint32_t af[4] = {mma::f32x2_to_bf16x2(x0.x, x0.y), mma::f32x2_to_bf16x2(x1.x, x1.y),
                                    mma::f32x2_to_bf16x2(x0.z, x0.w), mma::f32x2_to_bf16x2(x1.z, x1.w)};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) mma::mma_bf16(acc[mt][nt], af, bf[nt][j][0], bf[nt][j][1]);
          }
        }
      }
    }
  };

  for (int st0 = 0; st0 < nst; st0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int st = st0 + d;
      if (st < nst) {
        compute_stage(buf[d], st);
        if (st + D < nst) load_stage(buf[d], st + D);
      }
    }
  }

  // Back to real units: the last block's scales (exact powers of two).
  if constexpr (kFp8W) {
    const int last = nst - 1;
    const float sw = mma::exp2i(static_cast<int>(wscale[last]) - 127);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float sx = 1.0f;
        if constexpr (KIND == Kind::kFp8Codes)
          sx = mt < mt_act ? mma::exp2i(prev_e[mt][hh] - static_cast<int>(wscale[last]) - 127) : 1.0f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float& v0 = acc[mt][nt][2 * hh];
          float& v1 = acc[mt][nt][2 * hh + 1];
          v0 = nan_scale ? __int_as_float(0x7fc00000) : (v0 * sw) * sx;
          v1 = nan_scale ? __int_as_float(0x7fc00000) : (v1 * sw) * sx;
        }
      }
  }

  // k-split partials: units 1.. through shared memory, added to unit 0's in unit order.
  const int ksplit = a.k_split;
  if (ksplit > 1) {
    constexpr int kPer = MT * kNT * 4;  // values per lane
    if (kw > 0) {
      float* dst = red + (static_cast<int64_t>((kw - 1) * a.row_warps + rw) * kPer) * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) dst[((mt * kNT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
    }
    __syncthreads();
    if (kw == 0) {
      for (int u = 1; u < ksplit; ++u) {
        const float* src = red + (static_cast<int64_t>((u - 1) * a.row_warps + rw) * kPer) * 32;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              acc[mt][nt][i] = add_rn(acc[mt][nt][i], src[((mt * kNT + nt) * 4 + i) * 32 + lane]);
      }
    }
  }
  if (kw != 0 || !tile_ok) return;
  const int64_t ldy = seg.ldy;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t token = m0 + mt * 16 + g + (i >= 2 ? 8 : 0);
        const int64_t row = row0 + nt * 8 + 2 * t + (i & 1);
        if (token >= a.m || row >= n) continue;
        float* yp = seg.y + token * ldy + row;
        float v = acc[mt][nt][i];
        if (seg.accumulate) v = add_rn(*yp, v);
        *yp = seg.round_bf16 ? round_bf16(v) : v;
      }
}

// ---------------------------------------------------------------- host side
Kind kind_of(const DecodeGemmArgs& a) {
  if (a.x_codes) return Kind::kFp8Codes;
  return a.seg[0].w.format == WeightFormat::kBf16 ? Kind::kBf16F32 : Kind::kFp8F32;
}

int64_t tiles_of(const DecodeGemmArgs& a) {
  int64_t tiles = 0;
  for (int i = 0; i < a.num_segments; ++i) tiles += (a.seg[i].w.n + kTileRows - 1) / kTileRows;
  return tiles;
}

int k_split_for(Kind kind, int64_t tiles, int64_t k) {
  const int64_t gran = kind == Kind::kBf16F32 ? 64 : 128;
  const int64_t units = k / gran;
  int kw = 1;
  // Enough warps in flight for small weights (about 1024), each unit at least 256 k.
  while (kw < kMaxKSplit && tiles * kw < 1024 && units % (2 * kw) == 0 && k / (2 * kw) >= 256) kw *= 2;
  return kw;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void validate_args(const DecodeGemmArgs& a, Kind kind) {
  TANDEM_CHECK(a.num_segments >= 1 && a.num_segments <= kMaxDecodeSegments);
  TANDEM_CHECK(a.m > 0 && a.k > 0);
  const WeightFormat f = kind == Kind::kBf16F32 ? WeightFormat::kBf16 : WeightFormat::kFp8Block;
  for (int i = 0; i < a.num_segments; ++i) {
    const DecodeSegment& s = a.seg[i];
    TANDEM_CHECK_MSG(s.w.format == f && s.w.k == a.k && s.w.n > 0 && s.y, "decode_gemm: segments must share format and k");
    TANDEM_CHECK_MSG(decode_gemm_supports(s.w, kind == Kind::kFp8Codes), "decode_gemm: unsupported weight");
    TANDEM_CHECK(s.x_col0 >= 0 && s.x_col0 + a.k <= a.ldx);
    if (kind == Kind::kFp8Codes) TANDEM_CHECK(s.x_col0 % 128 == 0);
    else TANDEM_CHECK(s.x_col0 % 4 == 0);
  }
  if (kind == Kind::kFp8Codes) {
    TANDEM_CHECK_MSG(a.x_scales && aligned16(a.x_codes) && a.ldx % 16 == 0, "decode_gemm: FP8 codes layout");
  } else {
    TANDEM_CHECK_MSG(a.x && aligned16(a.x) && a.ldx % 4 == 0, "decode_gemm: fp32 activation layout");
  }
}

template <Kind KIND, int MT>
void launch_kind(const KernelArgs& ka, int64_t chunks, bool pdl, cudaStream_t s) {
  constexpr int kMaxT = kMaxThreads;
  constexpr int kD = MT <= 3 ? 4 : 2;
  auto* kern = decode_gemm_kernel<KIND, MT, kD, kMaxT>;
  static bool attr_set = false;  // set on the first (eager) call, never inside a capture
  if (!attr_set) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kern),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    attr_set = true;
  }
  const int threads = 32 * ka.row_warps * ka.k_split;
  TANDEM_CHECK(threads <= kMaxT);
  const size_t smem = static_cast<size_t>(ka.k_split - 1) * ka.row_warps * MT * kNT * 4 * 32 * sizeof(float);
  TANDEM_CHECK(smem <= static_cast<size_t>(kMaxSmem));
  // Chunks of one row tile are consecutive blocks, so past 96 rows they run together and share the
  // tile through L2.
  const int64_t blocks = (ka.total_tiles + ka.row_warps - 1) / ka.row_warps;
  TANDEM_CHECK(blocks <= 65535 && chunks < (int64_t{1} << 31));
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(blocks));
  if (pdl) {
    launch_pdl(kern, grid, dim3(threads), smem, s, ka);
  } else {
    kern<<<grid, threads, smem, s>>>(ka);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

template <Kind KIND>
void launch_mt(const KernelArgs& ka, int mt, int64_t chunks, bool pdl, cudaStream_t s) {
  switch (mt) {
    case 1: return launch_kind<KIND, 1>(ka, chunks, pdl, s);
    case 2: return launch_kind<KIND, 2>(ka, chunks, pdl, s);
    case 3: return launch_kind<KIND, 3>(ka, chunks, pdl, s);
    default: return launch_kind<KIND, 6>(ka, chunks, pdl, s);
  }
}

}  // namespace

bool decode_gemm_supports(const WeightRef& w, bool fp8_act) {
  if (!w.data || w.n <= 0 || (reinterpret_cast<uintptr_t>(w.data) & 15u) != 0) return false;
  if (w.format == WeightFormat::kFp8Block) return w.scale && w.k % 128 == 0;
  if (w.format == WeightFormat::kBf16) return !fp8_act && w.k % 64 == 0;
  return false;
}

int decode_gemm_k_split(const DecodeGemmArgs& a) { return k_split_for(kind_of(a), tiles_of(a), a.k); }

void decode_gemm(const DecodeGemmArgs& a, cudaStream_t s) {
  if (a.m == 0) return;
  const Kind kind = kind_of(a);
  validate_args(a, kind);
  KernelArgs ka{};
  ka.x_codes = a.x_codes;
  ka.x_scales = a.x_scales;
  ka.ld_scales = a.ld_scales > 0 ? a.ld_scales : a.ldx / 128;
  ka.x = a.x;
  ka.ldx = a.ldx;
  ka.m = a.m;
  ka.k = a.k;
  ka.num_segments = a.num_segments;
  ka.tile_start[0] = 0;
  for (int i = 0; i < a.num_segments; ++i) {
    ka.seg[i] = a.seg[i];
    if (ka.seg[i].ldy <= 0) ka.seg[i].ldy = a.seg[i].w.n;
    ka.tile_start[i + 1] = ka.tile_start[i] + (a.seg[i].w.n + kTileRows - 1) / kTileRows;
  }
  ka.total_tiles = ka.tile_start[a.num_segments];
  ka.k_split = k_split_for(kind, ka.total_tiles, a.k);
  ka.ku = a.k / ka.k_split;
  // m tiles per chunk, and rows of tiles per CTA: more rows per CTA for more tokens (the
  // activation is then read by more warps per L1), at least 4 warps, within the smem budget.
  const int64_t mc = std::min<int64_t>(a.m, kDecodeRowsPerCall);
  const int mt = mc <= 16 ? 1 : mc <= 32 ? 2 : mc <= 48 ? 3 : 6;
  const int max_warps = kMaxThreads / 32;
  int rw = std::max(mt, std::max(1, 4 / ka.k_split));
  rw = std::min(rw, std::max(1, max_warps / ka.k_split));
  while (rw > 1 && static_cast<int64_t>(ka.k_split - 1) * rw * mt * kNT * 4 * 32 * 4 > kMaxSmem) --rw;
  ka.row_warps = rw;
  const int64_t chunks = (a.m + kDecodeRowsPerCall - 1) / kDecodeRowsPerCall;
  switch (kind) {
    case Kind::kFp8Codes: return launch_mt<Kind::kFp8Codes>(ka, mt, chunks, a.pdl, s);
    case Kind::kBf16F32: return launch_mt<Kind::kBf16F32>(ka, mt, chunks, a.pdl, s);
    case Kind::kFp8F32: return launch_mt<Kind::kFp8F32>(ka, mt, chunks, a.pdl, s);
  }
}

}  // namespace tandem::kernels::cuda
