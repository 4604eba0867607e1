// mHC ops against a float64 transcription of spec 5.1-5.3.
#include <gtest/gtest.h>

#include <cmath>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::bf16d;
using testing::correctly_rounded;
using testing::Stored;
using testing::close;
using testing::randn;

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct HcRef {
  std::vector<double> x, x_err, post, comb;  // x before its bf16 rounding; x_err: fp32 slack
};

HcRef ref_pre(const std::vector<float>& h, const std::vector<float>& fn, const std::vector<float>& scale,
              const std::vector<float>& base, int64_t T, int hc, int64_t D, int iters) {
  const int nm = (2 + hc) * hc;
  const int64_t HD = hc * D;
  const double eps = 1e-6;
  HcRef r;
  r.x.resize(T * D);
  r.x_err.resize(T * D);
  r.post.resize(T * hc);
  r.comb.resize(T * hc * hc);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = h.data() + t * HD;
    double ss = 0;
    for (int64_t i = 0; i < HD; ++i) ss += double(xt[i]) * xt[i];
    const double rs = 1.0 / std::sqrt(ss / HD + 1e-6);
    std::vector<double> mix(nm);
    for (int j = 0; j < nm; ++j) {
      double s = 0;
      for (int64_t i = 0; i < HD; ++i) s += double(fn[j * HD + i]) * xt[i];
      mix[j] = s * rs;
    }
    std::vector<double> pre(hc);
    for (int j = 0; j < hc; ++j) {
      pre[j] = sig(mix[j] * scale[0] + base[j]) + eps;
      r.post[t * hc + j] = 2 * sig(mix[hc + j] * scale[1] + base[hc + j]);
    }
    std::vector<double> C(hc * hc);
    for (int j = 0; j < hc; ++j) {
      double m = -INFINITY;
      for (int k = 0; k < hc; ++k) {
        C[j * hc + k] = mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        m = std::max(m, C[j * hc + k]);
      }
      double z = 0;
      for (int k = 0; k < hc; ++k) z += std::exp(C[j * hc + k] - m);
      for (int k = 0; k < hc; ++k) C[j * hc + k] = std::exp(C[j * hc + k] - m) / z + eps;
    }
    auto coln = [&] {
      for (int k = 0; k < hc; ++k) {
        double s = 0;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] /= s + eps;
      }
    };
    coln();
    for (int it = 0; it < iters - 1; ++it) {
      for (int j = 0; j < hc; ++j) {
        double s = 0;
        for (int k = 0; k < hc; ++k) s += C[j * hc + k];
        for (int k = 0; k < hc; ++k) C[j * hc + k] /= s + eps;
      }
      coln();
    }
    for (int i = 0; i < hc * hc; ++i) r.comb[t * hc * hc + i] = C[i];
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += pre[i] * xt[i * D + d];
      r.x[t * D + d] = s;
      double l1 = 0;
      for (int i = 0; i < hc; ++i) l1 += std::fabs(xt[i * D + d]);
      r.x_err[t * D + d] = 2e-5 * l1;  // pre_i carries the fp32 error of a 1024-term mix
    }
  }
  return r;
}

TEST(Hc, PreMatchesSpec) {
  const int64_t T = 3, D = 256;
  const int hc = 4, nm = 24;
  auto h = randn(T * hc * D, 1);
  auto fn = randn(nm * hc * D, 2, 0.05f, false);
  std::vector<float> scale = {0.7f, 1.3f, 2.0f};
  auto base = randn(nm, 3, 0.5f, false);
  std::vector<float> x(T * D), post(T * hc), comb(T * hc * hc);
  HcPreParams p;
  p.h = h.data();
  p.fn = fn.data();
  p.scale = scale.data();
  p.base = base.data();
  p.tokens = T;
  p.hc = hc;
  p.dim = D;
  p.x = x.data();
  p.post = post.data();
  p.comb = comb.data();
  cpu::hc_pre(p);
  auto r = ref_pre(h, fn, scale, base, T, hc, D, 20);
  EXPECT_TRUE(close(post, r.post, 1e-6, 1e-5));
  EXPECT_TRUE(close(comb, r.comb, 1e-6, 1e-5));
  EXPECT_TRUE(correctly_rounded(x, r.x, Stored::kBf16, 0.0, &r.x_err));
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < hc; ++k) {  // ends on a column normalization: columns sum to ~1
      double s = 0;
      for (int j = 0; j < hc; ++j) s += comb[t * 16 + j * hc + k];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
}

TEST(Hc, PostContractsFirstIndexInPlace) {
  const int64_t T = 2, D = 64;
  const int hc = 4;
  auto f = randn(T * D, 4);
  auto res = randn(T * hc * D, 5);
  auto post = randn(T * hc, 6, 1.0f, false);
  auto comb = randn(T * hc * hc, 7, 1.0f, false);  // asymmetric: catches a transposed contraction
  std::vector<double> want(T * hc * D), err(T * hc * D);
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < hc; ++k)
      for (int64_t d = 0; d < D; ++d) {
        double s = 0;
        for (int j = 0; j < hc; ++j) s += double(comb[t * 16 + j * hc + k]) * res[(t * hc + j) * D + d];
        want[(t * hc + k) * D + d] = post[t * hc + k] * f[t * D + d] + s;
        double l1 = std::fabs(post[t * hc + k] * f[t * D + d]);
        for (int j = 0; j < hc; ++j) l1 += std::fabs(double(comb[t * 16 + j * hc + k]) * res[(t * hc + j) * D + d]);
        err[(t * hc + k) * D + d] = 6e-7 * l1;
      }
  HcPostParams p;
  p.f = f.data();
  p.res = res.data();
  p.post = post.data();
  p.comb = comb.data();
  p.out = res.data();  // aliasing allowed
  p.tokens = T;
  p.hc = hc;
  p.dim = D;
  cpu::hc_post(p);
  EXPECT_TRUE(correctly_rounded(res, want, Stored::kBf16, 0.0, &err));
}

// The load epilogue (f_add, f_round) is the all-reduce epilogue the forward no longer launches: bit
// for bit hc_post of f' = bf16(f + f_add) (the MoE's shared expert) or bf16(f) (the attention
// output), f' computed first as the launch did. f fp32 (a sum of partials), with a bf16 tie and a
// value that rounds to inf; in place, as the model runs it.
TEST(Hc, PostLoadEpilogueEqualsRoundThenPost) {
  const int64_t T = 3, D = 96;
  const int hc = 4;
  auto f = randn(T * D, 40, 1.0f, false);
  const auto fadd = randn(T * D, 41);
  const auto res = randn(T * hc * D, 42);
  const auto post = randn(T * hc, 43, 1.0f, false);
  const auto comb = randn(T * hc * hc, 44, 1.0f, false);
  f[5] = 1.00390625f;  // 1 + 2^-8: a bf16 tie (to even: 1) without the add
  f[7] = 3.4e38f;      // past the largest bf16: inf without the add
  for (bool add : {false, true}) {
    std::vector<float> f2(f.size());
    for (size_t i = 0; i < f.size(); ++i) f2[i] = num::round_bf16(add ? f[i] + fadd[i] : f[i]);
    std::vector<float> want = res, got = res;
    HcPostParams p;
    p.post = post.data();
    p.comb = comb.data();
    p.tokens = T;
    p.hc = hc;
    p.dim = D;
    p.f = f2.data();
    p.res = p.out = want.data();
    cpu::hc_post(p);
    p.f = f.data();
    p.f_add = add ? fadd.data() : nullptr;
    p.f_round = true;
    p.res = p.out = got.data();
    cpu::hc_post(p);
    EXPECT_TRUE(testing::same_bits(got, want)) << (add ? "bf16(f + f_add)" : "bf16(f)");
    // The epilogue changes the result (the test sees it): f is not bf16 already.
    EXPECT_FALSE(testing::same_bits(f2, f));
  }
}

TEST(Hc, HeadMatchesSpec) {
  const int64_t T = 2, D = 128;
  const int hc = 4;
  auto h = randn(T * hc * D, 8);
  auto fn = randn(hc * hc * D, 9, 0.05f, false);
  std::vector<float> scale = {0.9f};
  auto base = randn(hc, 10, 0.5f, false);
  std::vector<float> y(T * D);
  HcHeadParams p;
  p.h = h.data();
  p.fn = fn.data();
  p.scale = scale.data();
  p.base = base.data();
  p.tokens = T;
  p.hc = hc;
  p.dim = D;
  p.y = y.data();
  cpu::hc_head(p);
  std::vector<double> want(T * D), err(T * D);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = h.data() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(xt[i]) * xt[i];
    const double rs = 1.0 / std::sqrt(ss / (hc * D) + 1e-6);
    for (int64_t d = 0; d < D; ++d) want[t * D + d] = 0;
    for (int i = 0; i < hc; ++i) {
      double m = 0;
      for (int64_t k = 0; k < hc * D; ++k) m += double(fn[i * hc * D + k]) * xt[k];
      const double pre = sig(m * rs * scale[0] + base[i]) + 1e-6;
      for (int64_t d = 0; d < D; ++d) want[t * D + d] += pre * xt[i * D + d];
    }
    for (int64_t d = 0; d < D; ++d) {
      double l1 = 0;
      for (int i = 0; i < hc; ++i) l1 += std::fabs(xt[i * D + d]);
      err[t * D + d] = 2e-5 * l1;
    }
  }
  EXPECT_TRUE(correctly_rounded(y, want, Stored::kBf16, 0.0, &err));
}

}  // namespace
}  // namespace tandem::kernels
