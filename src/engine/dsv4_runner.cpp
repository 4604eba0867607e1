// Dsv4Runner: adapts DsV4Model (src/model/model.h) to the engine's ModelRunner interface.
// The engine sizes the KV pool from the model's bytes per block and per slot before the model
// exists: those come from DsV4Model::state_sizes (config.json only), and the checkpoint is loaded
// once, in allocate(), with the pool the engine computed and the KV dtype it resolved.
#include "engine/dsv4_runner.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/check.h"
#include "common/comm.h"
#include "common/hash.h"
#include "common/log.h"
#include "io/model_config.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tandem {

namespace {

class Dsv4Runner : public ModelRunner {
 public:
  Dsv4Runner(std::string dir, int num_threads, std::unique_ptr<Tokenizer> tok, ModelConfig config,
             ModelOptions probe, ModelStateSizes sizes, int tp_rank, int tp_size, Comm* comm)
      : tp_rank_(tp_rank),
        tp_size_(tp_size),
        comm_(comm),
        dir_(std::move(dir)),
        num_threads_(num_threads),
        tokenizer_(std::move(tok)),
        config_(std::move(config)),
        probe_(probe),
        slot_state_bytes_(static_cast<int64_t>(sizes.slot_state_bytes)) {}

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_model_len() const override { return config_.max_position_embeddings; }
  int32_t eos_token_id() const override { return static_cast<int32_t>(config_.eos_token_id); }
  int32_t noise_token_id() const override {
    return config_.has_dspark() ? static_cast<int32_t>(config_.dspark_noise_token_id) : -1;
  }
  std::string device() const override {
    return tp_size_ > 1 ? fmt::format("cpu (tensor parallel x{})", tp_size_) : std::string("cpu");
  }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }

  Status check_kv_cache_dtype(const std::string& dtype) const override {
    auto d = parse_kv_dtype(dtype);
    if (!d.ok())
      return invalid_argument("kv_cache_dtype {} is not supported by the CPU model (supported: fp8, bf16, nvfp4)",
                              dtype);
    return Status();
  }
  int64_t kv_bytes_per_block(int block_size, const std::string&) const override {
    // Honest: the CPU model keeps every cached KV value as an fp32 float whatever the dtype (the
    // dtype only picks the round trip the values take), so a block costs the same in every mode.
    // A packed GPU record would be 584 B (fp8_ds_mla), 1024 B (bf16) or 384 B (nvfp4_ds_mla) per
    // 512-dim entry instead of 2048 B here.
    ModelOptions o = probe_;
    o.block_size = block_size;
    auto sz = DsV4Model::state_sizes(config_, o);
    if (sz.ok()) return static_cast<int64_t>(sz->pool_block_bytes);
    // An invalid block size fails in allocate(); until then, scale the 256-token size.
    auto s256 = DsV4Model::state_sizes(config_, probe_);
    return s256.ok() ? std::max<int64_t>(1, static_cast<int64_t>(s256->pool_block_bytes) * block_size / 256) : 1;
  }
  int64_t slot_state_bytes() const override { return slot_state_bytes_; }

  // The CPU model maps the checkpoint read-only (file-backed pages the kernel can reclaim), keeps
  // KV as fp32 whatever the dtype, and sizes its step scratch inside load(): weights are reported
  // as already counted, the pools the engine sized as to be allocated.
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    int64_t weights = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
      if (e.path().extension() == ".safetensors") weights += static_cast<int64_t>(e.file_size(ec));
    plan.add(kPoolWeights, "host", weights, "file-backed mmap of the shards", /*already_counted=*/true);
    ModelRunner::plan_memory(alloc, plan);
    plan.pools.back().note = "estimate before load";
    plan.pools[plan.pools.size() - 2].note = "fp32 values whatever the KV dtype";
  }

  Status allocate(const RunnerAllocation& alloc) override {
    if (alloc.block_size % 128 != 0)
      return invalid_argument("--block-size {} must be a multiple of 128 for DeepSeek-V4 (compression ratio 128)",
                              alloc.block_size);
    ModelOptions o;
    o.max_slots = alloc.max_slots;
    o.num_blocks = alloc.num_blocks;
    o.block_size = alloc.block_size;
    o.max_tokens_per_step = alloc.max_tokens_per_step;
    o.max_rollback = std::max(alloc.max_verify_tokens, 1);
    num_draft_tokens_ = alloc.num_draft_tokens;
    o.num_threads = num_threads_;
    o.load_draft = true;
    o.tp_rank = tp_rank_;
    o.tp_size = tp_size_;
    o.comm = comm_;
    TANDEM_ASSIGN_OR_RETURN(o.kv_dtype, parse_kv_dtype(alloc.kv_cache_dtype.empty() ? "fp8" : alloc.kv_cache_dtype));
    model_.reset();
    TANDEM_ASSIGN_OR_RETURN(model_, DsV4Model::load(dir_, o));
    slot_state_bytes_ = static_cast<int64_t>(model_->slot_state_bytes());
    sampling_.init(config_.vocab_size, eos_token_id(), noise_token_id(), alloc.max_slots);
    TLOG_INFO("engine", "model loaded from {} (KV dtype {}): {}", dir_, kv_dtype_name(o.kv_dtype),
              model_->load_report().summary());
    if (tp_size_ > 1)
      TLOG_INFO("engine", "rank {}/{}: {:.1f} MiB of weights bound, {:.1f} MiB resident after load", tp_rank_,
                tp_size_, model_->load_report().weight_bytes / 1048576.0, resident_mib());
    return Status();
  }

  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    to_step_batch(batch, model_->has_draft(), batch_);
    TANDEM_RETURN_IF_ERROR(model_->forward(batch_, step_out_));
    out.samples.clear();
    if (!samples) return Status();
    first_sampled_row(batch, step_out_.logits_row, first_row_);
    return sampling_.run(batch, *samples, first_row_, step_out_.logits.data(), out);
  }

  void rollback(int slot, int64_t new_len) override {
    Status st = model_->rollback(slot, new_len);
    TANDEM_CHECK_MSG(st.ok(), st.message().c_str());
  }
  void reset(int slot) override {
    model_->reset(slot);
    if (model_->has_draft()) model_->draft_reset(slot);
    sampling_.clear_q(slot);
  }
  void export_slot_state(int slot, std::span<uint8_t> out) const override {
    Status st = model_->export_slot_state(slot, out);
    TANDEM_CHECK_MSG(st.ok(), st.message().c_str());
  }
  Status import_slot_state(int slot, std::span<const uint8_t> in) override {
    // The snapshot carries the draft's context windows too (DsV4Model::export_slot_state), so a
    // prefix hit restores the draft exactly as a cold run would have it.
    return model_->import_slot_state(slot, in);
  }

  // Before allocate() there is no model yet: a DSpark config means a draft (load() with
  // load_draft fails if the checkpoint lacks its tensors).
  bool has_draft() const override { return model_ ? model_->has_draft() : config_.has_dspark(); }
  int num_draft_tokens() const override {
    if (model_) return model_->draft_block_size();
    return config_.has_dspark() ? config_.dspark_block_size : 0;
  }

  void draft_insert_context(int slot, int64_t start_pos, int64_t rows, int batch_index) override {
    if (!model_->has_draft() || rows <= 0) return;
    Status st = batch_index >= 0 && batch_index < static_cast<int>(step_out_.taps_row.size()) &&
                        step_out_.taps_row[batch_index] >= 0
                    ? model_->draft_insert_context(
                          slot, start_pos,
                          std::span<const float>(step_out_.taps.data() + step_out_.taps_row[batch_index] * model_->tap_dim(),
                                                 static_cast<size_t>(rows * model_->tap_dim())))
                    : invalid_argument("no taps for batch entry {} in the last step", batch_index);
    if (!st.ok()) TLOG_WARN("engine", "draft context insert (slot {}, pos {}): {}", slot, start_pos, st.message());
  }

  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    // One batched call: greedy and sampled requests together (sampled draws are keyed by each
    // request's seed and position, so batching changes nothing).
    out.resize(reqs.size());
    model_reqs_.clear();
    bool sampled = false;
    for (const DraftQuery& q : reqs) {
      model_reqs_.push_back({q.slot, q.anchor, q.position, q.temperature, q.seed});
      sampled = sampled || q.temperature > 0;
    }
    DraftSampling ds;
    ds.want_probs = sampled;
    ds.num_tokens = num_draft_tokens_;
    TANDEM_RETURN_IF_ERROR(model_->draft_propose(model_reqs_, ds, results_));
    for (size_t i = 0; i < reqs.size(); ++i) {
      to_draft_proposal(results_[i], reqs[i].temperature > 0, out[i]);
      if (out[i].sampled) {
        const int k = static_cast<int>(results_[i].tokens.size());
        std::copy(results_[i].probs.begin(), results_[i].probs.end(), sampling_.store_q(reqs[i].slot, k));
      } else {
        sampling_.clear_q(reqs[i].slot);
      }
    }
    return Status();
  }

 private:
  // Resident set of this process (what the weights' touched pages and the state cost).
  static double resident_mib() {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
  }

  int tp_rank_;
  int tp_size_;
  Comm* comm_;
  std::string dir_;
  int num_threads_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelConfig config_;
  ModelOptions probe_;            // the options the sizes were computed for (block size 256)
  int64_t slot_state_bytes_ = 0;
  int num_draft_tokens_ = 0;  // K from the engine (RunnerAllocation); 0 = the whole draft block
  std::unique_ptr<DsV4Model> model_;  // created by allocate()
  StepBatch batch_;
  StepOutput step_out_;
  std::vector<int64_t> first_row_;
  HostSampling sampling_;
  std::vector<DraftRequest> model_reqs_;
  std::vector<DraftResult> results_;
};

}  // namespace

LogitsMode logits_mode(const RunnerSeq& r) {
  return r.sample_rows == 0 ? LogitsMode::kNone : r.sample_rows == 1 ? LogitsMode::kLast : LogitsMode::kAll;
}

void to_step_batch(std::span<const RunnerSeq> batch, bool has_draft, StepBatch& out) {
  out.seqs.clear();  // no allocation once grown to the largest batch
  for (const RunnerSeq& r : batch) {
    SeqStep s;
    s.slot = r.slot;
    s.start_pos = r.start_pos;
    s.tokens = r.tokens;
    s.block_table = r.block_table;
    s.logits = logits_mode(r);
    s.collect_taps = r.collect_taps && has_draft;
    out.seqs.push_back(s);
  }
}

void first_sampled_row(std::span<const RunnerSeq> batch, std::span<const int64_t> logits_row, std::vector<int64_t>& out) {
  out.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const RunnerSeq& r = batch[i];
    const int64_t rows = logits_mode(r) == LogitsMode::kAll ? static_cast<int64_t>(r.tokens.size()) : 1;
    out.push_back(r.sample_rows == 0 ? -1 : logits_row[i] + rows - r.sample_rows);
  }
}

void to_draft_proposal(const DraftResult& r, bool sampled, DraftProposal& p) {
  p.tokens = r.tokens;
  p.confidence.resize(r.confidence.size());
  for (size_t k = 0; k < r.confidence.size(); ++k)
    p.confidence[k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(r.confidence[k]))));
  p.sampled = sampled;
}

Result<std::unique_ptr<ModelRunner>> create_dsv4_runner(const EngineConfig& config, int tp_rank, int tp_size,
                                                        Comm* comm) {
  const std::string& dir = config.model_dir;
  TANDEM_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_file(dir + "/tokenizer.json"));
  auto cfg = load_model_config(dir + "/config.json");
  if (!cfg.ok()) return cfg.status().with_context("loading " + dir);
  // Sizes from the config alone; the weights are loaded once, in allocate().
  ModelOptions probe;
  probe.max_slots = 1;
  probe.num_blocks = 1;
  probe.block_size = 256;
  probe.max_tokens_per_step = 8;
  // Same rollback depth as allocate(): the slot-state size depends on it.
  probe.max_rollback = config.speculative.method.empty() ? 1 : config.speculative.num_speculative_tokens + 1;
  probe.num_threads = config.num_threads;
  probe.load_draft = true;
  auto sizes = DsV4Model::state_sizes(*cfg, probe);
  if (!sizes.ok()) return sizes.status().with_context("loading " + dir);
  return std::unique_ptr<ModelRunner>(
      new Dsv4Runner(dir, config.num_threads, std::move(tok), std::move(cfg).value(), probe, *sizes, tp_rank, tp_size,
                     comm));
}

}  // namespace tandem
