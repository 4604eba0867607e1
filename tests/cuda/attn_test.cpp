// The generic CUDA ops compress_pool / indexer_score / topk / sparse_attn against the CPU ops at the
// model's shapes (d 512 / 128, 64 index heads x 128, top-512, 64 heads x 512 over top-k + window)
// and odd ones. (The forward runs its own kernels for these jobs: compressor_test, indexer_test,
// attention_test.) topk must be identical (including its tie and NaN rules); indexer_score bit for
// bit on queries and keys whose dots are exact in fp32 (checked); compress_pool correctly rounded
// (bf16) or within its bound (fp32) against float64 (exp); sparse_attn, whose bf16 probabilities
// make every p an inner rounding, within the interval its probabilities' possible roundings and the
// fp32 errors allow (see sparse_ref).
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "cuda/model_kernel_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(CudaCompressPool, MatchesCpu) {
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
    // The reference per (entry, channel): the op's candidates (the previous block's first half with
    // overlap, then the block), scores fl(score + ape) as both sides form them.
    std::vector<double> ref, bound;
    for (int64_t e = 0; e < c.num_entries; ++e)
      for (int64_t ch = 0; ch < c.d; ++ch) {
        const int64_t j = c.first_entry + e;
        std::vector<double> sc, kvv;
        for (int cand = 0; cand < coff * c.ratio; ++cand) {
          int64_t row, choff;
          if (overlap && cand < c.ratio) {
            if (j == 0) continue;
            row = c.ratio * (j - 1) + cand - c.first_pos;
            choff = 0;
          } else {
            row = c.ratio * j + (overlap ? cand - c.ratio : cand) - c.first_pos;
            choff = overlap ? c.d : 0;
          }
          float sv = score[row * ld + choff + ch];
          if (c.ape) sv = sv + ape[((c.first_pos + row) % c.ratio) * coff * c.d + choff + ch];
          sc.push_back(sv);
          kvv.push_back(kv[row * ld + choff + ch]);
        }
        double w, b;
        pool_ref_values(sc, kvv, &w, &b);
        ref.push_back(w);
        bound.push_back(b);
      }
    auto check = [&](const std::vector<float>& out) {
      std::vector<float> v;
      for (int64_t e = 0; e < c.num_entries; ++e)
        for (int64_t ch = 0; ch < c.d; ++ch) v.push_back(out[e * ldo + ch]);
      return c.round ? correctly_rounded(v.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, bound.data())
                     : within(v, ref, bound);
    };
    EXPECT_TRUE(check(want)) << "the CPU's compress_pool";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dkv = to_dev(kv), ds = to_dev(score), da = to_dev(ape);
    auto dout = poisoned<float>(want.size());
    p.kv = dkv.get();
    p.score = ds.get();
    p.ape = c.ape ? da.get() : nullptr;
    p.out = dout.get();
    cuda::compress_pool(p, kStream);
    EXPECT_TRUE(check(to_host(dout)));
  }
  TANDEM_REQUIRE_GPU();
}

struct IdxCase {
  int64_t tokens, heads, dim, entries, ldk, lds;
  bool b16;
  std::vector<int32_t> visible;
};

TEST(CudaIndexerScore, MatchesCpuBitForBit) {
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
    // Queries and keys on a grid of k/16: every q.k dot is exact in fp32 (checked below), as the
    // forward's FP4 queries and keys are; then the bf16 roundings and the head sum in ascending order
    // are the same operations on the same values on both sides.
    std::vector<float> q = grid_values(static_cast<size_t>(c.tokens * c.heads * c.dim), seed++, 15, 16.0f);
    std::vector<float> k = grid_values(static_cast<size_t>(c.entries * ldk), seed++, 15, 16.0f);
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
    int64_t inexact = 0;
    std::vector<double> terms(static_cast<size_t>(c.dim));
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t e = 0; e < std::min<int64_t>(c.entries, c.visible[t]); ++e)
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t i = 0; i < c.dim; ++i)
            terms[i] = static_cast<double>(q[(t * c.heads + h) * c.dim + i]) * k[e * ldk + i];
          inexact += sum_bound(terms.data(), c.dim, 1.0) > 0;
        }
    ASSERT_EQ(inexact, 0) << "every q.k dot of the case must be exact in fp32";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dq = to_dev(q), dk = to_dev(k), dw = to_dev(w);
    DeviceBuffer<int32_t> dv = to_dev(c.visible);
    auto dsc = poisoned<float>(want.size());
    p.q = dq.get();
    p.k = dk.get();
    p.w = dw.get();
    p.visible = dv.get();
    p.scores = dsc.get();
    cuda::indexer_score(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dsc), want));
  }
  TANDEM_REQUIRE_GPU();
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

// The interval an fp32 evaluation of one (token, head) of sparse_attn (the reference kernel's
// blocked online softmax, SparseAttnParams) can land in, per output dim, from float64:
//  * a score s_i = (q . k_i) * scale is off by E_i = gamma(ds) * sum |q k_i| * scale + u |s_i|;
//  * e_i = exp(s_i - bm) (bm: the running max after i's block) by rho_i (both scores' errors, the
//    subtraction, expf: kExpRel); p_i = bf16(e_i) (b16) lies in bf16_range of e_i's interval;
//  * the rescaling of block b to the final max, F = exp(bm_b - m), by the alphas after b (each an
//    expf of a difference of two maxima, then a product);
//  * the value sum: the interval of sum_i p_i v_i F_i over p_i's range, widened by
//    gamma(acc_depth) * sum |p v F|; the denominator sum_i e_i F_i + exp(sink - m) by its terms'
//    errors and gamma(zd); the quotient's rounding u. A factor 1.25 widens every first-order term.
// No valid index: exactly 0.
void sparse_ref(const float* q, const float* kv, int64_t ldkv, const int32_t* idx, int64_t K, int64_t D, int blk,
                float scale, float sink, bool b16, double ds, double acc_depth, double* lo, double* hi) {
  std::vector<int64_t> pos;
  std::vector<double> s, err;
  double emax = 0;
  for (int64_t i = 0; i < K; ++i) {
    if (idx[i] < 0) continue;
    double d = 0, a = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double t = static_cast<double>(q[j]) * kv[idx[i] * ldkv + j];
      d += t;
      a += std::fabs(t);
    }
    pos.push_back(i);
    s.push_back(d * scale);
    err.push_back(1.25 * (gamma_n(ds) * a * scale + kU * std::fabs(d * scale)));
    emax = std::max(emax, err.back());
  }
  if (pos.empty()) {
    for (int64_t j = 0; j < D; ++j) lo[j] = hi[j] = 0;
    return;
  }
  const int64_t nblk = (K + blk - 1) / blk;
  // Running maxima after each block and the final one.
  std::vector<double> bm(static_cast<size_t>(nblk), -INFINITY);
  double m = -INFINITY;
  size_t at = 0;
  for (int64_t b = 0; b < nblk; ++b) {
    while (at < pos.size() && pos[at] < (b + 1) * blk) m = std::max(m, s[at++]);
    bm[b] = m;
  }
  // rhoF[b]: relative error of the rescaling of block b (the alphas after it: expf of the difference
  // of two fp32 maxima, and one product each).
  std::vector<double> rhoF(static_cast<size_t>(nblk), 0.0);
  for (int64_t b = nblk - 2; b >= 0; --b) {
    const double arg = bm[b] == -INFINITY ? 0 : std::fabs(bm[b] - bm[b + 1]);
    const double e = 2 * emax + kU * arg;
    rhoF[b] = rhoF[b + 1] + std::expm1(e) + kExpRel * (1 + std::expm1(e)) + 2 * kU;
  }
  const double mf = bm[nblk - 1];
  double z_lo = 0, z_hi = 0;
  std::vector<double> plo(pos.size()), phi(pos.size()), F(pos.size()), rf(pos.size());
  for (size_t k = 0; k < pos.size(); ++k) {
    const int64_t b = pos[k] / blk;
    const double x = s[k] - bm[b];
    const double e = err[k] + emax + kU * (std::fabs(x) + 2 * emax);
    const double rho = std::expm1(e) + kExpRel * (1 + std::expm1(e));
    const double ev = std::exp(x);
    F[k] = std::exp(bm[b] - mf);
    rf[k] = rhoF[b];
    plo[k] = ev * (1 - 1.25 * rho);
    phi[k] = ev * (1 + 1.25 * rho);
    z_lo += plo[k] * F[k] * (1 - 1.25 * rf[k]);
    z_hi += phi[k] * F[k] * (1 + 1.25 * rf[k]);
  }
  const double xs = sink - mf, es = emax + kU * (std::fabs(xs) + emax);
  const double rs = 1.25 * (std::expm1(es) + kExpRel * (1 + std::expm1(es)));
  const double zd = 1.25 * gamma_n(static_cast<double>(blk) + 2 * nblk + 2);
  z_lo = (z_lo + std::exp(xs) * (1 - rs)) * (1 - zd);
  z_hi = (z_hi + std::exp(xs) * (1 + rs)) * (1 + zd);
  for (int64_t j = 0; j < D; ++j) {
    double n_lo = 0, n_hi = 0, mag = 0;
    for (size_t k = 0; k < pos.size(); ++k) {
      const double v = kv[idx[pos[k]] * ldkv + j];
      // p's possible values: the bf16 roundings (b16) or the fp32 values of e's interval.
      double p_lo = plo[k], p_hi = phi[k];
      if (b16) std::tie(p_lo, p_hi) = bf16_range(plo[k], phi[k]);
      const double c1 = p_lo * v * F[k], c2 = p_hi * v * F[k];
      const double cmin = std::min(c1, c2), cmax = std::max(c1, c2);
      n_lo += cmin < 0 ? cmin * (1 + 1.25 * rf[k]) : cmin * (1 - 1.25 * rf[k]);
      n_hi += cmax < 0 ? cmax * (1 - 1.25 * rf[k]) : cmax * (1 + 1.25 * rf[k]);
      mag += p_hi * std::fabs(v) * F[k] * (1 + 1.25 * rf[k]);
    }
    const double acc = 1.25 * gamma_n(acc_depth) * mag;
    n_lo -= acc;
    n_hi += acc;
    double a = std::min(n_lo / z_lo, n_lo / z_hi), c = std::max(n_hi / z_lo, n_hi / z_hi);
    lo[j] = a - 1.25 * kU * std::fabs(a);
    hi[j] = c + 1.25 * kU * std::fabs(c);
  }
}

TEST(CudaSparseAttn, MatchesCpu) {
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
    // Each side's interval: its score depth and value-sum depth (the kernel: a lane's FMA chain of
    // dim/32 and a 5-level tree; one FMA chain over the keys; the CPU: its GEMM's depths).
    const float scale = c.scale > 0 ? c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim)));
    const int64_t nblk = c.topk > 0 ? (c.topk + c.block - 1) / c.block : 0;
    auto check = [&](const std::vector<float>& out, double ds, double acc_depth) -> ::testing::AssertionResult {
      std::vector<double> lo(static_cast<size_t>(c.dim)), hi(static_cast<size_t>(c.dim));
      for (int64_t t = 0; t < c.tokens; ++t)
        for (int64_t h = 0; h < c.heads; ++h) {
          sparse_ref(q.data() + t * qts + h * c.dim, kv.data(), ldkv, idx.data() + t * ldi, c.topk, c.dim, c.block,
                     scale, sink[h], c.b16, ds, acc_depth, lo.data(), hi.data());
          for (int64_t j = 0; j < c.dim; ++j) {
            const float g = out[t * ots + h * c.dim + j];
            const bool ok = c.b16 ? representable(g, Stored::kBf16) &&
                                        g >= lo[j] - 0.5 * ulp_of(lo[j], Stored::kBf16) &&
                                        g <= hi[j] + 0.5 * ulp_of(hi[j], Stored::kBf16)
                                  : g >= lo[j] && g <= hi[j];
            if (!ok)
              return ::testing::AssertionFailure() << "token " << t << " head " << h << " dim " << j << ": got " << g
                                                   << ", want " << (c.b16 ? "the bf16 rounding of a value in" : "in")
                                                   << " [" << lo[j] << ", " << hi[j] << "]";
          }
        }
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(check(want, cpu_gemm_depth(c.dim) + 1, cpu_gemm_depth(c.topk) + nblk + 2)) << "the CPU's sparse_attn";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dq = to_dev(q), dkv = to_dev(kv), dsink = to_dev(sink);
    DeviceBuffer<int32_t> didx = to_dev(idx);
    auto dout = poisoned<float>(want.size());
    p.q = dq.get();
    p.kv = dkv.get();
    p.idx = didx.get();
    p.sink = dsink.get();
    p.out = dout.get();
    cuda::sparse_attn(p, kStream);
    EXPECT_TRUE(check(to_host(dout), c.dim / 32.0 + 7, static_cast<double>(c.topk) + 2 * nblk + 2));
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
