// Dsv4Runner: adapts DsV4Model (src/model/model.h) to the engine's ModelRunner interface through
// SlotRunner (slot_runner.h). The engine sizes the KV pool from the model's bytes per block and per
// slot before the model exists: those come from DsV4Model::state_sizes (config.json only), and the
// checkpoint is loaded once, in allocate(), with the pool the engine computed and the KV dtype it
// resolved. The CPU model keeps every cached KV value as an fp32 float whatever the dtype (the
// dtype only picks the round trip the values take), so a block costs the same in every mode; a
// packed GPU record would be 584 B (fp8_ds_mla), 1024 B (bf16) or 384 B (nvfp4_ds_mla) per
// 512-dim entry instead of 2048 B here.
#include "engine/dsv4_runner.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/comm.h"
#include "common/log.h"
#include "engine/host_sampling.h"
#include "engine/slot_runner.h"
#include "model/model.h"

namespace tandem {

namespace {

class Dsv4Runner : public SlotRunner<DsV4Model> {
 public:
  Dsv4Runner(RunnerCheckpoint ck, int num_threads, int tp_rank, int tp_size, DataComm* comm)
      : SlotRunner(std::move(ck), "CPU model"),
        tp_rank_(tp_rank),
        tp_size_(tp_size),
        comm_(comm),
        num_threads_(num_threads) {}

  std::string device() const override {
    return tp_size_ > 1 ? fmt::format("cpu (tensor parallel x{})", tp_size_) : std::string("cpu");
  }

  // The CPU model maps the checkpoint read-only (file-backed pages the kernel can reclaim), keeps
  // KV as fp32 whatever the dtype, and sizes its step scratch inside load(): weights are reported
  // as already counted, the pools the engine sized as to be allocated.
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    int64_t weights = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ck_.dir, ec))
      if (e.path().extension() == ".safetensors") weights += static_cast<int64_t>(e.file_size(ec));
    plan.add(kPoolWeights, "host", weights, "file-backed mmap of the shards", /*already_counted=*/true);
    ModelRunner::plan_memory(alloc, plan);
    for (MemoryPool& p : plan.pools) {
      if (p.name == kPoolSlotState) p.note = "estimate before load";
      if (p.name == kPoolKv) p.note = "fp32 values whatever the KV dtype";
    }
  }

  Status allocate(const RunnerAllocation& alloc) override {
    TANDEM_ASSIGN_OR_RETURN(ModelOptions o, model_options_for(alloc));
    num_draft_tokens_ = alloc.num_draft_tokens;
    o.num_threads = num_threads_;
    o.tp_rank = tp_rank_;
    o.tp_size = tp_size_;
    o.comm = comm_;
    model_.reset();
    TANDEM_ASSIGN_OR_RETURN(model_, DsV4Model::load(ck_.dir, o));
    set_max_slots(alloc.max_slots);
    TANDEM_RETURN_IF_ERROR(init_snapshots(alloc.num_snapshots));
    sampling_.init(ck_.config.vocab_size, eos_token_id(), noise_token_id(), alloc.max_slots);
    TLOG_INFO("engine", "model loaded from {} (KV dtype {}): {}", ck_.dir, kv_dtype_name(o.kv_dtype),
              model_->load_report().summary());
    if (tp_size_ > 1)
      TLOG_INFO("engine", "rank {}/{}: {:.1f} MiB of weights bound, {:.1f} MiB resident after load", tp_rank_,
                tp_size_, model_->load_report().weight_bytes / 1048576.0, resident_mib());
    return Status();
  }

  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    TANDEM_RETURN_IF_ERROR(begin_step(batch));
    to_step_batch(batch, model_->has_draft(), batch_);
    TANDEM_RETURN_IF_ERROR(model_->forward(batch_, step_out_));
    out.samples.clear();
    if (!samples) return Status();
    first_sampled_row(batch, step_out_.logits_row, first_row_);
    return sampling_.run(batch, *samples, first_row_, step_out_.logits.data(), out);
  }

  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    // One batched call: greedy and sampled requests together (sampled draws are keyed by each
    // request's seed and position, so batching changes nothing).
    out.resize(reqs.size());
    bool sampled = false;
    for (const DraftQuery& q : reqs) sampled = sampled || !is_greedy(q.temperature);
    DraftSampling ds;
    ds.want_probs = sampled;
    ds.num_tokens = num_draft_tokens_;
    TANDEM_RETURN_IF_ERROR(model_->draft_propose(reqs, ds, results_));
    for (size_t i = 0; i < reqs.size(); ++i) {
      to_draft_proposal(results_[i], !is_greedy(reqs[i].temperature), out[i]);
      if (out[i].sampled) {
        const int k = static_cast<int>(results_[i].tokens.size());
        std::copy(results_[i].probs.begin(), results_[i].probs.end(), sampling_.store_q(reqs[i].slot, k));
      } else {
        sampling_.clear_q(reqs[i].slot);
      }
    }
    return Status();
  }

 protected:
  Status insert_draft_context(int slot, int64_t start_pos, int64_t rows, int batch_index) override {
    if (batch_index >= static_cast<int>(step_out_.taps_row.size()) || step_out_.taps_row[batch_index] < 0)
      return invalid_argument("no taps for batch entry {} in the last step", batch_index);
    const int64_t td = model_->tap_dim();
    return model_->draft_insert_context(
        slot, start_pos,
        std::span<const float>(step_out_.taps.data() + step_out_.taps_row[batch_index] * td,
                               static_cast<size_t>(rows * td)));
  }
  void reset_draft_store(int slot) override { sampling_.clear_q(slot); }

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
  DataComm* comm_;
  int num_threads_;
  int num_draft_tokens_ = 0;  // K from the engine (RunnerAllocation); 0 = the whole draft block
  StepBatch batch_;
  StepOutput step_out_;
  std::vector<int64_t> first_row_;
  HostSampling sampling_;
  std::vector<DraftResult> results_;
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> create_dsv4_runner(const EngineConfig& config, int tp_rank, int tp_size,
                                                        DataComm* comm) {
  TANDEM_ASSIGN_OR_RETURN(RunnerCheckpoint ck, open_runner_checkpoint(config, &DsV4Model::state_sizes));
  return std::unique_ptr<ModelRunner>(new Dsv4Runner(std::move(ck), config.num_threads, tp_rank, tp_size, comm));
}

}  // namespace tandem
