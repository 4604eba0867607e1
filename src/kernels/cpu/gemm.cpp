// GEMM y = x @ W^T with W kept in its stored format (f32, bf16, FP8 128x128-block, MXFP4).
// A thread takes a tile of NT weight rows, dequantizes them over the whole K once into its scratch
// (exact: every stored value is representable in fp32) and runs a register-blocked MR x NR
// micro-kernel over an M block of up to MC rows. On x86-64 the hot loops are compiled three times
// (AVX-512, AVX2+FMA, baseline SSE) and picked at run time, so the default (non -march=native)
// build is fast; on aarch64 (the GB10 hosts) twice: NEON with FMA (the default) and the portable
// baseline.
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_hook.h"
#include "kernels/ops.h"

// The AVX/AVX-512 vector types only live inside always-inline helpers of the target-specific clones.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kMc = 128;  // rows of x per M block
constexpr int64_t kDecodeChunk = 512;  // == kGemvChunk in gemm_tile.inc

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

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

}  // namespace

#if defined(__x86_64__)
// Each ISA's copy of the tile is compiled inside a target region (GCC: push_options/target;
// clang: attribute push).
namespace avx512 {
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx2,fma,f16c")
#endif
#define TANDEM_TILE_WIDEN 2
#define TANDEM_TILE_V v16f
#define TANDEM_TILE_MR 4
#define TANDEM_TILE_NR 4
#include "kernels/cpu/gemm_tile.inc"
#undef TANDEM_TILE_WIDEN
#undef TANDEM_TILE_V
#undef TANDEM_TILE_MR
#undef TANDEM_TILE_NR
#undef TANDEM_INLINE
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx512

namespace avx2 {
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define TANDEM_TILE_WIDEN 1
#define TANDEM_TILE_V v8f
#define TANDEM_TILE_MR 4
#define TANDEM_TILE_NR 2
#include "kernels/cpu/gemm_tile.inc"
#undef TANDEM_TILE_WIDEN
#undef TANDEM_TILE_V
#undef TANDEM_TILE_MR
#undef TANDEM_TILE_NR
#undef TANDEM_INLINE
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx2

#endif  // __x86_64__

#if defined(__aarch64__)
// NEON (every aarch64 CPU has it): byte widening with vmovl, explicit FMA (the build turns GCC's
// contraction off, see CMakeLists.txt), and a wider NR than SSE's since aarch64 has 32 vector
// registers (16 accumulators + 4 weight vectors + 1 input vector).
namespace neon {
#define TANDEM_TILE_WIDEN 4
#define TANDEM_TILE_FMA 1
#define TANDEM_TILE_V v4f
#define TANDEM_TILE_MR 4
#define TANDEM_TILE_NR 4
#include "kernels/cpu/gemm_tile.inc"
#undef TANDEM_TILE_WIDEN
#undef TANDEM_TILE_FMA
#undef TANDEM_TILE_V
#undef TANDEM_TILE_MR
#undef TANDEM_TILE_NR
#undef TANDEM_INLINE
}  // namespace neon
#endif  // __aarch64__

namespace base {
#if defined(__x86_64__)
#define TANDEM_TILE_WIDEN 0
#else
#define TANDEM_TILE_WIDEN 3
#endif
#define TANDEM_TILE_V v4f
#define TANDEM_TILE_MR 4
#define TANDEM_TILE_NR 2
#include "kernels/cpu/gemm_tile.inc"
#undef TANDEM_TILE_WIDEN
#undef TANDEM_TILE_V
#undef TANDEM_TILE_MR
#undef TANDEM_TILE_NR
#undef TANDEM_INLINE
}  // namespace base

namespace {
const auto tile_base = &base::tile;
#if defined(__x86_64__)
const auto tile_avx512 = &avx512::tile;
const auto tile_avx2 = &avx2::tile;
#else
const auto tile_avx512 = &base::tile;  // never picked: has_avx512() and has_avx2() are false
const auto tile_avx2 = &base::tile;
#endif
#if defined(__aarch64__)
const auto tile_neon = &neon::tile;
#else
const auto tile_neon = &base::tile;  // never picked: has_neon() is false
#endif

using TileFn = void (*)(const TileArgs&);
bool has_avx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}
bool has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
constexpr bool has_neon() {
#if defined(__aarch64__)
  return true;  // Advanced SIMD is mandatory in ARMv8-A
#else
  return false;
#endif
}
TileFn pick_tile() {
  if (has_avx512()) return tile_avx512;
  if (has_avx2()) return tile_avx2;
  if (has_neon()) return tile_neon;
  return tile_base;
}
TileFn g_tile = pick_tile();
GemmHook g_hook = nullptr;

void gemm_one(const float* x, int64_t ldx, const WeightRef& w, float* y, int64_t ldy, int64_t m, int64_t n,
              int64_t k, bool accumulate, bool round) {
  const int64_t nt_rows = k <= 4096 ? 16 : 8;
  const int64_t ntiles = (n + nt_rows - 1) / nt_rows;
  const int nthreads = threads_for(ntiles, 2.0 * static_cast<double>(std::min(m, kMc)) * nt_rows * k);
#pragma omp parallel num_threads(nthreads)
  {
    // Panel path: nt_rows x k; decode path: up to 4 rows x kGemvChunk.
    float* scratch = w.format == WeightFormat::kF32
                         ? nullptr
                         : thread_scratch(static_cast<size_t>(std::max<int64_t>(nt_rows * k, 4 * kDecodeChunk)));
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
    case Isa::kNeon: if (!has_neon()) return false; g_tile = tile_neon; return true;
    case Isa::kBaseline: g_tile = tile_base; return true;
  }
  return false;
}

void set_gemm_hook(GemmHook hook) { g_hook = hook; }

const char* gemm_isa_name() {
  if (has_avx512() && g_tile == tile_avx512) return "avx512";
  if (has_avx2() && g_tile == tile_avx2) return "avx2";
  if (has_neon() && g_tile == tile_neon) return "neon";
  return "baseline";
}

void gemm(const GemmParams& p) {
  validate(p);
  if (p.m == 0 || p.n == 0) return;
  if (g_hook && g_hook(p)) return;
  const int64_t ldx = ld_or(p.ldx, p.k), ldy = ld_or(p.ldy, p.n);
  for (int64_t b = 0; b < p.batch; ++b) {
    const WeightRef wb = p.w.rows(b * p.w_batch_rows, p.n);
    const float* x = p.x + b * p.x_batch_stride;
    int64_t lx = ldx;
    if (p.quantize_x_block > 0) {
      float* xq = thread_scratch(static_cast<size_t>(p.m * p.k), 4);
      for (int64_t i = 0; i < p.m; ++i) std::memcpy(xq + i * p.k, x + i * ldx, sizeof(float) * p.k);
      ActQuantFp8Params q;
      q.x = xq;
      q.rows = p.m;
      q.cols = p.k;
      q.block = p.quantize_x_block;
      act_quant_fp8(q);
      x = xq;
      lx = p.k;
    }
    gemm_one(x, lx, wb, p.y + b * p.y_batch_stride, ldy, p.m, p.n, p.k, p.accumulate, p.round_bf16);
  }
}

}  // namespace tandem::kernels::cpu
