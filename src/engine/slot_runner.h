// SlotRunner<Model>: what the two model runners share (dsv4_runner.cpp over the CPU oracle
// DsV4Model, cuda_runner.cpp over CudaModel): the checkpoint's facts before the model is loaded
// (config.json, tokenizer, the sizes Model::state_sizes reports), the model options an allocation
// becomes, a step's slot life cycle (reset or restore before the forward, SlotCommit after it), the
// prefix-cache snapshots' numbering (host buffers by default; a device runner keeps them on its
// device) and the translation of batches and draft results. A runner adds its model's loading, forward and
// sampling, where a draft context's taps come from, and where sampled drafts' q are kept.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "io/model_config.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tandem {

// What a runner knows before its model exists: config.json (with --synthetic NAME the built-in
// official config instead) and tokenizer.json of the model directory, and the state sizes for `probe` (one slot, 256-token blocks, the engine's rollback
// depth K + 1, on which the slot state's size depends).
struct RunnerCheckpoint {
  std::string dir;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  ModelOptions probe;
  ModelStateSizes sizes;
};
using StateSizesFn = Result<ModelStateSizes> (*)(const ModelConfig&, const ModelOptions&);
Result<RunnerCheckpoint> open_runner_checkpoint(const EngineConfig& config, StateSizesFn state_sizes);

// The model options an allocation asks for (everything but threads, ranks and the KV dtype's
// parse); InvalidArgument when the block size is not a multiple of 128.
Result<ModelOptions> model_options_for(const RunnerAllocation& alloc);

// The step batch in (logits for the rows that sample: none, the last, or all), where each
// sequence's first sampled row sits in the step's logits (-1: none), a draft's result as a
// proposal (confidence = sigmoid of the head's raw projection).
LogitsMode logits_mode(const RunnerSeq& r);
void to_step_batch(std::span<const RunnerSeq> batch, bool has_draft, StepBatch& out);
void first_sampled_row(std::span<const RunnerSeq> batch, std::span<const int64_t> logits_row, std::vector<int64_t>& out);
void to_draft_proposal(const DraftResult& r, bool sampled, DraftProposal& p);

template <class Model>
class SlotRunner : public ModelRunner {
 public:
  int64_t vocab_size() const override { return ck_.config.vocab_size; }
  int64_t max_model_len() const override { return ck_.config.max_position_embeddings; }
  int32_t eos_token_id() const override { return static_cast<int32_t>(ck_.config.eos_token_id); }
  int32_t noise_token_id() const override {
    return ck_.config.has_dspark() ? static_cast<int32_t>(ck_.config.dspark_noise_token_id) : -1;
  }
  const Tokenizer& tokenizer() const override { return *ck_.tokenizer; }

  Status check_kv_cache_dtype(const std::string& dtype) const override {
    if (!parse_kv_dtype(dtype).ok())
      return invalid_argument("kv_cache_dtype {} is not supported by the {} (supported: fp8, bf16, nvfp4)", dtype,
                              what_);
    return Status();
  }
  // The model's bytes of one pool block for the dtype (Model::state_sizes, config.json alone).
  int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const override {
    ModelOptions o = ck_.probe;
    if (auto d = parse_kv_dtype(dtype); d.ok()) o.kv_dtype = *d;
    o.block_size = block_size;
    if (auto sz = Model::state_sizes(ck_.config, o); sz.ok()) return static_cast<int64_t>(sz->pool_block_bytes);
    // An invalid block size fails in allocate(); until then, scale the 256-token size.
    o.block_size = ck_.probe.block_size;
    auto s256 = Model::state_sizes(ck_.config, o);
    return s256.ok() ? std::max<int64_t>(1, static_cast<int64_t>(s256->pool_block_bytes) * block_size / o.block_size)
                     : 1;
  }
  int64_t slot_state_bytes() const override {
    return static_cast<int64_t>(model_ ? model_->slot_state_bytes() : ck_.sizes.slot_state_bytes);
  }

  // Before allocate() there is no model yet: a DSpark config means a draft (loading with
  // load_draft fails if the checkpoint lacks its tensors).
  bool has_draft() const override { return model_ ? model_->has_draft() : ck_.config.has_dspark(); }
  int num_draft_tokens() const override {
    if (model_) return model_->draft_block_size();
    return ck_.config.has_dspark() ? ck_.config.dspark_block_size : 0;
  }

  Status commit(std::span<const SlotCommit> commits) override {
    for (const SlotCommit& c : commits) {
      if (c.batch_index < 0 || static_cast<size_t>(c.batch_index) >= last_.size() ||
          last_[c.batch_index].slot != c.slot)
        return make_error(StatusCode::kInternal, "commit: slot {} is not batch entry {} of the last step", c.slot,
                          c.batch_index);
      const int64_t len = model_->slot_length(c.slot);
      if (c.length > len)
        return make_error(StatusCode::kInternal, "commit: slot {} has {} positions, not {}", c.slot, len, c.length);
      if (c.length < len) TANDEM_RETURN_IF_ERROR(model_->rollback(c.slot, c.length));
      if (c.context_rows > 0 && model_->has_draft()) {
        // A failed insert costs acceptance only, never correctness: the step goes on.
        Status st = insert_draft_context(c.slot, last_[c.batch_index].start_pos, c.context_rows, c.batch_index);
        if (!st.ok())
          TLOG_WARN("engine", "draft context insert (slot {}, pos {}): {}", c.slot, last_[c.batch_index].start_pos,
                    st.message());
      }
      if (c.snapshot >= 0) {
        if (static_cast<size_t>(c.snapshot) >= snap_saved_.size())
          return make_error(StatusCode::kInternal, "commit: slot {} into snapshot {} of {}", c.slot, c.snapshot,
                            snap_saved_.size());
        TANDEM_RETURN_IF_ERROR(save_snapshot(c.slot, c.snapshot));
        snap_saved_[c.snapshot] = 1;
      }
    }
    return Status();
  }

 protected:
  SlotRunner(RunnerCheckpoint ck, std::string what) : ck_(std::move(ck)), what_(std::move(what)) {}

  // The start of every forward: the slots of sequences that start over are reset (and restored
  // from their snapshot), and the batch's slots and start positions are kept for commit().
  Status begin_step(std::span<const RunnerSeq> batch) {
    for (size_t i = 0; i < batch.size(); ++i) {
      const RunnerSeq& r = batch[i];
      if (r.slot < 0 || r.slot >= max_slots_)
        return make_error(StatusCode::kInternal, "step seq {}: slot {} outside [0, {})", i, r.slot, max_slots_);
      if (r.reset && r.restore >= 0 &&
          (static_cast<size_t>(r.restore) >= snap_saved_.size() || !snap_saved_[r.restore]))
        return make_error(StatusCode::kInternal, "step seq {}: snapshot {} of {} was never saved", i, r.restore,
                          snap_saved_.size());
    }
    last_.clear();  // no allocation once grown to the largest batch
    for (const RunnerSeq& r : batch) {
      last_.push_back({r.slot, r.start_pos});
      if (!r.reset) continue;
      model_->reset(r.slot);
      reset_draft_store(r.slot);
      // The snapshot carries the draft's context windows too, so a prefix hit restores the draft
      // exactly as a cold run would have it.
      if (r.restore >= 0) TANDEM_RETURN_IF_ERROR(load_snapshot(r.slot, r.restore));
    }
    return Status();
  }
  void set_max_slots(int n) { max_slots_ = n; }

  // The prefix-cache snapshots, made once by allocate() after the model exists. By default host
  // buffers that the model's export/import_slot_state fill (the CPU model); a device runner
  // overrides the three to keep them on its device. save/load get a checked number.
  Status init_snapshots(int count) {
    snap_saved_.assign(static_cast<size_t>(std::max(count, 0)), 0);
    return allocate_snapshots(std::max(count, 0));
  }
  virtual Status allocate_snapshots(int count) {
    snap_bytes_ = model_->slot_state_bytes();
    // Uninitialized: only the pages of snapshots taken get touched.
    snap_host_.reset(count > 0 ? new uint8_t[static_cast<size_t>(count) * snap_bytes_] : nullptr);
    return Status();
  }
  virtual Status save_snapshot(int slot, int index) {
    return model_->export_slot_state(slot, {snap_host_.get() + static_cast<size_t>(index) * snap_bytes_, snap_bytes_});
  }
  virtual Status load_snapshot(int slot, int index) {
    return model_->import_slot_state(slot, {snap_host_.get() + static_cast<size_t>(index) * snap_bytes_, snap_bytes_});
  }

  // The first `rows` taps rows of the last forward's entry `batch_index` into the slot's draft
  // context at positions start_pos.. .
  virtual Status insert_draft_context(int slot, int64_t start_pos, int64_t rows, int batch_index) = 0;
  // Forgets the slot's stored draft distributions.
  virtual void reset_draft_store(int slot) = 0;

  RunnerCheckpoint ck_;
  std::string what_;                // "CPU model", "CUDA runner": names the backend in messages
  std::unique_ptr<Model> model_;    // created by allocate()
  int max_slots_ = 0;

 private:
  struct Entry {
    int slot = 0;
    int64_t start_pos = 0;
  };
  std::vector<Entry> last_;  // the last forward's batch
  std::vector<uint8_t> snap_saved_;  // per snapshot number: 1 once saved
  std::unique_ptr<uint8_t[]> snap_host_;
  size_t snap_bytes_ = 0;
};

}  // namespace tandem
