// CUDA compress_pool / indexer_score / topk / sparse_attn against the CPU ops at the model's shapes
// (d 512 / 128, 64 index heads x 128, top-512, 64 heads x 512 over top-k + window) and odd ones.
// topk must be identical (including its tie and NaN rules); the others agree within their fp32 /
// bf16 rounding (bf16 roundings of nearly equal values may flip by one step).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(CudaCompressPool, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int ratio;
    int64_t d, first_entry, num_entries, first_pos, rows, ld, ldo;
    bool ape, round;
  };
  uint64_t seed = 1;
  for (const C& c : {C{4, 512, 0, 3, 0, 12, 0, 0, true, true},      // main KV, overlap, from the start
                     C{4, 128, 5, 2, 16, 12, 0, 0, true, true},     // indexer KV, later entries
                     C{4, 128, 9, 1, 32, 8, 260, 130, false, false},
                     C{128, 512, 1, 2, 128, 256, 0, 0, true, true},  // ratio 128, no overlap
                     C{2, 7, 3, 4, 6, 8, 9, 8, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "ratio " << c.ratio << " d " << c.d << " entries " << c.first_entry << "+"
                                    << c.num_entries);
    const bool overlap = c.ratio == 4;
    const int64_t coff = overlap ? 2 : 1;
    const int64_t ld = c.ld ? c.ld : coff * c.d, ldo = c.ldo ? c.ldo : c.d;
    std::vector<float> kv = randn(static_cast<size_t>(c.rows * ld), seed++, 1.0f, true);
    std::vector<float> score = randn(static_cast<size_t>(c.rows * ld), seed++, 2.0f, false);
    std::vector<float> ape = randn(static_cast<size_t>(c.ratio * coff * c.d), seed++, 0.5f, false);
    std::vector<float> want = poisoned_host<float>(static_cast<size_t>(c.num_entries * ldo));
    CompressPoolParams p;
    p.kv = kv.data();
    p.score = score.data();
    p.ape = c.ape ? ape.data() : nullptr;
    p.rows = c.rows;
    p.ld = c.ld;
    p.first_pos = c.first_pos;
    p.ratio = c.ratio;
    p.d = c.d;
    p.overlap = overlap;
    p.first_entry = c.first_entry;
    p.num_entries = c.num_entries;
    p.out = want.data();
    p.ldo = c.ldo;
    p.round_bf16 = c.round;
    cpu_ops().compress_pool(p);
    DeviceBuffer<float> dkv = to_dev(kv), ds = to_dev(score), da = to_dev(ape);
    auto dout = poisoned<float>(want.size());
    p.kv = dkv.get();
    p.score = ds.get();
    p.ape = c.ape ? da.get() : nullptr;
    p.out = dout.get();
    cuda::compress_pool(p, kStream);
    EXPECT_TRUE(close(to_host(dout), want, 4e-6, c.round ? 1.0 / 128 : 2e-6));
  }
}

struct IdxCase {
  int64_t tokens, heads, dim, entries, ldk, lds;
  bool b16;
  std::vector<int32_t> visible;
};

TEST(CudaIndexerScore, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  const IdxCase cases[] = {
      {3, 64, 128, 1000, 0, 0, true, {1000, 517, 0}},
      {2, 64, 128, 8192, 0, 0, true, {8192, 4001}},
      {2, 5, 37, 70, 40, 75, false, {70, 33}},
      {2, 100, 64, 90, 0, 0, true, {90, 64}},   // more heads than one pass
      {1, 64, 128, 31, 0, 0, false, {31}},
  };
  uint64_t seed = 100;
  for (const IdxCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << " dim " << c.dim << " entries "
                                    << c.entries);
    const int64_t ldk = c.ldk ? c.ldk : c.dim, lds = c.lds ? c.lds : c.entries;
    std::vector<float> q = randn(static_cast<size_t>(c.tokens * c.heads * c.dim), seed++, 1.0f, true);
    std::vector<float> k = randn(static_cast<size_t>(c.entries * ldk), seed++, 1.0f, true);
    std::vector<float> w = randn(static_cast<size_t>(c.tokens * c.heads), seed++, 0.01f, true);
    std::vector<float> want = poisoned_host<float>(static_cast<size_t>(c.tokens * lds));
    IndexerScoreParams p;
    p.q = q.data();
    p.k = k.data();
    p.w = w.data();
    p.visible = c.visible.data();
    p.tokens = c.tokens;
    p.heads = c.heads;
    p.dim = c.dim;
    p.entries = c.entries;
    p.ldk = c.ldk;
    p.scores = want.data();
    p.lds = c.lds;
    p.bf16_numerics = c.b16;
    cpu_ops().indexer_score(p);
    DeviceBuffer<float> dq = to_dev(q), dk = to_dev(k), dw = to_dev(w);
    DeviceBuffer<int32_t> dv = to_dev(c.visible);
    auto dsc = poisoned<float>(want.size());
    p.q = dq.get();
    p.k = dk.get();
    p.w = dw.get();
    p.visible = dv.get();
    p.scores = dsc.get();
    cuda::indexer_score(p, kStream);
    // Tolerance: bf16 flips of each term and of the total; fp32 order of the dots.
    std::vector<double> tol(want.size(), 0.0);
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t s = 0; s < std::min<int64_t>(c.entries, c.visible[t]); ++s) {
        double terms = 0, dots = 0;
        for (int64_t h = 0; h < c.heads; ++h) {
          double d = 0, da = 0;
          for (int64_t i = 0; i < c.dim; ++i) {
            const double a = q[(t * c.heads + h) * c.dim + i], b = k[s * ldk + i];
            d += a * b;
            da += std::fabs(a * b);
          }
          const double wh = std::fabs(w[t * c.heads + h]);
          terms += wh * std::max(d, 0.0);
          dots += wh * da;
        }
        const size_t o = static_cast<size_t>(t * lds + s);
        tol[o] = 2e-6 * dots + (c.b16 ? std::ldexp(terms + std::fabs(want[o]), -7) : 0.0);
      }
    EXPECT_TRUE(close(to_host(dsc), want, 1e-30, 1.0, &tol));
  }
}

struct TopkCase {
  int64_t rows, n, k, lds, ldo;
  int32_t offset;
  bool n_valid;
  int ties;  // 0 bf16 normals, 1 few distinct values, 2 all equal
};

TEST(CudaTopk, MatchesCpuExactly) {
  TANDEM_REQUIRE_GPU();
  const TopkCase cases[] = {
      {4, 8192, 512, 0, 520, 128, true, 0},   // indexer top-512 with visible counts
      {2, 65536, 512, 0, 0, 0, false, 1},     // heavy ties at the cut
      {1, 262144, 512, 0, 0, 7, false, 0},    // 1M-token context / 4
      {3, 100, 2048, 101, 0, 0, false, 0},    // k > n: all, sorted, then -1
      {2, 5, 3, 0, 0, 0, true, 2},
      {5, 1000, 1, 0, 0, 0, false, 1},
      {2, 3000, 4096, 0, 0, 0, false, 1},
  };
  uint64_t seed = 200;
  for (const TopkCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " n " << c.n << " k " << c.k << " ties " << c.ties);
    const int64_t lds = c.lds ? c.lds : c.n, ldo = c.ldo ? c.ldo : c.k;
    std::vector<float> s = randn(static_cast<size_t>(c.rows * lds), seed++, 1.0f, true);
    for (auto& v : s) {
      if (c.ties == 1) v = std::round(v * 2.0f) / 2.0f;
      if (c.ties == 2) v = 0.25f;
    }
    if (c.n >= 100) {
      s[3] = kNan;
      s[5] = kNan;
      s[7] = kInf;
      s[9] = -kInf;
      s[11] = -0.0f;
      s[12] = 0.0f;
    }
    std::vector<int32_t> nv(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) nv[r] = static_cast<int32_t>((r * 2654435761u) % (c.n + 1));
    if (c.rows >= 4) {
      nv[0] = static_cast<int32_t>(c.n);
      nv[1] = 0;
      nv[2] = static_cast<int32_t>(std::min<int64_t>(c.k - 1, c.n));
    }
    std::vector<int32_t> want = poisoned_host<int32_t>(static_cast<size_t>(c.rows * ldo), 0x5a);
    TopkParams p;
    p.scores = s.data();
    p.n_valid = c.n_valid ? nv.data() : nullptr;
    p.rows = c.rows;
    p.n = c.n;
    p.lds = c.lds;
    p.k = c.k;
    p.index_offset = c.offset;
    p.out = want.data();
    p.ldo = c.ldo;
    cpu_ops().topk(p);
    DeviceBuffer<float> ds = to_dev(s);
    DeviceBuffer<int32_t> dnv = to_dev(nv);
    auto dout = poisoned<int32_t>(want.size(), 0x5a);
    p.scores = ds.get();
    p.n_valid = c.n_valid ? dnv.get() : nullptr;
    p.out = dout.get();
    cuda::topk(p, kStream);
    EXPECT_TRUE(same_values(to_host(dout), want));
  }
}

struct AttnCase {
  int64_t tokens, heads, dim, kv_rows, ldkv, topk, ldi, qts, ots;
  int block;
  float scale;
  bool b16;
};

TEST(CudaSparseAttn, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  const AttnCase cases[] = {
      {2, 64, 512, 3000, 0, 640, 0, 0, 0, 64, 0.0f, true},   // top-512 + 128-token window
      {1, 64, 512, 200, 0, 128, 0, 0, 0, 64, 0.0f, true},
      {3, 5, 100, 90, 104, 70, 75, 5 * 100 + 3, 5 * 100 + 1, 16, 0.1f, false},
      {2, 2, 64, 10, 0, 0, 0, 0, 0, 64, 0.0f, true},          // no keys at all
  };
  uint64_t seed = 300;
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << " dim " << c.dim << " topk "
                                    << c.topk);
    const int64_t ldkv = c.ldkv ? c.ldkv : c.dim, ldi = c.ldi ? c.ldi : c.topk;
    const int64_t qts = c.qts ? c.qts : c.heads * c.dim, ots = c.ots ? c.ots : c.heads * c.dim;
    std::vector<float> q = randn(static_cast<size_t>(c.tokens * qts), seed++, 1.0f, true);
    std::vector<float> kv = randn(static_cast<size_t>(c.kv_rows * ldkv), seed++, 1.0f, true);
    std::vector<float> sink = randn(static_cast<size_t>(c.heads), seed++, 1.0f, false);
    std::vector<int32_t> idx(static_cast<size_t>(std::max<int64_t>(1, c.tokens * ldi)), -1);
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t i = 0; i < c.topk; ++i) {
        const uint64_t r = mix64(seed * 31 + t * 100003 + i);
        idx[t * ldi + i] = r % 9 == 0 ? -1 : static_cast<int32_t>(r % c.kv_rows);
      }
    if (c.tokens >= 3)
      for (int64_t i = 0; i < c.topk; ++i) idx[2 * ldi + i] = -1;  // a token with no valid index
    std::vector<float> want = poisoned_host<float>(static_cast<size_t>(c.tokens * ots));
    SparseAttnParams p;
    p.q = q.data();
    p.kv = kv.data();
    p.idx = idx.data();
    p.sink = sink.data();
    p.out = want.data();
    p.tokens = c.tokens;
    p.heads = c.heads;
    p.dim = c.dim;
    p.kv_rows = c.kv_rows;
    p.ldkv = c.ldkv;
    p.topk = c.topk;
    p.ldi = c.ldi;
    p.q_token_stride = c.qts;
    p.out_token_stride = c.ots;
    p.scale = c.scale;
    p.block = c.block;
    p.bf16_numerics = c.b16;
    cpu_ops().sparse_attn(p);
    DeviceBuffer<float> dq = to_dev(q), dkv = to_dev(kv), dsink = to_dev(sink);
    DeviceBuffer<int32_t> didx = to_dev(idx);
    auto dout = poisoned<float>(want.size());
    p.q = dq.get();
    p.kv = dkv.get();
    p.idx = didx.get();
    p.sink = dsink.get();
    p.out = dout.get();
    cuda::sparse_attn(p, kStream);
    // Tolerance: relative to sum_i p_i |kv_i| (double reference probabilities) per output element.
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.dim));
    std::vector<double> tol(want.size(), 0.0);
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t h = 0; h < c.heads; ++h) {
        std::vector<double> sc(static_cast<size_t>(c.topk));
        double m = -INFINITY;
        for (int64_t i = 0; i < c.topk; ++i) {
          const int32_t r = idx[t * ldi + i];
          if (r < 0) continue;
          double d = 0;
          for (int64_t j = 0; j < c.dim; ++j) d += static_cast<double>(q[t * qts + h * c.dim + j]) * kv[r * ldkv + j];
          sc[i] = d * scale;
          m = std::max(m, sc[i]);
        }
        if (m == -INFINITY) continue;
        double z = std::exp(sink[h] - m);
        for (int64_t i = 0; i < c.topk; ++i)
          if (idx[t * ldi + i] >= 0) z += std::exp(sc[i] - m);
        for (int64_t j = 0; j < c.dim; ++j) {
          double a = 0;
          for (int64_t i = 0; i < c.topk; ++i) {
            const int32_t r = idx[t * ldi + i];
            if (r >= 0) a += std::exp(sc[i] - m) / z * std::fabs(kv[r * ldkv + j]);
          }
          const size_t o = static_cast<size_t>(t * ots + h * c.dim + j);
          tol[o] = (c.b16 ? 1.0 / 128 : 2e-6) * a + (c.b16 ? std::ldexp(std::fabs(want[o]), -7) : 0.0);
        }
      }
    EXPECT_TRUE(close(to_host(dout), want, 1e-30, 1.0, &tol));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
