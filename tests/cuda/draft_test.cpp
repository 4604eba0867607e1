// The runner's small kernels and DSpark's Markov head (src/model/cuda/embed.cu, draft.cu) against
// the CPU model, all bit for bit: the embedding rows (model::LinearW::row into every stream; a
// tensor-parallel rank's vocabulary rows and replicate_hc), the
// taps (model::taps_mean), the draft block's ids and positions (draft_propose), the Markov head's
// gather (LinearW::row of markov_w1) and step: the corrected logits z = base + bias, the raw
// confidence (model::dot over [y, e], the kernel summing in model::dot's order), the drafted token
// (greedy: the CPU RowSampler's argmax; sampled: RowSampler's inverse-CDF draw with the same
// rng_uniform key) and the draft distribution q (within one fp32 rounding of the double softmax).
#include <cstdio>
#include <cstring>

#include "cuda/model_kernel_util.h"
#include "kernels/cpu/sampling.h"
#include "kernels/sampling.h"
#include "model/cuda/draft.h"
#include "model/cuda/embed.h"
#include "model/math.h"
#include "model/weights.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::BlockPositionsArgs;
using cuda_model::DraftBlockIdsArgs;
using cuda_model::EmbedArgs;
using cuda_model::IotaPositionsArgs;
using cuda_model::MarkovGatherArgs;
using cuda_model::MarkovStepArgs;
using cuda_model::TapsMeanArgs;

// A host weight [n, k] in bf16 or fp32 as a model::LinearW (the CPU's row()).
struct DenseWeight {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  model::LinearW lin;
  DenseWeight(WeightFormat f, int64_t n, int64_t k, uint64_t seed) {
    const std::vector<float> v = randn(static_cast<size_t>(n * k), seed, 0.5f, f == WeightFormat::kBf16);
    lin.out = n;
    lin.in = k;
    lin.w.format = f;
    lin.w.n = n;
    lin.w.k = k;
    if (f == WeightFormat::kBf16) {
      for (float x : v) bf16.push_back(num::f32_to_bf16(x));
      lin.w.data = bf16.data();
    } else {
      f32 = v;
      lin.w.data = f32.data();
    }
  }
  const void* data() const { return bf16.empty() ? static_cast<const void*>(f32.data()) : bf16.data(); }
  size_t bytes() const { return bf16.empty() ? f32.size() * 4 : bf16.size() * 2; }
};

DeviceBuffer<uint8_t> upload_weight(const DenseWeight& w) {
  const uint8_t* p = static_cast<const uint8_t*>(w.data());
  return to_dev(std::vector<uint8_t>(p, p + w.bytes()));
}

TEST(CudaEmbed, RowsMatchCpuBitForBit) {
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kF32}) {
    const int64_t V = 1000, D = 384, rows = 9;
    const int hc = 4;
    const DenseWeight w(f, V, D, 11);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<int32_t>(mix64(r + 5) % V);
    ids[0] = 0;
    ids[1] = static_cast<int32_t>(V - 1);
    // The CPU: embed_rows, then the row copied into every stream (forward / draft_propose).
    std::vector<float> want(static_cast<size_t>(rows * hc * D));
    for (int64_t r = 0; r < rows; ++r) {
      w.lin.row(ids[r], want.data() + r * hc * D);
      for (int k = 1; k < hc; ++k) std::copy_n(want.begin() + r * hc * D, D, want.begin() + (r * hc + k) * D);
    }
    if (!have_gpu()) continue;
    DeviceBuffer<uint8_t> dw = upload_weight(w);
    DeviceBuffer<int32_t> did = to_dev(ids);
    auto dh = poisoned<float>(want.size());
    WeightRef ref = w.lin.w;
    ref.data = dw.get();
    cuda_model::embed_rows(EmbedArgs{ref, did.get(), rows, hc, D, dh.get()}, kStream);
    EXPECT_TRUE(same_bits(to_host(dh), want)) << (f == WeightFormat::kBf16 ? "bf16" : "f32");
  }
  TANDEM_REQUIRE_GPU();
}

// Vocabulary-parallel embedding (two ranks of 500 rows each, as DsV4Model::Impl::embed_rows under
// tensor parallelism): each rank's rows hold its ids' embedding rows and zeros for the others', in
// one stream; their fp32 sum, spread by replicate_hc, is the unsharded embedding bit for bit.
TEST(CudaEmbed, VocabularyParallelRowsAndReplicate) {
  const int64_t V = 1000, D = 384, rows = 11, per = V / 2;
  const int hc = 4;
  const DenseWeight w(WeightFormat::kBf16, V, D, 13);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<int32_t>(mix64(r + 9) % V);
  ids[0] = 0;
  ids[1] = static_cast<int32_t>(per - 1);
  ids[2] = static_cast<int32_t>(per);
  ids[3] = static_cast<int32_t>(V - 1);
  std::vector<float> full(static_cast<size_t>(rows * D)), want_h(static_cast<size_t>(rows * hc * D));
  for (int64_t r = 0; r < rows; ++r) {
    w.lin.row(ids[r], full.data() + r * D);
    for (int k = 0; k < hc; ++k) std::copy_n(full.begin() + r * D, D, want_h.begin() + (r * hc + k) * D);
  }
  TANDEM_REQUIRE_GPU();
  DeviceBuffer<uint8_t> dw = upload_weight(w);
  DeviceBuffer<int32_t> did = to_dev(ids);
  std::vector<float> sum(full.size(), 0.0f);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    WeightRef ref = w.lin.w;
    ref.data = dw.get();
    ref = ref.rows(rank * per, per);  // the rank's shard: rows [rank * per, (rank + 1) * per)
    auto dx = poisoned<float>(full.size());
    EmbedArgs e{ref, did.get(), rows, 1, D, dx.get()};
    e.vocab_begin = rank * per;
    e.vocab_end = (rank + 1) * per;
    cuda_model::embed_rows(e, kStream);
    std::vector<float> want(full.size(), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      if (ids[r] >= e.vocab_begin && ids[r] < e.vocab_end) std::copy_n(full.begin() + r * D, D, want.begin() + r * D);
    const std::vector<float> got = to_host(dx);
    EXPECT_TRUE(same_bits(got, want));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = rank == 0 ? got[i] : sum[i] + got[i];  // rank order
  }
  EXPECT_TRUE(same_bits(sum, full)) << "the sum over ranks";
  DeviceBuffer<float> dsum = to_dev(sum);
  auto dh = poisoned<float>(want_h.size());
  cuda_model::replicate_hc(cuda_model::ReplicateHcArgs{dsum.get(), rows, hc, D, dh.get()}, kStream);
  EXPECT_TRUE(same_bits(to_host(dh), want_h)) << "replicate_hc";
}

TEST(CudaDraftPieces, TapsIdsAndPositionsMatchCpu) {
  // taps: rows with and without a destination, two tap layers side by side (col_off).
  const int64_t rows = 7, D = 384, hc = 4, td = 2 * D;
  const std::vector<float> h = randn(static_cast<size_t>(rows * hc * D), 21, 1.0f, true);
  const std::vector<int32_t> dst = {0, -1, 1, 2, -1, 3, 4};
  std::vector<float> want_taps = poisoned_host<float>(static_cast<size_t>(5 * td));
  for (int64_t t = 0; t < rows; ++t)
    if (dst[t] >= 0) model::taps_mean(h.data() + t * hc * D, static_cast<int>(hc), D, want_taps.data() + dst[t] * td + D);
  // draft ids and positions (draft_propose: block [anchor, noise x (K-1)] at positions P..P+K-1)
  const std::vector<int32_t> anchor = {17, 4000, 0};
  const std::vector<int64_t> P = {1, 77, 100000};
  const int K = 5;
  const int32_t noise = 8191;
  std::vector<int32_t> want_ids;
  std::vector<int64_t> want_pos;
  for (size_t b = 0; b < anchor.size(); ++b)
    for (int t = 0; t < K; ++t) {
      want_ids.push_back(t == 0 ? anchor[b] : noise);
      want_pos.push_back(P[b] + t);
    }
  std::vector<int64_t> want_iota(300);
  for (int64_t i = 0; i < 300; ++i) want_iota[i] = 123456 + i;
  if (have_gpu()) {
    DeviceBuffer<float> dh = to_dev(h);
    DeviceBuffer<int32_t> ddst = to_dev(dst), danchor = to_dev(anchor);
    DeviceBuffer<int64_t> dP = to_dev(P);
    auto dtaps = poisoned<float>(want_taps.size());
    cuda_model::taps_mean(TapsMeanArgs{dh.get(), ddst.get(), rows, static_cast<int>(hc), D, dtaps.get(), td, D},
                          kStream);
    EXPECT_TRUE(same_bits(to_host(dtaps), want_taps)) << "taps_mean";
    auto dids = poisoned<int32_t>(want_ids.size());
    auto dpos = poisoned<int64_t>(want_pos.size());
    auto diota = poisoned<int64_t>(want_iota.size());
    const int64_t B = static_cast<int64_t>(anchor.size());
    cuda_model::draft_block_ids(DraftBlockIdsArgs{danchor.get(), B, K, noise, dids.get()}, kStream);
    cuda_model::block_positions(BlockPositionsArgs{dP.get(), B * K, K, dpos.get()}, kStream);
    cuda_model::iota_positions(IotaPositionsArgs{123456, 300, diota.get()}, kStream);
    EXPECT_TRUE(same_values(to_host(dids), want_ids)) << "draft_block_ids";
    EXPECT_TRUE(same_values(to_host(dpos), want_pos)) << "block_positions";
    EXPECT_TRUE(same_values(to_host(diota), want_iota)) << "iota_positions";
  }
  TANDEM_REQUIRE_GPU();
}

// The Markov head: K sequential steps for B requests, each step's e (gathered by markov_gather, or
// by the previous step's finishing CTAs) and z/conf/token checked against the CPU draft's loop
// (dspark.cpp), the bias GEMM's output being an input of the step.
// Vocabularies of one chunk, several (the last one partial) and the real one (32 chunks).
TEST(CudaDraftPieces, MarkovHeadMatchesCpu) {
  for (const int64_t V : {int64_t{3000}, int64_t{5 * cuda_model::kMarkovChunk + 123}, int64_t{129280}}) {
  SCOPED_TRACE(::testing::Message() << "vocabulary " << V);
  // The real vocabulary with the real widths (dim 4,096 + rank 256: the confidence's 4,352
  // products in the kernel's shared memory).
  const int64_t D = V == 129280 ? 4096 : 384, R = V == 129280 ? 256 : 64;
  const int K = 5;
  const int64_t B = 4;
  const DenseWeight w1(WeightFormat::kBf16, V, R, 31);
  const std::vector<float> base = randn(static_cast<size_t>(B * K * V), 32, 2.0f, false);
  const std::vector<float> y = randn(static_cast<size_t>(B * K * D), 33, 1.0f, true);
  const std::vector<float> conf_w = randn(static_cast<size_t>(D + R), 34, 0.05f, false);
  // Per request: greedy (T = 0) and sampled (T = 0.8, 1.5), anchors and seeds.
  const std::vector<double> temp = {0.0, 0.8, 1.5, 0.0};
  const std::vector<uint64_t> seed = {1, 2, 3, 4};
  const std::vector<int64_t> pos = {10, 200, 3000, 7};
  std::vector<int32_t> prev = {5, 17, 2999, 0};
  // The CPU draft's loop. bias[b] (markov_w2 @ e) is the caller's GEMM: random per (b, step).
  std::vector<std::vector<float>> bias(K);
  for (int i = 0; i < K; ++i) bias[i] = randn(static_cast<size_t>(B * V), 40 + i, 1.0f, false);
  std::vector<float> want_e(static_cast<size_t>(K * B * R)), want_z(static_cast<size_t>(B * K * V));
  std::vector<float> want_conf(static_cast<size_t>(B * K)), want_q(static_cast<size_t>(B * K * V));
  std::vector<int32_t> want_tok(static_cast<size_t>(B * K));
  std::vector<double> q_ref(static_cast<size_t>(B * K * V));
  RowSampler rs(V);
  SampleInputs in;
  in.vocab = V;
  {
    std::vector<int32_t> pv = prev;
    std::vector<float> feat(static_cast<size_t>(D + R));
    for (int i = 0; i < K; ++i)
      for (int64_t b = 0; b < B; ++b) {
        float* e = want_e.data() + (i * B + b) * R;
        w1.lin.row(pv[b], e);
        const int64_t row = b * K + i;
        float* z = want_z.data() + row * V;
        for (int64_t v = 0; v < V; ++v) z[v] = base[row * V + v] + bias[i][b * V + v];
        std::copy_n(y.begin() + row * D, D, feat.begin());
        std::copy_n(e, R, feat.begin() + D);
        want_conf[row] = model::dot(feat.data(), conf_w.data(), D + R);
        SampleRow sr;
        sr.temperature = temp[b];
        sr.seed = seed[b];
        sr.position = pos[b] + i + 1;
        rs.prepare(z, sr, in);
        const int32_t tok = rs.sample(rng_uniform(seed[b], sr.position, RngStream::kDraft));
        rs.probs(want_q.data() + row * V);
        want_tok[row] = tok;
        pv[b] = tok;
        // q in double: softmax(z / T) (one-hot at the argmax when greedy).
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
        for (int64_t v = 0; v < V; ++v) sum += temp[b] > 0 ? std::exp((z[v] - mx) / temp[b]) : 0.0;
        for (int64_t v = 0; v < V; ++v)
          q_ref[row * V + v] = temp[b] > 0 ? std::exp((z[v] - mx) / temp[b]) / sum : (v == rs.argmax() ? 1.0 : 0.0);
      }
  }
  // Unchained: markov_gather before every step. Chained: before the first only, each step's
  // finishing CTAs gathering the next position's e (MarkovStepArgs::e_next).
  for (const bool chained : {false, true}) {
  if (!have_gpu()) break;
  SCOPED_TRACE(chained ? "e gathered by the previous step" : "e gathered by markov_gather");
    DeviceBuffer<uint8_t> dw1 = upload_weight(w1);
    WeightRef w1ref = w1.lin.w;
    w1ref.data = dw1.get();
    DeviceBuffer<float> dbase = to_dev(base), dy = to_dev(y), dconfw = to_dev(conf_w);
    DeviceBuffer<double> dtemp = to_dev(temp);
    DeviceBuffer<uint64_t> dseed = to_dev(seed);
    DeviceBuffer<int64_t> dpos = to_dev(pos);
    DeviceBuffer<int32_t> dprev = to_dev(prev);
    auto de = poisoned<float>(static_cast<size_t>(B * R)), dbias = poisoned<float>(static_cast<size_t>(B * V));
    auto dtok = poisoned<int32_t>(want_tok.size());
    auto dconf = poisoned<float>(want_conf.size()), dz = poisoned<float>(want_z.size()), dq = poisoned<float>(want_q.size());
    MarkovStepArgs ms;
    ms.base = dbase.get();
    ms.bias = dbias.get();
    ms.e = de.get();
    ms.y = dy.get();
    ms.conf_w = dconfw.get();
    ms.temperature = dtemp.get();
    ms.seed = dseed.get();
    ms.pos = dpos.get();
    ms.V = V;
    ms.dim = D;
    ms.rank = R;
    ms.K = K;
    ms.prev = dprev.get();
    ms.tokens = dtok.get();
    ms.conf = dconf.get();
    ms.logits = dz.get();
    ms.probs = dq.get();
    ms.B = B;
    DeviceBuffer<uint8_t> dscratch = to_dev(std::vector<uint8_t>(cuda_model::markov_scratch_bytes(B, V), 0));
    ms.scratch = dscratch.get();
    if (chained) {
      ms.w1 = w1ref;
      ms.e_next = de.get();
    }
    for (int i = 0; i < K; ++i) {
      if (!chained || i == 0) cuda_model::markov_gather(MarkovGatherArgs{w1ref, dprev.get(), B, R, de.get()}, kStream);
      const std::vector<float> got_e = to_host(de);
      EXPECT_TRUE(same_bits(got_e, std::vector<float>(want_e.begin() + i * B * R, want_e.begin() + (i + 1) * B * R)))
          << "e of step " << i;
      upload(dbias, bias[i]);
      ms.i = i;
      cuda_model::markov_step(ms, kStream);
    }
    if (chained) {  // the last step gathers nothing: e stays the last position's
      const std::vector<float> got_e = to_host(de);
      EXPECT_TRUE(same_bits(got_e, std::vector<float>(want_e.end() - B * R, want_e.end()))) << "e after the last step";
    }
    EXPECT_TRUE(same_bits(to_host(dz), want_z)) << "z = base + bias";
    EXPECT_TRUE(same_bits(to_host(dconf), want_conf)) << "confidence (model::dot order)";
    EXPECT_TRUE(same_values(to_host(dtok), want_tok)) << "drafted tokens";
    // q: the kernel's float of a double softmax; the CPU's too: both within one fp32 rounding of
    // the double reference plus the double's own error (exp in double, sums of V terms).
    const std::vector<float> got_q = to_host(dq);
    std::vector<double> qb(q_ref.size());
    for (size_t j = 0; j < qb.size(); ++j) qb[j] = std::ldexp(std::fabs(q_ref[j]), -23) + 1e-40;
    EXPECT_TRUE(within(got_q, q_ref, qb)) << "draft distribution q";
    EXPECT_TRUE(within(want_q, q_ref, qb)) << "the CPU's q";
    // Every call leaves the arrival counters at zero (a captured graph replays them as they are).
    const std::vector<uint8_t> sc = to_host(dscratch);
    const int64_t C = (V + cuda_model::kMarkovChunk - 1) / cuda_model::kMarkovChunk;
    const size_t stride = sc.size() / static_cast<size_t>(B);
    for (int64_t b = 0; b < B; ++b) {
      int32_t cnt = -1;
      std::memcpy(&cnt, sc.data() + b * stride + 24 * C + 24, sizeof(cnt));
      EXPECT_EQ(cnt, 0) << "request " << b << "'s arrival counter after the calls";
    }
    if (V == 129280 && !chained) {
      // One request, the last step, greedy then sampled, with q (the draft step's shapes at batch 1).
      MarkovStepArgs one = ms;
      one.B = 1;
      one.i = K - 1;
      for (int r = 0; r < 2; ++r) {
        one.temperature = dtemp.get() + r;  // request 0 greedy, request 1 at T = 0.8
        std::printf("[cuda perf] markov step, vocabulary %lld, 1 request, %s with q: %.1f us\n",
                    static_cast<long long>(V), r ? "sampled" : "greedy",
                    median_us([&] { cuda_model::markov_step(one, kStream); }));
      }
    }
  }
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
