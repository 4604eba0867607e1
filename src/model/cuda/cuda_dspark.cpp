// DSpark on the device (the CPU oracle is src/model/dspark.cpp): context-KV insertion from target
// taps into each stage's sliding-window ring of KV records, and batched drafting: three stages of
// non-causal attention of the block [anchor, noise x (K-1)] over the context ring plus the block,
// hc_head + the shared LM head, then K sequential Markov steps (gather, GEMV, argmax or a sample)
// that never leave the device until the K tokens, confidences and (when asked) q are copied out.
#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

using OpClass = CudaModel::OpClass;

Status CudaModel::draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps_rows) {
  const int64_t td = tap_dim();
  if (impl_->w.has_draft && taps_rows.size() % td)
    return invalid_argument("draft_insert_context: {} floats is not a multiple of tap_dim {}", taps_rows.size(), td);
  return impl_->insert_draft_context(slot, start_pos, taps_rows.data(),
                                     impl_->w.has_draft ? static_cast<int64_t>(taps_rows.size()) / td : 0,
                                     cudaMemcpyHostToDevice);
}

Status CudaModel::draft_insert_context_from_step(int slot, int64_t start_pos, int seq, int64_t rows) {
  Impl& m = *impl_;
  const size_t ns = m.step.batch ? m.step.batch->seqs.size() : 0;
  if (seq < 0 || static_cast<size_t>(seq) >= ns || static_cast<size_t>(seq) >= m.step.taps_row.size() ||
      m.step.taps_row[seq] < 0)
    return invalid_argument("draft_insert_context: batch entry {} of the last step has no taps", seq);
  if (rows < 0 || rows > static_cast<int64_t>(m.step.batch->seqs[seq].tokens.size()))
    return invalid_argument("draft_insert_context: {} rows of a {}-token entry", rows,
                            m.step.batch->seqs[seq].tokens.size());
  if (m.step.ctx_in_step) return Status();  // the step inserted every row itself (insert_step_context)
  return m.insert_draft_context(slot, start_pos, m.taps.get() + m.step.taps_row[seq] * tap_dim(), rows,
                                cudaMemcpyDeviceToDevice);
}

Status CudaModel::Impl::insert_draft_context(int slot, int64_t start_pos, const float* taps_rows, int64_t n,
                                             cudaMemcpyKind kind) {
  Impl& m = *this;
  const ModelConfig& c = m.cfg;
  if (!m.w.has_draft) return invalid_argument("draft_insert_context: the model has no DSpark draft");
  if (slot < 0 || slot >= m.opt.max_slots) return invalid_argument("draft_insert_context: slot {} out of range", slot);
  if (start_pos < 0) return invalid_argument("draft_insert_context: negative start_pos");
  const int64_t td = c.hidden_size * static_cast<int64_t>(c.dspark_target_layer_ids.size());
  if (n == 0) return Status();
  const int64_t W = c.sliding_window, R = m.lay.draft_ring;
  // Only the last W positions can ever be read.
  const int64_t skip = n > W ? n - W : 0;
  const float* rows = taps_rows + skip * td;
  const int64_t pos0 = start_pos + skip;
  n -= skip;
  for (int64_t r0 = 0; r0 < n; r0 += m.opt.max_tokens_per_step) {
    const int64_t rn = std::min<int64_t>(m.opt.max_tokens_per_step, n - r0);
    // Positions pos0 + r0 + t for the RoPE of the context KV.
    cuda_model::iota_positions({pos0 + r0, rn, m.draft_pos.get()}, m.stream);
    m.draft_context_records(rows + r0 * td, rn, kind, m.draft_pos.get(), 0, [&](int st, const uint8_t* records) {
      uint8_t* ring = m.draft_ctx.get() + slot * m.lay.draft_slot_bytes + st * R * m.lay.rec.bytes;
      cuda_model::ring_write({records, m.lay.rec.bytes, 0, rn, pos0 + r0, ring, static_cast<int>(R)}, m.stream);
    });
  }
  // No synchronization: copies from the caller's (pageable) rows complete before cudaMemcpyAsync
  // returns, device rows are read in stream order, and later work is ordered on the same stream.
  return Status();
}

template <typename Store>
void CudaModel::Impl::draft_context_records(const float* taps_rows, int64_t n, cudaMemcpyKind kind,
                                            const int64_t* positions, int64_t stage_stride, Store store) {
  Impl& m = *this;
  const ModelConfig& c = m.cfg;
  const int64_t td = c.hidden_size * static_cast<int64_t>(c.dspark_target_layer_ids.size());
  const int64_t D = c.hidden_size, hd = c.head_dim;
  // main_proj's input is bf16(taps): rows on the device are the step's taps (m.taps, which
  // taps_mean stores rounded to bf16) and are read where they are; a caller's host rows are copied
  // and rounded.
  const float* in = taps_rows;
  if (kind != cudaMemcpyDeviceToDevice) {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.mh.get(), taps_rows, sizeof(float) * n * td, kind, m.stream));
    kernels::RoundBf16Params rb;
    rb.x = m.mh.get();
    rb.rows = n;
    rb.cols = td;
    kernels::cuda::round_bf16(rb, m.stream);
    in = m.mh.get();
  }
  m.linear(m.w.draft.main_proj, in, n, m.main_x.get());
  m.norm_rows(m.main_x.get(), n, D, m.w.draft.main_norm);
  for (int st = 0; st < c.num_draft_stages; ++st) {
    const cuda_model::DAttn& a = m.w.draft.stages[st].attn;
    m.linear(a.wkv, m.main_x.get(), n, m.kv.get());
    // kv's RMSNorm, RoPE and records in one kernel (as the target's q_and_kv)
    uint8_t* records = m.kv_rec.get() + st * stage_stride;
    cuda_model::NormRopeArgs nr;
    nr.k = m.kv.get();
    nr.k_dim = static_cast<int>(hd);
    nr.k_norm = a.kv_norm;
    nr.rec = m.lay.rec;
    nr.records = records;
    nr.positions = positions;
    nr.inv_freq = m.rope_swa.get();
    nr.rope_dim = static_cast<int>(c.qk_rope_head_dim);
    nr.tokens = n;
    nr.eps = static_cast<float>(c.rms_norm_eps);
    m.dec.packed_x = nullptr;  // as norm_rows: kv is rewritten
    cuda_model::norm_rope(nr, m.stream);
    store(st, records);
  }
}

void CudaModel::Impl::insert_step_context() {
  // The rows' kernels are the commit path's for the same rows (decode_gemm and the tensor-core
  // GEMMs give a row the same bits whatever the row count), so every accepted row's records equal
  // what draft_insert_context_from_step would store.
  // The last layer's ring commit (ring_stream, joined at the end of the step otherwise) still
  // reads the step's KV records in kv_rec, which stage 0's records below overwrite.
  join_ring();
  const bool was_in_step = in_step;
  in_step = false;  // the linears choose by the row count, as outside a step
  const int64_t n = step.rows;
  const int64_t rb = lay.rec.bytes, R = lay.draft_ring;
  cuda_model::RingCommitArgs rings[cuda_model::kMaxRingCommits];
  int nrings = 0;
  section(OpClass::kOther);
  draft_context_records(taps.get(), n, cudaMemcpyDeviceToDevice, meta.positions, n * rb,
                        [&](int st, const uint8_t* records) {
                          rings[nrings++] = {records, rb, meta, n, draft_ctx.get(), lay.draft_slot_bytes, st * R * rb,
                                             static_cast<int>(R)};
                          if (nrings == cuda_model::kMaxRingCommits) {
                            cuda_model::ring_commit_batch(rings, nrings, stream);
                            nrings = 0;
                          }
                        });
  cuda_model::ring_commit_batch(rings, nrings, stream);
  in_step = was_in_step;
}

void CudaModel::Impl::launch_draft(int64_t B, bool want_probs) {
  draft_inputs(B);
  for (int st = 0; st < cfg.num_draft_stages; ++st) {
    draft_stage_attention(st, B);
    draft_stage_ffn(st, B);
  }
  draft_heads(B, want_probs);
  join_comb();  // every branch ends in the draft (hc_post joins each; this is the backstop)
  join_ring();
}

void CudaModel::Impl::draft_inputs(int64_t B) {
  const ModelConfig& c = cfg;
  const int64_t K = draft_k;
  const int64_t N = B * K;
  // slots | anchors | positions | T | seeds: one copy (draft_host and d_draft_in share the layout)
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(d_draft_in.get(), draft_host, 32 * B, cudaMemcpyHostToDevice, stream));
  const DraftIn in = draft_in(B);
  cuda_model::draft_block_ids(
      {in.prev, B, static_cast<int>(K), static_cast<int32_t>(c.dspark_noise_token_id), draft_ids.get()}, stream);
  cuda_model::block_positions({in.pos, N, static_cast<int>(K), draft_pos.get()}, stream);
  embed_tokens(draft_ids.get(), N);  // vocabulary-parallel under tensor parallelism
}

void CudaModel::Impl::draft_stage_attention(int st, int64_t B) {
  const ModelConfig& c = cfg;
  const int64_t K = draft_k;
  const int64_t hd = c.head_dim, W = c.sliding_window;
  const int64_t N = B * K;
  const int64_t* pos = draft_pos.get();
  const cuda_model::DBlock& b = w.draft.stages[st];
  const int64_t H = b.attn.n_heads;  // this rank's heads (the stages shard like the target's blocks)
  section(OpClass::kMhc);
  // hc_pre + attn_norm (+ the norm's act_quant codes for the projections) in one launch, as the
  // target's layers.
  hc_pre(h.get(), N, b.hc_attn_fn, b.hc_attn_scale, b.hc_attn_base, x.get(), post.get(), comb.get(), b.attn_norm);
  q_and_kv(b.attn, x.get(), N, rope_swa.get(), pos);  // q, kv normalized and rotated, kv's records
  section(OpClass::kAttention);
  cuda_model::DraftAttnArgs da;
  da.q = q.get();
  da.block_kv = kv.get();
  da.ctx = draft_ctx.get();
  da.slot_stride = lay.draft_slot_bytes;
  da.stage_off = static_cast<int64_t>(st) * lay.draft_ring * lay.rec.bytes;
  const DraftIn in = draft_in(B);
  da.req_slot = in.slot;
  da.req_pos = in.pos;
  da.K = static_cast<int>(K);
  da.window = static_cast<int>(W);
  da.ring = lay.draft_ring;
  da.sink = b.attn.attn_sink;
  da.heads = static_cast<int>(H);
  da.hd = static_cast<int>(hd);
  da.rec = lay.rec;
  da.out = o.get();
  da.B = B;
  da.out_positions = pos;  // o's inverse RoPE in the attention's epilogue
  da.out_inv_freq = rope_swa.get();
  da.out_rope_dim = static_cast<int>(c.qk_rope_head_dim);
  cuda_model::draft_attention(da, stream);
  output_proj(b.attn, o.get(), N, a.get());
  section(OpClass::kMhc);
  hc_post(a.get(), h.get(), N, h.get());  // the op reads every residual stream before writing
}

void CudaModel::Impl::draft_stage_ffn(int st, int64_t B) {
  const int64_t N = B * draft_k;
  const cuda_model::DBlock& b = w.draft.stages[st];
  section(OpClass::kMhc);
  hc_pre(h.get(), N, b.hc_ffn_fn, b.hc_ffn_scale, b.hc_ffn_base, x.get(), post.get(), comb.get(), b.ffn_norm);
  moe(b.ffn, x.get(), draft_ids.get(), N, a.get(), cfg.num_hidden_layers + st);  // draft stages after the target's layers
  section(OpClass::kMhc);
  hc_post(a.get(), h.get(), N, h.get());  // the op reads every residual stream before writing
}

void CudaModel::Impl::draft_heads(int64_t B, bool want_probs) {
  const ModelConfig& c = cfg;
  const int64_t K = draft_k, D = c.hidden_size, V = c.vocab_size, Rk = c.dspark_markov_rank;
  const int64_t N = B * K;
  const cuda_model::DDraft& dw = w.draft;
  head_logits(h.get(), N, w, dw.hc_head_fn, dw.hc_head_scale, dw.hc_head_base, dw.norm, head_y.get(),
                base.get());

  // Markov correction: K sequential steps over all requests at once.
  section(OpClass::kLmHead);
  cuda_model::MarkovStepArgs ms;
  ms.base = base.get();
  ms.bias = bias.get();
  ms.e = e_row.get();
  ms.y = head_y.get();
  ms.conf_w = dw.confidence;
  const DraftIn in = draft_in(B);
  ms.temperature = in.temp;
  ms.seed = in.seed;
  ms.pos = in.pos;
  ms.V = V;
  ms.dim = D;
  ms.rank = Rk;
  ms.K = static_cast<int>(K);
  ms.prev = in.prev;
  ms.tokens = d_tokens.get();
  ms.conf = d_conf.get();
  ms.logits = d_zlogits.get();
  ms.probs = want_probs ? d_probs.get() : nullptr;
  ms.B = B;
  ms.scratch = markov_scratch.get();
  // Position 0's e from the anchors; each step's finishing CTAs gather the next position's.
  cuda_model::markov_gather({dw.markov_w1.w, in.prev, B, Rk, e_row.get()}, stream);
  ms.w1 = dw.markov_w1.w;
  ms.e_next = e_row.get();
  for (int64_t i = 0; i < K; ++i) {
    linear(dw.markov_w2, e_row.get(), B, bias.get(), false);
    ms.i = static_cast<int>(i);
    cuda_model::markov_step(ms, stream);
  }
}

Status CudaModel::draft_propose(std::span<const DraftQueryDev> requests, bool want_probs,
                                std::vector<DraftResult>& results, bool want_logits) {
  Impl& m = *impl_;
  const Impl::CallTimer timer(m);
  const ModelConfig& c = m.cfg;
  if (!m.w.has_draft) return invalid_argument("draft_propose: the model has no DSpark draft");
  const int64_t B = static_cast<int64_t>(requests.size());
  if (B > m.max_draft_requests)
    return invalid_argument("draft_propose: {} requests, more than the {} this runner was sized for", B,
                            m.max_draft_requests);
  const int64_t K = m.draft_k, V = c.vocab_size;
  for (const DraftQueryDev& r : requests) {
    if (r.slot < 0 || r.slot >= m.opt.max_slots) return invalid_argument("draft_propose: slot {} out of range", r.slot);
    if (r.anchor_token < 0 || r.anchor_token >= V)
      return invalid_argument("draft_propose: anchor token {} outside the vocabulary", r.anchor_token);
    if (r.anchor_pos < 1) return invalid_argument("draft_propose: anchor position must be >= 1 (context needed)");
  }
  results.resize(requests.size());
  if (B == 0) return Status();

  const int64_t N = B * K;

  // Request arrays through the pinned staging area: slots, anchors (as prev), positions, T, seeds.
  uint8_t* hs = m.draft_host;
  auto* h_slot = reinterpret_cast<int32_t*>(hs);
  auto* h_prev = reinterpret_cast<int32_t*>(hs + 4 * B);
  auto* h_pos = reinterpret_cast<int64_t*>(hs + 8 * B);
  auto* h_temp = reinterpret_cast<double*>(hs + 16 * B);
  auto* h_seed = reinterpret_cast<uint64_t*>(hs + 24 * B);
  auto* h_tok = reinterpret_cast<int32_t*>(hs + 32 * B);
  auto* h_conf = reinterpret_cast<float*>(hs + 32 * B + 4 * N);
  // Sampled requests need q on the device (verification reads it from the slot's store).
  bool any_sampled = false;
  for (const DraftQueryDev& r : requests) any_sampled = any_sampled || !is_greedy(r.temperature);
  const bool host_probs = want_probs;
  want_probs = want_probs || any_sampled;
  for (int64_t b = 0; b < B; ++b) {
    h_slot[b] = requests[b].slot;
    h_prev[b] = requests[b].anchor_token;
    h_pos[b] = requests[b].anchor_pos;
    h_temp[b] = requests[b].temperature;
    h_seed[b] = requests[b].seed;
  }
  // Drafts replay a CUDA graph per (requests, probabilities wanted) when graphs are on: the first
  // draft of a shape runs eagerly, then the same launches are captured (they read the requests
  // from the pinned staging area, so a replay drafts the current requests).
  if (m.copt.max_graph_batch > 0) {
    const std::pair<int64_t, bool> key{B, want_probs};
    auto it = m.draft_graphs.find(key);
    if (it != m.draft_graphs.end()) {
      TANDEM_CUDA_CHECK(cudaGraphLaunch(it->second, m.stream));
      ++m.gstats.replays;
    } else {
      m.capture_draft(B, want_probs);
    }
  } else {
    m.launch_draft(B, want_probs);
    ++m.gstats.eager;
  }
  for (int64_t b = 0; b < B; ++b)
    if (!is_greedy(requests[b].temperature))
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.q_store.get() + static_cast<int64_t>(requests[b].slot) * K * V,
                                        m.d_probs.get() + b * K * V, sizeof(float) * K * V, cudaMemcpyDeviceToDevice,
                                        m.stream));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_tok, m.d_tokens.get(), 4 * N, cudaMemcpyDeviceToHost, m.stream));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_conf, m.d_conf.get(), 4 * N, cudaMemcpyDeviceToHost, m.stream));
  for (int64_t b = 0; b < B; ++b) {
    DraftResult& r = results[b];
    r.logits.clear();
    if (want_logits) {
      r.logits.resize(K * V);
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(r.logits.data(), m.d_zlogits.get() + b * K * V, sizeof(float) * K * V,
                                        cudaMemcpyDeviceToHost, m.stream));
    }
    if (host_probs) {
      r.probs.resize(K * V);
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(r.probs.data(), m.d_probs.get() + b * K * V, sizeof(float) * K * V,
                                        cudaMemcpyDeviceToHost, m.stream));
    } else {
      r.probs.clear();
    }
  }
  m.wait_stream();
  // A failed collective leaves the group's state undefined: the caller drops the whole group.
  TANDEM_RETURN_IF_ERROR(std::exchange(m.comm_status, Status()));
  for (int64_t b = 0; b < B; ++b) {
    DraftResult& r = results[b];
    r.tokens.assign(h_tok + b * K, h_tok + (b + 1) * K);
    r.confidence.assign(h_conf + b * K, h_conf + (b + 1) * K);
  }
  return Status();
}

Result<CudaModel::StepProfile> CudaModel::profile_draft(std::span<const DraftQueryDev> requests, int reps,
                                                       const ReplayHook& hook, int eager_reps, bool ablate) {
  Impl& m = *impl_;
  std::vector<DraftResult> res;
  // One real proposal first: validates, stages the requests and warms every kernel.
  TANDEM_RETURN_IF_ERROR(draft_propose(requests, false, res));
  const int64_t B = static_cast<int64_t>(requests.size());
  StepProfile prof = cuda_model::time_eager_and_graph(m.stream, reps, eager_reps < 0 ? reps : eager_reps,
                                                      [&m, B] { m.launch_draft(B, false); }, hook, &m.marks, ablate);
  // the timing graph (the profiler's, the ablated ones)
  m.gstats.instantiations += (hook ? 2 : 1) + static_cast<int64_t>(prof.ablation.size());
  TANDEM_RETURN_IF_ERROR(std::exchange(m.comm_status, Status()));
  return prof;
}

}  // namespace tandem
