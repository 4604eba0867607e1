// The engine's public API: the only header the server and the CLI include. Submit a request,
// receive its events (tokens, text deltas, finish, usage) through a callback or a queue, cancel.
// Everything behind it (scheduler, KV pool, DSpark loop, model runner) is private to src/engine.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/runtime_facts.h"
#include "text/token_constraint.h"  // TokenConstraint (requests carry one)

namespace tandem {

// ---- configuration (filled from flags; names follow vLLM) ----
// How many drafts a request verifies each step. kFixed: K; kThreshold: while the draft's confidence
// is >= confidence_threshold; kAuto: chosen per step and request from confidences and measured
// batch-shape costs.
enum class VerifyMode : uint8_t { kFixed, kThreshold, kAuto };
// How the draft picks its tokens: kGreedy (argmax, q one-hot) or kSample (at the request's
// temperature; verification is then lossless rejection sampling against q).
enum class DraftSampleMethod : uint8_t { kGreedy, kSample };
struct SpeculativeConfig {
  std::string method;              // "" (off) | "dspark"
  int num_speculative_tokens = 5;  // K
  VerifyMode verify_mode = VerifyMode::kAuto;
  double confidence_threshold = 0.5;
  DraftSampleMethod draft_sample_method = DraftSampleMethod::kGreedy;
  bool enabled() const { return !method.empty(); }
  // K + 1 (1 without speculation): the most tokens one sequence's step runs through verification,
  // and so the most a slot rolls back in one step. The one place K + 1 is computed.
  int max_verify_tokens() const { return enabled() ? num_speculative_tokens + 1 : 1; }
};
// Parses vLLM's --speculative-config JSON ('{"method":"dspark","num_speculative_tokens":5}'); the
// string values become the enums here, once.
Result<SpeculativeConfig> parse_speculative_config(const std::string& json_text);
// "fixed" | "threshold" | "auto" and back (InvalidArgument names the value).
Result<VerifyMode> parse_verify_mode(const std::string& name);
const char* verify_mode_name(VerifyMode mode);
const char* draft_sample_method_name(DraftSampleMethod method);

struct EngineConfig {
  std::string model_dir;
  // --synthetic NAME: the official config NAME (io/official_configs.h) with synthetic weights
  // generated on the GPU (no checkpoint); model_dir then only supplies the tokenizer.
  std::string synthetic;
  uint64_t synthetic_seed = 1;
  std::string device = "auto";           // "auto" | "cpu" | "cuda"
  int max_num_seqs = 8;
  int max_num_batched_tokens = 2048;
  // vLLM's chunked-prefill fairness knobs. A prompt with more than the threshold tokens left is
  // "long": while other requests run or wait, each of its chunks is capped at the threshold (0 =
  // max_num_batched_tokens / 4), and at most max_num_partial_prefills long prompts prefill at once.
  int long_prefill_token_threshold = 0;
  int max_num_partial_prefills = 1;
  int64_t max_model_len = 0;             // 0 = from the model (capped by KV capacity)
  int block_size = 256;
  std::string kv_cache_dtype = "auto";   // auto|bf16|fp8|nvfp4 (+ fp8_ds_mla, nvfp4_ds_mla)
  int64_t kv_cache_memory = 0;           // bytes; 0 = derive from gpu_memory_utilization / default
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;
  // Tensor parallelism: one process per rank (src/engine/parallel/tp_runner.h). On one host the
  // head starts its workers itself; across nodes each node runs `tandem serve` with --nnodes,
  // --node-rank and the head's --master-addr/--master-port (that port and the next).
  int tensor_parallel_size = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double distributed_timeout_s = 120.0;  // the head waits this long for every rank to connect
  std::string worker_binary;             // the `tandem` binary workers run; "" = this executable
  // Tensor parallelism on GPUs (src/engine/parallel/device_tp.h): each rank on its own GPU (its
  // local rank is its CUDA ordinal); the paths that carry the collectives (auto | nccl | peer |
  // symmetric, src/model/cuda/device_comm.h), the largest message of the peer-memory path, where
  // NCCL is ("" = the loader's search), and, for tests only, ranks sharing GPUs.
  std::string tp_collectives = "auto";
  int64_t tp_peer_max_bytes = int64_t{1} << 20;
  std::string nccl_library;
  bool tp_share_gpus = false;
  int max_cudagraph_capture_size = 8;
  int num_threads = 0;                   // CPU threads, 0 = all cores
  SpeculativeConfig speculative;
  uint64_t default_seed = 0;
  // Start-up refuses when the host's MemAvailable (or a device's free memory) would fall under this
  // after the planned pools are allocated (--memory-headroom-floor; 0 = no floor).
  int64_t memory_headroom_floor = 0;
  // Watchdog: a step that makes no progress for this long fails the requests in flight and marks
  // the engine unhealthy instead of hanging (--engine-iteration-timeout; 0 = off).
  double engine_iteration_timeout_s = 0;
};

// ---- requests ----
struct SamplingParams {
  double temperature = 1.0;   // 0 = greedy
  double top_p = 1.0;
  int top_k = 0;              // 0 = off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::optional<uint64_t> seed;
  int max_tokens = 256;               // >= 1; 0 only with prompt_logprobs (score the prompt only)
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;      // stop strings (not included in the output)
  int logprobs = -1;                  // -1 = off; otherwise number of top alternatives (0..20)
  // -1 = off; n (0..20): the log-probability and rank of every prompt token after the first, with
  // its top n alternatives (RequestEvent::prompt_logprobs). Such a request prefills its whole
  // prompt (no prefix-cache hit: cached positions have no logits).
  int prompt_logprobs = -1;
};

struct Request {
  std::string request_id;
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  std::shared_ptr<TokenConstraint> constraint;  // null = unconstrained
  int priority = 0;
  // Deadline in seconds from submit (0 = none): past it the request ends with kTimeout, its
  // blocks and slot freed, at the next step boundary.
  double timeout_s = 0.0;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError, kTimeout };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error", "timeout"

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top-n alternatives
  int32_t rank = 0;  // prompt log-probabilities: the token's rank (1 = the most likely); 0 = none
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;          // prompt tokens served from the prefix cache
  int64_t draft_tokens = 0;           // speculative tokens proposed for this request
  int64_t accepted_draft_tokens = 0;
};

// One event per engine step per request (tokens accepted in that step), then a final one.
struct RequestEvent {
  std::string request_id;
  std::vector<int32_t> tokens;        // new tokens this step (already stop-trimmed)
  std::string text;                   // UTF-8-safe text delta for those tokens
  std::vector<TokenLogprob> logprobs; // one per token when requested
  // SamplingParams::prompt_logprobs: prompt tokens 1 .. n-1 (the first has no context), on the
  // request's first event (with its first token, or its final event when max_tokens is 0).
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;  // != kNone on the last event
  std::string error;                  // when finish == kError
  Usage usage;                        // filled on the last event
  double ttft_s = 0.0;                // on the first token event
};

using EventCallback = std::function<void(const RequestEvent&)>;

// ---- counters (vLLM meanings; published by the server at /metrics) ----
struct EngineMetrics {
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t request_success_total = 0;
  double kv_cache_usage_perc = 0.0;    // 0..1
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_leaked = 0;        // integrity check: allocated blocks with no owner
  int64_t prefix_cache_queries_total = 0;  // tokens queried
  int64_t prefix_cache_hits_total = 0;     // tokens hit
  int64_t num_preemptions_total = 0;
  int64_t spec_decode_num_drafts_total = 0;
  int64_t spec_decode_num_draft_tokens_total = 0;
  int64_t spec_decode_num_accepted_tokens_total = 0;
  std::vector<int64_t> spec_decode_num_accepted_tokens_per_pos_total;
  // Long prefills (prompts of at least kLongPrefillTokens): prompt tokens still to prefill over all
  // running requests, and the progress of the oldest long prefill in flight (0 / 0 when none).
  int64_t prefill_tokens_pending = 0;
  int64_t long_prefill_done_tokens = 0;
  int64_t long_prefill_prompt_tokens = 0;
  int64_t watchdog_stalls_total = 0;
  // Device allocations the runner made after start-up (must stay 0 under any load); -1 when the
  // runner does not count them (the CPU runners).
  int64_t device_allocations_after_start = -1;
  // CUDA graphs the runner instantiated after start-up (must stay 0; -1 when not counted), and the
  // device memory taken since start-up as cudaMemGetInfo sees it (must stay 0; 0 when not measured).
  int64_t device_graphs_after_start = -1;
  int64_t device_bytes_taken_after_start = 0;
  // Where the engine thread's time goes (seconds since start-up, summed over steps): scheduling and
  // building the batch, the runner's forward (uploads, launch, device time, results), the outputs
  // (sampling results, events to the requests' callbacks), the runner's commit (the DSpark draft's
  // context insertion), the draft (choosing who drafts, the runner's proposal), and the loop's own
  // time between two steps while there is work (inbox, metrics). device_wait: how much of forward
  // and draft the runner spent blocked on the device (-1 when it does not measure it); device_submit:
  // how much it spent before those waits, packing, uploading and launching (-1 likewise).
  int64_t engine_steps_total = 0;
  double engine_schedule_s = 0, engine_forward_s = 0, engine_outputs_s = 0, engine_commit_s = 0, engine_draft_s = 0,
         engine_between_steps_s = 0;
  double device_wait_s = -1, device_submit_s = -1;
  // Latency samples since the last call (drained by take_metrics()).
  std::vector<double> ttft_s, itl_s, e2e_s;
};

struct ModelInfo {
  std::string model_dir;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  int64_t kv_capacity_tokens = 0;
  int32_t eos_token_id = 1;
  bool has_draft = false;
  std::string device;       // "cpu" | "cuda:0" ...
  // For the runtime audit and the start-up report (empty for engines without a model runner).
  std::string kv_cache_dtype;             // resolved: "bf16" | "fp8" | "nvfp4"
  std::vector<DeviceFacts> ranks;         // one per rank (1 in a single process)
  MemoryPlan memory;                      // the pools planned at start-up and the headroom check's inputs
};

// Prompts at least this long log their prefill progress and show it in /metrics.
inline constexpr int64_t kLongPrefillTokens = 8192;

class Tokenizer;  // text/tokenizer.h

class Engine {
 public:
  virtual ~Engine() = default;
  // Loads the model, sizes the KV pool, starts the step loop thread.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);

  virtual const ModelInfo& model_info() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // Queues a request; events arrive on the engine thread through `on_event` (keep it short).
  // Errors (prompt too long, queue full, bad params) come back here, not as events.
  virtual Status submit(Request request, EventCallback on_event) = 0;
  // Cancels; the request's final event (kCancelled) arrives within one step. Unknown ids are ignored.
  virtual void cancel(const std::string& request_id) = 0;
  virtual EngineMetrics metrics() = 0;       // snapshot; drains latency samples
  virtual bool healthy() const = 0;
  // Why healthy() is false ("" when healthy or unknown): e.g. a tensor-parallel rank was lost.
  virtual std::string unhealthy_reason() const { return ""; }
  // Stops accepting; waits up to `deadline_s` for in-flight requests, then cancels the rest.
  virtual void shutdown(double deadline_s) = 0;
};

}  // namespace tandem
