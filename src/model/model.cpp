// DsV4Model: loading, per-slot state layout, step validation, forward() driver, rollback and
// slot-state export/import. The layer math is in forward.cpp, the DSpark draft in dspark.cpp.
#include "model/model.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/comm.h"
#include "common/log.h"
#include "common/numeric.h"
#include "io/safetensors.h"
#include "model/impl.h"
#include "model/slot_state.h"

namespace tandem {

std::string LoadReport::summary() const {
  std::string s = fmt::format("{}/{} target tensors loaded", target_tensors_loaded, target_tensors_expected);
  if (draft_tensors_expected > 0)
    s += fmt::format("; {}/{} draft parameters loaded", draft_tensors_loaded, draft_tensors_expected);
  s += skipped_tensors ? fmt::format("; {} tensors skipped", skipped_tensors) : std::string("; no skipped tensors");
  if (other_rank_tensors) s += fmt::format("; {} tensors belong to other ranks", other_rank_tensors);
  return s;
}

DsV4Model::DsV4Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DsV4Model::~DsV4Model() = default;

const ModelConfig& DsV4Model::config() const { return impl_->cfg; }
const ModelOptions& DsV4Model::options() const { return impl_->opt; }
const LoadReport& DsV4Model::load_report() const { return impl_->report; }
int64_t DsV4Model::vocab_size() const { return impl_->cfg.vocab_size; }
bool DsV4Model::has_draft() const { return impl_->w.has_draft; }
int DsV4Model::draft_block_size() const { return impl_->w.has_draft ? impl_->cfg.dspark_block_size : 0; }
int64_t DsV4Model::tap_dim() const {
  return impl_->cfg.has_dspark()
             ? impl_->cfg.hidden_size * static_cast<int64_t>(impl_->cfg.dspark_target_layer_ids.size())
             : 0;
}

Result<KvDtype> parse_kv_dtype(const std::string& name) {
  if (name == "fp8") return KvDtype::kFp8;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "nvfp4") return KvDtype::kNvfp4;
  return invalid_argument("kv dtype '{}' is not fp8, bf16 or nvfp4", name);
}

const char* kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp8: return "fp8";
    case KvDtype::kBf16: return "bf16";
    case KvDtype::kNvfp4: return "nvfp4";
  }
  return "?";
}

// The slot-state and pool-block layout: a function of the config and options only, so
// state_sizes() can report it before (and without) loading weights.
void DsV4Model::Impl::plan_state() {
  const int64_t hd = cfg.head_dim, ihd = cfg.index_head_dim, bs = opt.block_size;
  win_ring = cfg.sliding_window + opt.max_rollback;
  layout.assign(cfg.num_hidden_layers, {});
  int64_t off = 0, boff = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerLayout& L = layout[l];
    L.win_off = off;
    off += win_ring * hd;
    const int r = cfg.compress_ratios[l];
    if (r) {
      L.comp.ring = 2 * r + opt.max_rollback;
      L.comp.chans = (r == 4 ? 2 : 1) * hd;
      L.comp.off = off;
      off += L.comp.ring * 2 * L.comp.chans;
      L.pool_main = boff;
      boff += (bs / r) * hd;
      if (r == 4) {
        L.icomp.ring = 2 * r + opt.max_rollback;
        L.icomp.chans = 2 * ihd;
        L.icomp.off = off;
        off += L.icomp.ring * 2 * L.icomp.chans;
        L.pool_idx = boff;
        boff += (bs / 4) * ihd;
      }
    }
  }
  slot_floats = off;
  block_floats = std::max<int64_t>(boff, 1);
}

Status DsV4Model::Impl::init_state() {
  TANDEM_RETURN_IF_ERROR(model::validate_state_options(opt));
  if (opt.num_threads <= 0) opt.num_threads = omp_get_max_threads();

  const bool yarn = cfg.rope_scaling_type == "yarn";
  rope_swa.build(cfg.qk_rope_head_dim, 0, cfg.rope_theta, 1.0, cfg.rope_beta_fast, cfg.rope_beta_slow);
  rope_comp.build(cfg.qk_rope_head_dim, yarn ? cfg.rope_original_max_position : 0, cfg.compress_rope_theta,
                  cfg.rope_factor, cfg.rope_beta_fast, cfg.rope_beta_slow);
  plan_state();
  slot_state.assign(static_cast<size_t>(opt.max_slots * slot_floats), 0.0f);
  slot_len.assign(opt.max_slots, 0);
  pool.assign(static_cast<size_t>(opt.num_blocks * block_floats), 0.0f);
  if (w.has_draft) {
    draft_ctx.assign(static_cast<size_t>(opt.max_slots) * cfg.num_draft_stages * cfg.sliding_window * cfg.head_dim,
                     0.0f);
    draft_pending.assign(static_cast<size_t>(opt.max_slots) * kPendingRows * cfg.hidden_size *
                             cfg.dspark_target_layer_ids.size(),
                         0.0f);
  }
  pending_start.assign(opt.max_slots, 0);
  pending_n.assign(opt.max_slots, 0);
  return Status();
}

namespace {
// Snapshot: [length][the slot's window and compressor rings][its DSpark context windows] (slot_state.h).
model::SnapshotFormat snapshot_format(const ModelConfig& c, int64_t slot_floats, bool has_draft) {
  model::SnapshotFormat f;
  f.state_bytes = sizeof(float) * static_cast<size_t>(slot_floats);
  f.draft_bytes = has_draft ? sizeof(float) * static_cast<size_t>(c.num_draft_stages) * c.sliding_window * c.head_dim : 0;
  return f;
}
}  // namespace

Result<ModelStateSizes> DsV4Model::state_sizes(const ModelConfig& config, const ModelOptions& options) {
  TANDEM_RETURN_IF_ERROR(model::validate_config(config));
  TANDEM_RETURN_IF_ERROR(model::validate_state_options(options));
  Impl m;
  m.cfg = config;
  m.opt = options;
  m.plan_state();
  ModelStateSizes sz;
  sz.slot_state_bytes = snapshot_format(config, m.slot_floats, config.has_dspark() && options.load_draft).bytes();
  sz.pool_block_bytes = sizeof(float) * static_cast<size_t>(m.block_floats);
  return sz;
}

Result<std::unique_ptr<DsV4Model>> DsV4Model::from_tensors(const ModelConfig& config,
                                                           const std::vector<const TensorView*>& tensors,
                                                           const ModelOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->opt = options;
  if (options.tp_size > 1 && !options.comm)
    return invalid_argument("model options: tp_size {} needs a communicator", options.tp_size);
  if (options.comm && (options.comm->size() != options.tp_size || options.comm->rank() != options.tp_rank))
    return invalid_argument("model options: rank {} of {} but the communicator is rank {} of {}", options.tp_rank,
                            options.tp_size, options.comm->rank(), options.comm->size());
  model::LoadCounts counts;
  auto weights = model::load_weights(config, tensors, options.load_draft, counts,
                                     model::Shard{options.tp_rank, options.tp_size});
  if (!weights.ok()) return weights.status();
  impl->w = std::move(weights).value();
  impl->report.target_tensors_loaded = counts.target_loaded;
  impl->report.target_tensors_expected = counts.target_expected;
  impl->report.draft_tensors_loaded = counts.draft_loaded;
  impl->report.draft_tensors_expected = counts.draft_expected;
  impl->report.skipped_tensors = counts.skipped;
  impl->report.other_rank_tensors = counts.other_ranks;
  impl->report.weight_bytes = model::weight_bytes(impl->w);
  TANDEM_RETURN_IF_ERROR(impl->init_state());
  return std::unique_ptr<DsV4Model>(new DsV4Model(std::move(impl)));
}

Result<std::unique_ptr<DsV4Model>> DsV4Model::load(const std::string& dir, const ModelOptions& options) {
  auto config = load_model_config(dir + "/config.json");
  if (!config.ok()) return config.status().with_context("loading " + dir);
  auto ckpt = Checkpoint::open(dir);
  if (!ckpt.ok()) return ckpt.status().with_context("loading " + dir);
  std::vector<const TensorView*> views;
  for (const auto& [name, view] : (*ckpt)->tensors()) views.push_back(view);
  auto model = from_tensors(*config, views, options);
  if (!model.ok()) return model.status().with_context("loading " + dir);
  (*model)->impl_->ckpt = std::move(*ckpt);  // the weights are views into its mmapped shards
  TLOG_INFO("model", "{}: {}", dir, (*model)->load_report().summary());
  if (options.tp_size > 1)
    TLOG_INFO("model", "tensor parallel rank {}/{}: {:.1f} MiB of weights bound on this rank", options.tp_rank,
              options.tp_size, (*model)->load_report().weight_bytes / 1048576.0);
  return model;
}

Status validate_step_batch(const StepBatch& batch, const ModelConfig& cfg, const ModelOptions& opt,
                           std::span<const int64_t> slot_len) {
  int64_t total = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqStep& q = batch.seqs[i];
    if (q.slot < 0 || q.slot >= opt.max_slots)
      return invalid_argument("step seq {}: slot {} outside [0, {})", i, q.slot, opt.max_slots);
    for (size_t k = 0; k < i; ++k)
      if (batch.seqs[k].slot == q.slot) return invalid_argument("step seq {}: slot {} appears twice in one step", i, q.slot);
    if (q.start_pos != slot_len[q.slot])
      return invalid_argument("step seq {}: start_pos {} != slot {} length {}", i, q.start_pos, q.slot,
                              slot_len[q.slot]);
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    total += n;
    for (int32_t t : q.tokens)
      if (t < 0 || t >= cfg.vocab_size)
        return invalid_argument("step seq {}: token id {} outside the vocabulary [0, {})", i, t, cfg.vocab_size);
    if (q.start_pos + n > cfg.max_position_embeddings)
      return invalid_argument("step seq {}: position {} beyond max_position_embeddings {}", i, q.start_pos + n,
                              cfg.max_position_embeddings);
    const int64_t need = (q.start_pos + n + opt.block_size - 1) / opt.block_size;
    if (static_cast<int64_t>(q.block_table.size()) < need)
      return invalid_argument("step seq {}: block table has {} blocks, {} needed for {} positions", i,
                              q.block_table.size(), need, q.start_pos + n);
    for (int64_t b = 0; b < need; ++b)
      if (q.block_table[b] < 0 || q.block_table[b] >= opt.num_blocks)
        return invalid_argument("step seq {}: block id {} outside the pool [0, {})", i, q.block_table[b],
                                opt.num_blocks);
    if (q.collect_taps && !cfg.has_dspark())
      return invalid_argument("step seq {}: collect_taps needs a model with a DSpark draft", i);
  }
  if (total > opt.max_tokens_per_step)
    return invalid_argument("step has {} tokens, more than max_tokens_per_step {}", total, opt.max_tokens_per_step);
  return Status();
}

Status DsV4Model::Impl::validate_step(const StepBatch& batch) const {
  return validate_step_batch(batch, cfg, opt, slot_len);
}

Status DsV4Model::forward(const StepBatch& batch, StepOutput& out) {
  Impl& m = *impl_;
  TANDEM_RETURN_IF_ERROR(m.validate_step(batch));
  m.use_threads();
  const ModelConfig& c = m.cfg;
  const int64_t V = c.vocab_size, D = c.hidden_size, HD = c.hc_mult * D, td = tap_dim();
  const size_t ns = batch.seqs.size();
  out.logits_row.assign(ns, -1);  // no allocation once the vectors have grown to the batch size
  out.taps_row.assign(ns, -1);
  int64_t lrows = 0, trows = 0;
  for (size_t i = 0; i < ns; ++i) {
    const SeqStep& q = batch.seqs[i];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (q.logits != LogitsMode::kNone && n > 0) {
      out.logits_row[i] = lrows;
      lrows += q.logits == LogitsMode::kAll ? n : 1;
    }
    if (q.collect_taps && n > 0) {
      out.taps_row[i] = trows;
      trows += n;
    }
  }
  out.num_logits_rows = lrows;
  out.num_taps_rows = trows;
  if (out.logits.size() < static_cast<size_t>(lrows * V)) out.logits.resize(lrows * V);
  if (out.taps.size() < static_cast<size_t>(trows * td)) out.taps.resize(trows * td);

  // Layer-outer over the whole step: every row of every sequence goes through the row-wise parts
  // (mHC, norms, MoE, LM head) together, so weights are read once per step rather than once per
  // sequence; attention runs per sequence. Each row's math is the same as in any other grouping.
  const int64_t total = m.begin_step(batch);
  if (total == 0) return Status();
  const auto& rows = m.s.step_rows;
  float* h = m.s.h.data();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    m.block_forward_step(l, batch, rows.data(), total, h);
    for (size_t ti = 0; ti < c.dspark_target_layer_ids.size(); ++ti) {
      if (c.dspark_target_layer_ids[ti] != l) continue;
      for (size_t i = 0; i < ns; ++i) {
        const SeqStep& q = batch.seqs[i];
        if (!q.collect_taps || q.tokens.empty()) continue;
        for (int64_t t = 0; t < static_cast<int64_t>(q.tokens.size()); ++t) {
          const float* hr = h + (rows[i] + t) * HD;
          float* dst = out.taps.data() + (out.taps_row[i] + t) * td + static_cast<int64_t>(ti) * D;
          model::taps_mean(hr, c.hc_mult, D, dst);
        }
      }
    }
  }
  // LM head over the rows that want logits, gathered in output order.
  if (lrows > 0) {
    if (m.s.head_in.size() < static_cast<size_t>(lrows * HD)) m.s.head_in.resize(lrows * HD);
    for (size_t i = 0; i < ns; ++i) {
      const SeqStep& q = batch.seqs[i];
      const int64_t n = static_cast<int64_t>(q.tokens.size());
      if (out.logits_row[i] < 0) continue;
      const int64_t first = q.logits == LogitsMode::kAll ? 0 : n - 1;
      std::memcpy(m.s.head_in.data() + out.logits_row[i] * HD, h + (rows[i] + first) * HD,
                  sizeof(float) * (n - first) * HD);
    }
    m.logits_rows(m.s.head_in.data(), lrows, out.logits.data());
  }
  TANDEM_RETURN_IF_ERROR(m.take_comm_status());  // a lost rank: the group is gone, the state undefined
  m.end_step(batch);
  return Status();
}

int64_t DsV4Model::Impl::begin_step(const StepBatch& batch) {
  const int64_t D = cfg.hidden_size, HD = cfg.hc_mult * D;
  const size_t ns = batch.seqs.size();
  auto& rows = s.step_rows;
  rows.resize(ns);  // no allocation once grown to the largest batch
  int64_t total = 0;
  for (size_t i = 0; i < ns; ++i) {
    rows[i] = total;
    total += static_cast<int64_t>(batch.seqs[i].tokens.size());
  }
  if (total == 0) return 0;
  if (s.h.size() < static_cast<size_t>(total * HD)) s.h.resize(total * HD);
  if (s.step_tokens.size() < static_cast<size_t>(total)) s.step_tokens.resize(total);
  float* h = s.h.data();
  for (size_t i = 0; i < ns; ++i) {
    const SeqStep& q = batch.seqs[i];
    for (size_t t = 0; t < q.tokens.size(); ++t) s.step_tokens[rows[i] + static_cast<int64_t>(t)] = q.tokens[t];
  }
  embed_rows(s.step_tokens.data(), total, h, HD);
  for (int64_t r = 0; r < total; ++r)
    for (int k = 1; k < cfg.hc_mult; ++k) std::memcpy(h + r * HD + k * D, h + r * HD, sizeof(float) * D);
  return total;
}

void DsV4Model::Impl::end_step(const StepBatch& batch) {
  for (const SeqStep& q : batch.seqs) slot_len[q.slot] += static_cast<int64_t>(q.tokens.size());
}

int64_t DsV4Model::slot_length(int slot) const { return model::slot_length(impl_->slot_len, slot); }

Status DsV4Model::rollback(int slot, int64_t new_length) {
  return model::rollback_slot(impl_->slot_len, impl_->opt.max_rollback, slot, new_length);
}

void DsV4Model::reset(int slot) {
  TANDEM_CHECK(slot >= 0 && slot < impl_->opt.max_slots);
  impl_->slot_len[slot] = 0;
  draft_reset(slot);
}

size_t DsV4Model::slot_state_bytes() const {
  return snapshot_format(impl_->cfg, impl_->slot_floats, impl_->w.has_draft).bytes();
}
size_t DsV4Model::pool_block_bytes() const { return sizeof(float) * impl_->block_floats; }

Status DsV4Model::export_slot_state(int slot, std::span<uint8_t> out) const {
  const Impl& m = *impl_;
  TANDEM_ASSIGN_OR_RETURN(model::SnapshotOut parts,
                          model::begin_export(m.slot_len, snapshot_format(m.cfg, m.slot_floats, m.w.has_draft), slot, out));
  // Deferred draft-context rows are projected first: the snapshot holds the finished window.
  // (Logically const: the slot's observable state does not change.)
  if (m.w.has_draft) impl_->flush_draft_context(slot);
  std::memcpy(parts.state.data(), m.slot_ptr(slot), parts.state.size());
  if (!parts.draft.empty())
    std::memcpy(parts.draft.data(), m.draft_ctx.data() + slot * (parts.draft.size() / sizeof(float)), parts.draft.size());
  return Status();
}

Status DsV4Model::import_slot_state(int slot, std::span<const uint8_t> in) {
  Impl& m = *impl_;
  TANDEM_ASSIGN_OR_RETURN(model::SnapshotIn parts,
                          model::read_snapshot(m.slot_len, snapshot_format(m.cfg, m.slot_floats, m.w.has_draft), slot, in));
  std::memcpy(m.slot_ptr(slot), parts.state.data(), parts.state.size());
  if (!parts.draft.empty())
    std::memcpy(m.draft_ctx.data() + slot * (parts.draft.size() / sizeof(float)), parts.draft.data(), parts.draft.size());
  m.pending_n[slot] = 0;
  m.slot_len[slot] = parts.length;
  return Status();
}

}  // namespace tandem
