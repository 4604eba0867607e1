// EngineCore: the single-threaded heart of the engine. One step = schedule, one batched target
// forward (new sequences' slot resets folded in), sample/verify, one commit of what every sequence
// keeps (rollback, draft context, prefix snapshot), draft. The scheduler rule (vLLM v1): every request has
// num_computed tokens chasing a target (its tokens plus the drafts chosen for verification); each
// step gives the chase a share of max_num_batched_tokens — decodes first, then partial prefills,
// then new requests in arrival order, a long prefill capped so the others get into every step —
// which covers prefill, chunked prefill, prefix-cache hits,
// decode and speculative verify alike. When the KV pool cannot cover a chase, the latest-arrived
// running request is preempted (blocks freed, recomputed later from its tokens). Engine (engine.cpp)
// drives it from a thread; tests drive it directly, step by step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_cache_manager.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/spec_planner.h"
#include "engine/text_stream.h"

namespace tandem {

struct CoreOptions {
  bool check_integrity_each_step =
#ifdef NDEBUG
      false;
#else
      true;
#endif
  int max_waiting = 4096;  // queued requests before submit says ResourceExhausted
  bool log_startup = true;
  // verify_mode auto: time every batch shape (forward per token count, draft per request count)
  // on dummy sequences at start-up, so the planner's first decisions use this machine's costs.
  bool profile_spec_costs = true;
  // Wall-time bound on that profile: start-up never waits longer on it, however loaded the
  // machine; shapes not reached keep the planner's priors and are learned from live steps.
  double profile_budget_s = 3.0;
};

// Canonical KV dtype for a flag value: auto -> first the runner supports of fp8, bf16;
// fp8_ds_mla -> fp8; nvfp4_ds_mla -> nvfp4. Unknown or unsupported values are errors naming the flag.
Result<std::string> resolve_kv_cache_dtype(const std::string& flag_value, const ModelRunner& runner);

class EngineCore {
 public:
  static Result<std::unique_ptr<EngineCore>> create(std::unique_ptr<ModelRunner> runner,
                                                    const EngineConfig& config, CoreOptions options = {});
  ~EngineCore();

  const ModelInfo& model_info() const { return info_; }
  const Tokenizer& tokenizer() const;
  ModelRunner& runner() { return *runner_; }
  Status runner_health() const { return runner_->health(); }  // any thread

  // Checks a request against the limits and sampling ranges without queueing it (thread-safe:
  // reads only immutable configuration).
  Status validate(const Request& request) const;
  Status add_request(Request request, EventCallback on_event);
  // Cancels: the final kCancelled event is emitted now and every block and slot freed.
  void abort(const std::string& request_id, FinishReason reason = FinishReason::kCancelled,
             const std::string& error = "");
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // One engine step. Errors here are internal (the affected requests already got kError).
  Status step();
  EngineMetrics metrics(bool drain_latencies);

  // ---- introspection for tests and logging ----
  const KvBlockManager& kv() const { return *kv_; }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  std::vector<int32_t> block_table(const std::string& request_id) const;
  int64_t num_computed(const std::string& request_id) const;
  Status check_integrity();  // also run after every step when options.check_integrity_each_step
  int64_t steps() const { return steps_; }
  int64_t max_model_len() const { return info_.max_model_len; }
  int num_kv_blocks() const { return kv_->num_blocks(); }
  const std::string& kv_cache_dtype() const { return kv_dtype_; }
  const SpecPlanner* planner() const { return planner_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Seq;
  EngineCore() = default;
  Status init(std::unique_ptr<ModelRunner> runner, const EngineConfig& config, CoreOptions options);

  bool spec_enabled() const { return planner_ != nullptr; }
  void plan_verify();
  bool ensure_blocks(Seq& s, int64_t total_tokens);
  void preempt(Seq& s);
  enum class Admit { kAdmitted, kSkipped, kNoRoom };
  Admit try_admit(Seq& s, int64_t& budget, bool contended, int& long_prefills);
  int64_t long_prefill_threshold() const;  // --long-prefill-token-threshold (0 = budget / 4)
  void expire_deadlines();  // finishes requests past their Request::timeout_s with kTimeout
  int64_t prefill_chunk(const Seq& s, int64_t budget) const;
  // A prefill chunk of n tokens shortened to the step's sampled rows left (sample_budget_): a
  // scoring prompt samples a row per token, a chunk that completes the tokens one (<= 0: not this
  // step); and the rows such a chunk samples.
  int64_t fit_sample_rows(const Seq& s, int64_t n) const;
  int64_t chunk_sample_rows(const Seq& s, int64_t n) const;
  int verify_limit(const Seq& s) const;       // drafts it may verify next step
  int64_t pending_prefill_tokens() const;     // prompt tokens the next forward may carry
  Status profile_costs();
  void process_output(Seq& s, const RunnerOutput& out, size_t index, std::vector<DraftQuery>& drafts);
  // Registers the sequence's full blocks for prefix caching; the number of the runner's snapshot
  // buffer its slot state goes to when it just reached a block boundary that has none yet (else -1).
  int cache_blocks(Seq& s);
  void log_long_prefill(Seq& s, int64_t old);
  void emit_and_maybe_finish(Seq& s, RequestEvent& ev, FinishReason finish);
  void finish(Seq& s, FinishReason reason, const std::string& error, RequestEvent* ev);
  void release(Seq& s);
  void remove_from_queues(Seq* s);

  EngineConfig config_;
  CoreOptions options_;
  ModelInfo info_;
  std::string kv_dtype_;
  std::unique_ptr<ModelRunner> runner_;
  // The runner's graph instantiations and free device memory when start-up was over (-1: not
  // counted); metrics report how far they moved since.
  int64_t graphs_at_start_ = -1, free_at_start_ = -1;
  // The device's free memory as metrics() last read it, and when (kDeviceMemoryPollS).
  int64_t free_now_ = -1;
  Clock::time_point free_read_{};
  std::unique_ptr<KvBlockManager> kv_;
  SampleRowsBuilder rows_builder_;
  std::unique_ptr<SpecPlanner> planner_;
  int num_spec_tokens_ = 0;

  std::map<std::string, std::unique_ptr<Seq>> seqs_;
  std::vector<Seq*> running_;  // arrival order
  std::deque<Seq*> waiting_;   // arrival order (preempted requests go back to their place)
  std::vector<int> free_slots_;
  uint64_t next_order_ = 0;
  int64_t steps_ = 0;
  // The end of the last step, and whether work was left then (the gap to the next step counts as
  // the loop's time between steps only then).
  Clock::time_point last_step_end_{};
  bool work_after_step_ = false;

  int64_t sample_budget_ = 0;  // rows the step being scheduled may still sample (ModelRunner::max_sample_rows)
  // Per-step scratch (sized at start-up).
  std::vector<Seq*> scheduled_;
  std::vector<int32_t> step_tokens_;
  std::vector<RunnerSeq> batch_;
  StepSamples samples_;
  RunnerOutput out_;
  std::vector<DraftQuery> draft_reqs_;
  std::vector<Seq*> draft_seqs_;
  std::vector<SlotCommit> commits_;
  std::vector<DraftProposal> proposals_;
  std::vector<SpecRequestState*> draft_states_;
  std::vector<int> draft_limits_;
  std::vector<uint8_t> draft_pick_;
  std::vector<std::span<const float>> plan_conf_;
  std::vector<int> plan_limits_;
  std::vector<Seq*> plan_who_;
  std::vector<SpecRequestState*> plan_states_;
  std::vector<int> plan_lengths_;
  std::vector<Seq*> order_, done_;
  std::vector<int> expected_refs_;

  EngineMetrics m_;
};

}  // namespace tandem

namespace tandem {
// Engine (engine.h) over a given runner: tests and benchmarks use it with FakeModelRunner.
Result<std::unique_ptr<Engine>> create_engine_with_runner(std::unique_ptr<ModelRunner> runner,
                                                          const EngineConfig& config);
}  // namespace tandem
