// sparse_attn against (a) exact float64 softmax-with-sink and (b) a float64 emulation of the
// reference kernel's blocked bf16 numerics; masked entries, ragged blocks, duplicates, empty rows.
#include <gtest/gtest.h>

#include <cmath>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::bf16d;
using testing::close;
using testing::randn;

struct Case {
  int64_t T, H, D, N, topk;
  std::vector<float> q, kv, sink;
  std::vector<int32_t> idx;
};

Case make_case(int64_t T, int64_t H, int64_t D, int64_t N, int64_t topk, uint64_t seed) {
  Case c{T, H, D, N, topk, randn(T * H * D, seed, 1.0f), randn(N * D, seed + 1, 1.0f), randn(H, seed + 2, 1.0f), {}};
  // Make later kv rows score higher so the running max changes between blocks.
  for (int64_t r = 0; r < N; ++r)
    for (int64_t d = 0; d < D; ++d) c.kv[r * D + d] = num::round_bf16(c.kv[r * D + d] * (1.0f + 3.0f * r / N));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  c.idx.resize(T * topk);
  for (auto& v : c.idx) v = static_cast<int32_t>(rng() % N);
  return c;
}

std::vector<double> exact(const Case& c, float scale) {
  std::vector<double> out(c.T * c.H * c.D, 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      std::vector<double> s;
      std::vector<int32_t> rows;
      for (int64_t i = 0; i < c.topk; ++i) {
        const int32_t r = c.idx[t * c.topk + i];
        if (r < 0) continue;
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d) dot += double(c.q[(t * c.H + h) * c.D + d]) * c.kv[r * c.D + d];
        s.push_back(dot * scale);
        rows.push_back(r);
      }
      if (s.empty()) continue;
      double m = *std::max_element(s.begin(), s.end());
      double z = std::exp(c.sink[h] - m);
      for (double v : s) z += std::exp(v - m);
      for (size_t i = 0; i < s.size(); ++i)
        for (int64_t d = 0; d < c.D; ++d) out[(t * c.H + h) * c.D + d] += std::exp(s[i] - m) / z * c.kv[rows[i] * c.D + d];
    }
  return out;
}

// The kernel's algorithm in double: blocks of `blk` list positions, running max, bf16 p for P.V.
std::vector<double> blocked(const Case& c, float scale, int64_t blk, bool round_out = true) {
  std::vector<double> out(c.T * c.H * c.D, 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      double m = -INFINITY, l = 0;
      std::vector<double> acc(c.D, 0.0);
      for (int64_t b0 = 0; b0 < c.topk; b0 += blk) {
        const int64_t bn = std::min(blk, c.topk - b0);
        std::vector<double> s(bn, -INFINITY);
        double bm = m;
        for (int64_t i = 0; i < bn; ++i) {
          const int32_t r = c.idx[t * c.topk + b0 + i];
          if (r < 0) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += double(c.q[(t * c.H + h) * c.D + d]) * c.kv[r * c.D + d];
          s[i] = dot * scale;
          bm = std::max(bm, s[i]);
        }
        const double alpha = m == -INFINITY ? 0.0 : std::exp(m - bm);
        double bs = 0;
        for (int64_t d = 0; d < c.D; ++d) acc[d] *= alpha;
        for (int64_t i = 0; i < bn; ++i) {
          const int32_t r = c.idx[t * c.topk + b0 + i];
          if (r < 0) continue;
          const double e = std::exp(s[i] - bm);
          bs += e;
          const double pb = bf16d(e);
          for (int64_t d = 0; d < c.D; ++d) acc[d] += pb * c.kv[r * c.D + d];
        }
        l = l * alpha + bs;
        m = bm;
      }
      if (m == -INFINITY) continue;
      const double z = l + std::exp(c.sink[h] - m);
      for (int64_t d = 0; d < c.D; ++d) out[(t * c.H + h) * c.D + d] = round_out ? bf16d(acc[d] / z) : acc[d] / z;
    }
  return out;
}

std::vector<float> run(const Case& c, bool b16, float scale = 0.0f, int block = 64) {
  std::vector<float> out(c.T * c.H * c.D, 123.0f);
  SparseAttnParams p;
  p.q = c.q.data();
  p.kv = c.kv.data();
  p.idx = c.idx.data();
  p.sink = c.sink.data();
  p.out = out.data();
  p.tokens = c.T;
  p.heads = c.H;
  p.dim = c.D;
  p.kv_rows = c.N;
  p.topk = c.topk;
  p.scale = scale;
  p.block = block;
  p.bf16_numerics = b16;
  cpu::sparse_attn(p);
  return out;
}

TEST(SparseAttn, ExactSoftmaxWithSink) {
  Case c = make_case(3, 16, 64, 300, 130, 1);  // ragged last block (130 = 64 + 64 + 2)
  c.idx[5] = -1;
  c.idx[70] = -1;
  c.idx[c.topk + 3] = c.idx[c.topk + 4];  // duplicate key counts twice
  const float scale = 1.0f / 8.0f;
  auto got = run(c, false);
  EXPECT_TRUE(close(got, exact(c, scale), 1e-6, 1e-5));
}

TEST(SparseAttn, Bf16BlockedNumericsMatchKernelEmulation) {
  Case c = make_case(2, 64, 512, 700, 640, 2);  // full-size head count and dim, window + 512
  for (int64_t i = 0; i < 90; ++i) c.idx[i * 7 % 640] = -1;
  const float scale = static_cast<float>(1.0 / std::sqrt(512.0));
  auto got = run(c, true);
  // Against the emulation before its final rounding: the output is bf16 and within half a bf16 ulp
  // (plus fp32 accumulation error); an fp32 exp that straddles a bf16 midpoint of one p moves a
  // head's outputs by a fraction of an ulp, so 1 in 1000 outputs may sit past the half ulp.
  const auto pre = blocked(c, scale, 64, false);
  double kmax = 0;
  for (float v : c.kv) kmax = std::max(kmax, double(std::fabs(v)));
  std::vector<double> err(pre.size(), 2e-6 * kmax);
  EXPECT_TRUE(testing::correctly_rounded(got.data(), pre.data(), got.size(), testing::Stored::kBf16, 0.0, err.data(),
                                         nullptr, got.size() / 1000));
  // And close to exact attention: bf16 probabilities carry 2^-9 relative error per term, so the
  // absolute error scales with sum_i p_i |v_i| rather than with |o|.
  const auto ex = exact(c, scale);
  EXPECT_TRUE(close(got.data(), ex.data(), ex.size(), 1e-2, 2e-2, nullptr, 0.99999));
}

TEST(SparseAttn, AllMaskedRowIsZeroAndOthersUnaffected) {
  Case c = make_case(2, 4, 32, 50, 70, 3);
  for (int64_t i = 0; i < c.topk; ++i) c.idx[i] = -1;  // token 0: nothing visible
  auto got = run(c, false, 0.3f, 16);
  for (int64_t i = 0; i < c.H * c.D; ++i) ASSERT_EQ(got[i], 0.0f);
  EXPECT_TRUE(close(got, exact(c, 0.3f), 1e-6, 1e-5));
}

TEST(SparseAttn, MaskedLeadingBlockThenValid) {
  // The first whole block is -1: the kernel must not produce NaN from exp(-inf - -inf).
  Case c = make_case(1, 2, 16, 40, 40, 4);
  for (int64_t i = 0; i < 16; ++i) c.idx[i] = -1;
  auto got = run(c, false, 0.25f, 16);
  for (float v : got) ASSERT_FALSE(std::isnan(v));
  EXPECT_TRUE(close(got, exact(c, 0.25f), 1e-6, 1e-5));
}

TEST(SparseAttn, RowIndependentOfBatchAndThreads) {
  Case c = make_case(5, 16, 64, 300, 200, 7);
  auto all = run(c, true);
  cpu::set_num_threads(1);
  Case one = c;
  one.T = 1;
  one.q.assign(c.q.begin() + 3 * 16 * 64, c.q.begin() + 4 * 16 * 64);
  one.idx.assign(c.idx.begin() + 3 * 200, c.idx.begin() + 4 * 200);
  auto single = run(one, true);
  cpu::set_num_threads(0);
  EXPECT_TRUE(testing::bits_equal(single.data(), all.data() + 3 * 16 * 64, 16 * 64));
}

TEST(SparseAttn, NanInKeyPropagatesOnlyWhereUsed) {
  Case c = make_case(2, 2, 16, 20, 4, 5);
  c.idx = {0, 1, 2, 3, 4, 5, 6, 7};
  c.kv[6 * 16 + 3] = std::nanf("");
  auto got = run(c, false, 0.25f);
  for (int64_t i = 0; i < 2 * 16; ++i) EXPECT_FALSE(std::isnan(got[i]));
  bool any = false;
  for (int64_t i = 2 * 16; i < 4 * 16; ++i) any |= std::isnan(got[i]);
  EXPECT_TRUE(any);
}

}  // namespace
}  // namespace tandem::kernels
