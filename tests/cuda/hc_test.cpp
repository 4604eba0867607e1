// CUDA mHC hc_pre / hc_post / hc_head against the CPU ops, at the model's shape (hc 4 x 4096) and
// small odd ones. hc_post has no transcendental and keeps the CPU's operation order (bit-exact
// with the default CPU build).
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

// Tolerance for a bf16-rounded collapse sum_i pre_i h_i: one bf16 step plus the effect of pre's
// last-ulp differences (exp) on the fp32 sum.
std::vector<double> collapse_tol(const std::vector<float>& h, const std::vector<float>& want, int64_t tokens, int hc,
                                 int64_t dim, bool round) {
  std::vector<double> tol(want.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += std::fabs(h[(t * hc + i) * dim + d]);
      const size_t o = static_cast<size_t>(t * dim + d);
      tol[o] = 2e-5 * s + (round ? std::ldexp(std::fabs(want[o]), -7) : 0.0);
    }
  return tol;
}

TEST(CudaHcPre, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int64_t tokens;
    int hc;
    int64_t dim;
    int iters;
  };
  uint64_t seed = 1;
  for (const C& c : {C{1, 4, 4096, 20}, C{3, 4, 4096, 20}, C{9, 4, 4096, 20}, C{5, 2, 100, 3}, C{2, 3, 64, 1},
                     C{2, 6, 64, 5}}) {  // hc 6: the one-thread Sinkhorn
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " hc " << c.hc << " dim " << c.dim);
    const int nmix = (2 + c.hc) * c.hc;
    const int64_t HD = c.hc * c.dim;
    std::vector<float> h = randn(static_cast<size_t>(c.tokens * HD), seed++, 1.0f, true);
    std::vector<float> fn = randn(static_cast<size_t>(nmix * HD), seed++, 0.02f, false);
    std::vector<float> scale = randu(3, seed++, 0.5f, 2.0f);
    std::vector<float> base = randn(static_cast<size_t>(nmix), seed++, 0.5f, false);
    std::vector<float> x(static_cast<size_t>(c.tokens * c.dim)), post(static_cast<size_t>(c.tokens * c.hc)),
        comb(static_cast<size_t>(c.tokens * c.hc * c.hc));
    HcPreParams p;
    p.h = h.data();
    p.fn = fn.data();
    p.scale = scale.data();
    p.base = base.data();
    p.tokens = c.tokens;
    p.hc = c.hc;
    p.dim = c.dim;
    p.sinkhorn_iters = c.iters;
    p.x = x.data();
    p.post = post.data();
    p.comb = comb.data();
    cpu_ops().hc_pre(p);

    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base);
    auto dx = poisoned<float>(x.size()), dpost = poisoned<float>(post.size()), dcomb = poisoned<float>(comb.size());
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    p.x = dx.get();
    p.post = dpost.get();
    p.comb = dcomb.get();
    cuda::hc_pre(p, kStream);
    EXPECT_TRUE(close(to_host(dpost), post, 1e-7, 2e-5));
    EXPECT_TRUE(close(to_host(dcomb), comb, 1e-7, 1e-4));
    const std::vector<double> tol = collapse_tol(h, x, c.tokens, c.hc, c.dim, true);
    EXPECT_TRUE(close(to_host(dx), x, 1e-30, 1.0, &tol));
  }
}

TEST(CudaHcHead, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  uint64_t seed = 40;
  for (auto [tokens, hc, dim, round] : {std::tuple<int64_t, int, int64_t, bool>{1, 4, 4096, true}, {4, 4, 4096, false},
                                        {3, 2, 33, true}}) {
    const int64_t HD = hc * dim;
    std::vector<float> h = randn(static_cast<size_t>(tokens * HD), seed++, 1.0f, true);
    std::vector<float> fn = randn(static_cast<size_t>(hc * HD), seed++, 0.02f, false);
    std::vector<float> scale = randu(1, seed++, 0.5f, 2.0f);
    std::vector<float> base = randn(static_cast<size_t>(hc), seed++, 0.5f, false);
    std::vector<float> y(static_cast<size_t>(tokens * dim));
    HcHeadParams p;
    p.h = h.data();
    p.fn = fn.data();
    p.scale = scale.data();
    p.base = base.data();
    p.tokens = tokens;
    p.hc = hc;
    p.dim = dim;
    p.y = y.data();
    p.round_bf16 = round;
    cpu_ops().hc_head(p);
    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base);
    auto dy = poisoned<float>(y.size());
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    p.y = dy.get();
    cuda::hc_head(p, kStream);
    const std::vector<double> tol = collapse_tol(h, y, tokens, hc, dim, round);
    EXPECT_TRUE(close(to_host(dy), y, 1e-30, 1.0, &tol)) << "tokens " << tokens << " dim " << dim;
  }
}

TEST(CudaHcPost, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  uint64_t seed = 70;
  for (auto [tokens, hc, dim, round, alias] :
       {std::tuple<int64_t, int, int64_t, bool, bool>{1, 4, 4096, true, true}, {5, 4, 4096, true, false},
        {3, 3, 37, false, false}, {2, 16, 64, true, true}}) {
    std::vector<float> f = randn(static_cast<size_t>(tokens * dim), seed++, 1.0f, true);
    std::vector<float> res = randn(static_cast<size_t>(tokens * hc * dim), seed++, 1.0f, true);
    std::vector<float> post = randu(static_cast<size_t>(tokens * hc), seed++, 0.0f, 2.0f);
    std::vector<float> comb = randu(static_cast<size_t>(tokens * hc * hc), seed++, 0.0f, 1.0f);
    res[0] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> want = alias ? res : std::vector<float>(res.size());
    std::vector<float> res_in = res;
    HcPostParams p;
    p.f = f.data();
    p.res = alias ? want.data() : res_in.data();
    p.post = post.data();
    p.comb = comb.data();
    p.out = want.data();
    p.tokens = tokens;
    p.hc = hc;
    p.dim = dim;
    p.round_bf16 = round;
    cpu_ops().hc_post(p);
    DeviceBuffer<float> df = to_dev(f), dres = to_dev(res), dpost = to_dev(post), dcomb = to_dev(comb);
    DeviceBuffer<float> dout = alias ? DeviceBuffer<float>() : poisoned<float>(res.size());
    p.f = df.get();
    p.res = dres.get();
    p.post = dpost.get();
    p.comb = dcomb.get();
    p.out = alias ? dres.get() : dout.get();
    cuda::hc_post(p, kStream);
    // Bit-exact with the default CPU build; a -march=native CPU build may contract the CPU's
    // multiply-adds into FMAs, hence one bf16 step / a few fp32 ulps of slack.
    EXPECT_TRUE(close(to_host(alias ? dres : dout), want, 1e-6, round ? 1.0 / 128 : 1e-6))
        << "tokens " << tokens << " hc " << hc;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
