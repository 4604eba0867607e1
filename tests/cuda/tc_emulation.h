// The CPU oracle's GEMMs computed the way the CUDA model's tensor-core prefill path accumulates
// them (kernels/cuda/gemm_tc.h, cuda_prefill.cpp), installed on the CPU GEMM through its testing
// hook (kernels/cpu/gemm_hook.h) for one scope: the layer-by-layer test's spread run for steps whose
// GEMMs take the tensor cores (layer_compare.h), and the stand-in device's tensor-core steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"
#include "cuda/tc_bound.h"
#include "kernels/cpu/gemm_hook.h"
#include "kernels/ops.h"

namespace tandem::tc_emulation {

// Which tensor-core kernel the CUDA model runs a GEMM of the CPU oracle on in a tensor-core step
// (cuda_prefill.cpp: linear_tc, gemm_bf16_tc, moe_routed_tc):
//  * kFp8: the block-scaled FP8 linears (FP8 weights, activations quantized per 128) and the routed
//    experts' grouped MXFP4 GEMMs (the weights converted exactly to e4m3 per 128-wide K block, the
//    same FP8 accumulation); an MXFP4 linear here is a routed expert (the checkpoints' shared
//    experts are FP8); a layer whose scale grid does not fit e4m3 keeps the GEMV kernels on the
//    device (moe_prefill.h, mxfp4_blocks_fit_e4m3) and is emulated here all the same;
//  * kBf16: the bf16 linears (compressors, indexer weights, gate, LM head, draft projections) and
//    wo_a's grouped einsum (stored FP8, exact in bf16, multiplied as bf16 on the device; the only
//    batched GEMM, and the only FP8 weight without act_quant that takes the tensor cores);
//  * kNone: the rest (fp32 weights, shapes the device's tensor-core kernels do not take).
enum class TcPath : uint8_t { kNone, kFp8, kBf16 };
inline TcPath tc_path(const kernels::GemmParams& p) {
  using kernels::WeightFormat;
  const WeightFormat f = p.w.format;
  if (p.quantize_x_block == 128 && p.batch == 1 && p.k % 128 == 0 &&
      (f == WeightFormat::kFp8Block || (f == WeightFormat::kMxfp4 && p.n % 128 == 0)))
    return TcPath::kFp8;
  if (p.quantize_x_block == 0 && p.k % 64 == 0 && (p.batch == 1 || p.x_batch_stride == p.k) &&
      (f == WeightFormat::kBf16 || (f == WeightFormat::kFp8Block && p.batch > 1)))
    return TcPath::kBf16;
  return TcPath::kNone;
}

enum class Mode : uint8_t {
  // The accumulation gemm_tc.h states, bit for bit as modelled: products exact; FP8: each 128-wide
  // K block summed in k32 steps, each step's 32 products and the block's running partial aligned
  // to the largest of them and truncated (toward zero) to kFp8Bits significant bits, the step's sum
  // truncated to kFp8Bits bits ("about 14 bits", gemm_tc.h), the block's partial added to the fp32
  // accumulator in K order (rounded to nearest); bf16: each k16 step's 16 products and the fp32
  // accumulator aligned to the largest and truncated to 24 bits, the sum truncated to fp32. An
  // accumulated y0 is added and the bf16 rounding applied after, as the kernels' epilogue does.
  kEmulate,
  // The exact sum moved by scale times the stated bound (tc_bound.h: fp8_tc_bound, bf16_tc_bound)
  // with a pseudo-random sign per element: scale 1 is the worst the bound allows, more is a kernel
  // outside its bound (the harness's own fault test).
  kBoundEdge,
};
constexpr int kFp8Bits = 14;
constexpr int kBf16Bits = 24;

struct Settings {
  Mode mode = Mode::kEmulate;
  int fp8_step = 32;   // kEmulate: FP8 products per fused step (16: a finer-grained variant, also
                       // within the bound: the harness's self-test runs a stand-in device on it)
  double scale = 1.0;  // kBoundEdge
  uint64_t seed = 1;   // kBoundEdge
};
inline Settings& settings() {
  static Settings s;
  return s;
}

// x truncated toward zero to `bits` significant bits.
inline double trunc_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  const int e = std::ilogb(x);  // 2^e <= |x| < 2^(e+1)
  const double q = std::ldexp(1.0, e - (bits - 1));
  return std::trunc(x / q) * q;
}

// One fused step of the tensor cores: acc + sum of t[0..n) with every term aligned to the largest
// magnitude among them and truncated to `bits` significant bits, the sum truncated to `bits` bits.
// The terms are exact products (at most 16 significant bits); in double the aligned sum is exact.
inline double fused_step(double acc, const double* t, int n, int bits) {
  double mx = std::fabs(acc);
  for (int i = 0; i < n; ++i) mx = std::max(mx, std::fabs(t[i]));
  if (mx == 0) return 0.0;
  if (!std::isfinite(mx)) {
    double s = acc;
    for (int i = 0; i < n; ++i) s += t[i];
    return s;
  }
  const int e = std::ilogb(mx);
  const double q = std::ldexp(1.0, e - (bits - 1)), inv = std::ldexp(1.0, (bits - 1) - e);
  double s = std::trunc(acc * inv);
  for (int i = 0; i < n; ++i) s += std::trunc(t[i] * inv);
  return trunc_bits(s * q, bits);
}

inline float emulate_fp8(const float* x, const float* w, int64_t k, int step = 32) {
  float acc = 0.0f;
  double t[128];
  for (int64_t b = 0; b < k; b += 128) {
    double part = 0;
    for (int64_t s = b; s < b + 128; s += step) {
      for (int i = 0; i < step; ++i) t[i] = static_cast<double>(x[s + i]) * w[s + i];
      part = fused_step(part, t, step, kFp8Bits);
    }
    acc = acc + static_cast<float>(part);
  }
  return acc;
}

inline float emulate_bf16(const float* x, const float* w, int64_t k) {
  double acc = 0;
  double t[16];
  for (int64_t s = 0; s < k; s += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, k - s));
    for (int i = 0; i < n; ++i) t[i] = static_cast<double>(x[s + i]) * w[s + i];
    acc = fused_step(acc, t, n, kBf16Bits);
  }
  return static_cast<float>(acc);
}

inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The exact sum moved to the edge of the stated bound; the sign hashes the seed, the output column
// and the exact sum's bits (the same row gives the same result wherever it sits in a call).
inline float bound_edge(const float* x, const float* w, int64_t k, int64_t col, TcPath path, const Settings& st) {
  double y = 0, S = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double p = static_cast<double>(x[i]) * w[i];
    y += p;
    S += std::fabs(p);
  }
  if (!std::isfinite(y)) return static_cast<float>(y);
  const double B = path == TcPath::kFp8 ? kernels::cuda_testing::fp8_tc_bound(k, S)
                                        : kernels::cuda_testing::bf16_tc_bound(k, S);
  uint64_t bits = 0;
  std::memcpy(&bits, &y, sizeof bits);
  const double sign = (mix(st.seed ^ mix(bits ^ mix(static_cast<uint64_t>(col)))) & 1) ? 1.0 : -1.0;
  return static_cast<float>(y + sign * st.scale * B);
}

// Row j of W (rows of `w` as given) dequantized exactly into out[0, k).
inline void weight_row(const kernels::WeightRef& w, int64_t j, float* out) {
  using kernels::WeightFormat;
  const int64_t k = w.k;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + j * k, sizeof(float) * k);
      return;
    case WeightFormat::kBf16: {
      const uint16_t* r = static_cast<const uint16_t*>(w.data) + j * k;
      for (int64_t c = 0; c < k; ++c) out[c] = num::bf16_to_f32(r[c]);
      return;
    }
    case WeightFormat::kFp8Block: {
      const int64_t sld = w.scale_ld > 0 ? w.scale_ld : (k + 127) / 128;
      const uint8_t* r = static_cast<const uint8_t*>(w.data) + j * k;
      const uint8_t* sc = w.scale + (j / 128) * sld;
      for (int64_t c = 0; c < k; ++c) out[c] = num::e4m3_to_f32(r[c]) * num::e8m0_to_f32(sc[c / 128]);
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* r = static_cast<const uint8_t*>(w.data) + j * (k / 2);
      const uint8_t* sc = w.scale + j * (k / 32);
      for (int64_t c = 0; c < k; ++c)
        out[c] = num::e2m1_to_f32(num::fp4_get(r, static_cast<size_t>(c))) * num::e8m0_to_f32(sc[c / 32]);
      return;
    }
  }
}

// The hook: computes the GEMMs a tensor-core step runs on the tensor cores, declines the rest.
inline bool gemm_hook(const kernels::GemmParams& p) {
  const TcPath path = tc_path(p);
  if (path == TcPath::kNone) return false;
  const Settings st = settings();
  TANDEM_CHECK(st.fp8_step > 0 && st.fp8_step <= 128 && 128 % st.fp8_step == 0);
  const int64_t m = p.m, n = p.n, k = p.k;
  const int64_t ldx = p.ldx > 0 ? p.ldx : k, ldy = p.ldy > 0 ? p.ldy : n;
  std::vector<float> xs(static_cast<size_t>(m * k)), ws(static_cast<size_t>(n * k));
  for (int64_t b = 0; b < p.batch; ++b) {
    const kernels::WeightRef wb = p.w.rows(b * p.w_batch_rows, n);
    const float* x = p.x + b * p.x_batch_stride;
    float* y = p.y + b * p.y_batch_stride;
    // The operands as the device's kernels take them: activations act_quant'ed per 128 (FP8), or
    // rounded to bf16 (exact: those inputs hold bf16 values); weights dequantized exactly.
    for (int64_t i = 0; i < m; ++i) std::memcpy(xs.data() + i * k, x + i * ldx, sizeof(float) * k);
    if (path == TcPath::kFp8) {
      kernels::ActQuantFp8Params q;
      q.x = xs.data();
      q.rows = m;
      q.cols = k;
      q.block = 128;
      kernels::cpu::act_quant_fp8(q);
    } else {
      for (float& v : xs) v = num::round_bf16(v);
    }
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j) weight_row(wb, j, ws.data() + j * k);
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = ws.data() + j * k;
      for (int64_t i = 0; i < m; ++i) {
        const float* xr = xs.data() + i * k;
        float v;
        if (st.mode == Mode::kBoundEdge)
          v = bound_edge(xr, wr, k, j, path, st);
        else
          v = path == TcPath::kFp8 ? emulate_fp8(xr, wr, k, st.fp8_step) : emulate_bf16(xr, wr, k);
        float& out = y[i * ldy + j];
        if (p.accumulate) v = out + v;
        out = p.round_bf16 ? num::round_bf16(v) : v;
      }
    }
  }
  return true;
}

// Installs the hook with `s` for the scope's lifetime; scopes nest (the outer settings come back).
class Scope {
 public:
  explicit Scope(const Settings& s) : prev_(settings()) {
    ++depth();
    settings() = s;
    kernels::cpu::set_gemm_hook(&gemm_hook);
  }
  ~Scope() {
    settings() = prev_;
    if (--depth() == 0) kernels::cpu::set_gemm_hook(nullptr);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  static int& depth() {
    static int d = 0;
    return d;
  }
  Settings prev_;
};

}  // namespace tandem::tc_emulation
