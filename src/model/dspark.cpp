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
  int64_t K = 0;
  TANDEM_RETURN_IF_ERROR(m.draft_begin(requests, sampling.num_tokens, &K));
  const int64_t N = static_cast<int64_t>(requests.size()) * K;
  float* h = m.ds.h.data();
  for (int st = 0; st < m.cfg.num_draft_stages; ++st) {
    m.draft_stage_attention(st, requests, K, h);
    m.draft_stage_ffn(st, N, h);
  }
  return m.draft_finish(requests, sampling, K, h, results);
}

Status DsV4Model::Impl::draft_begin(std::span<const DraftRequest> requests, int64_t num_tokens, int64_t* k_out) {
  const ModelConfig& c = cfg;
  if (!w.has_draft) return invalid_argument("draft_propose: the model has no DSpark draft");
  if (num_tokens < 0 || num_tokens > c.dspark_block_size)
    return invalid_argument("draft_propose: {} draft tokens requested, the draft block holds {}", num_tokens,
                            c.dspark_block_size);
  const int64_t K = num_tokens > 0 ? num_tokens : c.dspark_block_size;
  const int64_t D = c.hidden_size, hc = c.hc_mult, HD = hc * D, V = c.vocab_size;
  // Local heads: the stages are sharded like the target's blocks (every stage has the same count).
  const int64_t H = w.draft.stages[0].attn.n_local_heads, hd = c.head_dim;
  const int64_t R = c.dspark_markov_rank, ql = c.q_lora_rank;
  for (const DraftRequest& r : requests) {
    if (r.slot < 0 || r.slot >= opt.max_slots) return invalid_argument("draft_propose: slot {} out of range", r.slot);
    if (r.anchor_token < 0 || r.anchor_token >= V)
      return invalid_argument("draft_propose: anchor token {} outside the vocabulary", r.anchor_token);
    if (r.anchor_pos < 1) return invalid_argument("draft_propose: anchor position must be >= 1 (context needed)");
  }
  for (const DraftRequest& r : requests) flush_draft_context(r.slot);
  use_threads();
  // Buffers live in ds (sized on the first call, reused after): no allocation per draft step.
  // All requests' blocks go through the stages together (B*K rows): mHC, norms, projections, MoE
  // and the LM head read their weights once per call; RoPE and attention over each request's own
  // context window run per request. Each row's math is the same as for a request drafted alone.
  DraftScratch& d = ds;
  const int64_t B = static_cast<int64_t>(requests.size()), N = B * K;
  d.ids.resize(N);
  d.h.resize(N * HD);
  d.res.resize(N * HD);
  d.x.resize(N * D);
  d.a.resize(N * D);
  d.post.resize(N * hc);
  d.comb.resize(N * hc * hc);
  d.qr.resize(N * ql);
  d.q.resize(N * H * hd);
  d.kv.resize(N * hd);
  d.o.resize(N * H * hd);
  d.y.resize(N * D);
  d.yn.resize(N * D);
  d.base.resize(N * V);
  d.bias.resize(V);
  d.feat.resize(D + R);
  d.e_row.resize(R);
  for (int64_t ri = 0; ri < B; ++ri)
    for (int64_t t = 0; t < K; ++t)
      d.ids[ri * K + t] = t == 0 ? requests[ri].anchor_token : static_cast<int32_t>(c.dspark_noise_token_id);
  embed_rows(d.ids.data(), N, d.h.data(), HD);
  for (int64_t row = 0; row < N; ++row)
    for (int64_t k = 1; k < hc; ++k) std::memcpy(&d.h[row * HD + k * D], &d.h[row * HD], sizeof(float) * D);
  *k_out = K;
  return Status();
}

void DsV4Model::Impl::draft_stage_attention(int st, std::span<const DraftRequest> requests, int64_t K, float* h) {
  const ModelConfig& c = cfg;
  const int64_t D = c.hidden_size, HD = c.hc_mult * D;
  const int64_t H = w.draft.stages[0].attn.n_local_heads, hd = c.head_dim, W = c.sliding_window;
  const int64_t B = static_cast<int64_t>(requests.size()), N = B * K;
  DraftScratch& d = ds;
  const model::BlockW& b = w.draft.stages[st];
  std::memcpy(d.res.data(), h, sizeof(float) * N * HD);
  hc_pre(h, N, b.hc_attn_fn, b.hc_attn_scale, b.hc_attn_base, d.x.data(), d.post.data(), d.comb.data());
  norm_rows(d.x.data(), N, D, b.attn_norm);
  q_and_kv(b.attn, rope_swa, d.x.data(), N, 0, d.qr.data(), d.q.data(), d.kv.data(), /*apply_rope=*/false);
  for (int64_t ri = 0; ri < B; ++ri) {
    const int64_t P = requests[ri].anchor_pos;
    float* qb = &d.q[ri * K * H * hd];
    float* kvb = &d.kv[ri * K * hd];
    float* ob = &d.o[ri * K * H * hd];
    rope_rows(rope_swa, qb, K, H, hd, P, 1, false);
    rope_rows(rope_swa, kvb, K, 1, hd, P, 1, false);
    const float* ctx = draft_ctx.data() + static_cast<int64_t>(requests[ri].slot) * c.num_draft_stages * W * hd;
    d.keys.clear();
    for (int64_t p = std::max<int64_t>(0, P - W); p < P; ++p) d.keys.push_back(ctx + st * W * hd + (p % W) * hd);
    for (int64_t t = 0; t < K; ++t) d.keys.push_back(&kvb[t * hd]);
    for (int64_t t = 0; t < K; ++t) attend(&qb[t * H * hd], H, d.keys, b.attn.attn_sink, &ob[t * H * hd]);
    rope_rows(rope_swa, ob, K, H, hd, P, 1, true);
  }
  output_proj(b.attn, d.o.data(), N, d.a.data());
  if (tp()) all_reduce_bf16(d.a.data(), N * D);  // wo_b is row-parallel
  hc_post(d.a.data(), d.res.data(), d.post.data(), d.comb.data(), N, h);
}

void DsV4Model::Impl::draft_stage_ffn(int st, int64_t N, float* h) {
  const int64_t D = cfg.hidden_size, HD = cfg.hc_mult * D;
  DraftScratch& d = ds;
  const model::BlockW& b = w.draft.stages[st];
  std::memcpy(d.res.data(), h, sizeof(float) * N * HD);
  hc_pre(h, N, b.hc_ffn_fn, b.hc_ffn_scale, b.hc_ffn_base, d.x.data(), d.post.data(), d.comb.data());
  norm_rows(d.x.data(), N, D, b.ffn_norm);
  moe(b.ffn, d.x.data(), d.ids.data(), N, d.a.data());
  hc_post(d.a.data(), d.res.data(), d.post.data(), d.comb.data(), N, h);
}

Status DsV4Model::Impl::draft_finish(std::span<const DraftRequest> requests, const DraftSampling& sampling, int64_t K,
                                     const float* h, std::vector<DraftResult>& results) {
  const ModelConfig& c = cfg;
  const int64_t D = c.hidden_size, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t B = static_cast<int64_t>(requests.size()), N = B * K;
  DraftScratch& d = ds;
  results.resize(requests.size());
  const model::DraftW& dw = w.draft;
  hc_head(h, N, dw.hc_head_fn, dw.hc_head_scale, dw.hc_head_base, d.y.data());
  d.yn = d.y;
  norm_rows(d.yn.data(), N, D, dw.norm);
  head_gemm(d.yn.data(), N, d.base.data());  // the shared (vocab-parallel) LM head
  TANDEM_RETURN_IF_ERROR(take_comm_status());

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
      dw.markov_w1.row(prev, d.e_row.data());
      const float* e = d.e_row.data();
      linear(dw.markov_w2, e, 1, d.bias.data(), false);
      float* z = &out.logits[i * V];
      const int64_t brow = ri * K + i;
      for (int64_t v = 0; v < V; ++v) z[v] = d.base[brow * V + v] + d.bias[v];
      std::memcpy(d.feat.data(), &d.y[brow * D], sizeof(float) * D);
      std::memcpy(d.feat.data() + D, e, sizeof(float) * R);
      out.confidence[i] = model::dot(d.feat.data(), dw.confidence.data(), D + R);
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
