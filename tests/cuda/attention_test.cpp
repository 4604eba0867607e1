// Attention with the sink as the forward calls it against the CPU forward's attention
// (model::attend over the key list DsV4Model::Impl::attention_target / draft_propose build): the
// target's MQA attention (src/model/cuda/attention.cu) over the sliding window from this step's rows
// and the slot's ring of KV records, plus the compressed entries (ratio 128: every visible one, up
// to a context of a million positions; ratio 4: the indexer's top-k list, which the CPU walks in
// position order and the kernel in list order), for fp8, nvfp4 and bf16 records, head dims 512 and
// 128, head counts that do and do not fill the 16-head tiles; and DSpark's draft attention
// (attention_draft.cu: context ring + the whole block). The output is bf16 of a softmax with exp,
// whose summation order and maxima the kernels do not share with the CPU: each element must be
// correctly rounded against a float64 reference within a stated bound of the kernel's arithmetic
// (see attend_ref), the CPU's output is held to the same reference with its own depths, and the
// count of outputs bit-equal to the CPU's is printed. The target kernel's two launch shapes (split
// over chunks + fold kernel, and one folding block per row) must agree bit for bit, and with the
// output's inverse RoPE in their epilogues (AttnArgs::out_inv_freq) equal the rope op after them.
#include <cstdio>
#include <map>

#include "cuda/model_kernel_util.h"
#include "model/cuda/attention.h"
#include "model/math.h"

namespace tandem::kernels::cuda_testing {
namespace {

// The RoPE inverse frequencies of the output epilogues' tests: base 10000, YaRN over
// original_seq_len with `factor` (0: none).
std::vector<float> rope_table(int rope_dim, int64_t original_seq_len, double factor) {
  std::vector<float> inv(static_cast<size_t>(rope_dim / 2));
  RopeFreqParams fp;
  fp.inv_freq = inv.data();
  fp.rope_dim = rope_dim;
  fp.base = 10000.0;
  fp.original_seq_len = original_seq_len;
  fp.factor = factor;
  rope_inv_freq(fp);
  return inv;
}

using cuda_model::AttnArgs;
using cuda_model::DraftAttnArgs;

// Error model of an fp32 evaluation of attend: ds = roundings a score's dot passes through (in units
// of u, relative to sum |q k|), scale_rel = relative error of the score scale times the score,
// dz / dn = depths of the sum of probabilities and of the weighted sum of values (relative to the
// sums of |terms|), exp_factors = further exp() factors (each with its own rounding) every
// probability is multiplied by on its way to the output.
struct AttnDepths {
  double ds, scale_rel, dz, dn, exp_factors;
};
// The draft kernel (each head's arithmetic that of one block per (row, head)): a lane's FMA chain of hd/32 terms and a 5-level
// shuffle tree; 1/sqrt in two correct roundings (attn_scale, as the CPU) and the scale product;
// z = per-thread sums of <= nk/256 terms, 5-level warp and block trees, the sink; the values: one
// FMA chain over the keys in order.
AttnDepths draft_gpu_depths(int64_t hd, size_t nk) {
  return {hd / 32.0 + 6, 3 * kU, std::ceil(nk / 256.0) + 11, static_cast<double>(nk) + 1, 0};
}
// The target kernel (attention.h): tensor-core dots of hd/16 k16 steps (each within 2^-19 = 32u of
// the sum of |terms| so far: the tensor core aligns a step's products to the largest and truncates
// to 24 bits) in two accumulators, their sum and the scale product; the scale fl(1/fl(sqrt(hd)))
// (3u); per chunk of 64 keys z_c in a tree of depth 11 and O_c in 4 k16 steps x 3 planes of exact
// bf16 terms (12 x 32u); the fold adds 2 roundings per chunk to both, the sink's addition and the
// division 1 each; every probability passes through exp(s - m_c), beta_c and up to one alpha per
// later chunk.
AttnDepths mqa_gpu_depths(int64_t hd, size_t nk) {
  const double nch = std::ceil(static_cast<double>(nk) / cuda_model::kAttnChunk);
  return {hd / 16.0 * 32 + 2, 3 * kU, 11 + 2 * nch + 2, 12 * 32 + 2 * nch + 2, nch + 1};
}
// The CPU (model::attend): model::dot = 8 lanes of hd/8 products summed in order, then a pairwise
// tree of 3; 1/sqrt in two roundings and the product; z and the values summed in key order.
AttnDepths cpu_depths(int64_t hd, size_t nk) {
  return {hd / 8.0 + 4, 3 * kU, static_cast<double>(nk) + 1, static_cast<double>(nk) + 1, 0};
}

// float64 attention of one head (q[hd] over keys[i][hd], sink) and, per output element, the bound
// of an fp32 evaluation with depths dp: a score is off by at most E_i = gamma(ds) * sum_d |q k_i| /
// sqrt(hd) + scale_rel |s_i|; a max by the largest E; exp's argument by both plus its own rounding,
// then exp itself (kExpRel), and each further exp factor by its own rounding and that of its
// argument (a difference of two maxima, below the score range): p_i relative error rho_i; z
// relative error max rho + gamma(dz); the value sum sum_i p_i |k_i| (rho_i + gamma(dn)); the
// division u. A factor 1.25 covers second order.
void attend_ref(const float* q, int64_t hd, const std::vector<const float*>& keys, float sink, const AttnDepths& dp,
                double* want, double* bound) {
  const size_t nk = keys.size();
  const double c = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(nk), err(nk), p(nk), rho(nk);
  double m = -INFINITY, lo = INFINITY, emax = 0;
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
    lo = std::min(lo, s[i]);
    emax = std::max(emax, err[i]);
  }
  if (nk == 0) {
    for (int64_t d = 0; d < hd; ++d) want[d] = bound[d] = 0;
    return;
  }
  // each further factor: exp of a difference of maxima (|.| <= m - lo + 2 emax), rounded once
  const double fe = kU * (m - lo + 2 * emax);
  const double extra = dp.exp_factors * (std::expm1(fe) + kExpRel * (1 + std::expm1(fe)));
  double z = 0, rho_max = 0;
  for (size_t i = 0; i < nk; ++i) {
    const double x = s[i] - m;
    const double e = err[i] + emax + kU * (std::fabs(x) + err[i] + emax);
    rho[i] = std::expm1(e) + kExpRel * (1 + std::expm1(e)) + extra;
    p[i] = std::exp(x);
    z += p[i];
    rho_max = std::max(rho_max, rho[i]);
  }
  const double xs = sink - m;
  const double es = emax + kU * (std::fabs(xs) + emax);
  rho_max = std::max(rho_max, std::expm1(es) + kExpRel * (1 + std::expm1(es)) + extra);
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

// The target kernel's arithmetic on the CPU in fp32 (rounding to nearest where the tensor cores
// truncate): chunks of 64 keys in the kernel's order, the chunk max, exp, the sums, the fold and the
// sink. Held to the kernel's bound, it checks that the bound covers the chunked algorithm itself.
void emulate_chunked(const float* q, int64_t hd, const std::vector<const float*>& keys, float sink, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t nk = keys.size();
  std::vector<float> o(hd, 0.0f), oc(hd);
  float m = -INFINITY, z = 0.0f;
  for (size_t c0 = 0; c0 < nk; c0 += cuda_model::kAttnChunk) {
    const size_t c1 = std::min(nk, c0 + cuda_model::kAttnChunk);
    std::vector<float> s(c1 - c0);
    float mc = -INFINITY;
    for (size_t i = c0; i < c1; ++i) {
      float acc = 0.0f;
      for (int64_t d = 0; d < hd; ++d) acc += q[d] * keys[i][d];
      s[i - c0] = acc * scale;
      mc = std::max(mc, s[i - c0]);
    }
    float zc = 0.0f;
    std::fill(oc.begin(), oc.end(), 0.0f);
    for (size_t i = c0; i < c1; ++i) {
      const float p = std::exp(s[i - c0] - mc);
      zc += p;
      for (int64_t d = 0; d < hd; ++d) oc[d] += p * keys[i][d];
    }
    const float mn = std::max(m, mc);
    const float al = m == mn ? 1.0f : std::exp(m - mn), be = mc == mn ? 1.0f : std::exp(mc - mn);
    z = z * al + zc * be;
    for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * al + oc[d] * be;
    m = mn;
  }
  const float zt = z + std::exp(sink - m);
  for (int64_t d = 0; d < hd; ++d) out[d] = num::round_bf16(o[d] / zt);
}

// Checks the kernel's output (when there is one), the CPU's and (target kernel) the emulation of the
// kernel's arithmetic against the reference of every (row, head): the same comparator, each with
// its own depths.
struct AttnCheck {
  bool target = true;  // the target kernel (mqa_gpu_depths, emulated) or the draft kernel
  std::vector<double> ref, gpu_bound, cpu_bound;
  std::vector<float> cpu, emu;
  // keys: the CPU's order; kernel_keys: the kernel's (the same keys, the top-k list in list order).
  // list_len: the kernel's list length where it holds masked ids (its chunk count), else 0.
  void add(const float* q, int64_t heads, int64_t hd, const std::vector<const float*>& keys, const float* sink,
           const std::vector<const float*>* kernel_keys = nullptr, size_t list_len = 0) {
    const size_t o = ref.size();
    ref.resize(o + heads * hd);
    gpu_bound.resize(o + heads * hd);
    cpu_bound.resize(o + heads * hd);
    cpu.resize(o + heads * hd);
    emu.resize(o + heads * hd);
    std::vector<float> scratch(keys.size() + 1);
    model::attend(q, heads, hd, keys.data(), keys.size(), sink, cpu.data() + o, scratch.data());
    std::vector<double> dummy(hd);
    const AttnDepths gd =
        target ? mqa_gpu_depths(hd, std::max(keys.size(), list_len)) : draft_gpu_depths(hd, keys.size());
    for (int64_t h = 0; h < heads; ++h) {
      attend_ref(q + h * hd, hd, keys, sink[h], gd, &ref[o + h * hd], &gpu_bound[o + h * hd]);
      attend_ref(q + h * hd, hd, keys, sink[h], cpu_depths(hd, keys.size()), dummy.data(), &cpu_bound[o + h * hd]);
      if (target) emulate_chunked(q + h * hd, hd, kernel_keys ? *kernel_keys : keys, sink[h], &emu[o + h * hd]);
    }
  }
  void check_cpu() const {
    EXPECT_TRUE(correctly_rounded(cpu.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, cpu_bound.data()))
        << "the CPU's attention (model::attend)";
    if (target) {
      EXPECT_TRUE(correctly_rounded(emu.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, gpu_bound.data()))
          << "the target kernel's arithmetic emulated in fp32";
    }
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
  bool mask_ids = false;      // ratio 4: some of the list's first k ids -1 or not yet visible (masked)
};

TEST(CudaAttention, MatchesCpu) {
  const int W = 128, win_ring = W + 5, bs = 256;
  std::vector<TargetCase> cases;
  cases.push_back({KvRecordKind::kFp8, 0, 8, 512, 0, {{0, 0, 6, {}}, {1, 300, 2, {}}, {2, 125, 5, {}}}});
  cases.push_back({KvRecordKind::kNvfp4, 128, 8, 512, 0, {{0, 700, 3, {}}, {1, 127, 2, {}}, {2, 0, 4, {}}}});
  cases.push_back({KvRecordKind::kBf16, 4, 8, 512, 64, {{0, 1000, 2, {}}, {1, 20, 3, {}}, {2, 0, 3, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 4, 512, 16, {{2, 61, 4, {}}, {0, 3, 1, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 64, 512, 512, {{0, 4000, 2, {}}, {1, 50, 1, {}}}});  // the model's shape
  cases.push_back({KvRecordKind::kFp8, 4, 32, 512, 512, {{1, 2500, 1, {}}}});  // one rank of TP=2
  // A million positions: 8125 entries + the window = 129 chunks (more than one fold group of 128),
  // 20 heads (a partial second head tile).
  cases.push_back({KvRecordKind::kFp8, 128, 20, 512, 0, {{0, 1040000, 2, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 6, 128, 32, {{0, 500, 3, {}}, {1, 0, 5, {}}}});  // the tiny models
  cases.push_back({KvRecordKind::kNvfp4, 128, 4, 128, 0, {{2, 300, 2, {}}}});
  // Verify sizes (6 and 96 rows of one sequence), each layer kind: the output's inverse RoPE check.
  cases.push_back({KvRecordKind::kFp8, 4, 32, 512, 512, {{0, 2100, 6, {}}}});
  cases.push_back({KvRecordKind::kBf16, 128, 8, 512, 0, {{1, 1500, 96, {}}}});
  cases.push_back({KvRecordKind::kNvfp4, 0, 8, 512, 0, {{0, 700, 96, {}}}});
  // Prefill chunks of several sequences (HCA: the key-row scratch's decoded entries), one starting at
  // 0 (no entry visible to its first rows), rows crossing an entry's boundary.
  cases.push_back({KvRecordKind::kFp8, 128, 32, 512, 0, {{0, 5000, 8, {}}, {1, 120, 8, {}}, {2, 250, 8, {}}}});
  cases.push_back({KvRecordKind::kNvfp4, 128, 16, 128, 0, {{1, 2040, 16, {}}, {0, 0, 4, {}}}});
  cases.push_back({KvRecordKind::kFp8, 4, 32, 512, 512, {{0, 3000, 8, {}}, {1, 200, 8, {}}}, true});
  // Decode shapes of the split launch (against the folding blocks): 1, 2 and 8 rows, windows of 1 key, partial, exactly full (position 127) and wrapped,
  // this step's fp32 rows among the window's records (a 6-row sequence), masked top-k ids, every
  // record kind, head dims 512 and 128, head counts that do and do not fill the 16-head tiles.
  cases.push_back({KvRecordKind::kFp8, 0, 32, 512, 0, {{0, 0, 1, {}}}});
  cases.push_back({KvRecordKind::kFp8, 0, 32, 512, 0, {{1, 300, 1, {}}, {0, 60, 1, {}}}});
  cases.push_back({KvRecordKind::kBf16, 0, 16, 512, 0, {{2, 127, 1, {}}}});
  cases.push_back({KvRecordKind::kNvfp4, 128, 32, 512, 0, {{0, 3000, 6, {}}, {1, 128, 1, {}}, {2, 5, 1, {}}}});
  cases.push_back({KvRecordKind::kFp8, 128, 32, 512, 0, {{1, 9000, 1, {}}}});
  cases.push_back({KvRecordKind::kBf16, 4, 32, 512, 512, {{0, 4000, 1, {}}, {1, 900, 1, {}}}, true});
  cases.push_back({KvRecordKind::kFp8, 4, 32, 512, 512, {{2, 2400, 1, {}}}, true});
  cases.push_back({KvRecordKind::kNvfp4, 4, 20, 512, 512, {{0, 2100, 8, {}}}, true});
  cases.push_back({KvRecordKind::kFp8, 4, 6, 128, 32, {{0, 500, 1, {}}}, true});
  cases.push_back({KvRecordKind::kNvfp4, 0, 20, 128, 0, {{1, 200, 2, {}}}});
  cases.push_back({KvRecordKind::kBf16, 128, 8, 128, 0, {{0, 900, 1, {}}}});
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
    SCOPED_TRACE(::testing::Message() << kind_name(c.kind) << " ratio " << c.ratio << " heads " << H << " hd " << hd
                                      << " top-k " << c.topk << " rows " << rows);
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
      if (c.mask_ids)  // masked ids inside the list: -1 and ids not yet visible
        for (int64_t i = 0; i < std::min<int64_t>(c.topk, vis); ++i) {
          if (i % 5 == 2) topk[t * topk_ld + i] = -1;
          if (i % 7 == 3) topk[t * topk_ld + i] = static_cast<int32_t>(vis + i);
        }
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
      std::vector<const float*> kernel_keys = keys;
      size_t list_len = 0;
      if (c.ratio == 4) {
        const int64_t vis = (p + 1) / 4, k = std::min<int64_t>(c.topk, vis);
        std::vector<int32_t> sel;
        for (int64_t i = 0; i < k; ++i) {
          const int32_t id = topk[t * topk_ld + i];
          if (id >= 0 && id < vis) sel.push_back(id);  // the others are masked
        }
        list_len = keys.size() + static_cast<size_t>(k);
        for (int32_t j : sel) kernel_keys.push_back(entry_val.at({static_cast<size_t>(s), j}).data());
        std::sort(sel.begin(), sel.end());  // the CPU walks the selection in position order
        for (int32_t j : sel) keys.push_back(entry_val.at({static_cast<size_t>(s), j}).data());
      } else if (c.ratio) {
        for (int64_t j = 0; j < (p + 1) / c.ratio; ++j) keys.push_back(entry_val.at({static_cast<size_t>(s), j}).data());
        kernel_keys = keys;
      }
      chk.add(q.data() + t * H * hd, H, hd, keys, sink.data(), &kernel_keys, list_len);
    }
    chk.check_cpu();
    if (!have_gpu()) continue;

    st.upload();
    DeviceBuffer<float> dq = to_dev(q), dkv = to_dev(step_kv), dsink = to_dev(sink);
    DeviceBuffer<uint8_t> dslots = to_dev(slots), dpool = to_dev(pool);
    DeviceBuffer<int32_t> dtopk = to_dev(topk);
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
    a.m = st.meta;
    a.rows = rows;
    // Split over chunks (every (row, chunk) has a slot; sm_count so large that splitting pays) ...
    const int64_t nchunks = (a.max_keys + cuda_model::kAttnChunk - 1) / cuda_model::kAttnChunk;
    auto partial = poisoned<float>(static_cast<size_t>(cuda_model::attn_partial_floats(c.heads, c.hd, rows * nchunks)));
    auto out_split = poisoned<float>(static_cast<size_t>(rows * H * hd));
    a.partial = partial.get();
    a.partial_slots = rows * nchunks;
    a.sm_count = 1 << 20;
    a.out = out_split.get();
    EXPECT_TRUE(cuda_model::attention_splits(a));
    cuda_model::attention(a, kStream);
    // ... and one folding block per (row, 16 heads).
    auto out_fold = poisoned<float>(static_cast<size_t>(rows * H * hd));
    a.partial = nullptr;
    a.partial_slots = 0;
    a.out = out_fold.get();
    EXPECT_FALSE(cuda_model::attention_splits(a));
    cuda_model::attention(a, kStream);
    const std::vector<float> got = to_host(out_split);
    chk.check_gpu(got, "attention");
    EXPECT_TRUE(same_bits(to_host(out_fold), got)) << "folding blocks vs split over chunks";
    // ... and the folding blocks with the key-row scratch (AttnArgs::key_rows): this step's rows in
    // bf16 and, with ratio > 0 and at least 4 rows a sequence, the entries decoded once for the step
    // (every sequence's, then only the first one's: the others' from their records; the scratch's
    // unused rows poisoned; with a top-k list the ids it selects are looked up there): the same bits.
    {
      const int64_t comp = c.ratio ? max_vis : 0, nseq = static_cast<int64_t>(c.seqs.size());
      a.entries_bound = comp;
      for (const int64_t fit : {nseq, int64_t{1}}) {
        const int64_t cap = rows + fit * comp;
        auto krows = poisoned<uint16_t>(static_cast<size_t>(cap * hd));
        auto out_rows = poisoned<float>(static_cast<size_t>(rows * H * hd));
        a.key_rows = krows.get();
        a.key_rows_cap = cap;
        a.seqs = nseq;
        a.out = out_rows.get();
        cuda_model::attention(a, kStream);
        EXPECT_TRUE(same_bits(to_host(out_rows), got)) << "folding blocks with key rows (entries of " << fit
                                                       << " sequences) vs split over chunks";
      }
      a.key_rows = nullptr;
      a.key_rows_cap = 0;
      a.seqs = 0;
      a.entries_bound = 0;
    }
    // o's inverse RoPE in the epilogue (AttnArgs::out_inv_freq) in both launch shapes == the rope op
    // (inverse, rounded to bf16: the forward's former launch) on the plain output, bit for bit.
    {
      const int rope_dim = 64;
      DeviceBuffer<float> dinv = to_dev(rope_table(rope_dim, 65536, 16.0));
      RopeParams rp;
      rp.x = out_fold.get();  // == got's bits
      rp.positions = st.meta.positions;
      rp.inv_freq = dinv.get();
      rp.tokens = rows;
      rp.heads = H;
      rp.head_stride = hd;
      rp.rope_offset = static_cast<int>(hd) - rope_dim;
      rp.rope_dim = rope_dim;
      rp.inverse = true;
      rp.round_bf16 = true;
      kernels::cuda::rope(rp, kStream);
      const std::vector<float> want = to_host(out_fold);
      a.out_inv_freq = dinv.get();
      a.out_rope_dim = rope_dim;
      auto rot_fold = poisoned<float>(static_cast<size_t>(rows * H * hd));
      a.out = rot_fold.get();
      cuda_model::attention(a, kStream);  // folding blocks (a.partial is null)
      auto rot_split = poisoned<float>(static_cast<size_t>(rows * H * hd));
      a.partial = partial.get();
      a.partial_slots = rows * nchunks;
      a.out = rot_split.get();
      EXPECT_TRUE(cuda_model::attention_splits(a));
      cuda_model::attention(a, kStream);
      const std::vector<float> gs = to_host(rot_split), gf = to_host(rot_fold);
      // (element i = row i / (heads * hd), head i / hd % heads, dim i % hd; the rotated dims are the last 64)
      EXPECT_TRUE(same_bits(gs, want)) << "attention + inverse RoPE epilogue (split + fold_kernel) vs then rope";
      EXPECT_TRUE(same_bits(gf, want)) << "attention + inverse RoPE epilogue (folding blocks) vs then rope";
      a.out_inv_freq = nullptr;
      a.out_rope_dim = 0;
      a.partial = nullptr;
      a.partial_slots = 0;
      a.out = out_fold.get();
    }
    if (H == 64)
      std::printf("[cuda perf] attention %s, 64 heads x 512, window 128 + top-%d, %lld rows: %.1f us\n",
                  kind_name(c.kind), c.topk, static_cast<long long>(rows),
                  median_us([&] { cuda_model::attention(a, kStream); }));
  }
  TANDEM_REQUIRE_GPU();
}

// ---------------------------------------------------------------- draft attention
// One draft attention case: B requests (slots, anchor positions P) of this stage's context ring
// (records of `kind`, window W; position p at ring row p % R, R = ring or W) plus their K block
// rows, H heads of head dim hd, random queries and sinks; host data and device buffers, and the
// args of a launch.
struct DraftCase {
  static constexpr int W = 128, K = 5, stages = 2, stage = 1;
  KvRecordLayout l;
  int64_t H = 0, hd = 0, B = 0;
  std::vector<int32_t> slot;
  std::vector<int64_t> P;
  std::map<std::pair<int, int64_t>, std::vector<float>> ctx_val;
  std::vector<float> block_kv, q, sink;
  DeviceBuffer<float> dq, dkv, dsink, dinv;
  DeviceBuffer<uint8_t> dctx;
  DeviceBuffer<int32_t> dslot;
  DeviceBuffer<int64_t> dpos, drpos;
  DraftAttnArgs a;

  DraftCase(KvRecordKind kind, int64_t heads, int64_t head_dim, std::vector<int32_t> slots, std::vector<int64_t> pos,
            uint64_t seed, int ring = 0)
      : l(KvRecordLayout::make(kind, static_cast<int>(head_dim), 64)), H(heads), hd(head_dim),
        B(static_cast<int64_t>(slots.size())), slot(std::move(slots)), P(std::move(pos)) {
    int max_slot = 0;
    for (int32_t s : slot) max_slot = std::max(max_slot, s);
    const int64_t R = ring > 0 ? ring : W;
    const int64_t slot_stride = static_cast<int64_t>(stages) * R * l.bytes + 16, stage_off = stage * R * l.bytes;
    std::vector<uint8_t> ctx(static_cast<size_t>((max_slot + 1) * slot_stride), 0x77);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = std::max<int64_t>(0, P[b] - W); p < P[b]; ++p) {
        const std::vector<float> x = randn(static_cast<size_t>(hd), seed + slot[b] * 100003 + p, 1.0f, true);
        const std::vector<uint8_t> rec = encode_kv_record(x.data(), l);
        std::memcpy(&ctx[slot[b] * slot_stride + stage_off + (p % R) * l.bytes], rec.data(), rec.size());
        ctx_val[{slot[b], p}] = decode_kv_record(rec.data(), l);
      }
    block_kv.resize(static_cast<size_t>(B * K * hd));
    for (int64_t r = 0; r < B * K; ++r) {
      const std::vector<float> x = random_kv(l, seed * 3 + r);
      std::copy(x.begin(), x.end(), block_kv.begin() + r * hd);
    }
    q = randn(static_cast<size_t>(B * K * H * hd), seed + 1, 1.0f, true);
    sink = randn(static_cast<size_t>(H), seed + 2, 1.0f, false);
    if (!have_gpu()) return;
    dq = to_dev(q);
    dkv = to_dev(block_kv);
    dsink = to_dev(sink);
    dctx = to_dev(ctx);
    dslot = to_dev(slot);
    dpos = to_dev(P);
    a.q = dq.get();
    a.block_kv = dkv.get();
    a.ctx = dctx.get();
    a.slot_stride = slot_stride;
    a.stage_off = stage_off;
    a.req_slot = dslot.get();
    a.req_pos = dpos.get();
    a.K = K;
    a.window = W;
    a.ring = ring;
    a.sink = dsink.get();
    a.heads = static_cast<int>(H);
    a.hd = static_cast<int>(hd);
    a.rec = l;
    a.B = B;
  }
  // draft_propose's key lists (context ring, then the whole block), model::attend per row.
  void add_rows(AttnCheck& chk) const {
    for (int64_t b = 0; b < B; ++b) {
      std::vector<const float*> keys;
      for (int64_t p = std::max<int64_t>(0, P[b] - W); p < P[b]; ++p) keys.push_back(ctx_val.at({slot[b], p}).data());
      for (int64_t t = 0; t < K; ++t) keys.push_back(block_kv.data() + (b * K + t) * hd);
      for (int64_t t = 0; t < K; ++t) chk.add(q.data() + (b * K + t) * H * hd, H, hd, keys, sink.data());
    }
  }
  // The output's inverse RoPE (rope_dim 64, base 10000) on in the args; the block's rows at P + t.
  void with_rope() {
    const int rope_dim = 64;
    const std::vector<float> inv = rope_table(rope_dim, 0, 1.0);
    std::vector<int64_t> rpos(static_cast<size_t>(B * K));
    for (int64_t r = 0; r < B * K; ++r) rpos[r] = P[r / K] + r % K;
    dinv = to_dev(inv);
    drpos = to_dev(rpos);
    a.out_positions = drpos.get();
    a.out_inv_freq = dinv.get();
    a.out_rope_dim = rope_dim;
  }
  // whole: draft_attention's whole-list shape where the device holds it, else a chunk at a time.
  std::vector<float> run(bool reference, bool whole = true) {
    auto out = poisoned<float>(static_cast<size_t>(B * K * H * hd));
    a.out = out.get();
    if (reference)
      cuda_model::draft_attention_reference(a, kStream);
    else
      cuda_model::draft_attention(a, kStream, whole);
    std::vector<float> h = to_host(out);
    a.out = nullptr;
    return h;
  }
};

TEST(CudaDraftAttention, MatchesCpu) {
  uint64_t seed = 900;
  // The ring as long as the window, and as the model lays it out (W + max_rollback rows).
  for (int ring : {0, DraftCase::W + 8})
  for (KvRecordKind kind : {KvRecordKind::kFp8, KvRecordKind::kNvfp4, KvRecordKind::kBf16}) {
    // anchor positions: 1 context key, 50, a full wrapped ring
    DraftCase c(kind, 8, 512, {2, 0, 1}, {1, 50, 300}, seed, ring);
    seed += 100;
    SCOPED_TRACE(::testing::Message() << kind_name(kind) << " requests " << c.B << " K " << c.K << " ring " << ring);
    AttnCheck chk;
    chk.target = false;
    c.add_rows(chk);
    chk.check_cpu();
    if (!have_gpu()) continue;
    const std::vector<float> out = c.run(false);
    chk.check_gpu(out, "draft_attention");
    // (element = (row * heads + head) * hd + dim)
    EXPECT_TRUE(same_bits(out, c.run(true))) << "draft_attention vs the one-block-per-(row, head) reference";
    EXPECT_TRUE(same_bits(out, c.run(false, false))) << "the whole key list vs a chunk at a time";
    // The output's inverse RoPE in the epilogue (DraftAttnArgs::out_inv_freq) == the rope op (inverse,
    // rounded to bf16) after the plain kernel, bit for bit; the block's rows at P + t.
    c.with_rope();
    RopeParams rp;
    auto dout = to_dev(out);
    rp.x = dout.get();
    rp.positions = c.a.out_positions;
    rp.inv_freq = c.a.out_inv_freq;
    rp.tokens = c.B * c.K;
    rp.heads = c.H;
    rp.head_stride = c.hd;
    rp.rope_offset = static_cast<int>(c.hd) - c.a.out_rope_dim;
    rp.rope_dim = c.a.out_rope_dim;
    rp.inverse = true;
    rp.round_bf16 = true;
    kernels::cuda::rope(rp, kStream);
    const std::vector<float> rot = c.run(false);
    EXPECT_TRUE(same_bits(rot, to_host(dout)))
        << "draft attention + inverse RoPE epilogue vs draft attention then rope (element = (row * heads + head) * "
        << c.hd << " + dim)";
    EXPECT_TRUE(same_bits(rot, c.run(true))) << "with the inverse RoPE epilogue vs the reference's";
  }
  TANDEM_REQUIRE_GPU();
}

// The model's shapes (32 heads per rank of TP=2, 64 unsharded, 8; head dim 512, and the builtin
// model's 6 heads of 128), one request (a full wrapped ring) and four (1 key, a partial ring, exactly
// full, wrapped), heads that do not fill a block's group: against the CPU within the bound and
// against the reference kernel bit for bit, with and without the epilogue's inverse RoPE. The
// launcher takes 1 head per block while the blocks fit on the GPU at once, then 2 and 4 beyond, so
// all three run here (the 128-dim shapes take 1 on an H100/H200), and chunks of 16, 32 and 64 keys
// (head dims 512, 256 and 128: keys_per_warp), each with the whole key list in shared memory where
// it fits and a chunk at a time.
TEST(CudaDraftAttention, ModelShapesMatchReferenceBitForBit) {
  struct Shape {
    int64_t H, hd;
    std::vector<int32_t> slot;
    std::vector<int64_t> P;
  };
  const std::vector<Shape> shapes = {{32, 512, {0}, {300}},
                                     {64, 512, {1}, {128}},
                                     {8, 512, {0}, {1000}},
                                     {32, 512, {3, 0, 2, 1}, {1, 77, 128, 1000}},
                                     {66, 512, {1, 0, 3, 2}, {5, 128, 260, 64}},
                                     {8, 128, {1, 0}, {40, 200}},
                                     {6, 128, {0}, {300}},
                                     {6, 128, {2, 0, 1, 3}, {1, 63, 129, 1000}},
                                     {8, 256, {1, 0}, {33, 400}}};
  uint64_t seed = 4100;
  for (KvRecordKind kind : {KvRecordKind::kFp8, KvRecordKind::kNvfp4, KvRecordKind::kBf16})
    for (const Shape& s : shapes) {
      DraftCase c(kind, s.H, s.hd, s.slot, s.P, seed);
      seed += 100;
      SCOPED_TRACE(::testing::Message() << kind_name(kind) << " heads " << s.H << " hd " << s.hd << " requests "
                                        << c.B);
      if (!have_gpu()) continue;
      AttnCheck chk;
      chk.target = false;
      c.add_rows(chk);
      const std::vector<float> out = c.run(false);
      chk.check_gpu(out, "draft_attention");
      EXPECT_TRUE(same_bits(out, c.run(true)))
          << "draft_attention vs the reference (element = (row * heads + head) * hd + dim)";
      EXPECT_TRUE(same_bits(out, c.run(false, false))) << "the whole key list vs a chunk at a time";
      c.with_rope();
      EXPECT_TRUE(same_bits(c.run(false), c.run(true))) << "with the inverse RoPE epilogue";
      EXPECT_TRUE(same_bits(c.run(false, false), c.run(true))) << "with the inverse RoPE epilogue, a chunk at a time";
      // Timings of the two model shapes (one request, fp8 records): the full size's 32 heads x 512
      // per rank and the built-in model's 6 x 128.
      if (kind == KvRecordKind::kFp8 && c.B == 1 && ((s.H == 32 && s.hd == 512) || (s.H == 6 && s.hd == 128))) {
        auto perf_out = poisoned<float>(out.size());
        c.a.out = perf_out.get();
        const double us_new = median_us([&] { cuda_model::draft_attention(c.a, kStream); });
        const double us_chunks = median_us([&] { cuda_model::draft_attention(c.a, kStream, false); });
        const double us_ref = median_us([&] { cuda_model::draft_attention_reference(c.a, kStream); });
        std::printf("[cuda perf] draft attention fp8, %d heads x %d, window 128 + 5, 1 request: %.1f us (a chunk at a "
                    "time: %.1f us; one block per (row, head): %.1f us)\n",
                    static_cast<int>(s.H), static_cast<int>(s.hd), us_new, us_chunks, us_ref);
        c.a.out = nullptr;
      }
    }
  TANDEM_REQUIRE_GPU();
}

// draft_attention's row decoder (8 dims at a time from the raw words) gives kv_record_get's values
// bit for bit (any NaN for a NaN), on records of random bytes (every code, NaN codes and scales,
// subnormal products, E8M0 scales 0 and 255) and on encoded rows.
TEST(CudaDraftAttention, RowDecoderMatchesRecordGet) {
  for (KvRecordKind kind : {KvRecordKind::kFp8, KvRecordKind::kNvfp4, KvRecordKind::kBf16})
    for (int hd : {512, 128}) {
      const KvRecordLayout l = KvRecordLayout::make(kind, hd, 64);
      const int64_t n = 600;
      SCOPED_TRACE(::testing::Message() << kind_name(kind) << " hd " << hd);
      std::vector<uint8_t> recs(static_cast<size_t>(n * l.bytes));
      uint64_t st = 0x9e3779b97f4a7c15ull + hd + static_cast<int>(kind);
      for (auto& b : recs) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        b = static_cast<uint8_t>(st >> 56);
      }
      for (int64_t r = n / 2; r < n; ++r) {  // the second half: encoded rows
        const std::vector<float> x = randn(static_cast<size_t>(hd), 77 + r, 1.0f, true);
        const std::vector<uint8_t> rec = encode_kv_record(x.data(), l);
        std::memcpy(&recs[r * l.bytes], rec.data(), rec.size());
      }
      std::vector<float> want(static_cast<size_t>(n * hd));
      size_t nan = 0;
      for (int64_t r = 0; r < n; ++r) {
        const std::vector<float> v = decode_kv_record(&recs[r * l.bytes], l);
        for (int d = 0; d < hd; ++d) {
          want[r * hd + d] = v[d];
          nan += std::isnan(v[d]);
        }
      }
      EXPECT_GT(nan, 0u) << "the random records hold NaN codes";
      if (!have_gpu()) continue;
      DeviceBuffer<uint8_t> drec = to_dev(recs);
      auto dout = poisoned<float>(want.size());
      cuda_model::draft_kv_decode_rows(drec.get(), n, l, dout.get(), kStream);
      EXPECT_TRUE(same_bits(to_host(dout), want)) << "element = record * hd + dim";
    }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
