// CUDA rms_norm (both modes), rope (forward / inverse, YaRN frequencies, strided heads) and hadamard
// against the CPU ops. The bf16 chain and the Hadamard butterflies are defined bit for bit and must
// match exactly. The fp32 norm is bit-exact too, up to the one value its fp64 sum of squares can
// make ambiguous: the sum (in any order) is within (n + 2) * 2^-53 of the exact one, the float of
// ss / n takes one of at most two values over that interval, and for each the rest of the row is
// the same fp32 operations on both sides, so the row must equal one of those candidate rows bit for
// bit. The rotation uses cos/sin (within 1 ulp on both sides) and must be correctly rounded (bf16)
// or within its stated bound (fp32) against a float64 reference; untouched dims stay bit-exact.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

// The candidate rows of the fp32 RMSNorm of row x (see the file comment): the fp32 operations of
// the op (rs = 1 / sqrt(var + eps), y = x * rs, then * weight, optional bf16) for each value var
// can take. Returns the first mismatch of `got` against the best candidate, or success.
::testing::AssertionResult rms_row_matches(const float* got, const float* x, int64_t dim, const RmsNormParams& p,
                                           const float* weight, const uint16_t* weight_bf16) {
  long double ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<long double>(x[i]) * x[i];
  const double q = static_cast<double>(ss / dim), eps_rel = (dim + 3) * std::ldexp(1.0, -53);
  std::vector<float> vars;
  if (!std::isfinite(q)) {
    vars.push_back(static_cast<float>(q));
  } else {
    const float lo = static_cast<float>(q * (1 - eps_rel)), hi = static_cast<float>(q * (1 + eps_rel));
    for (float v = lo; v <= hi; v = std::nextafter(v, INFINITY)) vars.push_back(v);
  }
  size_t best_bad = SIZE_MAX, best_first = 0;
  float best_var = 0, best_want = 0;
  for (float var : vars) {
    const float rs = 1.0f / std::sqrt(var + p.eps);
    size_t bad = 0, first = 0;
    float want_first = 0;
    for (int64_t i = 0; i < dim; ++i) {
      float v = x[i] * rs;
      if (weight) v = weight[i] * v;
      if (weight_bf16) v = num::bf16_to_f32(weight_bf16[i]) * v;
      if (p.round_bf16) v = num::round_bf16(v);
      const bool same = (std::isnan(v) && std::isnan(got[i])) || num::f32_bits(v) == num::f32_bits(got[i]);
      if (!same && bad++ == 0) {
        first = static_cast<size_t>(i);
        want_first = v;
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    if (bad < best_bad) {
      best_bad = bad;
      best_first = first;
      best_var = var;
      best_want = want_first;
    }
  }
  return ::testing::AssertionFailure() << best_bad << " of " << dim << " elements differ from the closest of "
                                       << vars.size() << " candidate rows (var " << best_var << "); first at "
                                       << best_first << ": got " << got[best_first] << " want " << best_want << " ("
                                       << f32_ulps(got[best_first], best_want) << " ulps)";
}

struct NormCase {
  int64_t rows, dim, ldx, ldy;
  int weight;  // 0 none, 1 fp32, 2 bf16
  RmsNormMode mode;
  bool round, in_place, specials;
};

TEST(CudaRmsNorm, MatchesCpu) {
  const NormCase cases[] = {
      {5, 4096, 0, 0, 1, RmsNormMode::kF32, true, false, true},     // attn/ffn norm
      {7, 4096, 0, 0, 2, RmsNormMode::kF32, false, false, false},   // bf16 weight
      {4, 1024, 0, 0, 2, RmsNormMode::kF32, true, true, false},     // q_norm, in place
      {3, 1000, 1010, 1005, 0, RmsNormMode::kF32, false, false, true},
      {192, 512, 0, 0, 0, RmsNormMode::kBf16Chain, false, true, false},  // per-head q (64 heads x 3)
      {9, 512, 520, 515, 2, RmsNormMode::kBf16Chain, false, false, true},
      {2, 7, 0, 0, 1, RmsNormMode::kBf16Chain, false, false, false},
      {1, 7, 0, 0, 1, RmsNormMode::kF32, true, false, false},
  };
  uint64_t seed = 1;
  for (const NormCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " dim " << c.dim << " mode " << static_cast<int>(c.mode)
                                      << " weight " << c.weight << (c.in_place ? " in place" : ""));
    const int64_t ldx = c.ldx ? c.ldx : c.dim, ldy = c.in_place ? ldx : (c.ldy ? c.ldy : c.dim);
    std::vector<float> x = randn(static_cast<size_t>(c.rows * ldx), seed++, 2.0f, true);
    if (c.specials && c.rows >= 3) {
      x[1 * ldx + 2] = std::numeric_limits<float>::quiet_NaN();
      x[2 * ldx + 1] = std::numeric_limits<float>::infinity();
    }
    std::vector<float> w = randn(static_cast<size_t>(c.dim), seed++, 0.5f, true);
    std::vector<uint16_t> wb(static_cast<size_t>(c.dim));
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = num::f32_to_bf16(w[i]);
    std::vector<float> want = c.in_place ? x : poisoned_host<float>(static_cast<size_t>(c.rows * ldy));
    std::vector<float> xin = x;
    RmsNormParams p;
    p.rows = c.rows;
    p.dim = c.dim;
    p.ldx = c.ldx;
    p.ldy = c.in_place ? c.ldx : c.ldy;
    p.mode = c.mode;
    p.round_bf16 = c.round;
    p.weight = c.weight == 1 ? w.data() : nullptr;
    p.weight_bf16 = c.weight == 2 ? wb.data() : nullptr;
    p.x = c.in_place ? want.data() : xin.data();
    p.y = want.data();
    cpu_ops().rms_norm(p);
    auto check_rows = [&](const std::vector<float>& got) {
      for (int64_t r = 0; r < c.rows; ++r) {
        ::testing::AssertionResult ok = rms_row_matches(got.data() + r * ldy, x.data() + r * ldx, c.dim, p,
                                                        c.weight == 1 ? w.data() : nullptr,
                                                        c.weight == 2 ? wb.data() : nullptr);
        if (!ok) return ::testing::AssertionFailure() << "row " << r << ": " << ok.message();
      }
      return ::testing::AssertionSuccess();
    };
    if (c.mode == RmsNormMode::kF32) {
      EXPECT_TRUE(check_rows(want)) << "the CPU's rms_norm";
    }
    if (!have_gpu()) continue;

    DeviceBuffer<float> dx = to_dev(x), dwt = to_dev(w);
    DeviceBuffer<uint16_t> dwb = to_dev(wb);
    DeviceBuffer<float> dy = c.in_place ? DeviceBuffer<float>() : poisoned<float>(want.size());
    p.x = dx.get();
    p.y = c.in_place ? dx.get() : dy.get();
    p.weight = c.weight == 1 ? dwt.get() : nullptr;
    p.weight_bf16 = c.weight == 2 ? dwb.get() : nullptr;
    cuda::rms_norm(p, kStream);
    const std::vector<float> got = to_host(c.in_place ? dx : dy);
    if (c.mode == RmsNormMode::kBf16Chain) {
      EXPECT_TRUE(same_bits(got, want));
    } else {
      EXPECT_TRUE(check_rows(got));
    }
  }
  TANDEM_REQUIRE_GPU();
}

struct RopeCase {
  int64_t tokens, heads, token_stride, head_stride;
  int rope_offset, rope_dim;
  bool yarn, inverse, round;
};

TEST(CudaRope, MatchesCpu) {
  const RopeCase cases[] = {
      {5, 64, 0, 0, 448, 64, true, false, true},         // q heads
      {5, 64, 0, 0, 448, 64, true, true, true},          // de-rotation of the attention output
      {9, 1, 0, 0, 448, 64, false, false, true},         // kv (SWA layer: no YaRN)
      {3, 8, 8 * 600 + 5, 600, 64, 64, true, false, false},  // strided heads, rope in the middle
      {2, 3, 0, 0, 0, 6, false, true, false},
  };
  uint64_t seed = 50;
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << (c.inverse ? " inverse" : ""));
    const int64_t hs = c.head_stride ? c.head_stride : c.rope_offset + c.rope_dim;
    const int64_t ts = c.token_stride ? c.token_stride : c.heads * hs;
    const size_t size = static_cast<size_t>((c.tokens - 1) * ts + c.heads * hs);
    std::vector<float> x = randn(size, seed++, 1.0f, true);
    std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
    for (int64_t t = 0; t < c.tokens; ++t) pos[t] = (t * 7919 * 131) % 1000003 + t;  // up to ~1M
    std::vector<float> inv(static_cast<size_t>(c.rope_dim / 2));
    RopeFreqParams fp;
    fp.inv_freq = inv.data();
    fp.rope_dim = c.rope_dim;
    fp.base = 10000.0;
    if (c.yarn) {
      fp.original_seq_len = 65536;
      fp.factor = 16.0;
    }
    rope_inv_freq(fp);
    std::vector<float> want = x;
    RopeParams p;
    p.x = want.data();
    p.positions = pos.data();
    p.inv_freq = inv.data();
    p.tokens = c.tokens;
    p.heads = c.heads;
    p.token_stride = c.token_stride;
    p.head_stride = c.head_stride;
    p.rope_offset = c.rope_offset;
    p.rope_dim = c.rope_dim;
    p.inverse = c.inverse;
    p.round_bf16 = c.round;
    cpu_ops().rope(p);

    // float64 reference of the rotated pairs: cos/sin of the fp32 angle fl(pos * inv_freq) (the
    // same float on both sides). An fp32 evaluation: cos and sin within 1 ulp (2u relative), the two
    // products and the difference one rounding each. Other dims are untouched (bit for bit).
    const int half = c.rope_dim / 2;
    std::vector<double> ref(size), bound(size);
    std::vector<char> rotated(size, 0);
    for (int64_t t = 0; t < c.tokens; ++t) {
      const float fpos = static_cast<float>(pos[t]);
      for (int64_t h = 0; h < c.heads; ++h)
        for (int i = 0; i < half; ++i) {
          const float ang = fpos * inv[i];
          const double cs = std::cos(static_cast<double>(ang)), sn = (c.inverse ? -1 : 1) * std::sin(static_cast<double>(ang));
          const size_t o = static_cast<size_t>(t * ts + h * hs + c.rope_offset + 2 * i);
          const double a = x[o], b = x[o + 1];
          ref[o] = a * cs - b * sn;
          ref[o + 1] = a * sn + b * cs;
          bound[o] = 1.25 * (3 * kU * (std::fabs(a * cs) + std::fabs(b * sn)) + kU * std::fabs(ref[o]));
          bound[o + 1] = 1.25 * (3 * kU * (std::fabs(a * sn) + std::fabs(b * cs)) + kU * std::fabs(ref[o + 1]));
          rotated[o] = rotated[o + 1] = 1;
        }
    }
    auto check = [&](const std::vector<float>& got) {
      std::vector<float> g_rot, g_rest, x_rest;
      std::vector<double> r_rot, b_rot;
      for (size_t i = 0; i < size; ++i) {
        if (rotated[i]) {
          g_rot.push_back(got[i]);
          r_rot.push_back(ref[i]);
          b_rot.push_back(bound[i]);
        } else {
          g_rest.push_back(got[i]);
          x_rest.push_back(x[i]);
        }
      }
      ::testing::AssertionResult r =
          c.round ? correctly_rounded(g_rot.data(), r_rot.data(), r_rot.size(), Stored::kBf16, 0.0, b_rot.data())
                  : within(g_rot, r_rot, b_rot);
      if (!r) return r;
      return same_bits(g_rest, x_rest);
    };
    EXPECT_TRUE(check(want)) << "the CPU's rope";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dx = to_dev(x), dinv = to_dev(inv);
    DeviceBuffer<int64_t> dpos = to_dev(pos);
    p.x = dx.get();
    p.positions = dpos.get();
    p.inv_freq = dinv.get();
    cuda::rope(p, kStream);
    EXPECT_TRUE(check(to_host(dx)));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaHadamard, MatchesCpuBitExact) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int64_t rows, n, ldx;
    bool round;
  };
  for (const C& c : {C{9, 128, 130, true}, C{64, 128, 0, true}, C{3, 4096, 0, false}, C{2, 1, 0, false},
                     C{5, 2, 3, true}, C{1, 8192, 0, false}}) {
    const int64_t ldx = c.ldx ? c.ldx : c.n;
    std::vector<float> x = randn(static_cast<size_t>(c.rows * ldx), c.n * 3 + c.rows, 1.0f, true);
    x[0] = std::numeric_limits<float>::infinity();
    std::vector<float> want = x;
    HadamardParams p;
    p.x = want.data();
    p.rows = c.rows;
    p.n = c.n;
    p.ldx = c.ldx;
    p.round_bf16 = c.round;
    cpu_ops().hadamard(p);
    DeviceBuffer<float> dx = to_dev(x);
    p.x = dx.get();
    cuda::hadamard(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dx), want)) << "rows " << c.rows << " n " << c.n;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
