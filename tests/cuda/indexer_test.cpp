// The lightning indexer as the forward calls it (src/model/cuda/indexer.cu: tensor-core scores over
// the paged FP4 key records of each row's sequence) against the CPU forward's indexer
// (kernels::cpu::indexer_score over the sequence's keys, visible = (pos+1)/4), bit for bit: queries
// and keys are FP4 round trips (e2m1 x power-of-two block scales), so every product has at most 4
// significant bits and every q.k dot is exact in fp32 in any summation order (and through the
// tensor cores' truncating accumulation) whenever the block scales of one dot span fewer than 9
// binades (checked for every dot of the case); the bf16 roundings that follow and the head sum in
// ascending order are then the same operations on the same values. Several sequences per step
// (prefill from 0, decode late in a context, a row with nothing visible yet), the -inf columns past
// visibility, 64, 32 (one rank of TP=2) and 5 heads, one row per block and four (spans of one
// sequence sharing the key tiles). The forward's top-k after it (the indexer's
// histogram as pass 1) against kernels::cpu::topk on the CPU's scores. Also the weights'
// scale_round against model::scale_round_bf16, and the kernel's own weight scaling (w_scale, the
// forward's path) against scale_round then the kernel, bit for bit (also at verify sizes 6 and 96).
#include <cmath>
#include <cstdio>

#include "cuda/model_kernel_util.h"
#include "model/cuda/indexer.h"
#include "model/cuda/indexer_topk.h"
#include "model/math.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::IndexerArgs;
using cuda_model::ScaleRoundArgs;

// True when every partial sum of q[0..n) * k[0..n), in any order, is exact in fp32.
bool dot_exact_in_fp32(const float* q, const float* k, int64_t n) {
  std::vector<double> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<double>(q[i]) * k[i];
  return sum_bound(t.data(), n, 1.0) == 0.0;
}

TEST(CudaIndexerPaged, MatchesCpuBitForBit) {
  struct C {
    int heads, dim, bs;
    std::vector<SeqPlan> seqs;  // blocks cover the visible entries' positions
  };
  std::vector<C> cases;
  cases.push_back({64, 128, 256, {{0, 0, 9, {3}}, {1, 400, 3, {1, 0}}, {2, 1000, 1, {4, 2, 5, 6}}}});
  cases.push_back({5, 64, 16, {{0, 0, 2, {0}}, {1, 61, 6, {7, 1, 6, 2}}, {2, 30, 4, {3, 4}}}});
  // verify sizes: 6 rows (64 heads), 96 rows (one rank of TP=2: 32 heads)
  cases.push_back({64, 128, 256, {{1, 1100, 6, {4, 0, 2, 3, 1}}}});
  cases.push_back({32, 128, 256, {{0, 600, 96, {2, 0, 1}}}});
  {
    // one rank of TP=2 (32 heads), 10,000 positions: 2,500 entries (20 tiles of 128, top-512 of them)
    C c{32, 128, 256, {{0, 9990, 3, {}}, {1, 3000, 1, {}}}};
    int32_t nb = 0;
    for (SeqPlan& q : c.seqs)
      for (int64_t b = 0; b * 256 < q.start + q.len; ++b) q.blocks.push_back(nb++);
    cases.push_back(c);
  }
  uint64_t seed = 7;
  for (const C& c : cases) {
    DeviceStep st(c.seqs, c.bs);
    const int64_t rows = st.rows, H = c.heads, D = c.dim;
    const IndexKeyLayout kl = IndexKeyLayout::make(c.dim);
    int64_t nblocks = 0, max_vis = 0;
    for (const SeqPlan& q : c.seqs)
      for (int32_t b : q.blocks) nblocks = std::max<int64_t>(nblocks, b + 1);
    for (int64_t p : st.positions) max_vis = std::max<int64_t>(max_vis, (p + 1) / 4);
    const int64_t n_cols = max_vis + 37;  // the forward's bound can exceed every row's visibility
    const int64_t pool_idx = 24, block_bytes = pool_idx + (c.bs / 4) * kl.bytes + 8;
    SCOPED_TRACE(::testing::Message() << "heads " << H << " dim " << D << " rows " << rows << " columns " << n_cols);

    // Keys: an FP4 record per visible entry of each sequence; the CPU keeps the decoded values.
    std::vector<uint8_t> pool(static_cast<size_t>(nblocks * block_bytes));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(mix64(seed + i));
    std::vector<std::vector<float>> keys(c.seqs.size());
    for (size_t q = 0; q < c.seqs.size(); ++q) {
      const int64_t vmax = (c.seqs[q].start + c.seqs[q].len) / 4;
      for (int64_t e = 0; e < vmax; ++e) {
        const std::vector<float> x = randn(static_cast<size_t>(D), seed * 1000 + q * 100000 + e, 1.0f, true);
        const std::vector<uint8_t> rec = encode_index_key(x.data(), kl);
        const int64_t pos = 4 * e;
        std::memcpy(&pool[c.seqs[q].blocks[pos / c.bs] * block_bytes + pool_idx + ((pos % c.bs) / 4) * kl.bytes],
                    rec.data(), rec.size());
        for (int d = 0; d < D; ++d) keys[q].push_back(cuda_model::index_key_get(rec.data(), kl, d));
      }
    }
    // Queries: FP4 round trips per (row, head); head weights: bf16.
    std::vector<float> qv = randn(static_cast<size_t>(rows * H * D), seed + 1, 1.0f, true);
    for (int64_t i = 0; i < rows * H; ++i) index_key_round_trip(qv.data() + i * D, c.dim);
    // The last head repeats the first one's query with the opposite weight, 2^20 times larger than
    // the others: their terms cancel after the heads between them were added to the first, whose
    // low bits were lost there, so the heads' fp32 summation order shows in the score's bits.
    std::vector<float> w = randn(static_cast<size_t>(rows * H), seed + 2, 0.05f, true);
    if (H > 1)
      for (int64_t t = 0; t < rows; ++t) {
        std::copy_n(qv.data() + t * H * D, D, qv.data() + (t * H + H - 1) * D);
        w[t * H] = std::ldexp(w[t * H], 20);
        w[t * H + H - 1] = -w[t * H];
      }
    seed += 10;

    // CPU: per sequence, as attention_target runs it.
    std::vector<float> want(static_cast<size_t>(rows * n_cols), -std::numeric_limits<float>::infinity());
    std::vector<int32_t> want_vis(static_cast<size_t>(rows));
    int64_t inexact = 0, order_shows = 0;
    for (size_t q = 0; q < c.seqs.size(); ++q) {
      const SeqPlan& sp = c.seqs[q];
      const int64_t r0 = st.seq_row0[q], vmax = (sp.start + sp.len) / 4;
      std::vector<int32_t> vis(static_cast<size_t>(sp.len));
      for (int t = 0; t < sp.len; ++t) want_vis[r0 + t] = vis[t] = static_cast<int32_t>((sp.start + t + 1) / 4);
      if (vmax == 0) continue;
      std::vector<float> sc(static_cast<size_t>(sp.len * vmax));
      IndexerScoreParams p;
      p.q = qv.data() + r0 * H * D;
      p.k = keys[q].data();
      p.w = w.data() + r0 * H;
      p.visible = vis.data();
      p.tokens = sp.len;
      p.heads = H;
      p.dim = D;
      p.entries = vmax;
      p.scores = sc.data();
      p.bf16_numerics = true;
      cpu::indexer_score(p);
      for (int t = 0; t < sp.len; ++t)
        for (int64_t e = 0; e < vmax; ++e) {
          want[(r0 + t) * n_cols + e] = sc[t * vmax + e];
          std::vector<float> terms(static_cast<size_t>(H));
          for (int64_t h = 0; h < H; ++h) {
            const float* qh = qv.data() + ((r0 + t) * H + h) * D;
            inexact += !dot_exact_in_fp32(qh, keys[q].data() + e * D, D);
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qh[d]) * keys[q][e * D + d];
            const float rd = num::round_bf16(static_cast<float>(dot));
            terms[h] = num::round_bf16((rd > 0.0f ? rd : 0.0f) * w[(r0 + t) * H + h]);
          }
          // the same terms added in descending head order: does the order show in the bits?
          float up = 0.0f, down = 0.0f;
          for (int64_t h = 0; h < H; ++h) up += terms[h];
          for (int64_t h = H - 1; h >= 0; --h) down += terms[h];
          order_shows += e < vis[t] && num::f32_to_bf16(up) != num::f32_to_bf16(down);
        }
    }
    ASSERT_EQ(inexact, 0) << "the case must keep every q.k dot exact in fp32 (block scales within 9 binades)";
    if (H > 8) {
      EXPECT_GT(order_shows, 0) << "the case's scores must depend on the heads' summation order";
    }
    // The CPU's top-k of its scores (kernels::cpu::topk), as the ids the device returns: ascending.
    const int TK = 512;
    std::vector<int32_t> want_top(static_cast<size_t>(rows * TK), -1);
    {
      std::vector<int32_t> top(static_cast<size_t>(rows * TK));
      TopkParams tk;
      tk.scores = want.data();
      tk.n_valid = want_vis.data();
      tk.rows = rows;
      tk.n = n_cols;
      tk.k = TK;
      tk.out = top.data();
      cpu::topk(tk);
      for (int64_t t = 0; t < rows; ++t) {
        const int64_t kk = std::min<int64_t>(TK, want_vis[t]);
        std::vector<int32_t> sel(top.begin() + t * TK, top.begin() + t * TK + kk);
        std::sort(sel.begin(), sel.end());
        std::copy(sel.begin(), sel.end(), want_top.begin() + t * TK);
      }
    }
    if (!have_gpu()) continue;

    st.upload();
    DeviceBuffer<float> dq = to_dev(qv), dw = to_dev(w);
    DeviceBuffer<uint8_t> dpool = to_dev(pool);
    const int64_t lds = (n_cols + 7) / 8 * 8 + 8;
    auto dsc = poisoned<uint16_t>(static_cast<size_t>(rows * lds));
    auto dvis = poisoned<int32_t>(want_vis.size());
    DeviceBuffer<uint8_t> counters(cuda_model::topk_counters_bytes(rows));
    TANDEM_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
    DeviceBuffer<uint8_t> work(cuda_model::topk_work_bytes(rows, n_cols));
    const cuda_model::TopkState tst = cuda_model::topk_state(counters.get(), rows, work.get(), work.bytes());
    IndexerArgs ia;
    ia.q = dq.get();
    ia.w = dw.get();
    ia.m = st.meta;
    ia.rows = rows;
    ia.heads = c.heads;
    ia.dim = c.dim;
    ia.pool = dpool.get();
    ia.block_bytes = block_bytes;
    ia.pool_idx = pool_idx;
    ia.key = kl;
    ia.scores = dsc.get();
    ia.n_cols = n_cols;
    ia.lds = lds;
    ia.visible = dvis.get();
    ia.hist = tst.hist1;
    cuda_model::indexer_scores_paged(ia, kStream);
    const std::vector<uint16_t> got_bits = to_host(dsc);
    std::vector<float> got(want.size());
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t e = 0; e < n_cols; ++e) got[t * n_cols + e] = num::bf16_to_f32(got_bits[t * lds + e]);
    EXPECT_TRUE(same_bits(got, want));
    EXPECT_TRUE(same_values(to_host(dvis), want_vis));
    if (c.heads == 64) {
      IndexerArgs ip = ia;
      ip.hist = nullptr;
      std::printf("[cuda perf] indexer_scores_paged 64 x 128, %lld rows x %lld columns: %.1f us\n",
                  static_cast<long long>(rows), static_cast<long long>(n_cols),
                  median_us([&] { cuda_model::indexer_scores_paged(ip, kStream); }));
    }
    // rows of one sequence sharing the key tiles (2, 4 and 8 per block asked: 64 heads get 2, the
    // 128 query rows that fit; groups that straddle sequences run in spans), on the row-group kernel
    // and on the one-row kernel's spans (at most 4 rows): the same bits. A grid sized for one
    // multiprocessor (sm_count 1) makes each block walk several tiles (the row-group kernel loads
    // the next tile's records during the current one's products).
    for (const bool group : {true, false})
      for (const int rpb : {2, 4, 8})
        for (const int sms : {0, 1}) {
          SCOPED_TRACE(::testing::Message() << "sm_count " << sms);
          auto dsc4 = poisoned<uint16_t>(static_cast<size_t>(rows * lds));
          IndexerArgs i4 = ia;
          i4.scores = dsc4.get();
          i4.hist = nullptr;
          i4.rows_per_block = rpb;
          i4.group_kernel = group;
          i4.sm_count = sms;
          cuda_model::indexer_scores_paged(i4, kStream);
          const std::vector<uint16_t> bits4 = to_host(dsc4);
          std::vector<float> got4(want.size());
          for (int64_t t = 0; t < rows; ++t)
            for (int64_t e = 0; e < n_cols; ++e) got4[t * n_cols + e] = num::bf16_to_f32(bits4[t * lds + e]);
          EXPECT_TRUE(same_bits(got4, want))
              << rpb << " rows per block, " << (group ? "row-group" : "one-row") << " kernel";
        }
    // the head weights' scale applied by the kernel (IndexerArgs::w_scale, the forward's path) ==
    // scale_round on unscaled weights, then the kernel: the same score bits, 1 and 4 rows per block
    {
      const float wsc = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)) / std::sqrt(64.0));
      const std::vector<float> u = randn(static_cast<size_t>(rows * H), seed + 3, 3.0f, true);  // GEMM rows (bf16)
      DeviceBuffer<float> du = to_dev(u), dscaled = to_dev(u);
      cuda_model::scale_round(ScaleRoundArgs{dscaled.get(), rows * H, wsc}, kStream);
      for (int rpb : {0, 4}) {
        auto d_ref = poisoned<uint16_t>(static_cast<size_t>(rows * lds));
        auto d_got = poisoned<uint16_t>(static_cast<size_t>(rows * lds));
        IndexerArgs ir = ia;
        ir.hist = nullptr;
        ir.rows_per_block = rpb;
        ir.w = dscaled.get();
        ir.scores = d_ref.get();
        cuda_model::indexer_scores_paged(ir, kStream);
        IndexerArgs ig = ir;
        ig.w = du.get();
        ig.w_scale = wsc;
        ig.scores = d_got.get();
        cuda_model::indexer_scores_paged(ig, kStream);
        std::vector<uint16_t> r = to_host(d_ref), g = to_host(d_got);
        for (int64_t t = 0; t < rows; ++t) {  // the padding columns past n_cols are not written
          std::fill(r.begin() + t * lds + n_cols, r.begin() + (t + 1) * lds, uint16_t{0});
          std::fill(g.begin() + t * lds + n_cols, g.begin() + (t + 1) * lds, uint16_t{0});
        }
        EXPECT_TRUE(same_values(g, r, static_cast<size_t>(lds)))
            << "scores with w_scale vs scale_round then scores (record = row), rows per block " << rpb;
      }
    }
    // the forward's top-k, pass 1 from the indexer
    auto dtop = poisoned<int32_t>(static_cast<size_t>(rows * (TK + 3)));
    cuda_model::IndexerTopkArgs ta;
    ta.scores = dsc.get();
    ta.lds = lds;
    ta.n_cols = n_cols;
    ta.visible = dvis.get();
    ta.rows = rows;
    ta.k = TK;
    ta.out = dtop.get();
    ta.ldo = TK + 3;
    ta.state = tst;
    ta.hist_ready = true;
    cuda_model::indexer_topk(ta, kStream);
    const std::vector<int32_t> top_all = to_host(dtop);
    std::vector<int32_t> got_top(static_cast<size_t>(rows * TK));
    for (int64_t t = 0; t < rows; ++t)
      std::copy(top_all.begin() + t * (TK + 3), top_all.begin() + t * (TK + 3) + TK, got_top.begin() + t * TK);
    EXPECT_TRUE(same_values(got_top, want_top, TK)) << "top-k after the indexer";
    // the counters are left zero for the next call
    std::vector<uint8_t> left(counters.bytes());
    TANDEM_CUDA_CHECK(cudaMemcpy(left.data(), counters.get(), left.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(left.begin(), left.end(), 0), static_cast<std::ptrdiff_t>(left.size()));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaIndexerPaged, WeightScaleRoundMatchesCpuBitForBit) {
  for (int64_t n : {int64_t{64}, int64_t{5 * 64}, int64_t{1000}}) {
    const std::vector<float> x = randn(static_cast<size_t>(n), 40 + n, 3.0f, false);  // fp32 GEMM outputs
    const float scale = static_cast<float>(1.0 / std::sqrt(128.0) / std::sqrt(64.0));
    std::vector<float> want = x;
    model::scale_round_bf16(want.data(), n, scale);
    if (!have_gpu()) continue;
    DeviceBuffer<float> dx = to_dev(x);
    cuda_model::scale_round(ScaleRoundArgs{dx.get(), n, scale}, kStream);
    EXPECT_TRUE(same_bits(to_host(dx), want)) << "n " << n;
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
