// GEMM y = x @ W^T with W kept in its stored format (f32, bf16, FP8 128x128-block, MXFP4).
// A thread takes a tile of NT weight rows, dequantizes them over the whole K once into its scratch
// (exact: every stored value is representable in fp32) and runs a register-blocked MR x NR
// micro-kernel over an M block of up to MC rows. The hot loops are compiled three times (AVX-512,
// AVX2+FMA, baseline SSE) and picked at run time, so the default (non -march=native) build is fast.
#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

// The AVX/AVX-512 vector types only live inside always-inline helpers of the target-specific clones.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kMc = 128;  // rows of x per M block

struct TileArgs {
  const float* x;      // [m, ldx]
  int64_t ldx;
  int64_t m;
  WeightRef w;         // the batch's weight (rows [0, n))
  int64_t n0;          // first weight row of the tile
  int64_t nt;          // rows in the tile
  int64_t k;
  float* y;            // [m, ldy], column n0 is the tile's first
  int64_t ldy;
  bool accumulate;
  bool round;
  float* scratch;      // >= nt * k floats
};

#define TANDEM_INLINE __attribute__((always_inline)) inline

// ---- exact dequantization of one weight row segment into fp32 ----
TANDEM_INLINE void dequant_bf16_row(const uint16_t* src, int64_t k, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < k; ++i) {
    uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    dst[i] = f;
  }
}

// e4m3fn byte -> fp32 without a table (vectorizable): normal codes become an fp32 with the exponent
// rebased (bias 7 -> 127); subnormals are m * 2^-9; 0x7f/0xff are NaN.
TANDEM_INLINE void dequant_fp8_seg(const uint8_t* src, int64_t len, float scale, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t b = src[i];
    const uint32_t mag = b & 0x7fu;
    const uint32_t sign = (b & 0x80u) << 24;
    const uint32_t normal_bits = sign | ((mag + (120u << 3)) << 20);
    float normal;
    std::memcpy(&normal, &normal_bits, 4);
    const float sub = static_cast<float>(b & 7u) * 0.001953125f;  // 2^-9
    const uint32_t sub_bits_sign = sign;
    float subv;
    uint32_t sb;
    std::memcpy(&sb, &sub, 4);
    sb |= sub_bits_sign;
    std::memcpy(&subv, &sb, 4);
    float v = (mag >> 3) == 0 ? subv : normal;
    v = mag == 0x7fu ? __builtin_nanf("") : v;
    dst[i] = v * scale;
  }
}

// e2m1 nibble -> fp32: e == 0: m * 0.5; else (1 + m/2) * 2^(e-1); bit 3 = sign.
TANDEM_INLINE float e2m1_bits(uint32_t nib) {
  const uint32_t e = (nib >> 1) & 3u, m = nib & 1u, sign = (nib & 8u) << 28;
  const uint32_t normal_bits = sign | ((e + 126u) << 23) | (m << 22);
  const uint32_t sub_bits = sign | (m ? 0x3f000000u : 0u);
  const uint32_t bits = e ? normal_bits : sub_bits;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TANDEM_INLINE void dequant_fp4_group(const uint8_t* src /*16 bytes*/, float scale, float* dst /*32*/) {
#pragma omp simd
  for (int i = 0; i < 16; ++i) {
    const uint32_t b = src[i];
    dst[2 * i] = e2m1_bits(b & 0xfu) * scale;
    dst[2 * i + 1] = e2m1_bits(b >> 4) * scale;
  }
}

TANDEM_INLINE void dequant_rows(const WeightRef& w, int64_t n0, int64_t nt, int64_t k, float* out) {
  switch (w.format) {
    case WeightFormat::kF32:
      for (int64_t r = 0; r < nt; ++r)
        std::memcpy(out + r * k, static_cast<const float*>(w.data) + (n0 + r) * k, sizeof(float) * k);
      break;
    case WeightFormat::kBf16:
      for (int64_t r = 0; r < nt; ++r) dequant_bf16_row(static_cast<const uint16_t*>(w.data) + (n0 + r) * k, k, out + r * k);
      break;
    case WeightFormat::kFp8Block: {
      const int64_t kb = (k + kFp8WeightBlock - 1) / kFp8WeightBlock;
      const int64_t sld = w.scale_ld > 0 ? w.scale_ld : kb;
      for (int64_t r = 0; r < nt; ++r) {
        const int64_t n = n0 + r;
        const uint8_t* src = static_cast<const uint8_t*>(w.data) + n * k;
        const uint8_t* srow = w.scale + (n / kFp8WeightBlock) * sld;
        for (int64_t b = 0; b < kb; ++b) {
          const int64_t k0 = b * kFp8WeightBlock, len = std::min<int64_t>(kFp8WeightBlock, k - k0);
          dequant_fp8_seg(src + k0, len, num::e8m0_to_f32(srow[b]), out + r * k + k0);
        }
      }
      break;
    }
    case WeightFormat::kMxfp4: {
      const int64_t groups = k / kMxfp4WeightGroup;
      for (int64_t r = 0; r < nt; ++r) {
        const int64_t n = n0 + r;
        const uint8_t* src = static_cast<const uint8_t*>(w.data) + n * (k / 2);
        const uint8_t* srow = w.scale + n * groups;
        for (int64_t g = 0; g < groups; ++g)
          dequant_fp4_group(src + g * 16, num::e8m0_to_f32(srow[g]), out + r * k + g * 32);
      }
      break;
    }
  }
}

// ---- micro-kernels ----
template <typename V>
TANDEM_INLINE V loadv(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
TANDEM_INLINE float hsum(V v) {
  constexpr int L = sizeof(V) / sizeof(float);
  float s = 0.0f;
  for (int i = 0; i < L; ++i) s += v[i];
  return s;
}

// acc[i][j] = sum_k x[i][k] * w[j][k] for an MR x NR block.
template <typename V, int MR, int NR>
TANDEM_INLINE void micro(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t k, float out[4][4]) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = V{};
  const int64_t kv = k - k % L;
  for (int64_t kk = 0; kk < kv; kk += L) {
    V wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = loadv<V>(w + j * ldw + kk);
    for (int i = 0; i < MR; ++i) {
      const V xv = loadv<V>(x + i * ldx + kk);
      for (int j = 0; j < NR; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t kk = kv; kk < k; ++kk) s += x[i * ldx + kk] * w[j * ldw + kk];
      out[i][j] = s;
    }
}

template <typename V>
TANDEM_INLINE void micro_any(int mr, int nr, const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t k,
                             float out[4][4]) {
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      float tmp[4][4];
      micro<V, 1, 1>(x + i * ldx, ldx, w + j * ldw, ldw, k, tmp);
      out[i][j] = tmp[0][0];
    }
}

TANDEM_INLINE void store(const TileArgs& a, int64_t m0, int64_t n, int mr, int nr, float out[4][4]) {
  for (int i = 0; i < mr; ++i) {
    float* yr = a.y + (m0 + i) * a.ldy + n;
    for (int j = 0; j < nr; ++j) {
      float v = a.accumulate ? yr[j] + out[i][j] : out[i][j];
      yr[j] = a.round ? num::round_bf16(v) : v;
    }
  }
}

template <typename V, int MR, int NR>
TANDEM_INLINE void tile_impl(const TileArgs& a) {
  const float* wt;
  int64_t ldw = a.k;
  if (a.w.format == WeightFormat::kF32) {
    wt = static_cast<const float*>(a.w.data) + a.n0 * a.k;
  } else {
    dequant_rows(a.w, a.n0, a.nt, a.k, a.scratch);
    wt = a.scratch;
  }
  float out[4][4];
  int64_t m = 0;
  for (; m + MR <= a.m; m += MR) {
    int64_t j = 0;
    for (; j + NR <= a.nt; j += NR) {
      micro<V, MR, NR>(a.x + m * a.ldx, a.ldx, wt + j * ldw, ldw, a.k, out);
      store(a, m, a.n0 + j, MR, NR, out);
    }
    if (j < a.nt) {
      micro_any<V>(MR, static_cast<int>(a.nt - j), a.x + m * a.ldx, a.ldx, wt + j * ldw, ldw, a.k, out);
      store(a, m, a.n0 + j, MR, static_cast<int>(a.nt - j), out);
    }
  }
  for (; m < a.m; ++m) {
    int64_t j = 0;
    for (; j + NR <= a.nt; j += NR) {
      micro<V, 1, NR>(a.x + m * a.ldx, a.ldx, wt + j * ldw, ldw, a.k, out);
      store(a, m, a.n0 + j, 1, NR, out);
    }
    for (; j < a.nt; ++j) {
      micro<V, 1, 1>(a.x + m * a.ldx, a.ldx, wt + j * ldw, ldw, a.k, out);
      store(a, m, a.n0 + j, 1, 1, out);
    }
  }
}

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

__attribute__((target("avx512f,avx512vl,avx2,fma,f16c"))) void tile_avx512(const TileArgs& a) {
  tile_impl<v16f, 4, 4>(a);
}
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const TileArgs& a) { tile_impl<v8f, 4, 2>(a); }
void tile_base(const TileArgs& a) { tile_impl<v4f, 4, 2>(a); }

using TileFn = void (*)(const TileArgs&);
bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
TileFn pick_tile() {
  if (has_avx512()) return tile_avx512;
  if (has_avx2()) return tile_avx2;
  return tile_base;
}
TileFn g_tile = pick_tile();

void gemm_one(const float* x, int64_t ldx, const WeightRef& w, float* y, int64_t ldy, int64_t m, int64_t n,
              int64_t k, bool accumulate, bool round) {
  const int64_t nt_rows = k <= 4096 ? 16 : 8;
  const int64_t ntiles = (n + nt_rows - 1) / nt_rows;
  const int nthreads = threads_for(ntiles, 2.0 * static_cast<double>(std::min(m, kMc)) * nt_rows * k);
#pragma omp parallel num_threads(nthreads)
  {
    float* scratch = w.format == WeightFormat::kF32 ? nullptr : thread_scratch(static_cast<size_t>(nt_rows * k));
    for (int64_t m0 = 0; m0 < m; m0 += kMc) {
      const int64_t mb = std::min(kMc, m - m0);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < ntiles; ++t) {
        TileArgs a;
        a.x = x + m0 * ldx;
        a.ldx = ldx;
        a.m = mb;
        a.w = w;
        a.n0 = t * nt_rows;
        a.nt = std::min(nt_rows, n - a.n0);
        a.k = k;
        a.y = y + m0 * ldy;
        a.ldy = ldy;
        a.accumulate = accumulate;
        a.round = round;
        a.scratch = scratch;
        g_tile(a);
      }
    }
  }
}

}  // namespace

bool set_gemm_isa(Isa isa) {
  switch (isa) {
    case Isa::kAuto: g_tile = pick_tile(); return true;
    case Isa::kAvx512: if (!has_avx512()) return false; g_tile = tile_avx512; return true;
    case Isa::kAvx2: if (!has_avx2()) return false; g_tile = tile_avx2; return true;
    case Isa::kBaseline: g_tile = tile_base; return true;
  }
  return false;
}

const char* gemm_isa_name() {
  if (g_tile == tile_avx512) return "avx512";
  if (g_tile == tile_avx2) return "avx2";
  return "baseline";
}

void gemm(const GemmParams& p) {
  validate(p);
  if (p.m == 0 || p.n == 0) return;
  const int64_t ldx = ld_or(p.ldx, p.k), ldy = ld_or(p.ldy, p.n);
  for (int64_t b = 0; b < p.batch; ++b) {
    const WeightRef wb = p.w.rows(b * p.w_batch_rows, p.n);
    gemm_one(p.x + b * p.x_batch_stride, ldx, wb, p.y + b * p.y_batch_stride, ldy, p.m, p.n, p.k, p.accumulate,
             p.round_bf16);
  }
}

}  // namespace tandem::kernels::cpu
