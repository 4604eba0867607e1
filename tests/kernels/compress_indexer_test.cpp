// compress_pool (ratio 4 overlap, ratio 128, ape, j = 0), indexer_score and topk (ties, NaN,
// visibility, offsets).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::bf16d;
using testing::close;
using testing::randn;

// Naive reference of spec 6.3 for entry j: candidates listed explicitly.
std::vector<double> ref_pool(const std::vector<float>& kv, const std::vector<float>& sc, const std::vector<float>* ape,
                             int64_t first_pos, int ratio, int64_t d, int64_t j, bool round) {
  const bool overlap = ratio == 4;
  const int64_t coff = overlap ? 2 : 1, ld = coff * d;
  std::vector<double> out(d);
  for (int64_t c = 0; c < d; ++c) {
    std::vector<std::pair<double, double>> cand;  // (score, kv)
    auto add = [&](int64_t pos, int64_t col) {
      const int64_t r = pos - first_pos;
      double s = sc[r * ld + col];
      if (ape) s += (*ape)[(pos % ratio) * ld + col];
      cand.push_back({s, kv[r * ld + col]});
    };
    if (overlap) {
      if (j > 0)
        for (int i = 0; i < ratio; ++i) add(ratio * (j - 1) + i, c);
      for (int i = 0; i < ratio; ++i) add(ratio * j + i, d + c);
    } else {
      for (int i = 0; i < ratio; ++i) add(ratio * j + i, c);
    }
    double m = -INFINITY, z = 0, acc = 0;
    for (auto& [s, v] : cand) m = std::max(m, s);
    for (auto& [s, v] : cand) z += std::exp(s - m);
    for (auto& [s, v] : cand) acc += std::exp(s - m) / z * v;
    out[c] = round ? bf16d(acc) : acc;
  }
  return out;
}

TEST(CompressPool, Ratio4OverlapFromFirstBlock) {
  const int ratio = 4;
  const int64_t d = 24, rows = 20;  // positions 0..19 -> entries 0..4
  auto kv = randn(rows * 2 * d, 1);
  auto sc = randn(rows * 2 * d, 2, 2.0f, false);
  auto ape = randn(ratio * 2 * d, 3, 1.0f, false);
  std::vector<float> out(5 * d);
  CompressPoolParams p;
  p.kv = kv.data();
  p.score = sc.data();
  p.ape = ape.data();
  p.rows = rows;
  p.first_pos = 0;
  p.ratio = ratio;
  p.d = d;
  p.overlap = true;
  p.first_entry = 0;
  p.num_entries = 5;
  p.out = out.data();
  p.round_bf16 = false;
  cpu::compress_pool(p);
  std::vector<double> want;
  for (int64_t j = 0; j < 5; ++j) {
    auto w = ref_pool(kv, sc, &ape, 0, ratio, d, j, false);
    want.insert(want.end(), w.begin(), w.end());
  }
  EXPECT_TRUE(close(out, want, 1e-6, 1e-5));
}

TEST(CompressPool, Ratio4MidSequenceWindowAndBf16) {
  // Rows start at position 36 (block 9):
  // entries 10..12 need blocks 9..12 = positions 36..51.
  const int ratio = 4;
  const int64_t d = 16, first_pos = 36, rows = 16;
  auto kv = randn(rows * 2 * d, 4);
  auto sc = randn(rows * 2 * d, 5, 3.0f, false);
  std::vector<float> out(3 * 20);
  CompressPoolParams p;
  p.kv = kv.data();
  p.score = sc.data();
  p.rows = rows;
  p.first_pos = first_pos;
  p.ratio = ratio;
  p.d = d;
  p.first_entry = 10;
  p.num_entries = 3;
  p.out = out.data();
  p.ldo = 20;
  cpu::compress_pool(p);
  for (int64_t e = 0; e < 3; ++e) {
    // The pooled value is stored as bf16: correctly rounded from the exact softmax-weighted sum, up
    // to the fp32 error of exp and the weighted sum (a few fp32 ulps of max |kv|).
    auto w = ref_pool(kv, sc, nullptr, first_pos, ratio, d, 10 + e, false);
    std::vector<float> g(out.begin() + e * 20, out.begin() + e * 20 + d);
    double kmax = 0;
    for (float v : kv) kmax = std::max(kmax, double(std::fabs(v)));
    std::vector<double> err(d, 2e-6 * kmax);
    EXPECT_TRUE(testing::correctly_rounded(g, w, testing::Stored::kBf16, 0.0, &err)) << "entry " << e;
  }
}

TEST(CompressPool, Ratio128Plain) {
  const int ratio = 128;
  const int64_t d = 8, rows = 256;
  auto kv = randn(rows * d, 6);
  auto sc = randn(rows * d, 7, 4.0f, false);
  sc[5 * d + 2] = 80.0f;  // one dominating score: softmax ~ one-hot
  auto ape = randn(ratio * d, 8, 0.5f, false);
  std::vector<float> out(2 * d);
  CompressPoolParams p;
  p.kv = kv.data();
  p.score = sc.data();
  p.ape = ape.data();
  p.rows = rows;
  p.ratio = ratio;
  p.d = d;
  p.overlap = false;
  p.num_entries = 2;
  p.out = out.data();
  p.round_bf16 = false;
  cpu::compress_pool(p);
  std::vector<double> want;
  for (int64_t j = 0; j < 2; ++j) {
    auto w = ref_pool(kv, sc, &ape, 0, ratio, d, j, false);
    want.insert(want.end(), w.begin(), w.end());
  }
  EXPECT_TRUE(close(out, want, 1e-6, 1e-5));
  EXPECT_NEAR(out[2], kv[5 * d + 2], 1e-5);
}

TEST(IndexerScore, MatchesReferenceWithBf16RoundingAndMask) {
  const int64_t T = 3, H = 8, D = 32, S = 70;
  auto q = randn(T * H * D, 9);
  auto k = randn(S * D, 10);
  auto w = randn(T * H, 11, 0.1f);
  int32_t vis[3] = {70, 1, 33};
  for (int b16 = 0; b16 < 2; ++b16) {
    std::vector<float> s(T * S);
    IndexerScoreParams p;
    p.q = q.data();
    p.k = k.data();
    p.w = w.data();
    p.visible = vis;
    p.tokens = T;
    p.heads = H;
    p.dim = D;
    p.entries = S;
    p.scores = s.data();
    p.bf16_numerics = b16;
    cpu::indexer_score(p);
    std::vector<double> want(T * S);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < S; ++e) {
        if (e >= vis[t]) {
          want[t * S + e] = -INFINITY;
          continue;
        }
        double tot = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += double(q[(t * H + h) * D + i]) * k[e * D + i];
          if (b16) dot = bf16d(dot);
          double term = std::max(dot, 0.0) * w[t * H + h];
          if (b16) term = bf16d(term);
          tot += term;
        }
        want[t * S + e] = tot;
      }
    if (b16) {
      // Each dot and term rounded to bf16 as above (float64 dot: no fp32 midpoint straddles for these
      // inputs), the final sum stored as bf16: within half a bf16 ulp of the sum of the rounded terms.
      std::vector<double> err(T * S, 0.0);
      for (int64_t i = 0; i < T * S; ++i) err[i] = 1e-6 * std::fabs(want[i]);
      EXPECT_TRUE(testing::correctly_rounded(s, want, testing::Stored::kBf16, 0.0, &err));
    } else {
      EXPECT_TRUE(close(s, want, 1e-5, 1e-5));
    }
  }
}

TEST(IndexerScore, ManyTokensChunksAndStridedKeys) {
  // 70 tokens (two token groups of the GEMM), 1100 entries (three entry chunks), ldk > dim.
  const int64_t T = 70, H = 8, D = 16, S = 1100, ldk = 20;
  auto q = randn(T * H * D, 19);
  auto k = randn(S * ldk, 20);
  auto w = randn(T * H, 21, 0.1f);
  std::vector<int32_t> vis(T);
  for (int64_t t = 0; t < T; ++t) vis[t] = static_cast<int32_t>((t * 37) % (S + 1));
  std::vector<float> s(T * S);
  IndexerScoreParams p;
  p.q = q.data();
  p.k = k.data();
  p.ldk = ldk;
  p.w = w.data();
  p.visible = vis.data();
  p.tokens = T;
  p.heads = H;
  p.dim = D;
  p.entries = S;
  p.scores = s.data();
  cpu::indexer_score(p);
  std::vector<double> want(T * S);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < S; ++e) {
      if (e >= vis[t]) {
        want[t * S + e] = -INFINITY;
        continue;
      }
      double tot = 0;
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < D; ++i) dot += double(q[(t * H + h) * D + i]) * k[e * ldk + i];
        tot += bf16d(std::max(bf16d(dot), 0.0) * w[t * H + h]);
      }
      want[t * S + e] = bf16d(tot);
    }
  EXPECT_TRUE(close(s, want, 1e-5, 2e-2));
}

TEST(Topk, OrderTiesNanValidityAndOffset) {
  // Row 0: ties at the cut; row 1: NaN and fewer valid than k; row 2: k > n.
  const int64_t n = 8;
  std::vector<float> s = {1, 5, 3, 5, 2, 5, 0, -1,                                  //
                          std::nanf(""), 4, -INFINITY, 9, 1, 1, 1, 1,               //
                          0.5f, 0.25f, 0.5f, 0.1f, 0.2f, 0.3f, 0.4f, 0.0f};
  int32_t nvalid[3] = {8, 3, 8};
  std::vector<int32_t> out(3 * 10, 77);
  TopkParams p;
  p.scores = s.data();
  p.n_valid = nvalid;
  p.rows = 3;
  p.n = n;
  p.k = 2;
  p.index_offset = 100;
  p.out = out.data();
  p.ldo = 10;
  cpu::topk(p);
  EXPECT_EQ(out[0], 101);
  EXPECT_EQ(out[1], 103);  // ties 1, 3, 5 -> lowest two indices
  EXPECT_EQ(out[10], 100);  // NaN first
  EXPECT_EQ(out[11], 101);
  p.k = 5;
  cpu::topk(p);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 5), (std::vector<int32_t>{101, 103, 105, 102, 104}));
  EXPECT_EQ(std::vector<int32_t>(out.begin() + 10, out.begin() + 15), (std::vector<int32_t>{100, 101, 102, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(out.begin() + 20, out.begin() + 25), (std::vector<int32_t>{100, 102, 106, 105, 101}));
  EXPECT_EQ(out[5], 77);  // past ldo's k columns untouched
}

TEST(Topk, LargeRandomMatchesSort) {
  const int64_t n = 5000, k = 512;
  auto s = randn(2 * n, 12);  // bf16 values: many exact ties
  std::vector<int32_t> out(2 * k);
  TopkParams p;
  p.scores = s.data();
  p.rows = 2;
  p.n = n;
  p.k = k;
  p.out = out.data();
  cpu::topk(p);
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<int32_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<int32_t>(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[r * n + a] > s[r * n + b]; });
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(out[r * k + i], idx[i]) << r << "," << i;
  }
}

}  // namespace
}  // namespace tandem::kernels
