// The CPU oracle's test-only entry points (model_testing.h): thin wrappers over DsV4Model::Impl's
// layer halves, step prologue and draft pieces, which forward() and draft_propose() also run.
#include "model/model_testing.h"

#include <algorithm>

#include "common/check.h"
#include "model/impl.h"

namespace tandem {

struct CpuModelTestAccess {
  static DsV4Model::Impl& impl(DsV4Model& m) { return *m.impl_; }
  static const DsV4Model::Impl& impl(const DsV4Model& m) { return *m.impl_; }
};

namespace model_testing {

namespace {
int64_t step_rows(const StepBatch& batch) {
  int64_t n = 0;
  for (const SeqStep& q : batch.seqs) n += static_cast<int64_t>(q.tokens.size());
  return n;
}
}  // namespace

CpuLayerState cpu_layer_state(const DsV4Model& m, int layer) {
  const DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  TANDEM_CHECK(layer >= 0 && layer < im.cfg.num_hidden_layers);
  const auto& L = im.layout[layer];
  CpuLayerState s;
  s.ratio = im.cfg.compress_ratios[layer];
  s.has_indexer = im.w.layers[layer].attn.has_indexer;
  s.win_off = L.win_off;
  s.win_ring = im.win_ring;
  if (s.ratio) {
    s.comp_off = L.comp.off;
    s.comp_ring = L.comp.ring;
    s.comp_chans = L.comp.chans;
    s.pool_main = L.pool_main;
  }
  if (s.has_indexer) {
    s.icomp_off = L.icomp.off;
    s.icomp_ring = L.icomp.ring;
    s.icomp_chans = L.icomp.chans;
    s.pool_idx = L.pool_idx;
  }
  return s;
}

std::span<float> cpu_slot_floats(DsV4Model& m, int slot) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots);
  return {im.slot_ptr(slot), static_cast<size_t>(im.slot_floats)};
}

std::span<float> cpu_pool_floats(DsV4Model& m) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  return {im.pool.data(), im.pool.size()};
}

int64_t cpu_block_floats(const DsV4Model& m) { return CpuModelTestAccess::impl(m).block_floats; }

std::span<float> cpu_draft_context(DsV4Model& m, int slot) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots);
  if (!im.w.has_draft) return {};
  im.flush_draft_context(slot);
  const int64_t per = static_cast<int64_t>(im.cfg.num_draft_stages) * im.cfg.sliding_window * im.cfg.head_dim;
  return {im.draft_ctx.data() + slot * per, static_cast<size_t>(per)};
}

Status cpu_begin_step(DsV4Model& m, const StepBatch& batch, std::vector<float>& h) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  TANDEM_RETURN_IF_ERROR(im.validate_step(batch));
  if (im.tp()) return invalid_argument("the layer hooks run one rank (tp_size 1)");
  im.use_threads();
  const int64_t total = im.begin_step(batch);
  const int64_t HD = static_cast<int64_t>(im.cfg.hc_mult) * im.cfg.hidden_size;
  h.assign(im.s.h.begin(), im.s.h.begin() + total * HD);
  return Status();
}

void cpu_attention_half(DsV4Model& m, int layer, const StepBatch& batch, float* h) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  im.attention_half(layer, batch, im.s.step_rows.data(), step_rows(batch), h);
}

void cpu_ffn_half(DsV4Model& m, int layer, const StepBatch& batch, float* h) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  im.ffn_half(layer, step_rows(batch), h);
}

void cpu_end_step(DsV4Model& m, const StepBatch& batch) { CpuModelTestAccess::impl(m).end_step(batch); }

void cpu_set_slot_length(DsV4Model& m, int slot, int64_t length) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots && length >= 0);
  im.slot_len[slot] = length;
}

void cpu_logits(DsV4Model& m, const float* h, int64_t rows, std::vector<float>& out) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  out.assign(static_cast<size_t>(rows * im.cfg.vocab_size), 0.0f);
  im.logits_rows(h, rows, out.data());
}

void cpu_last_indexer(DsV4Model& m, int64_t rows, int64_t cols, std::vector<float>& scores,
                      std::vector<int32_t>& topk) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  const int64_t K = im.cfg.index_topk;
  TANDEM_CHECK(static_cast<int64_t>(im.s.topk_idx.size()) >= rows * K);
  TANDEM_CHECK(static_cast<int64_t>(im.s.idx_scores.size()) >= rows * cols);
  scores.assign(im.s.idx_scores.begin(), im.s.idx_scores.begin() + rows * cols);
  topk.assign(im.s.topk_idx.begin(), im.s.topk_idx.begin() + rows * K);
}

void cpu_last_routing(DsV4Model& m, int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  const int64_t E = im.cfg.n_routed_experts, K = im.cfg.num_experts_per_tok;
  TANDEM_CHECK(static_cast<int64_t>(im.s.gate_scores.size()) >= rows * E);
  TANDEM_CHECK(static_cast<int64_t>(im.s.moe_idx.size()) >= rows * K);
  gate_logits.assign(im.s.gate_scores.begin(), im.s.gate_scores.begin() + rows * E);
  experts.assign(im.s.moe_idx.begin(), im.s.moe_idx.begin() + rows * K);
}

std::vector<float> cpu_gate_bias(const DsV4Model& m, int layer, bool draft) {
  const DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  const model::MoEW& f = draft ? im.w.draft.stages.at(static_cast<size_t>(layer)).ffn
                               : im.w.layers.at(static_cast<size_t>(layer)).ffn;
  return f.hash ? std::vector<float>() : f.bias;
}

Status cpu_draft_begin(DsV4Model& m, std::span<const DraftRequest> requests, std::vector<float>& h, int64_t* k_out) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  if (im.tp()) return invalid_argument("the layer hooks run one rank (tp_size 1)");
  TANDEM_RETURN_IF_ERROR(im.draft_begin(requests, 0, k_out));
  h = im.ds.h;
  return Status();
}

void cpu_draft_stage_attention(DsV4Model& m, int stage, std::span<const DraftRequest> requests, int64_t K, float* h) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  im.draft_stage_attention(stage, requests, K, h);
}

void cpu_draft_stage_ffn(DsV4Model& m, int stage, int64_t rows, float* h) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  im.draft_stage_ffn(stage, rows, h);
}

Status cpu_draft_finish(DsV4Model& m, std::span<const DraftRequest> requests, int64_t K, const float* h,
                        std::vector<DraftResult>& results) {
  DsV4Model::Impl& im = CpuModelTestAccess::impl(m);
  im.use_threads();
  return im.draft_finish(requests, DraftSampling(), K, h, results);
}

void cpu_set_softmax_jitter(bool on) { model::set_softmax_jitter(on); }

}  // namespace model_testing
}  // namespace tandem
