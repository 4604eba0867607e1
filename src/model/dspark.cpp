// DSpark draft on the CPU: context-KV insertion from target taps (main_proj + main_norm, per-stage
// wkv/kv_norm/RoPE/KV-dtype round trip into a sliding_window ring), three stages of non-causal attention of the
// block [anchor, noise x (K-1)] at positions P..P+K-1 over the context window plus the whole block,
// hc_head + shared LM head, the sequential Markov correction and the raw confidence projection.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/numeric.h"
#include "model/impl.h"

namespace tandem {

void DsV4Model::draft_reset(int slot) {
  Impl& m = *impl_;
  TANDEM_CHECK(slot >= 0 && slot < m.opt.max_slots);
  if (!m.w.has_draft) return;
  const int64_t per = static_cast<int64_t>(m.cfg.num_draft_stages) * m.cfg.sliding_window * m.cfg.head_dim;
  std::fill(m.draft_ctx.begin() + slot * per, m.draft_ctx.begin() + (slot + 1) * per, 0.0f);
  m.pending_n[slot] = 0;
}

Status DsV4Model::draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps_rows) {
  Impl& m = *impl_;
  if (!m.w.has_draft) return invalid_argument("draft_insert_context: the model has no DSpark draft");
  if (slot < 0 || slot >= m.opt.max_slots) return invalid_argument("draft_insert_context: slot {} out of range", slot);
  if (start_pos < 0) return invalid_argument("draft_insert_context: negative start_pos");
  const int64_t td = tap_dim();
  if (taps_rows.size() % td)
    return invalid_argument("draft_insert_context: {} floats is not a multiple of tap_dim {}", taps_rows.size(), td);
  const int64_t n = static_cast<int64_t>(taps_rows.size()) / td;
  if (n == 0) return Status();
  // Decode steps insert one to K+1 rows each: they wait in the slot's pending buffer and are
  // projected together (one GEMM instead of one GEMV per step) when the slot drafts, is exported,
  // or the buffer fills. A request that is not drafting (auto mode) thus pays almost nothing for
  // keeping its draft window current. Results are the same: every step is per row.
  int64_t& pn = m.pending_n[slot];
  if (pn > 0 && (start_pos != m.pending_start[slot] + pn || pn + n > Impl::kPendingRows)) m.flush_draft_context(slot);
  if (n >= Impl::kPendingRows) {
    m.project_draft_context(slot, start_pos, taps_rows.data(), n);
    return Status();
  }
  if (pn == 0) m.pending_start[slot] = start_pos;
  std::memcpy(m.draft_pending.data() + (static_cast<int64_t>(slot) * Impl::kPendingRows + pn) * td, taps_rows.data(),
              sizeof(float) * n * td);
  pn += n;
  return Status();
}

void DsV4Model::Impl::flush_draft_context(int slot) {
  if (pending_n[slot] == 0) return;
  const int64_t td = static_cast<int64_t>(cfg.hidden_size) * static_cast<int64_t>(cfg.dspark_target_layer_ids.size());
  const int64_t n = pending_n[slot];
  pending_n[slot] = 0;
  project_draft_context(slot, pending_start[slot], draft_pending.data() + static_cast<int64_t>(slot) * kPendingRows * td,
                        n);
}

void DsV4Model::Impl::project_draft_context(int slot, int64_t start_pos, const float* taps_rows, int64_t n) {
  const ModelConfig& c = cfg;
  const int64_t td = static_cast<int64_t>(c.hidden_size) * static_cast<int64_t>(c.dspark_target_layer_ids.size());
  const int64_t D = c.hidden_size, hd = c.head_dim, rd = c.qk_rope_head_dim, W = c.sliding_window;
  // Only the last W positions can ever be read.
  int64_t first = 0;
  if (n > W) first = n - W;
  const float* rows = taps_rows + first * td;
  const int64_t pos0 = start_pos + first;
  n -= first;
  use_threads();
  auto& mh = ds.mh;
  auto& main_x = ds.main_x;
  auto& kv = ds.ctx_kv;
  mh.assign(rows, rows + n * td);
  main_x.resize(n * D);
  kv.resize(n * hd);
  model::round_bf16(mh.data(), mh.size());
  linear(w.draft.main_proj, mh.data(), n, main_x.data());
  norm_rows(main_x.data(), n, D, w.draft.main_norm);
  const int64_t per_stage = W * hd;
  float* ctx = draft_ctx.data() + static_cast<int64_t>(slot) * c.num_draft_stages * per_stage;
  for (int st = 0; st < c.num_draft_stages; ++st) {
    const model::AttentionW& a = w.draft.stages[st].attn;
    linear(a.wkv, main_x.data(), n, kv.data());
    norm_rows(kv.data(), n, hd, a.kv_norm);
    rope_rows(rope_swa, kv.data(), n, 1, hd, pos0, 1, false);
    kv_nope(kv.data(), n, hd, hd - rd);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(ctx + st * per_stage + ((pos0 + t) % W) * hd, &kv[t * hd], sizeof(float) * hd);
  }
}

Status DsV4Model::draft_propose(std::span<const DraftRequest> requests, const DraftSampling& sampling,
                                std::vector<DraftResult>& results) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg;
  if (!m.w.has_draft) return invalid_argument("draft_propose: the model has no DSpark draft");
  if (sampling.num_tokens < 0 || sampling.num_tokens > c.dspark_block_size)
    return invalid_argument("draft_propose: {} draft tokens requested, the draft block holds {}", sampling.num_tokens,
                            c.dspark_block_size);
  const int64_t K = sampling.num_tokens > 0 ? sampling.num_tokens : c.dspark_block_size;
  const int64_t D = c.hidden_size, hc = c.hc_mult, HD = hc * D, V = c.vocab_size;
  // Local heads: the stages are sharded like the target's blocks (every stage has the same count).
  const int64_t H = m.w.draft.stages[0].attn.n_local_heads, hd = c.head_dim, W = c.sliding_window;
  const int64_t R = c.dspark_markov_rank, ql = c.q_lora_rank;
  for (const DraftRequest& r : requests) {
    if (r.slot < 0 || r.slot >= m.opt.max_slots) return invalid_argument("draft_propose: slot {} out of range", r.slot);
    if (r.anchor_token < 0 || r.anchor_token >= V)
      return invalid_argument("draft_propose: anchor token {} outside the vocabulary", r.anchor_token);
    if (r.anchor_pos < 1) return invalid_argument("draft_propose: anchor position must be >= 1 (context needed)");
  }
  for (const DraftRequest& r : requests) m.flush_draft_context(r.slot);
  results.resize(requests.size());
  m.use_threads();
  // Buffers live in m.ds (sized on the first call, reused after): no allocation per draft step.
  Impl::DraftScratch& d = m.ds;
  auto sized = [](auto& v, int64_t n) -> auto& {
    v.resize(n);
    return v;
  };
  // All requests' blocks go through the stages together (B*K rows): mHC, norms, projections, MoE
  // and the LM head read their weights once per call; RoPE and attention over each request's own
  // context window run per request. Each row's math is the same as for a request drafted alone.
  const int64_t B = static_cast<int64_t>(requests.size()), N = B * K;
  auto& ids = sized(d.ids, N);
  auto &h = sized(d.h, N * HD), &res = sized(d.res, N * HD), &x = sized(d.x, N * D), &a = sized(d.a, N * D);
  auto &post = sized(d.post, N * hc), &comb = sized(d.comb, N * hc * hc), &qr = sized(d.qr, N * ql);
  auto &q = sized(d.q, N * H * hd), &kv = sized(d.kv, N * hd), &o = sized(d.o, N * H * hd);
  auto &y = sized(d.y, N * D), &yn = sized(d.yn, N * D), &base = sized(d.base, N * V);
  auto &bias = sized(d.bias, V), &feat = sized(d.feat, D + R), &e_row = sized(d.e_row, R);
  auto& keys = d.keys;
  for (int64_t ri = 0; ri < B; ++ri)
    for (int64_t t = 0; t < K; ++t)
      ids[ri * K + t] = t == 0 ? requests[ri].anchor_token : static_cast<int32_t>(c.dspark_noise_token_id);
  m.embed_rows(ids.data(), N, h.data(), HD);
  for (int64_t row = 0; row < N; ++row)
    for (int64_t k = 1; k < hc; ++k) std::memcpy(&h[row * HD + k * D], &h[row * HD], sizeof(float) * D);
  for (int st = 0; st < c.num_draft_stages; ++st) {
    const model::BlockW& b = m.w.draft.stages[st];
    res = h;
    m.hc_pre(h.data(), N, b.hc_attn_fn, b.hc_attn_scale, b.hc_attn_base, x.data(), post.data(), comb.data());
    m.norm_rows(x.data(), N, D, b.attn_norm);
    m.q_and_kv(b.attn, m.rope_swa, x.data(), N, 0, qr.data(), q.data(), kv.data(), /*apply_rope=*/false);
    for (int64_t ri = 0; ri < B; ++ri) {
      const int64_t P = requests[ri].anchor_pos;
      float* qb = &q[ri * K * H * hd];
      float* kvb = &kv[ri * K * hd];
      float* ob = &o[ri * K * H * hd];
      m.rope_rows(m.rope_swa, qb, K, H, hd, P, 1, false);
      m.rope_rows(m.rope_swa, kvb, K, 1, hd, P, 1, false);
      const float* ctx = m.draft_ctx.data() + static_cast<int64_t>(requests[ri].slot) * c.num_draft_stages * W * hd;
      keys.clear();
      for (int64_t p = std::max<int64_t>(0, P - W); p < P; ++p) keys.push_back(ctx + st * W * hd + (p % W) * hd);
      for (int64_t t = 0; t < K; ++t) keys.push_back(&kvb[t * hd]);
      for (int64_t t = 0; t < K; ++t) m.attend(&qb[t * H * hd], H, keys, b.attn.attn_sink, &ob[t * H * hd]);
      m.rope_rows(m.rope_swa, ob, K, H, hd, P, 1, true);
    }
    m.output_proj(b.attn, o.data(), N, a.data());
    if (m.tp()) m.all_reduce_bf16(a.data(), N * D);  // wo_b is row-parallel
    m.hc_post(a.data(), res.data(), post.data(), comb.data(), N, h.data());
    res = h;
    m.hc_pre(h.data(), N, b.hc_ffn_fn, b.hc_ffn_scale, b.hc_ffn_base, x.data(), post.data(), comb.data());
    m.norm_rows(x.data(), N, D, b.ffn_norm);
    m.moe(b.ffn, x.data(), ids.data(), N, a.data());
    m.hc_post(a.data(), res.data(), post.data(), comb.data(), N, h.data());
  }
  const model::DraftW& dw = m.w.draft;
  m.hc_head(h.data(), N, dw.hc_head_fn, dw.hc_head_scale, dw.hc_head_base, y.data());
  yn = y;
  m.norm_rows(yn.data(), N, D, dw.norm);
  m.head_gemm(yn.data(), N, base.data());  // the shared (vocab-parallel) LM head
  TANDEM_RETURN_IF_ERROR(m.take_comm_status());

  // The Markov correction is sequential along each block. Draws go through the host sampler
  // (the same RowSampler as the target's rows), keyed by (seed, drafted position): a request's
  // drafts never depend on its batch neighbours, and the CUDA draft keys its draws the same way.
  if (!d.sampler) d.sampler = std::make_unique<RowSampler>(V);
  RowSampler& rs = *d.sampler;
  SampleInputs in;
  in.vocab = V;
  for (int64_t ri = 0; ri < B; ++ri) {
    const DraftRequest& r = requests[ri];
    DraftResult& out = results[ri];
    out.tokens.assign(K, 0);
    out.confidence.assign(K, 0.0f);
    out.logits.resize(K * V);
    if (sampling.want_probs) out.probs.resize(K * V);
    SampleRow row;
    row.temperature = r.temperature;
    row.seed = r.seed;
    int32_t prev = r.anchor_token;
    for (int64_t i = 0; i < K; ++i) {
      dw.markov_w1.row(prev, e_row.data());
      const float* e = e_row.data();
      m.linear(dw.markov_w2, e, 1, bias.data(), false);
      float* z = &out.logits[i * V];
      const int64_t brow = ri * K + i;
      for (int64_t v = 0; v < V; ++v) z[v] = base[brow * V + v] + bias[v];
      std::memcpy(feat.data(), &y[brow * D], sizeof(float) * D);
      std::memcpy(feat.data() + D, e, sizeof(float) * R);
      out.confidence[i] = model::dot(feat.data(), dw.confidence.data(), D + R);
      row.position = r.anchor_pos + i + 1;
      rs.prepare(z, row, in);
      const int32_t tok = rs.sample(rng_uniform(r.seed, row.position, RngStream::kDraft));
      if (sampling.want_probs) rs.probs(&out.probs[i * V]);
      out.tokens[i] = tok;
      prev = tok;
    }
  }
  return Status();
}

}  // namespace tandem
