// CUDA mHC hc_pre / hc_head / hc_post against the CPU, bit for bit, at the model's shape (hc 4 x
// 4096) and small odd ones (hc 6: the one-thread Sinkhorn).
// hc_pre / hc_head: the streams and fn are drawn on coarse grids (h = k/16, fn = k/1024) so that
// every mixing dot is exact in fp32 in any summation order (checked per dot) and the fp64 sum of
// squares is exact: the kernel's split-K mixes then equal the CPU's (GEMM or model::dot). What
// follows (the rms scale, sigmoid, the Sinkhorn, the collapse) is the ops' formulas in the CPU op's
// operation order, which the kernel keeps; its exp is the fp64 exp rounded to fp32 (exp_cr). The
// reference is that CPU computation run on the host with the same exp, and the kernel must equal it
// bit for bit (an fp64 exp result within ~2^-52 of an fp32 midpoint could round either way on the
// two sides: about one exp in 2^27). The CPU ops (glibc's expf, < 1 ulp) are compared too and their
// agreement printed. hc_post has no transcendental: bit for bit with the CPU op (default build: no
// FMA contraction on the host). hc_pre_pack (hc_pre with decode_act_pack's norm and quantization
// of x fused in) equals the two CUDA ops bit for bit, and the host composition of the same steps.
// hc_post's load epilogue (f_add, f_round: a tensor-parallel all-reduce's round, or the MoE's
// shared-expert add and round) equals the launches it replaces (round_bf16 or moe_add_shared, then
// hc_post) bit for bit, and the CPU op (which applies it the same way).
// The finishing kernels' two launch shapes (hc_mix.h's HcFinishShape: one CTA per token, or
// kHcSplit CTAs per token, hc_pre_pack's as a thread-block cluster) give the same bits (CudaHcFinish).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/decode_test_util.h"
#include "kernels/cuda/hc_mix.h"
#include "model/cuda/moe.h"
#include "model/math.h"

namespace tandem::kernels::cuda_testing {
namespace {

float exp_cr(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }
float sigmoid_cr(float x) { return 1.0f / (1.0f + exp_cr(-x)); }

// The mixes of token t: exact dots (asserted) times r = 1/sqrt(mean(h^2) + eps), in fp32.
std::vector<float> mixes(const float* ht, const float* fn, int nmix, int64_t HD, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < HD; ++i) ss += static_cast<double>(ht[i]) * ht[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(HD)) + eps);
  std::vector<float> m(static_cast<size_t>(nmix));
  std::vector<double> terms(static_cast<size_t>(HD));
  for (int j = 0; j < nmix; ++j) {
    double d = 0;
    for (int64_t i = 0; i < HD; ++i) d += (terms[i] = static_cast<double>(fn[j * HD + i]) * ht[i]);
    EXPECT_EQ(sum_bound(terms.data(), HD, 1.0), 0.0) << "mix " << j << " must be exact in fp32";
    m[j] = static_cast<float>(d) * r;
  }
  return m;
}

void collapse(const float* ht, const float* pre, int hc, int64_t dim, float* y, bool round) {
  for (int64_t d = 0; d < dim; ++d) {
    float s = 0.0f;
    for (int i = 0; i < hc; ++i) s += pre[i] * ht[i * dim + d];
    y[d] = round ? num::round_bf16(s) : s;
  }
}

// hc_pre's formulas (ops.h) in the CPU op's order, exp = exp_cr.
void hc_pre_ref(const HcPreParams& p, float* x, float* post, float* comb) {
  const int hc = p.hc, nmix = (2 + hc) * hc;
  const int64_t HD = hc * p.dim;
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* ht = p.h + t * HD;
    const std::vector<float> mix = mixes(ht, p.fn, nmix, HD, p.norm_eps);
    float pre[16];
    float* pt = post + t * hc;
    float* C = comb + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      pre[j] = sigmoid_cr(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
      pt[j] = 2.0f * sigmoid_cr(mix[j + hc] * p.scale[1] + p.base[j + hc]);
    }
    for (int i = 0; i < hc * hc; ++i) C[i] = mix[2 * hc + i] * p.scale[2] + p.base[2 * hc + i];
    for (int j = 0; j < hc; ++j) {
      float m = C[j * hc];
      for (int k = 1; k < hc; ++k) m = C[j * hc + k] > m ? C[j * hc + k] : m;
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) {
        C[j * hc + k] = exp_cr(C[j * hc + k] - m);
        s += C[j * hc + k];
      }
      for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / s + p.hc_eps;
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] = C[j * hc + k] / (s + p.hc_eps);
      }
    };
    col_norm();
    for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += C[j * hc + k];
        for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / (s + p.hc_eps);
      }
      col_norm();
    }
    collapse(ht, pre, hc, p.dim, x + t * p.dim, true);
  }
}

size_t bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += num::f32_bits(a[i]) == num::f32_bits(b[i]);
  return n;
}

TEST(CudaHcPre, MatchesCpuBitForBit) {
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
    const std::vector<float> h = grid_values(static_cast<size_t>(c.tokens * HD), seed++, 31, 16.0f);
    const std::vector<float> fn = grid_values(static_cast<size_t>(nmix * HD), seed++, 8, 1024.0f);
    const std::vector<float> scale = randu(3, seed++, 0.5f, 2.0f);
    const std::vector<float> base = randn(static_cast<size_t>(nmix), seed++, 0.5f, false);
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
    std::vector<float> rx = x, rpost = post, rcomb = comb;
    hc_pre_ref(p, rx.data(), rpost.data(), rcomb.data());
    p.x = x.data();
    p.post = post.data();
    p.comb = comb.data();
    cpu_ops().hc_pre(p);
    // The CPU forward's own hc_pre (model::hc_pre: mixes by model::dot) on the same inputs.
    std::vector<float> mx(x.size()), mpost(post.size()), mcomb(comb.size()), scratch(static_cast<size_t>(nmix));
    model::hc_pre({c.hc, c.dim, p.norm_eps, p.hc_eps, c.iters}, h.data(), c.tokens, fn.data(), scale.data(),
                  base.data(), mx.data(), mpost.data(), mcomb.data(), scratch.data());
    std::printf("[cuda hc_pre] hc %d dim %lld: the CPU op / model::hc_pre equal the reference in x %zu / %zu, post "
                "%zu / %zu, comb %zu / %zu of %zu / %zu / %zu\n",
                c.hc, static_cast<long long>(c.dim), bit_equal(x, rx), bit_equal(mx, rx), bit_equal(post, rpost),
                bit_equal(mpost, rpost), bit_equal(comb, rcomb), bit_equal(mcomb, rcomb), x.size(), post.size(),
                comb.size());
    if (!have_gpu()) continue;

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
    EXPECT_TRUE(same_bits(to_host(dpost), rpost)) << "post";
    EXPECT_TRUE(same_bits(to_host(dcomb), rcomb)) << "comb";
    EXPECT_TRUE(same_bits(to_host(dx), rx)) << "x";
  }
  TANDEM_REQUIRE_GPU();
}

// The RMSNorm of decode_act.cuh's pack_row on the host, in the kernel's fp64 summation order: thread
// i of 256 sums x[i]^2, x[i + 256]^2, ... (exact products), then block_sum: xor butterflies within
// each warp (after which every lane holds the same bits: a + b == b + a), lane 0's sums of the 8
// warps, a butterfly over them. rs and y as the rms_norm op: y = bf16(w * (x * rs)).
void pack_norm_ref(const float* x, int64_t dim, const float* w, float eps, float* y) {
  constexpr int kT = 256;
  double th[kT];
  for (int i = 0; i < kT; ++i) {
    th[i] = 0.0;
    for (int64_t k = i; k < dim; k += kT) th[i] += static_cast<double>(x[k]) * x[k];
  }
  auto butterfly = [](double* v) {  // warp_sum over 32 lanes
    for (int o = 16; o > 0; o >>= 1) {
      double n[32];
      for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ o];
      std::copy(n, n + 32, v);
    }
  };
  double red[32] = {};
  for (int wi = 0; wi < kT / 32; ++wi) {
    butterfly(th + wi * 32);
    red[wi] = th[wi * 32];
  }
  butterfly(red);
  const float var = static_cast<float>(red[0] / static_cast<double>(dim));
  const float rs = 1.0f / std::sqrt(var + eps);
  for (int64_t k = 0; k < dim; ++k) y[k] = num::round_bf16(w[k] * (x[k] * rs));
}

// hc_pre_pack == hc_pre, then decode_act_pack(x, norm_weight, y = x), both CUDA ops, bit for bit:
// the normed x, codes, scales, post and comb. Against the host (the hc_pre test's grids, so the
// mixes are exact): post and comb equal hc_pre_ref's, the normed rows hc_pre_ref's x normalized by
// pack_norm_ref, the codes and scales the CPU act_quant op's of those rows. The norm weight has a
// NaN column; one case has a token whose streams hold a NaN (its whole row is NaN, the others
// unaffected), compared GPU against GPU only. The RMSNorm's eps differs from the mixes' on purpose.
TEST(CudaHcPrePack, EqualsHcPreThenDecodeActPack) {
  struct C {
    int64_t tokens;
    int hc;
    int64_t dim;
    int iters;
    int64_t nan_token;  // < 0: none
  };
  const float eps = 1e-5f;
  uint64_t seed = 100;
  for (const C& c : {C{1, 4, 4096, 20, -1}, C{7, 4, 4096, 20, 3}, C{96, 4, 4096, 20, -1}, C{1, 4, 384, 20, -1},
                     C{7, 4, 384, 20, -1}, C{96, 4, 384, 20, -1}, C{3, 6, 256, 5, -1}}) {  // hc 6: one-thread Sinkhorn
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " hc " << c.hc << " dim " << c.dim
                                      << (c.nan_token >= 0 ? " with a NaN token" : ""));
    const int nmix = (2 + c.hc) * c.hc;
    const int64_t HD = c.hc * c.dim, T = c.tokens, D = c.dim, nb = c.dim / 128;
    std::vector<float> h = grid_values(static_cast<size_t>(T * HD), seed++, 31, 16.0f);
    if (c.nan_token >= 0) h[c.nan_token * HD + HD / 2 + 5] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> fn = grid_values(static_cast<size_t>(nmix * HD), seed++, 8, 1024.0f);
    const std::vector<float> scale = randu(3, seed++, 0.5f, 2.0f);
    const std::vector<float> base = randn(static_cast<size_t>(nmix), seed++, 0.5f, false);
    std::vector<float> w = randn(static_cast<size_t>(D), seed++, 0.5f, true);
    w[7] = std::numeric_limits<float>::quiet_NaN();
    HcPreParams p;
    p.h = h.data();
    p.fn = fn.data();
    p.scale = scale.data();
    p.base = base.data();
    p.tokens = T;
    p.hc = c.hc;
    p.dim = D;
    p.sinkhorn_iters = c.iters;
    const bool host = c.nan_token < 0;
    std::vector<float> rx(static_cast<size_t>(T * D)), rpost(static_cast<size_t>(T * c.hc)),
        rcomb(static_cast<size_t>(T * c.hc * c.hc)), ry(rx.size());
    HostCodes rc;
    if (host) {
      hc_pre_ref(p, rx.data(), rpost.data(), rcomb.data());
      for (int64_t t = 0; t < T; ++t) pack_norm_ref(rx.data() + t * D, D, w.data(), eps, ry.data() + t * D);
      rc = host_act_quant(ry, T, D, D);
      // The CPU rms_norm op sums in index order: printed, not asserted (see norm_rope_test.cpp).
      std::vector<float> cy(rx.size());
      RmsNormParams np;
      np.x = rx.data();
      np.y = cy.data();
      np.weight = w.data();
      np.rows = T;
      np.dim = D;
      np.eps = eps;
      np.round_bf16 = true;
      cpu_ops().rms_norm(np);
      std::printf("[cuda hc_pre_pack] tokens %lld hc %d dim %lld: the CPU rms_norm op equals the kernel-order norm in "
                  "%zu of %zu\n",
                  static_cast<long long>(T), c.hc, static_cast<long long>(D), bit_equal(cy, ry), ry.size());
    }
    if (!have_gpu()) continue;

    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base),
                        dw = to_dev(w);
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    const size_t nx = static_cast<size_t>(T * D), ns = static_cast<size_t>(T * nb);
    // The two ops: hc_pre, then the pack in place (as dec_norm_rows).
    auto x0 = poisoned<float>(nx), post0 = poisoned<float>(rpost.size()), comb0 = poisoned<float>(rcomb.size());
    auto c0 = poisoned<uint8_t>(nx), s0 = poisoned<uint8_t>(ns);
    auto two_ops = [&] {
      p.x = x0.get();
      p.post = post0.get();
      p.comb = comb0.get();
      cuda::hc_pre(p, kStream);
      cuda::DecodeActPackArgs a;
      a.x = x0.get();
      a.rows = T;
      a.dim = D;
      a.norm_weight = dw.get();
      a.eps = eps;
      a.y = x0.get();
      a.codes = c0.get();
      a.scales = s0.get();
      cuda::decode_act_pack(a, kStream);
    };
    // The fused kernel.
    auto x1 = poisoned<float>(nx), post1 = poisoned<float>(rpost.size()), comb1 = poisoned<float>(rcomb.size());
    auto c1 = poisoned<uint8_t>(nx), s1 = poisoned<uint8_t>(ns);
    auto fused = [&] {
      p.x = x1.get();
      p.post = post1.get();
      p.comb = comb1.get();
      cuda::HcPrePackArgs k;
      k.norm_weight = dw.get();
      k.eps = eps;
      k.codes = c1.get();
      k.scales = s1.get();
      cuda::hc_pre_pack(p, k, kStream);
    };
    two_ops();
    fused();
    const std::vector<float> gx = to_host(x1), gpost = to_host(post1), gcomb = to_host(comb1);
    const std::vector<uint8_t> gc = to_host(c1), gs = to_host(s1);
    // The byte arrays' first mismatch is named as (token, column) records; a float array's index / dim
    // (x), / hc (post) or / (hc * hc) (comb) is its token.
    EXPECT_TRUE(same_bits(gx, to_host(x0))) << "normed x: fused vs hc_pre + decode_act_pack";
    EXPECT_TRUE(same_values(gc, to_host(c0), static_cast<size_t>(D))) << "codes: fused vs the two ops";
    EXPECT_TRUE(same_values(gs, to_host(s0), static_cast<size_t>(nb))) << "scales: fused vs the two ops";
    EXPECT_TRUE(same_bits(gpost, to_host(post0))) << "post: fused vs hc_pre";
    EXPECT_TRUE(same_bits(gcomb, to_host(comb0))) << "comb: fused vs hc_pre";
    if (c.nan_token >= 0) {  // the NaN token's row is NaN throughout, its codes NaN, its scales the floor's
      const uint8_t floor_scale =
          num::e8m0_from_exponent(num::ue8m0_scale_exponent(0.0f, num::kE4m3Max, num::kFp8ActAmaxFloor));
      size_t nan = 0, nan_codes = 0, floors = 0;
      for (int64_t d = 0; d < D; ++d) {
        nan += std::isnan(gx[c.nan_token * D + d]);
        nan_codes += (gc[c.nan_token * D + d] & 0x7f) == 0x7f;
      }
      for (int64_t b = 0; b < nb; ++b) floors += gs[c.nan_token * nb + b] == floor_scale;
      EXPECT_EQ(nan, static_cast<size_t>(D)) << "NaN token's normed row: NaN values";
      EXPECT_EQ(nan_codes, static_cast<size_t>(D)) << "NaN token's codes: NaN codes";
      EXPECT_EQ(floors, static_cast<size_t>(nb)) << "NaN token's scales: the amax floor's";
    }
    if (host) {
      EXPECT_TRUE(same_bits(gpost, rpost)) << "post vs host";
      EXPECT_TRUE(same_bits(gcomb, rcomb)) << "comb vs host";
      EXPECT_TRUE(same_bits(gx, ry)) << "normed x vs host (hc_pre_ref, then pack_norm_ref)";
      EXPECT_TRUE(same_values(gc, rc.codes, static_cast<size_t>(D))) << "codes vs the CPU act_quant op";
      EXPECT_TRUE(same_values(gs, rc.scales, static_cast<size_t>(nb))) << "scales vs the CPU act_quant op";
    }
    if (host && D == 4096)
      std::printf("[cuda perf] hc_pre_pack tokens %lld hc %d dim %lld: fused %.1f us, hc_pre + decode_act_pack %.1f us\n",
                  static_cast<long long>(T), c.hc, static_cast<long long>(D), median_us(fused), median_us(two_ops));
  }
  TANDEM_REQUIRE_GPU();
}

// hc_pre_pack, hc_pre and hc_head with the finishing kernel forced to each launch shape (kToken:
// one CTA per token; kSplit: kHcSplit CTAs per token, hc_pre_pack's a cluster reading the row from
// its CTAs' shared memory for the RMSNorm): every output equal bit for bit between the shapes, at
// token counts around the automatic crossover (kHcSplitMaxTokens) and at dims whose 128-column
// blocks do not fill the kHcSplit CTAs (256, 384, 512) or are no multiple of 128 (plain hc_pre,
// hc_head). Two data sets per case: (a) the coarse grids (exact mixes), with one token scaled by
// 2^-12 and one 128-column block of another scaled by 2^7 (rows of wide dynamic range; the mixes
// stay exact, which mixes() asserts), compared with the host reference (hc_pre_ref, pack_norm_ref,
// the CPU act_quant op) as well; (b) unrounded random streams whose columns span 2^-20 .. 2^20,
// GPU shape against GPU shape only (their mixes are not exact). The norm weight has a NaN column.
// hc_pre_pack also runs with its comb on a side stream (HcCombSide: comb_kernel beside the
// finishing kernel, which then skips the Sinkhorn) in both shapes: every output equal bit for bit.
struct FinishOut {
  std::vector<float> x, post, comb;
  std::vector<uint8_t> codes, scales;
};

// hc_pre_pack's comb branch (HcCombSide): a second stream and its fork / join events.
struct CombSide {
  cuda::HcCombSide side;
  CombSide() {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming));
  }
  ~CombSide() {
    cudaStreamSynchronize(side.stream);
    cudaEventDestroy(side.fork);
    cudaEventDestroy(side.join);
    cudaStreamDestroy(side.stream);
  }
  CombSide(const CombSide&) = delete;
  CombSide& operator=(const CombSide&) = delete;
};

TEST(CudaHcFinish, SplitEqualsOneCtaPerToken) {
  using cuda::HcFinishShape;
  struct C {
    int hc;
    int64_t dim;
    int iters;
    bool pack;  // dim a multiple of 128: hc_pre_pack too
  };
  const float eps = 1e-5f;
  const int64_t kCross = cuda::kHcSplitMaxTokens;
  uint64_t seed = 500;
  std::optional<CombSide> side;  // made once a GPU is known
  for (const C& c : {C{4, 4096, 20, true}, C{4, 512, 20, true}, C{4, 384, 20, true}, C{4, 256, 20, true},
                     C{6, 256, 5, true}, C{4, 100, 20, false}, C{3, 72, 2, false}}) {
    for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, kCross, kCross + 1}) {
      for (const bool grid : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "tokens " << T << " hc " << c.hc << " dim " << c.dim
                                          << (grid ? " (exact grids)" : " (wide-range random)"));
        const int nmix = (2 + c.hc) * c.hc;
        const int64_t HD = c.hc * c.dim, D = c.dim, nb = D / 128;
        std::vector<float> h, fn;
        if (grid) {
          h = grid_values(static_cast<size_t>(T * HD), seed++, 31, 16.0f);
          fn = grid_values(static_cast<size_t>(nmix * HD), seed++, 8, 1024.0f);
          for (int64_t i = 0; i < HD; ++i) h[static_cast<size_t>(i)] *= 0x1p-12f;  // token 0: tiny
          if (T > 1 && c.pack)                                                   // token 1: one loud block
            for (int i = 0; i < c.hc; ++i)
              for (int64_t d = 128; d < 256 && d < D; ++d) h[static_cast<size_t>(HD + i * D + d)] *= 0x1p7f;
        } else {
          h = randn(static_cast<size_t>(T * HD), seed++, 1.0f, false);
          fn = randn(static_cast<size_t>(nmix * HD), seed++, 0.02f, false);
          for (size_t i = 0; i < h.size(); ++i)
            h[i] = std::ldexp(h[i], static_cast<int>(mix64(seed * 7919 + i % static_cast<size_t>(D)) % 41) - 20);
          ++seed;
        }
        const std::vector<float> scale = randu(3, seed++, 0.5f, 2.0f);
        const std::vector<float> base = randn(static_cast<size_t>(nmix), seed++, 0.5f, false);
        std::vector<float> w = randn(static_cast<size_t>(D), seed++, 0.5f, true);
        w[7] = std::numeric_limits<float>::quiet_NaN();
        HcPreParams p;
        p.h = h.data();
        p.fn = fn.data();
        p.scale = scale.data();
        p.base = base.data();
        p.tokens = T;
        p.hc = c.hc;
        p.dim = D;
        p.sinkhorn_iters = c.iters;
        // The host reference (grids only): hc_pre's x, post, comb; the pack's normed rows and codes.
        std::vector<float> rx(static_cast<size_t>(T * D)), rpost(static_cast<size_t>(T * c.hc)),
            rcomb(static_cast<size_t>(T * c.hc * c.hc)), ry(rx.size());
        HostCodes rc;
        if (grid) {
          hc_pre_ref(p, rx.data(), rpost.data(), rcomb.data());
          if (c.pack) {
            for (int64_t t = 0; t < T; ++t) pack_norm_ref(rx.data() + t * D, D, w.data(), eps, ry.data() + t * D);
            rc = host_act_quant(ry, T, D, D);
          }
        }
        if (!have_gpu()) continue;

        DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base),
                            dw = to_dev(w);
        p.h = dh.get();
        p.fn = dfn.get();
        p.scale = dscale.get();
        p.base = dbase.get();
        const size_t nx = static_cast<size_t>(T * D);
        if (!side) side.emplace();
        auto run = [&](bool pack, HcFinishShape shape, bool comb_side = false) {
          auto x = poisoned<float>(nx), post = poisoned<float>(rpost.size()), comb = poisoned<float>(rcomb.size());
          auto codes = poisoned<uint8_t>(pack ? nx : 0), scales = poisoned<uint8_t>(pack ? static_cast<size_t>(T * nb) : 0);
          HcPreParams q = p;
          q.x = x.get();
          q.post = post.get();
          q.comb = comb.get();
          if (pack) {
            cuda::HcPrePackArgs k;
            k.norm_weight = dw.get();
            k.eps = eps;
            k.codes = codes.get();
            k.scales = scales.get();
            k.finish = shape;
            k.comb_side = comb_side ? &side->side : nullptr;
            cuda::hc_pre_pack(q, k, kStream);
            if (comb_side) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(kStream, side->side.join, 0));
          } else {
            cuda::hc_pre(q, kStream, shape);
          }
          FinishOut o{to_host(x), to_host(post), to_host(comb), {}, {}};
          if (pack) {
            o.codes = to_host(codes);
            o.scales = to_host(scales);
          }
          return o;
        };
        for (const bool pack : {false, true}) {
          if (pack && !c.pack) continue;
          const char* op = pack ? "hc_pre_pack" : "hc_pre";
          const FinishOut a = run(pack, HcFinishShape::kToken), b = run(pack, HcFinishShape::kSplit);
          EXPECT_TRUE(same_bits(b.x, a.x)) << op << " x: split vs one CTA per token";
          EXPECT_TRUE(same_bits(b.post, a.post)) << op << " post: split vs one CTA per token";
          EXPECT_TRUE(same_bits(b.comb, a.comb)) << op << " comb: split vs one CTA per token";
          if (pack) {
            EXPECT_TRUE(same_values(b.codes, a.codes, static_cast<size_t>(D))) << op << " codes: split vs one CTA";
            EXPECT_TRUE(same_values(b.scales, a.scales, static_cast<size_t>(nb))) << op << " scales: split vs one CTA";
          }
          if (grid) {
            EXPECT_TRUE(same_bits(b.x, pack ? ry : rx)) << op << " x (split) vs host";
            EXPECT_TRUE(same_bits(b.post, rpost)) << op << " post (split) vs host";
            EXPECT_TRUE(same_bits(b.comb, rcomb)) << op << " comb (split) vs host";
            if (pack) {
              EXPECT_TRUE(same_values(b.codes, rc.codes, static_cast<size_t>(D))) << op << " codes (split) vs host";
              EXPECT_TRUE(same_values(b.scales, rc.scales, static_cast<size_t>(nb))) << op << " scales (split) vs host";
            }
          }
          // The automatic shape is one of the two.
          const FinishOut z = run(pack, HcFinishShape::kAuto);
          EXPECT_TRUE(same_bits(z.x, a.x)) << op << " x: automatic shape";
          if (!pack) continue;
          // The comb on the side stream, both shapes: the same bits in every output.
          for (const HcFinishShape shape : {HcFinishShape::kToken, HcFinishShape::kSplit}) {
            const FinishOut sd = run(true, shape, true);
            const char* sh = shape == HcFinishShape::kToken ? "one CTA per token" : "split";
            EXPECT_TRUE(same_bits(sd.comb, a.comb)) << "comb on the side stream (" << sh << ")";
            EXPECT_TRUE(same_bits(sd.x, a.x)) << "x, comb on the side stream (" << sh << ")";
            EXPECT_TRUE(same_bits(sd.post, a.post)) << "post, comb on the side stream (" << sh << ")";
            EXPECT_TRUE(same_values(sd.codes, a.codes, static_cast<size_t>(D)))
                << "codes, comb on the side (" << sh << ")";
            EXPECT_TRUE(same_values(sd.scales, a.scales, static_cast<size_t>(nb)))
                << "scales, comb on the side (" << sh << ")";
          }
        }
        if (grid && D == 4096 && (T == 1 || T == 8 || T >= kCross)) {  // the crossover's two sides too
          auto x = poisoned<float>(nx), post = poisoned<float>(rpost.size()), comb = poisoned<float>(rcomb.size());
          auto codes = poisoned<uint8_t>(nx), scales = poisoned<uint8_t>(static_cast<size_t>(T * nb));
          p.x = x.get();
          p.post = post.get();
          p.comb = comb.get();
          auto timed = [&](HcFinishShape shape) {
            cuda::HcPrePackArgs k;
            k.norm_weight = dw.get();
            k.eps = eps;
            k.codes = codes.get();
            k.scales = scales.get();
            k.finish = shape;
            return median_us([&] { cuda::hc_pre_pack(p, k, kStream); }, 50);
          };
          std::printf("[cuda perf] hc_pre_pack (mix + finish) tokens %lld hc %d dim %lld: one CTA per token %.1f us, "
                      "%d-CTA cluster per token %.1f us\n",
                      static_cast<long long>(T), c.hc, static_cast<long long>(D), timed(HcFinishShape::kToken),
                      cuda::kHcSplit, timed(HcFinishShape::kSplit));
        }
      }
    }
  }
  TANDEM_REQUIRE_GPU();
}

// hc_pre_pack's cluster shape captured in a CUDA graph (a PDL cluster launch inside capture, twice
// in a row so one cluster kernel precedes the next mix programmatically) replays the eager bits;
// so does the same pair with the comb on a side stream (a graph branch forked after each mix and
// joined before the next; the captured edges are printed: what the capture made of the fork and
// the join, a programmatic or a full edge into each kernel).
TEST(CudaHcFinish, SplitCapturesInAGraph) {
  TANDEM_REQUIRE_GPU();
  const int64_t T = 8, D = 4096, HD = 4 * D, nb = D / 128;
  const int nmix = 24;
  DeviceBuffer<float> dh = to_dev(randn(static_cast<size_t>(T * HD), 950, 1.0f, true));
  DeviceBuffer<float> dfn = to_dev(randn(static_cast<size_t>(nmix * HD), 951, 0.02f, false));
  DeviceBuffer<float> dscale = to_dev(randu(3, 952, 0.5f, 2.0f)), dbase = to_dev(randn(nmix, 953, 0.5f, false));
  DeviceBuffer<float> dw = to_dev(randn(static_cast<size_t>(D), 954, 0.5f, true));
  struct Out {
    DeviceBuffer<float> x, post, comb;
    DeviceBuffer<uint8_t> codes, scales;
  };
  auto outs = [&] {
    return Out{poisoned<float>(static_cast<size_t>(T * D)), poisoned<float>(static_cast<size_t>(T * 4)),
               poisoned<float>(static_cast<size_t>(T * 16)), poisoned<uint8_t>(static_cast<size_t>(T * D)),
               poisoned<uint8_t>(static_cast<size_t>(T * nb))};
  };
  CombSide side;
  auto call = [&](Out& o, cudaStream_t st, bool comb_side) {
    HcPreParams p;
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    p.tokens = T;
    p.x = o.x.get();
    p.post = o.post.get();
    p.comb = o.comb.get();
    cuda::HcPrePackArgs k;
    k.norm_weight = dw.get();
    k.codes = o.codes.get();
    k.scales = o.scales.get();
    k.finish = cuda::HcFinishShape::kSplit;
    k.comb_side = comb_side ? &side.side : nullptr;
    cuda::hc_pre_pack(p, k, st);
    if (comb_side) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(st, side.side.join, 0));  // before the next mix
  };
  auto print_edges = [](cudaGraph_t g) {
    size_t ne = 0;
    TANDEM_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> ed(ne);
    TANDEM_CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    auto name = [](cudaGraphNode_t n) -> std::string {
      cudaGraphNodeType t;
      TANDEM_CUDA_CHECK(cudaGraphNodeGetType(n, &t));
      if (t != cudaGraphNodeTypeKernel) return "node type " + std::to_string(static_cast<int>(t));
      cudaKernelNodeParams kp{};
      TANDEM_CUDA_CHECK(cudaGraphKernelNodeGetParams(n, &kp));
      const char* nm = nullptr;
      if (cudaFuncGetName(&nm, kp.func) != cudaSuccess || !nm) return "kernel";
      return std::string(nm).substr(0, 60);
    };
    for (size_t i = 0; i < ne; ++i)
      std::printf("[hc comb side] edge %s -> %s: type %d (1 = programmatic), from port %d\n", name(from[i]).c_str(),
                  name(to[i]).c_str(), static_cast<int>(ed[i].type), static_cast<int>(ed[i].from_port));
  };
  Out eager = outs();
  call(eager, kStream, false);
  sync();
  cudaStream_t st;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const bool comb_side : {false, true}) {
    SCOPED_TRACE(comb_side ? "comb on a side stream" : "one stream");
    Out g1 = outs(), g2 = outs();
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    call(g1, st, comb_side);
    call(g2, st, comb_side);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    if (comb_side) print_edges(g);
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 2; ++r) TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, st));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(st));
    for (Out* o : {&g1, &g2}) {
      EXPECT_TRUE(same_bits(to_host(o->x), to_host(eager.x))) << "x";
      EXPECT_TRUE(same_bits(to_host(o->post), to_host(eager.post))) << "post";
      EXPECT_TRUE(same_bits(to_host(o->comb), to_host(eager.comb))) << "comb";
      EXPECT_TRUE(same_values(to_host(o->codes), to_host(eager.codes), static_cast<size_t>(D))) << "codes";
      EXPECT_TRUE(same_values(to_host(o->scales), to_host(eager.scales), static_cast<size_t>(nb))) << "scales";
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(st));
}

// hc_head: the split shape (kHcSplit CTAs per token, each a column slice) equals one CTA per token
// bit for bit, and the host reference on the exact grids.
TEST(CudaHcFinish, HeadSplitEqualsOneCtaPerToken) {
  using cuda::HcFinishShape;
  uint64_t seed = 800;
  for (auto [hc, dim] : {std::pair<int, int64_t>{4, 4096}, {4, 100}, {2, 33}}) {
    for (int64_t T : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{17}}) {
      SCOPED_TRACE(::testing::Message() << "tokens " << T << " hc " << hc << " dim " << dim);
      const int64_t HD = hc * dim;
      const std::vector<float> h = grid_values(static_cast<size_t>(T * HD), seed++, 31, 16.0f);
      const std::vector<float> fn = grid_values(static_cast<size_t>(hc * HD), seed++, 8, 1024.0f);
      const std::vector<float> scale = randu(1, seed++, 0.5f, 2.0f);
      const std::vector<float> base = randn(static_cast<size_t>(hc), seed++, 0.5f, false);
      std::vector<float> ry(static_cast<size_t>(T * dim));
      HcHeadParams p;
      p.tokens = T;
      p.hc = hc;
      p.dim = dim;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> mix = mixes(h.data() + t * HD, fn.data(), hc, HD, p.norm_eps);
        float pre[16];
        for (int j = 0; j < hc; ++j) pre[j] = sigmoid_cr(mix[j] * scale[0] + base[j]) + p.hc_eps;
        collapse(h.data() + t * HD, pre, hc, dim, ry.data() + t * dim, true);
      }
      if (!have_gpu()) continue;
      DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base);
      p.h = dh.get();
      p.fn = dfn.get();
      p.scale = dscale.get();
      p.base = dbase.get();
      auto run = [&](HcFinishShape shape) {
        auto dy = poisoned<float>(ry.size());
        p.y = dy.get();
        cuda::hc_head(p, kStream, shape);
        return to_host(dy);
      };
      const std::vector<float> a = run(HcFinishShape::kToken), b = run(HcFinishShape::kSplit);
      EXPECT_TRUE(same_bits(b, a)) << "split vs one CTA per token";
      EXPECT_TRUE(same_bits(b, ry)) << "split vs host";
    }
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaHcHead, MatchesCpuBitForBit) {
  uint64_t seed = 40;
  for (auto [tokens, hc, dim, round] : {std::tuple<int64_t, int, int64_t, bool>{1, 4, 4096, true}, {4, 4, 4096, false},
                                        {3, 2, 33, true}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " hc " << hc << " dim " << dim);
    const int64_t HD = hc * dim;
    const std::vector<float> h = grid_values(static_cast<size_t>(tokens * HD), seed++, 31, 16.0f);
    const std::vector<float> fn = grid_values(static_cast<size_t>(hc * HD), seed++, 8, 1024.0f);
    const std::vector<float> scale = randu(1, seed++, 0.5f, 2.0f);
    const std::vector<float> base = randn(static_cast<size_t>(hc), seed++, 0.5f, false);
    std::vector<float> y(static_cast<size_t>(tokens * dim)), ry(y.size());
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
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> mix = mixes(h.data() + t * HD, fn.data(), hc, HD, p.norm_eps);
      float pre[16];
      for (int j = 0; j < hc; ++j) pre[j] = sigmoid_cr(mix[j] * scale[0] + base[j]) + p.hc_eps;
      collapse(h.data() + t * HD, pre, hc, dim, ry.data() + t * dim, round);
    }
    cpu_ops().hc_head(p);
    std::printf("[cuda hc_head] dim %lld: the CPU op equals the reference in %zu of %zu\n", static_cast<long long>(dim),
                bit_equal(y, ry), y.size());
    if (!have_gpu()) continue;
    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn), dscale = to_dev(scale), dbase = to_dev(base);
    auto dy = poisoned<float>(y.size());
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    p.y = dy.get();
    cuda::hc_head(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dy), ry));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaHcPost, MatchesCpuBitForBit) {
  uint64_t seed = 70;
  for (auto [tokens, hc, dim, round, alias] :
       {std::tuple<int64_t, int, int64_t, bool, bool>{1, 4, 4096, true, true}, {5, 4, 4096, true, false},
        {3, 3, 37, false, false}, {2, 16, 64, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " hc " << hc << (alias ? " in place" : ""));
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
    if (!have_gpu()) continue;
    DeviceBuffer<float> df = to_dev(f), dres = to_dev(res), dpost = to_dev(post), dcomb = to_dev(comb);
    DeviceBuffer<float> dout = alias ? DeviceBuffer<float>() : poisoned<float>(res.size());
    p.f = df.get();
    p.res = dres.get();
    p.post = dpost.get();
    p.comb = dcomb.get();
    p.out = alias ? dres.get() : dout.get();
    cuda::hc_post(p, kStream);
    // The kernel rounds each product and sum as the CPU op does; a -march=native CPU build (__FMA__)
    // may contract the CPU's multiply-adds, and is then held to correct rounding of the products.
    const std::vector<float> got = to_host(alias ? dres : dout);
#if defined(__FMA__)
    std::vector<double> ref(got.size()), slack(got.size());
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t d = 0; d < dim; ++d)
        for (int k = 0; k < hc; ++k) {
          double s = 0, a = 0;
          for (int j = 0; j < hc; ++j) {
            s += static_cast<double>(comb[t * hc * hc + j * hc + k]) * res[(t * hc + j) * dim + d];
            a += std::fabs(static_cast<double>(comb[t * hc * hc + j * hc + k]) * res[(t * hc + j) * dim + d]);
          }
          const double v = static_cast<double>(post[t * hc + k]) * f[t * dim + d] + s;
          const size_t o = static_cast<size_t>((t * hc + k) * dim + d);
          ref[o] = v;
          slack[o] = gamma_n(2 * hc + 2) * (a + std::fabs(static_cast<double>(post[t * hc + k]) * f[t * dim + d]));
        }
    EXPECT_TRUE(round ? correctly_rounded(got.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, slack.data())
                      : within(got, ref, slack));
#else
    EXPECT_TRUE(same_bits(got, want));
#endif
  }
  TANDEM_REQUIRE_GPU();
}

// ---- hc_post's load epilogue: what the forward did after a sub-block output's all-reduce under
// tensor parallelism (wo_b: round_bf16; the MoE: moe_add_shared), applied by hc_post as it loads f.

enum class Epi { kRound, kAddRound };  // wo_b's all-reduce; the MoE's (+ the shared expert)
const char* epi_name(Epi e) { return e == Epi::kRound ? "round" : "add+round"; }

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Random data at 1, 2, 6, 16 and 48 rows; shapes: the model's (hc 4 x 4096) and the tiny presets'
// (4 x 256, 4 x 384) on the float4 path, hc 3 x 37 on the scalar path. f is fp32 (an all-reduced
// sum of partials), f_add bf16 (the shared expert's output); token 0 also carries bf16 ties (round
// to even, both ways), a value that rounds to inf, inf, a NaN (in f, or in f_add) and an exact
// cancellation f + f_add = 0. Against the launches replaced (the epilogue's own kernel on a copy of
// f, then hc_post) on the GPU, the CPU op with the epilogue and the CPU composition (f rounded on
// the host, then the CPU op), bit for bit; the output streams in place as the model runs them.
TEST(CudaHcPost, LoadEpilogueEqualsTheLaunchesReplacedAndTheCpu) {
  struct Shape {
    int hc;
    int64_t dim;
  };
  uint64_t seed = 900;
  for (int64_t T : {1, 2, 6, 16, 48})
    for (const Shape& sh : {Shape{4, 4096}, Shape{4, 256}, Shape{4, 384}, Shape{3, 37}})
      for (Epi epi : {Epi::kRound, Epi::kAddRound}) {
        const int hc = sh.hc;
        const int64_t D = sh.dim;
        const bool add = epi == Epi::kAddRound;
        SCOPED_TRACE(::testing::Message() << "tokens " << T << " hc " << hc << " dim " << D << " epilogue "
                                          << epi_name(epi));
        std::vector<float> f = randn(static_cast<size_t>(T * D), seed++, 1.0f, false);
        std::vector<float> fadd = randn(f.size(), seed++, 1.0f, true);
        const std::vector<float> res = randn(static_cast<size_t>(T * hc * D), seed++, 1.0f, true);
        const std::vector<float> post = randu(static_cast<size_t>(T * hc), seed++, 0.0f, 2.0f);
        const std::vector<float> comb = randu(static_cast<size_t>(T * hc * hc), seed++, 0.0f, 1.0f);
        f[0] = from_bits(0x3F808000u);  // 1 + 2^-8: a bf16 tie, to even (down)
        f[1] = from_bits(0x3F818000u);  // a tie to even (up)
        f[2] = 3.4e38f;                 // rounds to +inf in bf16
        f[3] = -std::numeric_limits<float>::infinity();
        f[4] = std::numeric_limits<float>::quiet_NaN();
        fadd[0] = fadd[1] = fadd[2] = 0.0f;  // the ties and the overflow as they are under the add too
        fadd[5] = std::numeric_limits<float>::quiet_NaN();
        f[6] = -fadd[6];  // f + f_add = +0

        HcPostParams p;
        p.post = post.data();
        p.comb = comb.data();
        p.tokens = T;
        p.hc = hc;
        p.dim = D;
        p.round_bf16 = true;
        // The CPU op with the epilogue, in place.
        std::vector<float> want = res;
        p.f = f.data();
        p.f_add = add ? fadd.data() : nullptr;
        p.f_round = true;
        p.res = want.data();
        p.out = want.data();
        cpu_ops().hc_post(p);
        // The CPU composition of the launches replaced: f' = bf16(f (+ f_add)) on the host, then the
        // CPU op without the epilogue.
        std::vector<float> fr(f.size()), want_composed = res;
        for (size_t i = 0; i < f.size(); ++i) fr[i] = num::round_bf16(add ? f[i] + fadd[i] : f[i]);
        {
          HcPostParams q = p;
          q.f = fr.data();
          q.f_add = nullptr;
          q.f_round = false;
          q.res = want_composed.data();
          q.out = want_composed.data();
          cpu_ops().hc_post(q);
        }
        EXPECT_TRUE(same_bits(want, want_composed)) << "the CPU op's epilogue vs the CPU composition";
        if (!have_gpu()) continue;

        const DeviceBuffer<float> df = to_dev(f), dfadd = to_dev(fadd), dpost = to_dev(post), dcomb = to_dev(comb);
        p.post = dpost.get();
        p.comb = dcomb.get();
        // A: the launches replaced, on a copy of f: round_bf16 (rows T, cols D) or moe_add_shared, then
        // hc_post without the epilogue.
        DeviceBuffer<float> fa = to_dev(f), ha = to_dev(res);
        if (add) {
          cuda_model::moe_add_shared({fa.get(), dfadd.get(), T * D}, kStream);
        } else {
          RoundBf16Params rb;
          rb.x = fa.get();
          rb.rows = T;
          rb.cols = D;
          cuda::round_bf16(rb, kStream);
        }
        HcPostParams pa = p;
        pa.f = fa.get();
        pa.f_add = nullptr;
        pa.f_round = false;
        pa.res = ha.get();
        pa.out = ha.get();
        cuda::hc_post(pa, kStream);
        // B: hc_post applying the epilogue as it loads f (f, f_add untouched).
        DeviceBuffer<float> hb = to_dev(res);
        HcPostParams pb = p;
        pb.f = df.get();
        pb.f_add = add ? dfadd.get() : nullptr;
        pb.res = hb.get();
        pb.out = hb.get();
        cuda::hc_post(pb, kStream);

        const std::vector<float> got = to_host(hb), ref = to_host(ha);
        EXPECT_TRUE(same_bits(got, ref)) << "streams: hc_post's load epilogue vs " << (add ? "moe_add_shared" : "round_bf16")
                                         << " + hc_post";
        EXPECT_TRUE(same_bits(to_host(df), f)) << "f changed";
#if !defined(__FMA__)  // the CPU op's multiply-adds uncontracted (see CudaHcPost.MatchesCpuBitForBit)
        EXPECT_TRUE(same_bits(got, want)) << "streams: hc_post's load epilogue vs the CPU op";
        EXPECT_TRUE(same_bits(got, want_composed)) << "streams: hc_post's load epilogue vs the CPU composition";
#endif
        if (D == 4096 && T <= 2 && !add) {
          // Out of place, so the launches are idempotent (round_bf16 of rounded values).
          DeviceBuffer<float> out = poisoned<float>(res.size()), dres = to_dev(res);
          pa.res = pb.res = dres.get();
          pa.out = pb.out = out.get();
          std::printf("[cuda perf] hc_post tokens %lld hc %d dim %lld: with the round as it loads %.1f us, "
                      "round_bf16 + hc_post %.1f us\n",
                      static_cast<long long>(T), hc, static_cast<long long>(D),
                      median_us([&] { cuda::hc_post(pb, kStream); }), median_us([&] {
                        RoundBf16Params rb;
                        rb.x = fa.get();
                        rb.rows = T;
                        rb.cols = D;
                        cuda::round_bf16(rb, kStream);
                        cuda::hc_post(pa, kStream);
                      }));
        }
      }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
