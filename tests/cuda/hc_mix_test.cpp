// The mHC mixing projection's two launch shapes (hc_mix.h) at decode and prefill token counts, on
// random inputs whose sums depend on the order they are added in: kRows (a CTA per mix row) and
// kTiled (a CTA per token tile and K slice, h read once) must give the same partials bit for bit,
// and both must equal the host's run of the kernel arithmetic (thread i's fmaf chain over k = k0 +
// i, k0 + i + 256, ...; block_sum's xor butterflies in each warp, then over the 8 warps' sums) on
// sampled tokens. Also hc_post at a prefill chunk against the CPU op, a captured graph of the tiled
// shape, and the per-launch times at 4096 + 3 rows ("[cuda perf]", never asserted).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda/cuda_test_util.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/hc_mix.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda::HcMixShape;

const char* shape_name(HcMixShape s) {
  return s == HcMixShape::kRows ? "rows" : (s == HcMixShape::kTiled ? "tiled" : "auto");
}

uint64_t dbits(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// block_sum as thread 0 of a 256-thread CTA computes it (device.cuh): lane l adds lane l ^ o's
// value at o = 16, 8, 4, 2, 1 in each warp; then the 8 warps' lane-0 sums in lanes 0..7 (zeros
// above) go through the same butterfly.
template <typename T>
T warp_sum_host(const T* in) {
  T l[32];
  for (int i = 0; i < 32; ++i) l[i] = in[i];
  for (int o = 16; o > 0; o >>= 1) {
    T n[32];
    for (int i = 0; i < 32; ++i) n[i] = l[i] + l[i ^ o];
    for (int i = 0; i < 32; ++i) l[i] = n[i];
  }
  return l[0];
}
template <typename T>
T block_sum_host(const T* v) {
  T w[32] = {};
  for (int wp = 0; wp < 8; ++wp) w[wp] = warp_sum_host(v + 32 * wp);
  return warp_sum_host(w);
}

// Partial (t, j, ks) as the kernels compute it.
double partial_host(const float* ht, const float* fn, int nmix, int64_t hd, int ksplit, int j, int ks) {
  const int64_t chunk = (hd + ksplit - 1) / ksplit, k0 = ks * chunk, k1 = std::min(k0 + chunk, hd);
  if (j < nmix) {
    const float* w = fn + j * hd;
    float acc[256];
    for (int i = 0; i < 256; ++i) {
      acc[i] = 0.0f;
      for (int64_t k = k0 + i; k < k1; k += 256) acc[i] = std::fmaf(ht[k], w[k], acc[i]);
    }
    return static_cast<double>(block_sum_host(acc));
  }
  double acc[256];
  for (int i = 0; i < 256; ++i) {
    acc[i] = 0.0;
    for (int64_t k = k0 + i; k < k1; k += 256) acc[i] += static_cast<double>(ht[k]) * ht[k];  // exact product
  }
  return block_sum_host(acc);
}

// Bit equality of two partial arrays; the first mismatch named as (token, row, slice).
::testing::AssertionResult same_partials(const std::vector<double>& got, const std::vector<double>& want, int nmix,
                                         int ksplit) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (dbits(got[i]) != dbits(want[i]) && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  const size_t per_t = static_cast<size_t>(nmix + 1) * ksplit;
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " partials differ; first: token "
                                       << first / per_t << " row " << (first % per_t) / ksplit << " slice "
                                       << first % ksplit << ": " << got[first] << " (0x" << std::hex
                                       << dbits(got[first]) << ") vs " << want[first] << " (0x" << dbits(want[first])
                                       << ")" << std::dec;
}

TEST(CudaHcMix, TiledEqualsRowsAndTheHostTreeBitForBit) {
  struct C {
    int64_t tokens;
    int nmix;
    int64_t hd;
    HcMixShape tiled;  // what a kTiled request runs
  };
  // hc 4 x 4096 (nmix 24: hc_pre; 4: hc_head) at decode and prefill counts (token counts off the
  // 16-token tile: 1, 5, 7, 97, 130, 4099); hd 6000 (1200-long slices: the 8 x 8 register tile);
  // hd 384 / 200 / 1000 / 202 (one slice, partly empty threads; nmix 7: a half-empty last row pair);
  // hc 16 x 4096 (slices of 4682: too long for the tile, kRows runs).
  const HcMixShape T = HcMixShape::kTiled, R = HcMixShape::kRows;
  const C cases[] = {{1, 24, 16384, T},  {5, 24, 16384, T},    {7, 24, 16384, T},   {96, 24, 16384, T},
                     {97, 24, 16384, T}, {4096, 24, 16384, T}, {4099, 24, 16384, T}, {130, 4, 16384, T},
                     {37, 48, 384, T},   {70, 24, 6000, T},    {20, 24, 6000, T},   {9, 8, 200, T},
                     {97, 7, 1000, T},   {9, 8, 202, T},       {3, 288, 65536, R}};
  uint64_t seed = 500;
  for (const C& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " nmix " << c.nmix << " hd " << c.hd);
    const int ksplit = cuda::hc_mix_ksplit(c.hd, c.nmix);
    std::vector<float> h = randn(static_cast<size_t>(c.tokens * c.hd), seed++, 1.0f, false);
    const std::vector<float> fn = randn(static_cast<size_t>(c.nmix * c.hd), seed++, 0.05f, false);
    if (c.tokens > 2) {
      h[1 * c.hd + 7] = std::numeric_limits<float>::quiet_NaN();  // token 1: NaN partials in one slice
      h[2 * c.hd + 3] = -0.0f;
    }
    // Host reference on sampled tokens.
    std::vector<int64_t> sample = {0, c.tokens / 2, c.tokens - 1};
    if (c.tokens > 2) sample.push_back(1);
    if (!have_gpu()) continue;
    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(fn);
    const size_t n = static_cast<size_t>(c.tokens) * (c.nmix + 1) * ksplit;
    std::vector<double> got[3];
    const HcMixShape shapes[3] = {HcMixShape::kRows, HcMixShape::kTiled, HcMixShape::kAuto};
    for (int s = 0; s < 3; ++s) {
      auto dp = poisoned<double>(n);
      const HcMixShape ran =
          cuda::hc_mix_partials(dh.get(), dfn.get(), c.tokens, c.nmix, c.hd, ksplit, dp.get(), kStream, shapes[s]);
      if (shapes[s] != HcMixShape::kAuto) {
        const HcMixShape want = shapes[s] == HcMixShape::kTiled ? c.tiled : HcMixShape::kRows;
        EXPECT_EQ(ran, want) << shape_name(shapes[s]) << " request ran " << shape_name(ran);
      }
      got[s] = to_host(dp);
    }
    EXPECT_TRUE(same_partials(got[1], got[0], c.nmix, ksplit)) << "tiled vs rows";
    EXPECT_TRUE(same_partials(got[2], got[0], c.nmix, ksplit)) << "auto vs rows";
    size_t checked = 0, bad = 0, nan = 0;
    for (int64_t t : sample)
      for (int j = 0; j <= c.nmix; ++j)
        for (int ks = 0; ks < ksplit; ++ks) {
          const double want = partial_host(h.data() + t * c.hd, fn.data(), c.nmix, c.hd, ksplit, j, ks);
          const double g = got[0][(static_cast<size_t>(t) * (c.nmix + 1) + j) * ksplit + ks];
          ++checked;
          if (std::isnan(want) && std::isnan(g)) {  // the GPU's NaN is canonical, the host's the input's
            ++nan;
            continue;
          }
          if (dbits(g) != dbits(want) && bad++ < 5)
            ADD_FAILURE() << "token " << t << " row " << j << " slice " << ks << ": GPU " << g << " host " << want;
        }
    EXPECT_EQ(bad, 0u) << "of " << checked << " sampled partials";
    if (c.tokens > 2) {
      EXPECT_GT(nan, 0u) << "token 1's NaN";
    }
    std::printf("[cuda hc_mix] tokens %lld nmix %d hd %lld ksplit %d: %zu partials equal in the three shapes, %zu "
                "sampled equal the host tree (%zu NaN)\n",
                static_cast<long long>(c.tokens), c.nmix, static_cast<long long>(c.hd), ksplit, n, checked - bad, nan);
    if (c.nmix == 24 && c.hd == 16384 && (c.tokens == 1 || c.tokens == 96 || c.tokens == 4099)) {
      auto dp = poisoned<double>(n);
      auto run = [&](HcMixShape s) {
        return median_us([&] {
          cuda::hc_mix_partials(dh.get(), dfn.get(), c.tokens, c.nmix, c.hd, ksplit, dp.get(), kStream, s);
        });
      };
      const double rows = run(HcMixShape::kRows), tiled = run(HcMixShape::kTiled), aut = run(HcMixShape::kAuto);
      std::printf("[cuda perf] hc mix partials %lld tokens, hc 4 x 4096: rows (the old shape) %.1f us, tiled %.1f us, "
                  "auto %.1f us (h %.1f MB: %.1f us at 4.3 TB/s)\n",
                  static_cast<long long>(c.tokens), rows, tiled, aut, h.size() * 4.0 / 1e6, h.size() * 4.0 / 4.3e6);
    }
  }
  TANDEM_REQUIRE_GPU();
}

// The tiled shape captured in a graph (launch_pdl inside capture) replays the eager bits.
TEST(CudaHcMix, TiledShapeCapturesInAGraph) {
  TANDEM_REQUIRE_GPU();
  const int64_t tokens = 200, hd = 16384;
  const int nmix = 24, ksplit = cuda::hc_mix_ksplit(hd, nmix);
  DeviceBuffer<float> dh = to_dev(randn(static_cast<size_t>(tokens * hd), 900, 1.0f, false));
  DeviceBuffer<float> dfn = to_dev(randn(static_cast<size_t>(nmix * hd), 901, 0.05f, false));
  const size_t n = static_cast<size_t>(tokens) * (nmix + 1) * ksplit;
  auto eager = poisoned<double>(n), graphed = poisoned<double>(n);
  cuda::hc_mix_partials(dh.get(), dfn.get(), tokens, nmix, hd, ksplit, eager.get(), kStream, HcMixShape::kAuto);
  sync();
  cudaStream_t st;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cuda::hc_mix_partials(dh.get(), dfn.get(), tokens, nmix, hd, ksplit, graphed.get(), st, HcMixShape::kAuto);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, st));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(st));
  EXPECT_TRUE(same_partials(to_host(graphed), to_host(eager), nmix, ksplit));
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(st));
}

// hc_pre_pack over a prefill chunk equals it run on single tokens (kRows mix, kSplit finish) for
// sampled tokens, in every output, at 97, 130 and 4099 tokens (the tiled mix, the one-CTA-per-token
// finish); and its time at 4099.
TEST(CudaHcPrefill, HcPrePackChunkEqualsSingleTokens) {
  TANDEM_REQUIRE_GPU();
  const int64_t D = 4096, nb = D / 128;
  const int hc = 4, nmix = (2 + hc) * hc;
  const int64_t HD = hc * D;
  for (const int64_t T : {int64_t{97}, int64_t{130}, int64_t{4099}}) {
    SCOPED_TRACE(::testing::Message() << "chunk of " << T << " tokens");
    std::vector<float> h = randn(static_cast<size_t>(T * HD), 960 + T, 1.0f, false);
    h[(T / 2) * HD + 77] = std::numeric_limits<float>::quiet_NaN();
    DeviceBuffer<float> dh = to_dev(h), dfn = to_dev(randn(static_cast<size_t>(nmix * HD), 961, 0.02f, false)),
                        dscale = to_dev(randu(3, 962, 0.5f, 2.0f)), dbase = to_dev(randn(nmix, 963, 0.5f, false)),
                        dw = to_dev(randn(static_cast<size_t>(D), 964, 0.5f, true));
    HcPreParams p;
    p.h = dh.get();
    p.fn = dfn.get();
    p.scale = dscale.get();
    p.base = dbase.get();
    p.hc = hc;
    p.dim = D;
    auto x = poisoned<float>(static_cast<size_t>(T * D)), post = poisoned<float>(static_cast<size_t>(T * hc)),
         comb = poisoned<float>(static_cast<size_t>(T * hc * hc));
    auto codes = poisoned<uint8_t>(static_cast<size_t>(T * D)), scales = poisoned<uint8_t>(static_cast<size_t>(T * nb));
    cuda::HcPrePackArgs k;
    k.norm_weight = dw.get();
    k.eps = 1e-6f;
    auto run = [&](int64_t t0, int64_t n, int64_t o) {  // tokens [t0, t0 + n) into rows [o, o + n)
      p.h = dh.get() + t0 * HD;
      p.tokens = n;
      p.x = x.get() + o * D;
      p.post = post.get() + o * hc;
      p.comb = comb.get() + o * hc * hc;
      k.codes = codes.get() + o * D;
      k.scales = scales.get() + o * nb;
      cuda::hc_pre_pack(p, k, kStream);
    };
    run(0, T, 0);
    const std::vector<float> cx = to_host(x), cpost = to_host(post), ccomb = to_host(comb);
    const std::vector<uint8_t> ccodes = to_host(codes), cscales = to_host(scales);
    for (int64_t t : {int64_t{0}, int64_t{1}, T / 2, T - 1}) {
      SCOPED_TRACE(::testing::Message() << "token " << t);
      run(t, 1, 0);  // row 0 of the buffers now holds token t alone
      auto row = [](const auto& v, int64_t w, int64_t r) {
        return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + r * w, v.begin() + (r + 1) * w);
      };
      const std::vector<float> sx = to_host(x), spost = to_host(post), scomb = to_host(comb);
      const std::vector<uint8_t> scodes = to_host(codes), sscales = to_host(scales);
      EXPECT_TRUE(same_bits(row(sx, D, 0), row(cx, D, t))) << "x";
      EXPECT_TRUE(same_bits(row(spost, hc, 0), row(cpost, hc, t))) << "post";
      EXPECT_TRUE(same_bits(row(scomb, hc * hc, 0), row(ccomb, hc * hc, t))) << "comb";
      EXPECT_TRUE(same_values(row(scodes, D, 0), row(ccodes, D, t))) << "codes";
      EXPECT_TRUE(same_values(row(sscales, nb, 0), row(cscales, nb, t))) << "scales";
    }
    if (T == 4099)
      std::printf("[cuda perf] hc_pre_pack %lld tokens, hc 4 x 4096: %.1f us (h %.0f MB: %.1f us at 4.3 TB/s)\n",
                  static_cast<long long>(T), median_us([&] { run(0, T, 0); }), h.size() * 4.0 / 1e6,
                  h.size() * 4.0 / 4.3e6);
  }
}

// hc_post (the float4 kernel) at a prefill chunk, in place, against the CPU op; and its time.
TEST(CudaHcPrefill, HcPostChunkMatchesCpuAndTimes) {
  const int64_t tokens = 4099, dim = 4096;
  const int hc = 4;
  std::vector<float> f = randn(static_cast<size_t>(tokens * dim), 950, 1.0f, true);
  std::vector<float> res = randn(static_cast<size_t>(tokens * hc * dim), 951, 1.0f, true);
  const std::vector<float> post = randu(static_cast<size_t>(tokens * hc), 952, 0.0f, 2.0f);
  const std::vector<float> comb = randu(static_cast<size_t>(tokens * hc * hc), 953, 0.0f, 1.0f);
  res[5 * hc * dim + 9] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> want = res;
  HcPostParams p;
  p.f = f.data();
  p.res = want.data();
  p.post = post.data();
  p.comb = comb.data();
  p.out = want.data();
  p.tokens = tokens;
  p.hc = hc;
  p.dim = dim;
  p.round_bf16 = true;
  cpu_ops().hc_post(p);
  if (!have_gpu()) GTEST_SKIP() << no_gpu_reason();
  DeviceBuffer<float> df = to_dev(f), dres = to_dev(res), dpost = to_dev(post), dcomb = to_dev(comb);
  p.f = df.get();
  p.res = dres.get();
  p.post = dpost.get();
  p.comb = dcomb.get();
  p.out = dres.get();
  cuda::hc_post(p, kStream);
#if !defined(__FMA__)  // hc_test.cpp's CudaHcPost holds an FMA host build to correct rounding instead
  EXPECT_TRUE(same_bits(to_host(dres), want));
#endif
  auto out = poisoned<float>(res.size());
  p.out = out.get();  // not in place, so each timed launch reads the same input
  const double us = median_us([&] { cuda::hc_post(p, kStream); });
  const double mb = (2.0 * res.size() + f.size()) * 4.0 / 1e6;
  std::printf("[cuda perf] hc_post %lld tokens, hc 4 x 4096: %.1f us (%.0f MB: %.1f us at 4.3 TB/s)\n",
              static_cast<long long>(tokens), us, mb, mb / 4.3e6 * 1e6);
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
