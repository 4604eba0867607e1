// Attention with the sink as the forward calls it (src/model/cuda/attention.cu) against the CPU
// forward's attention (model::attend over the key list DsV4Model::Impl::attention_target /
// draft_propose build): the sliding window from this step's rows and the slot's ring of KV records,
// plus the compressed entries (ratio 128: every visible one; ratio 4: the indexer's top-k list, which
// the CPU walks in position order and the kernel in list order), for fp8, nvfp4 and bf16 records;
// and DSpark's draft attention (context ring + the whole block). The output is bf16 of a softmax
// with exp, whose summation order the kernel does not share with the CPU: each element must be
// correctly rounded against a float64 reference within a stated bound of the fp32 arithmetic (see
// attend_ref), the CPU's output is held to the same reference with its own depths, and the count
// of outputs bit-equal to the CPU's is printed.
#include <cstdio>
#include <map>

#include "cuda/model_kernel_util.h"
#include "model/cuda/attention.h"
#include "model/math.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::AttnArgs;
using cuda_model::DraftAttnArgs;

// Rounding depths of an fp32 evaluation of attend: ds = roundings a score's product passes through
// in its dot (plus the product's own), scale_rel = relative error of fl(1/sqrt(hd)) times the score,
// dz / dn = depths of the sum of probabilities and of the weighted sum of values.
struct AttnDepths {
  double ds, scale_rel, dz, dn;
};
// The kernel: a lane's FMA chain of hd/32 terms and a 5-level shuffle tree; 1/sqrt in two correct
// roundings (attn_scale, as the CPU) and the scale product; z = per-thread sums of <= nk/256
// terms, 5-level warp and block trees, the sink; the values: one FMA chain over the keys in order.
AttnDepths gpu_depths(int64_t hd, size_t nk) {
  return {hd / 32.0 + 6, 3 * kU, std::ceil(nk / 256.0) + 11, static_cast<double>(nk) + 1};
}
// The CPU (model::attend): model::dot = 8 lanes of hd/8 products summed in order, then a pairwise
// tree of 3; 1/sqrt in two roundings and the product; z and the values summed in key order.
AttnDepths cpu_depths(int64_t hd, size_t nk) {
  return {hd / 8.0 + 4, 3 * kU, static_cast<double>(nk) + 1, static_cast<double>(nk) + 1};
}

// float64 attention of one head (q[hd] over keys[i][hd], sink) and, per output element, the bound
// of an fp32 evaluation with depths dp: a score is off by at most E_i = gamma(ds) * sum_d |q k_i| /
// sqrt(hd) + scale_rel |s_i|; the max by the largest E; exp's argument by both plus its own rounding,
// then exp itself (kExpRel): p_i relative error rho_i; z relative error max rho + gamma(dz); the
// value sum sum_i p_i |k_i| (rho_i + gamma(dn)); the division u. A factor 1.25 covers second order.
void attend_ref(const float* q, int64_t hd, const std::vector<const float*>& keys, float sink, const AttnDepths& dp,
                double* want, double* bound) {
  const size_t nk = keys.size();
  const double c = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(nk), err(nk), p(nk), rho(nk);
  double m = -INFINITY, emax = 0;
  for (size_t i = 0; i < nk; ++i) {
    double dot = 0, a = 0;
    for (int64_t d = 0; d < hd; ++d) {
      const double t = static_cast<double>(q[d]) * keys[i][d];
      dot += t;
      a += std::fabs(t);
    }
    s[i] = dot * c;
    err[i] = gamma_n(dp.ds) * a * c + dp.scale_rel * std::fabs(s[i]);
    m = std::max(m, s[i]);
    emax = std::max(emax, err[i]);
  }
  if (nk == 0) {
    for (int64_t d = 0; d < hd; ++d) want[d] = bound[d] = 0;
    return;
  }
  double z = 0, rho_max = 0;
  for (size_t i = 0; i < nk; ++i) {
    const double x = s[i] - m;
    const double e = err[i] + emax + kU * (std::fabs(x) + err[i] + emax);
    rho[i] = std::expm1(e) + kExpRel * (1 + std::expm1(e));
    p[i] = std::exp(x);
    z += p[i];
    rho_max = std::max(rho_max, rho[i]);
  }
  const double xs = sink - m;
  const double es = emax + kU * (std::fabs(xs) + emax);
  rho_max = std::max(rho_max, std::expm1(es) + kExpRel * (1 + std::expm1(es)));
  z += std::exp(xs);
  const double rho_z = rho_max + gamma_n(dp.dz);
  for (int64_t d = 0; d < hd; ++d) {
    double n = 0, nb = 0;
    for (size_t i = 0; i < nk; ++i) {
      n += p[i] * keys[i][d];
      nb += p[i] * std::fabs(keys[i][d]) * (rho[i] + gamma_n(dp.dn));
    }
    want[d] = n / z;
    bound[d] = 1.25 * (nb / z + std::fabs(want[d]) * (rho_z + kU));
  }
}

// Checks the kernel's output (when there is one) and the CPU's against the reference of every
// (row, head): the same comparator, each with its own depths.
struct AttnCheck {
  std::vector<double> ref, gpu_bound, cpu_bound;
  std::vector<float> cpu;
  void add(const float* q, int64_t heads, int64_t hd, const std::vector<const float*>& keys, const float* sink) {
    const size_t o = ref.size();
    ref.resize(o + heads * hd);
    gpu_bound.resize(o + heads * hd);
    cpu_bound.resize(o + heads * hd);
    cpu.resize(o + heads * hd);
    std::vector<float> scratch(keys.size() + 1);
    model::attend(q, heads, hd, keys.data(), keys.size(), sink, cpu.data() + o, scratch.data());
    std::vector<double> dummy(hd);
    for (int64_t h = 0; h < heads; ++h) {
      attend_ref(q + h * hd, hd, keys, sink[h], gpu_depths(hd, keys.size()), &ref[o + h * hd], &gpu_bound[o + h * hd]);
      attend_ref(q + h * hd, hd, keys, sink[h], cpu_depths(hd, keys.size()), dummy.data(), &cpu_bound[o + h * hd]);
    }
  }
  void check_cpu() const {
    EXPECT_TRUE(correctly_rounded(cpu.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, cpu_bound.data()))
        << "the CPU's attention (model::attend)";
  }
  void check_gpu(const std::vector<float>& got, const char* what) const {
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_TRUE(correctly_rounded(got.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, gpu_bound.data())) << what;
    size_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += num::f32_bits(got[i]) == num::f32_bits(cpu[i]);
    std::printf("[cuda %s] %zu of %zu outputs bit-equal to the CPU's\n", what, same, got.size());
  }
};

// ---------------------------------------------------------------- target attention
struct TargetCase {
  KvRecordKind kind;
  int ratio;          // 0 (window only), 4 (top-k list), 128 (every visible entry)
  int heads, hd, topk;
  std::vector<SeqPlan> seqs;  // blocks are assigned by the test
};

TEST(CudaAttention, MatchesCpu) {
  const int W = 128, win_ring = W + 5, bs = 256;
  std::vector<TargetCase> cases;
  cases.push_back({KvRecordKind::kFp8, 0, 8, 512, 0, {{0, 0, 6, {}}, {1, 300, 2, {}}, {2, 125, 5, {}}}});
  cases.push_back({KvRecordKind::kNvfp4, 128, 8, 512, 0, {{0, 700, 3, {}}, {1, 127, 2, {}}, {2, 0, 4, {}}}});
  cases.push_back({KvRecordKind::kBf16, 4, 8, 512, 64, {{0, 1000, 2, {}}, {1, 20, 3, {}}, {2, 0, 3, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 4, 512, 16, {{2, 61, 4, {}}, {0, 3, 1, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 64, 512, 512, {{0, 4000, 2, {}}, {1, 50, 1, {}}}});  // the model's shape
  uint64_t seed = 1;
  for (TargetCase& c : cases) {
    const KvRecordLayout l = KvRecordLayout::make(c.kind, c.hd, 64);
    int32_t next_block = 0;
    for (SeqPlan& q : c.seqs) {
      q.blocks.clear();
      for (int64_t b = 0; b * bs < q.start + q.len; ++b) q.blocks.push_back(next_block++);
    }
    DeviceStep st(c.seqs, bs);
    const int64_t rows = st.rows, H = c.heads, hd = c.hd;
    SCOPED_TRACE(::testing::Message() << kind_name(c.kind) << " ratio " << c.ratio << " heads " << H << " top-k "
                                      << c.topk << " rows " << rows);
    // Slot rings: the window records of every position before each sequence's step.
    const int64_t win_off = 64, slot_bytes = win_off + win_ring * l.bytes + 32;
    std::vector<uint8_t> slots(static_cast<size_t>(3 * slot_bytes), 0xab);
    std::map<std::pair<int, int64_t>, std::vector<float>> ring_val;  // (slot, position) -> decoded key
    for (const SeqPlan& q : c.seqs)
      for (int64_t p = std::max<int64_t>(0, q.start - W); p < q.start; ++p) {
        const std::vector<float> x = randn(static_cast<size_t>(hd), seed * 7 + q.slot * 100003 + p, 1.0f, true);
        const std::vector<uint8_t> rec = encode_kv_record(x.data(), l);
        std::memcpy(&slots[q.slot * slot_bytes + win_off + (p % win_ring) * l.bytes], rec.data(), rec.size());
        ring_val[{q.slot, p}] = decode_kv_record(rec.data(), l);
      }
    // Pool: a record per visible compressed entry.
    const int64_t per_block = c.ratio ? bs / c.ratio : 0, pool_main = 16;
    const int64_t block_bytes = pool_main + per_block * l.bytes + 8;
    std::vector<uint8_t> pool(static_cast<size_t>(std::max<int32_t>(next_block, 1) * block_bytes), 0xcd);
    std::map<std::pair<size_t, int64_t>, std::vector<float>> entry_val;  // (seq, j) -> decoded key
    if (c.ratio)
      for (size_t s = 0; s < c.seqs.size(); ++s) {
        const SeqPlan& q = c.seqs[s];
        for (int64_t j = 0; j < (q.start + q.len) / c.ratio; ++j) {
          const std::vector<float> x = randn(static_cast<size_t>(hd), seed * 11 + s * 1000003 + j, 1.0f, true);
          const std::vector<uint8_t> rec = encode_kv_record(x.data(), l);
          const int64_t pos = c.ratio * j;
          std::memcpy(&pool[q.blocks[pos / bs] * block_bytes + pool_main + ((pos % bs) / c.ratio) * l.bytes],
                      rec.data(), rec.size());
          entry_val[{s, j}] = decode_kv_record(rec.data(), l);
        }
      }
    // This step's KV rows (after the cache round trip), queries, sinks, top-k lists.
    std::vector<float> step_kv(static_cast<size_t>(rows * hd));
    for (int64_t t = 0; t < rows; ++t) {
      const std::vector<float> x = random_kv(l, seed * 13 + t);
      std::copy(x.begin(), x.end(), step_kv.begin() + t * hd);
    }
    const std::vector<float> q = randn(static_cast<size_t>(rows * H * hd), seed + 5, 1.0f, true);
    const std::vector<float> sink = randn(static_cast<size_t>(H), seed + 6, 1.0f, false);
    const int topk_ld = c.topk + 3;
    std::vector<int32_t> topk(static_cast<size_t>(std::max<int64_t>(1, rows * topk_ld)), -1);
    int max_vis = 0;
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t vis = c.ratio ? (st.positions[t] + 1) / c.ratio : 0;
      max_vis = std::max<int>(max_vis, static_cast<int>(vis));
      if (c.ratio != 4) continue;
      // k distinct entries of [0, vis) in score order (not id order), as the topk op lists them.
      std::vector<int32_t> ids(static_cast<size_t>(vis));
      for (int64_t j = 0; j < vis; ++j) ids[j] = static_cast<int32_t>(j);
      for (int64_t j = vis - 1; j > 0; --j) std::swap(ids[j], ids[mix64(seed + t * 7919 + j) % (j + 1)]);
      for (int64_t i = 0; i < std::min<int64_t>(c.topk, vis); ++i) topk[t * topk_ld + i] = ids[i];
    }
    seed += 100;

    // CPU: the forward's key list per row, then model::attend.
    AttnCheck chk;
    for (int64_t t = 0; t < rows; ++t) {
      const int s = st.row_seq[t];
      const SeqPlan& sp = c.seqs[s];
      const int64_t p = st.positions[t];
      std::vector<const float*> keys;
      for (int64_t wp = std::max<int64_t>(0, p - W + 1); wp <= p; ++wp)
        keys.push_back(wp >= sp.start ? step_kv.data() + (st.seq_row0[s] + wp - sp.start) * hd
                                      : ring_val.at({sp.slot, wp}).data());
      if (c.ratio == 4) {
        const int64_t vis = (p + 1) / 4, k = std::min<int64_t>(c.topk, vis);
        std::vector<int32_t> sel(topk.begin() + t * topk_ld, topk.begin() + t * topk_ld + k);
        std::sort(sel.begin(), sel.end());  // the CPU walks the selection in position order
        for (int32_t j : sel) keys.push_back(entry_val.at({static_cast<size_t>(s), j}).data());
      } else if (c.ratio) {
        for (int64_t j = 0; j < (p + 1) / c.ratio; ++j) keys.push_back(entry_val.at({static_cast<size_t>(s), j}).data());
      }
      chk.add(q.data() + t * H * hd, H, hd, keys, sink.data());
    }
    chk.check_cpu();
    if (!have_gpu()) continue;

    st.upload();
    DeviceBuffer<float> dq = to_dev(q), dkv = to_dev(step_kv), dsink = to_dev(sink);
    DeviceBuffer<uint8_t> dslots = to_dev(slots), dpool = to_dev(pool);
    DeviceBuffer<int32_t> dtopk = to_dev(topk);
    auto dout = poisoned<float>(static_cast<size_t>(rows * H * hd));
    AttnArgs a;
    a.q = dq.get();
    a.step_kv = dkv.get();
    a.slot_state = dslots.get();
    a.slot_bytes = slot_bytes;
    a.win_off = win_off;
    a.win_ring = win_ring;
    a.window = W;
    a.ratio = c.ratio;
    a.pool = dpool.get();
    a.block_bytes = block_bytes;
    a.pool_main = pool_main;
    a.topk = c.ratio == 4 ? dtopk.get() : nullptr;
    a.topk_ld = topk_ld;
    a.topk_k = c.topk;
    a.sink = dsink.get();
    a.heads = c.heads;
    a.hd = c.hd;
    a.rec = l;
    a.max_keys = W + (c.ratio == 4 ? c.topk : max_vis);
    a.out = dout.get();
    a.m = st.meta;
    a.rows = rows;
    cuda_model::attention(a, kStream);
    chk.check_gpu(to_host(dout), "attention");
    if (H == 64)
      std::printf("[cuda perf] attention %s, 64 heads x 512, window 128 + top-%d, %lld rows: %.1f us\n",
                  kind_name(c.kind), c.topk, static_cast<long long>(rows),
                  median_us([&] { cuda_model::attention(a, kStream); }));
  }
  TANDEM_REQUIRE_GPU();
}

// ---------------------------------------------------------------- draft attention
TEST(CudaDraftAttention, MatchesCpu) {
  const int W = 128, K = 5, stages = 2, stage = 1;
  uint64_t seed = 900;
  for (KvRecordKind kind : {KvRecordKind::kFp8, KvRecordKind::kNvfp4, KvRecordKind::kBf16}) {
    const KvRecordLayout l = KvRecordLayout::make(kind, 512, 64);
    const int64_t H = 8, hd = 512;
    const std::vector<int32_t> slot = {2, 0, 1};
    const std::vector<int64_t> P = {1, 50, 300};  // anchor positions: 1 context key, 50, a full wrapped ring
    const int64_t B = static_cast<int64_t>(slot.size());
    SCOPED_TRACE(::testing::Message() << kind_name(kind) << " requests " << B << " K " << K);
    const int64_t slot_stride = static_cast<int64_t>(stages) * W * l.bytes + 16, stage_off = stage * W * l.bytes;
    std::vector<uint8_t> ctx(static_cast<size_t>(3 * slot_stride), 0x77);
    std::map<std::pair<int, int64_t>, std::vector<float>> ctx_val;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = std::max<int64_t>(0, P[b] - W); p < P[b]; ++p) {
        const std::vector<float> x = randn(static_cast<size_t>(hd), seed + slot[b] * 100003 + p, 1.0f, true);
        const std::vector<uint8_t> rec = encode_kv_record(x.data(), l);
        std::memcpy(&ctx[slot[b] * slot_stride + stage_off + (p % W) * l.bytes], rec.data(), rec.size());
        ctx_val[{slot[b], p}] = decode_kv_record(rec.data(), l);
      }
    std::vector<float> block_kv(static_cast<size_t>(B * K * hd));
    for (int64_t r = 0; r < B * K; ++r) {
      const std::vector<float> x = random_kv(l, seed * 3 + r);
      std::copy(x.begin(), x.end(), block_kv.begin() + r * hd);
    }
    const std::vector<float> q = randn(static_cast<size_t>(B * K * H * hd), seed + 1, 1.0f, true);
    const std::vector<float> sink = randn(static_cast<size_t>(H), seed + 2, 1.0f, false);
    seed += 100;
    // CPU: draft_propose's key list (context ring, then the whole block), model::attend per row.
    AttnCheck chk;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<const float*> keys;
      for (int64_t p = std::max<int64_t>(0, P[b] - W); p < P[b]; ++p) keys.push_back(ctx_val.at({slot[b], p}).data());
      for (int64_t t = 0; t < K; ++t) keys.push_back(block_kv.data() + (b * K + t) * hd);
      for (int64_t t = 0; t < K; ++t) chk.add(q.data() + (b * K + t) * H * hd, H, hd, keys, sink.data());
    }
    chk.check_cpu();
    if (!have_gpu()) continue;
    DeviceBuffer<float> dq = to_dev(q), dkv = to_dev(block_kv), dsink = to_dev(sink);
    DeviceBuffer<uint8_t> dctx = to_dev(ctx);
    DeviceBuffer<int32_t> dslot = to_dev(slot);
    DeviceBuffer<int64_t> dpos = to_dev(P);
    auto dout = poisoned<float>(static_cast<size_t>(B * K * H * hd));
    DraftAttnArgs a;
    a.q = dq.get();
    a.block_kv = dkv.get();
    a.ctx = dctx.get();
    a.slot_stride = slot_stride;
    a.stage_off = stage_off;
    a.req_slot = dslot.get();
    a.req_pos = dpos.get();
    a.K = K;
    a.window = W;
    a.sink = dsink.get();
    a.heads = static_cast<int>(H);
    a.hd = static_cast<int>(hd);
    a.rec = l;
    a.out = dout.get();
    a.B = B;
    cuda_model::draft_attention(a, kStream);
    chk.check_gpu(to_host(dout), "draft_attention");
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
