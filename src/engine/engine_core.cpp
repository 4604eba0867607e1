// EngineCore: see engine_core.h. Sections: start-up sizing, request intake, scheduling, output
// processing (sample / verify / commit / draft), finishing, integrity and metrics.
#include "engine/engine_core.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/hash.h"
#include "common/log.h"
#include "text/tokenizer.h"

namespace tandem {

struct EngineCore::Seq {
  std::string id;
  uint64_t order = 0;
  SamplingParams sp;
  std::shared_ptr<TokenConstraint> constraint;
  EventCallback cb;
  std::vector<int32_t> tokens;  // prompt + output; the last one is not yet in the cache
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     // positions in the model's cache (== the slot's length)
  int slot = -1;
  bool running = false;
  bool admitted_once = false;
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;
  DraftProposal draft;
  bool has_draft = false;
  // Admitted this step: the runner resets the slot before the forward (and loads `restore`, the
  // prefix hit's snapshot number, when >= 0).
  bool fresh = false;
  int restore = -1;
  SpecRequestState spec;        // what the planner has learned about this request's drafts
  int num_verify = 0;           // drafts verified in this step
  int sample_begin = -1;        // this step's first row in samples_ (-1: a prefill chunk)
  int64_t scheduled = 0;        // tokens in this step's forward
  uint64_t seed = 0;
  PenaltyState pen;
  std::unique_ptr<TextStream> text;
  Usage usage;
  Clock::time_point arrival, last_event;
  Clock::time_point deadline = Clock::time_point::max();  // Request::timeout_s after arrival
  bool got_first = false;
  Clock::time_point prefill_start, prefill_logged;  // long prefills only
  // SamplingParams::prompt_logprobs: collected chunk by chunk while the prompt prefills (dropped
  // by a preemption before it is complete), handed out with the request's first event.
  std::vector<TokenLogprob> prompt_lp;
  bool prompt_scored = false;   // every prompt token has its entry
  int score_rows = 0;           // this step's score rows (the first of the sequence's sample rows)
  int64_t output_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // The prompt's rows are still to be scored: each prefill token samples a row, no prefix hit.
  bool scoring() const { return sp.prompt_logprobs >= 0 && !prompt_scored; }
};

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
double seconds_since(std::chrono::steady_clock::time_point t) { return seconds_between(t, std::chrono::steady_clock::now()); }
constexpr size_t kMaxLatencySamples = 100000;
// How often metrics() reads the device's free memory while work is left (see there).
constexpr double kDeviceMemoryPollS = 0.1;
void push_sample(std::vector<double>& v, double x) {
  if (v.size() < kMaxLatencySamples) v.push_back(x);
}
}  // namespace

// ================================ start-up ================================

Result<std::string> resolve_kv_cache_dtype(const std::string& flag_value, const ModelRunner& runner) {
  std::string v = flag_value;
  if (v == "fp8_ds_mla" || v == "fp8_e4m3") v = "fp8";
  if (v == "nvfp4_ds_mla") v = "nvfp4";
  if (v == "auto") {
    for (const char* d : {"fp8", "bf16"})
      if (runner.check_kv_cache_dtype(d).ok()) return std::string(d);
    return invalid_argument("--kv-cache-dtype auto: the model supports neither fp8 nor bf16 KV");
  }
  if (v != "bf16" && v != "fp8" && v != "nvfp4")
    return invalid_argument(
        "--kv-cache-dtype '{}' is not one of auto, bf16, fp8, nvfp4, fp8_ds_mla, nvfp4_ds_mla", flag_value);
  Status st = runner.check_kv_cache_dtype(v);
  if (!st.ok()) return st.with_context("--kv-cache-dtype " + flag_value);
  return v;
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(std::unique_ptr<ModelRunner> runner,
                                                       const EngineConfig& config, CoreOptions options) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  TANDEM_RETURN_IF_ERROR(core->init(std::move(runner), config, options));
  return core;
}

EngineCore::~EngineCore() = default;

const Tokenizer& EngineCore::tokenizer() const { return runner_->tokenizer(); }

Status EngineCore::init(std::unique_ptr<ModelRunner> runner, const EngineConfig& config, CoreOptions options) {
  config_ = config;
  options_ = options;
  runner_ = std::move(runner);
  if (config.max_num_seqs < 1 || config.max_num_seqs > 4096)
    return invalid_argument("--max-num-seqs {} must be in [1, 4096]", config.max_num_seqs);
  if (config.max_num_batched_tokens < 1)
    return invalid_argument("--max-num-batched-tokens {} must be >= 1", config.max_num_batched_tokens);
  if (config.long_prefill_token_threshold < 0)
    return invalid_argument("--long-prefill-token-threshold {} must be >= 0", config.long_prefill_token_threshold);
  if (config.max_num_partial_prefills < 1)
    return invalid_argument("--max-num-partial-prefills {} must be >= 1", config.max_num_partial_prefills);
  if (config.block_size < 1 || config.block_size > 65536)
    return invalid_argument("--block-size {} must be in [1, 65536]", config.block_size);
  if (config.max_model_len < 0) return invalid_argument("--max-model-len {} must be >= 0", config.max_model_len);
  if (config.kv_cache_memory < 0)
    return invalid_argument("--kv-cache-memory {} must be >= 0", config.kv_cache_memory);
  TANDEM_ASSIGN_OR_RETURN(kv_dtype_, resolve_kv_cache_dtype(config.kv_cache_dtype, *runner_));

  // ---- speculative decoding ----
  const SpeculativeConfig& sc = config.speculative;
  if (!sc.method.empty()) {
    if (sc.method != "dspark")
      return invalid_argument("--speculative-config: method '{}' is not supported (only \"dspark\")", sc.method);
    if (!runner_->has_draft())
      return invalid_argument("--speculative-config: method dspark needs a checkpoint with a DSpark draft");
    if (sc.num_speculative_tokens < 1 || sc.num_speculative_tokens > runner_->num_draft_tokens())
      return invalid_argument("--speculative-config: num_speculative_tokens {} must be in [1, {}] (the draft block)",
                              sc.num_speculative_tokens, runner_->num_draft_tokens());
    if (!(sc.confidence_threshold >= 0 && sc.confidence_threshold <= 1))
      return invalid_argument("--speculative-config: confidence_threshold {} must be in [0, 1]",
                              sc.confidence_threshold);
    num_spec_tokens_ = sc.num_speculative_tokens;
    planner_ = std::make_unique<SpecPlanner>(sc, num_spec_tokens_);
  }

  // ---- KV pool sizing ----
  const int bs = config.block_size;
  const int64_t model_len = runner_->max_model_len();
  if (config.max_model_len > model_len)
    return invalid_argument("--max-model-len {} exceeds the model's maximum {}", config.max_model_len, model_len);
  const int64_t want_len = config.max_model_len > 0 ? config.max_model_len : model_len;
  // Prefix caching keeps slot-state snapshots at block boundaries. They can be far larger than a
  // block's KV (window ring + compressor state), so the pool holds a bounded number of them
  // (recycled LRU); with a small budget, one per block.
  const int64_t snapshot_bytes = config.enable_prefix_caching ? runner_->slot_state_bytes() : 0;
  const int64_t kv_block_bytes = runner_->kv_bytes_per_block(bs, kv_dtype_);
  TANDEM_CHECK(kv_block_bytes > 0);
  const int64_t max_snapshots =
      config.enable_prefix_caching ? std::max<int64_t>(64, int64_t{16} * config.max_num_seqs) : 0;
  RunnerAllocation alloc;
  alloc.num_blocks = 0;  // sized below
  alloc.block_size = bs;
  alloc.max_slots = config.max_num_seqs;
  alloc.max_tokens_per_step = config.max_num_batched_tokens;
  alloc.max_verify_tokens = sc.max_verify_tokens();
  alloc.num_draft_tokens = num_spec_tokens_;
  alloc.kv_cache_dtype = kv_dtype_;
  int64_t budget = config.kv_cache_memory;
  std::string budget_from = "--kv-cache-memory";
  // Room for every sequence at full length (and the snapshots): a default pool never exceeds it.
  const int64_t want = static_cast<int64_t>(config.max_num_seqs) * ((want_len + bs - 1) / bs + 1) * kv_block_bytes +
                       max_snapshots * snapshot_bytes;
  // A GPU runner's plan without KV says what --gpu-memory-utilization leaves for it.
  MemoryPlan no_kv;
  if (budget == 0) runner_->plan_memory(alloc, no_kv);
  if (budget == 0 && !no_kv.gpu_domain.empty()) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t under, kv_budget_from_utilization(no_kv, config.gpu_memory_utilization));
    budget = std::min(under, want);
    budget_from = fmt::format("{}--gpu-memory-utilization {} x {}{}",
                              under > want ? "max_num_seqs x max_model_len, under " : "", config.gpu_memory_utilization,
                              format_bytes(no_kv.gpu_total_bytes), no_kv.gpu_unified ? " (unified memory)" : "");
  } else if (budget == 0) {
    // CPU default: room for every sequence at full length, at most min(2 GiB, 25% of RAM).
    int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    int64_t cap = std::min<int64_t>(phys / 4, int64_t{2} << 30);
    budget = std::min(want, std::max<int64_t>(cap, kv_block_bytes + snapshot_bytes));
    budget_from = "default (max_num_seqs x max_model_len, <= min(2 GiB, 25% of RAM))";
  }
  int64_t num_blocks, num_snapshots;
  if (snapshot_bytes == 0) {
    num_blocks = budget / kv_block_bytes;
    num_snapshots = 0;
  } else if (budget >= max_snapshots * (snapshot_bytes + kv_block_bytes)) {
    num_snapshots = max_snapshots;
    num_blocks = (budget - max_snapshots * snapshot_bytes) / kv_block_bytes;
  } else {
    num_blocks = budget / (kv_block_bytes + snapshot_bytes);
    num_snapshots = num_blocks;
  }
  if (num_blocks < 1)
    return make_error(StatusCode::kResourceExhausted,
                      "{} = {} bytes is smaller than one KV block ({} bytes{})", budget_from, budget,
                      kv_block_bytes + snapshot_bytes,
                      snapshot_bytes ? fmt::format(" incl. a {}-byte slot snapshot", snapshot_bytes) : "");
  num_blocks = std::min<int64_t>(num_blocks, (int64_t{1} << 31) / bs - 1);
  const int64_t capacity = num_blocks * bs;

  info_.model_dir = config.model_dir;
  info_.vocab_size = runner_->vocab_size();
  info_.max_model_len = std::min(want_len, capacity);
  info_.kv_capacity_tokens = capacity;
  info_.eos_token_id = runner_->eos_token_id();
  info_.has_draft = runner_->has_draft();
  info_.device = runner_->device();

  alloc.num_blocks = static_cast<int>(num_blocks);
  alloc.num_snapshots = static_cast<int>(num_snapshots);  // the runner keeps them where it computes
  // ---- the memory plan: every pool named and checked against the headroom floor before any
  // of them is allocated (the seeds' OOM came from the host running out under load) ----
  MemoryPlan& plan = info_.memory;
  plan = MemoryPlan();
  plan.headroom_floor_bytes = config.memory_headroom_floor;
  runner_->plan_memory(alloc, plan);
  if (!plan.find_domain("host")) {
    auto avail = read_host_mem_available();
    int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    plan.domains.push_back({"host", avail.ok() ? *avail : -1, phys, "/proc/meminfo MemAvailable"});
  }
  if (options_.log_startup) TLOG_INFO("engine", "{}", format_memory_report(plan));
  TANDEM_RETURN_IF_ERROR(check_memory_headroom(plan));
  info_.kv_cache_dtype = kv_dtype_;
  TANDEM_RETURN_IF_ERROR(runner_->allocate(alloc).with_context("allocating the model's KV pool"));
  info_.ranks.assign(1, runner_->device_facts());
  // The runner knows its exact slot-state size only once its pools exist.
  const int64_t final_snapshot_bytes = config.enable_prefix_caching ? runner_->slot_state_bytes() : 0;
  kv_ = std::make_unique<KvBlockManager>(static_cast<int>(num_blocks), bs, config.enable_prefix_caching,
                                         static_cast<int>(num_snapshots));
  rows_builder_.vocab = runner_->vocab_size();
  rows_builder_.eos = runner_->eos_token_id();
  for (int s = config.max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
  step_tokens_.reserve(config.max_num_batched_tokens);
  batch_.reserve(config.max_num_seqs);
  scheduled_.reserve(config.max_num_seqs);
  draft_reqs_.reserve(config.max_num_seqs);
  draft_seqs_.reserve(config.max_num_seqs);
  commits_.reserve(config.max_num_seqs);
  expected_refs_.resize(num_blocks);
  m_.spec_decode_num_accepted_tokens_per_pos_total.assign(num_spec_tokens_, 0);
  m_.kv_blocks_total = num_blocks;
  m_.kv_blocks_free = num_blocks;
  draft_states_.reserve(config.max_num_seqs);
  plan_conf_.reserve(config.max_num_seqs);
  plan_limits_.reserve(config.max_num_seqs);
  plan_who_.reserve(config.max_num_seqs);
  plan_states_.reserve(config.max_num_seqs);
  plan_lengths_.reserve(config.max_num_seqs);
  order_.reserve(config.max_num_seqs);
  done_.reserve(config.max_num_seqs);
  draft_limits_.reserve(config.max_num_seqs);
  draft_pick_.reserve(config.max_num_seqs);
  if (planner_ && sc.verify_mode == VerifyMode::kAuto && options_.profile_spec_costs) {
    if (options_.log_startup)
      TLOG_INFO("engine", "speculative planner: timing batch shapes on this machine (at most {:.0f} s)...",
                options_.profile_budget_s);
    TANDEM_RETURN_IF_ERROR(profile_costs().with_context("profiling batch shapes for the speculative planner"));
  }
  // Start-up is over: from here on nothing may instantiate a graph or take device memory.
  graphs_at_start_ = runner_->device_graph_instantiations();
  free_at_start_ = runner_->device_free_bytes();
  if (options_.log_startup)
    TLOG_INFO("engine",
              "KV cache: {} blocks x {} tokens = {} tokens capacity ({} KV, {} bytes/block) + {} slot snapshots x {} "
              "bytes = {:.1f} MiB from {}; max_model_len {}; max_num_seqs {}; prefix caching {}; speculative {}",
              num_blocks, bs, capacity,
              config.kv_cache_dtype == kv_dtype_ ? kv_dtype_ : fmt::format("{} = {}", config.kv_cache_dtype, kv_dtype_),
              kv_block_bytes, num_snapshots, final_snapshot_bytes,
              static_cast<double>(num_blocks * kv_block_bytes + num_snapshots * final_snapshot_bytes) / (1 << 20),
              budget_from, info_.max_model_len,
              config.max_num_seqs, config.enable_prefix_caching ? "on" : "off",
              spec_enabled() ? fmt::format("dspark K={} verify={}", num_spec_tokens_, verify_mode_name(sc.verify_mode))
                             : "off");
  return Status();
}

Status EngineCore::profile_costs() {
  // Dummy sequences of kCtx tokens in up to 8 slots; every verify shape b x (1 + L) is run three
  // times (rolled back after each run) and every draft batch b is drafted three times. Nothing is
  // cached or counted in the metrics; slots and blocks are returned at the end.
  constexpr int64_t kCtx = 32;
  constexpr int kReps = 3;
  const int K = num_spec_tokens_;
  const int64_t budget = config_.max_num_batched_tokens;
  const int64_t ctx = std::min<int64_t>(kCtx, budget);
  if (info_.max_model_len < ctx + K + 2) return Status();
  const int bs = kv_->block_size();
  const int need = static_cast<int>((ctx + K + 1 + bs - 1) / bs);
  int max_b = std::min<int>({8, config_.max_num_seqs, static_cast<int>(free_slots_.size()), kv_->num_free() / need});
  if (max_b < 1) return Status();
  auto t_start = Clock::now();
  std::vector<int> slots(free_slots_.end() - max_b, free_slots_.end());
  std::vector<std::vector<int32_t>> tables(max_b);
  for (auto& t : tables) TANDEM_CHECK(kv_->allocate(need, t));
  const int32_t noise = runner_->noise_token_id();
  auto dummy = [&](int64_t i) {
    int32_t t = static_cast<int32_t>((i * 7919 + 13) % info_.vocab_size);
    return t == noise || t == info_.eos_token_id ? static_cast<int32_t>((t + 1) % info_.vocab_size) : t;
  };
  std::vector<int32_t> toks(static_cast<size_t>(max_b) * (ctx + K + 1));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = dummy(static_cast<int64_t>(i));
  std::vector<RunnerSeq> batch;
  std::vector<SlotCommit> commits;
  RunnerOutput out;
  Status st;
  // Context: one prefill per slot (which starts it over), its taps into the draft window.
  for (int b = 0; b < max_b && st.ok(); ++b) {
    RunnerSeq r;
    r.slot = slots[b];
    r.start_pos = 0;
    r.tokens = std::span<const int32_t>(toks.data() + b * (ctx + K + 1), static_cast<size_t>(ctx));
    r.block_table = tables[b];
    r.collect_taps = true;
    r.reset = true;
    batch.assign(1, r);
    st = runner_->forward(batch, nullptr, out);
    if (st.ok()) st = runner_->commit(std::vector<SlotCommit>{{slots[b], 0, ctx, ctx, -1}});
  }
  // Every timed row samples greedily over a draft, as a verify step does.
  StepSamples samples;
  SamplingParams greedy;
  greedy.temperature = 0;
  PenaltyState no_pen;
  std::vector<DraftQuery> dq;
  std::vector<DraftProposal> props;
  auto time_shape = [&](int b, int L, bool record) -> Status {
    batch.clear();
    samples.clear();
    for (int i = 0; i < b; ++i) {
      RunnerSeq r;
      r.slot = slots[i];
      r.start_pos = ctx;
      r.tokens = std::span<const int32_t>(toks.data() + i * (ctx + K + 1) + ctx, static_cast<size_t>(1 + L));
      r.block_table = tables[i];
      r.sample_rows = 1 + L;
      r.sample_begin = static_cast<int>(samples.rows.size());
      r.collect_taps = true;
      rows_builder_.append(greedy, no_pen, nullptr, 0, ctx + 1, r.tokens.subspan(1), false, samples);
      batch.push_back(r);
    }
    auto t0 = Clock::now();
    TANDEM_RETURN_IF_ERROR(runner_->forward(batch, &samples, out));
    if (record) planner_->observe_forward(b, static_cast<int64_t>(b) * (1 + L), seconds_since(t0));
    commits.clear();
    // Rolled back to the context; no snapshot (-1 spelled out: `{}` would value-initialize it to
    // snapshot 0, which a start-up without the prefix cache does not have).
    for (int i = 0; i < b; ++i) commits.push_back({slots[i], i, ctx, 0, -1});
    return runner_->commit(commits);
  };
  auto time_draft = [&](int b, bool record) -> Status {
    dq.clear();
    for (int i = 0; i < b; ++i) {
      DraftQuery d;
      d.slot = slots[i];
      d.anchor_token = toks[i * (ctx + K + 1) + ctx];
      d.anchor_pos = ctx;
      dq.push_back(d);
    }
    auto t0 = Clock::now();
    TANDEM_RETURN_IF_ERROR(runner_->draft_propose(dq, props));
    if (record) planner_->observe_draft(b, seconds_since(t0));
    return Status();
  };
  if (st.ok()) st = time_shape(1, 0, false);  // warm-up (first-touch pages, thread start)
  if (st.ok()) st = time_draft(1, false);
  // Shapes in order of use (one sequence first); the wall-time budget cuts the rest.
  auto over = [&] { return seconds_since(t_start) >= options_.profile_budget_s; };
  bool cut = false;
  for (int rep = 0; rep < kReps && st.ok() && !cut; ++rep) {
    for (int b = 1; b <= max_b && st.ok() && !cut; b *= 2) {
      for (int L = 0; L <= K && st.ok() && !(cut = over()); ++L)
        if (b * (1 + L) <= budget) st = time_shape(b, L, true);
      if (st.ok() && !(cut = cut || over())) st = time_draft(b, true);
    }
  }
  for (int b = 0; b < max_b; ++b) kv_->release(tables[b]);  // the slots start over when next admitted
  TANDEM_RETURN_IF_ERROR(st);
  if (options_.log_startup)
    TLOG_INFO("engine",
              "speculative planner: measured in {:.2f} s{}: forward {:.2f} ms (1 token), {:.2f} ms ({} tokens of one "
              "sequence), {:.2f} ms ({} sequences x 1 token); draft {:.2f} ms (1 request), {:.2f} ms ({} requests)",
              seconds_since(t_start), cut ? " (budget reached; the rest is learned while serving)" : "",
              1e3 * planner_->predict_forward(1, 1), 1e3 * planner_->predict_forward(1, 1 + K),
              1 + K, 1e3 * planner_->predict_forward(max_b, max_b), max_b, 1e3 * planner_->predict_draft(1),
              1e3 * planner_->predict_draft(max_b), max_b);
  return Status();
}

// ================================ intake ================================

Status EngineCore::validate(const Request& r) const {
  const SamplingParams& sp = r.sampling;
  if (r.request_id.empty()) return invalid_argument("request_id is empty");
  if (r.prompt_tokens.empty()) return invalid_argument("request {}: the prompt has no tokens", r.request_id);
  if (!(r.timeout_s >= 0 && std::isfinite(r.timeout_s)))
    return invalid_argument("request {}: timeout {} must be a finite number of seconds >= 0", r.request_id, r.timeout_s);
  for (size_t i = 0; i < r.prompt_tokens.size(); ++i)
    if (r.prompt_tokens[i] < 0 || r.prompt_tokens[i] >= info_.vocab_size)
      return invalid_argument("request {}: prompt token {} at index {} is outside the vocabulary [0, {})",
                              r.request_id, r.prompt_tokens[i], i, info_.vocab_size);
  if (static_cast<int64_t>(r.prompt_tokens.size()) >= info_.max_model_len)
    return make_error(StatusCode::kOutOfRange,
                      "request {}: the prompt has {} tokens but max_model_len is {} (room for at least one "
                      "output token is needed)",
                      r.request_id, r.prompt_tokens.size(), info_.max_model_len);
  if (!(sp.temperature >= 0 && std::isfinite(sp.temperature)))
    return invalid_argument("temperature {} must be >= 0", sp.temperature);
  if (!(sp.top_p > 0 && sp.top_p <= 1)) return invalid_argument("top_p {} must be in (0, 1]", sp.top_p);
  if (sp.top_k < -1) return invalid_argument("top_k {} must be -1, 0 (off) or positive", sp.top_k);
  if (!(sp.min_p >= 0 && sp.min_p <= 1)) return invalid_argument("min_p {} must be in [0, 1]", sp.min_p);
  if (!(sp.presence_penalty >= -2 && sp.presence_penalty <= 2))
    return invalid_argument("presence_penalty {} must be in [-2, 2]", sp.presence_penalty);
  if (!(sp.frequency_penalty >= -2 && sp.frequency_penalty <= 2))
    return invalid_argument("frequency_penalty {} must be in [-2, 2]", sp.frequency_penalty);
  if (!(sp.repetition_penalty > 0 && std::isfinite(sp.repetition_penalty)))
    return invalid_argument("repetition_penalty {} must be > 0", sp.repetition_penalty);
  if (sp.prompt_logprobs < -1 || sp.prompt_logprobs > kMaxTopLogprobs)
    return invalid_argument("prompt_logprobs {} must be in [0, {}]", sp.prompt_logprobs, kMaxTopLogprobs);
  if (sp.max_tokens < (sp.prompt_logprobs >= 0 ? 0 : 1))
    return invalid_argument("max_tokens {} must be >= 1 (0 only when the prompt's log-probabilities are asked for)",
                            sp.max_tokens);
  if (sp.logprobs < -1 || sp.logprobs > 20) return invalid_argument("logprobs {} must be in [0, 20]", sp.logprobs);
  for (int32_t t : sp.stop_token_ids)
    if (t < 0 || t >= info_.vocab_size)
      return invalid_argument("stop_token_ids: {} is outside the vocabulary [0, {})", t, info_.vocab_size);
  return Status();
}

Status EngineCore::add_request(Request request, EventCallback on_event) {
  TANDEM_RETURN_IF_ERROR(validate(request));
  if (seqs_.count(request.request_id))
    return invalid_argument("request id '{}' is already in flight", request.request_id);
  if (static_cast<int>(waiting_.size()) >= options_.max_waiting)
    return make_error(StatusCode::kResourceExhausted, "{} requests are already waiting", waiting_.size());
  auto s = std::make_unique<Seq>();
  s->id = request.request_id;
  s->order = next_order_++;
  s->sp = request.sampling;
  s->constraint = request.constraint;
  s->cb = std::move(on_event);
  s->tokens = std::move(request.prompt_tokens);
  s->tokens.reserve(s->tokens.size() + s->sp.max_tokens + config_.speculative.max_verify_tokens());
  s->prompt_len = static_cast<int64_t>(s->tokens.size());
  s->seed = s->sp.seed ? *s->sp.seed : mix64(config_.default_seed ^ mix64(s->order));
  s->pen.init(s->sp, s->tokens);
  if (planner_) planner_->start_request(s->spec);
  s->text = std::make_unique<TextStream>(runner_->tokenizer(), s->sp.stop);
  s->usage.prompt_tokens = s->prompt_len;
  s->arrival = Clock::now();
  if (request.timeout_s > 0)
    s->deadline = s->arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(request.timeout_s));
  waiting_.push_back(s.get());
  seqs_[s->id] = std::move(s);
  return Status();
}

void EngineCore::abort(const std::string& request_id, FinishReason reason, const std::string& error) {
  auto it = seqs_.find(request_id);
  if (it == seqs_.end()) return;
  finish(*it->second, reason, error, nullptr);
}

// ================================ scheduling ================================

void EngineCore::plan_verify() {
  // Confidences of the drafts proposed at the end of the last step decide this step's lengths.
  // Scratch vectors are members reserved at start-up (max_num_seqs): no allocation per step.
  plan_conf_.clear();
  plan_limits_.clear();
  plan_who_.clear();
  plan_states_.clear();
  for (Seq* s : running_) {
    s->num_verify = 0;
    bool decode = s->num_computed + 1 == static_cast<int64_t>(s->tokens.size());
    if (!decode || !s->has_draft) continue;
    size_t k = std::min({s->draft.confidence.size(), s->draft.tokens.size(), static_cast<size_t>(num_spec_tokens_)});
    plan_conf_.emplace_back(s->draft.confidence.data(), k);
    plan_limits_.push_back(verify_limit(*s));
    plan_who_.push_back(s);
    plan_states_.push_back(&s->spec);
  }
  if (plan_who_.empty()) return;
  planner_->plan(plan_conf_, plan_limits_, pending_prefill_tokens(), plan_lengths_, plan_states_);
  for (size_t i = 0; i < plan_who_.size(); ++i) plan_who_[i]->num_verify = plan_lengths_[i];
}

int EngineCore::verify_limit(const Seq& s) const {
  int64_t lim = num_spec_tokens_;
  lim = std::min<int64_t>(lim, s.sp.max_tokens - s.output_len() - 1);
  lim = std::min<int64_t>(lim, info_.max_model_len - static_cast<int64_t>(s.tokens.size()) - 1);
  return static_cast<int>(std::max<int64_t>(lim, 0));
}

int64_t EngineCore::pending_prefill_tokens() const {
  int64_t extra = 0;
  for (const Seq* s : running_)
    if (s->num_computed + 1 != static_cast<int64_t>(s->tokens.size()))
      extra += static_cast<int64_t>(s->tokens.size()) - s->num_computed;
  return std::min<int64_t>(extra, config_.max_num_batched_tokens);
}

bool EngineCore::ensure_blocks(Seq& s, int64_t total_tokens) {
  const int bs = kv_->block_size();
  int64_t need = (total_tokens + bs - 1) / bs - static_cast<int64_t>(s.block_table.size());
  if (need <= 0) return true;
  return kv_->allocate(static_cast<int>(need), s.block_table);
}

int64_t EngineCore::prefill_chunk(const Seq& s, int64_t budget) const {
  int64_t n = std::min(static_cast<int64_t>(s.tokens.size()) - s.num_computed, budget);
  if (kv_->prefix_caching()) {
    // End the chunk on a block boundary when it crosses one, so the slot state there can be
    // snapshotted for later prefix hits (only a chunk's end is observable).
    const int bs = kv_->block_size();
    int64_t end = s.num_computed + n;
    int64_t b = end / bs * bs;
    if (b > s.num_computed && b != end) n = b - s.num_computed;
  }
  return n;
}

int64_t EngineCore::fit_sample_rows(const Seq& s, int64_t n) const {
  if (s.scoring()) return std::min(n, sample_budget_);
  const bool last = s.num_computed + n == static_cast<int64_t>(s.tokens.size());
  return last && sample_budget_ < 1 ? n - 1 : n;
}

int64_t EngineCore::chunk_sample_rows(const Seq& s, int64_t n) const {
  if (s.scoring()) return n;
  return s.num_computed + n == static_cast<int64_t>(s.tokens.size()) ? 1 : 0;
}

void EngineCore::release(Seq& s) {
  kv_->release(s.block_table);
  s.block_hashes.clear();
  if (s.slot >= 0) {
    free_slots_.push_back(s.slot);
    s.slot = -1;
  }
  s.has_draft = false;
  s.num_verify = 0;
}

void EngineCore::remove_from_queues(Seq* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
}

void EngineCore::preempt(Seq& s) {
  TLOG_DEBUG("engine", "preempting {} at {} computed tokens", s.id, s.num_computed);
  release(s);
  s.num_computed = 0;
  if (s.scoring()) s.prompt_lp.clear();  // its prompt is scored again from the start
  s.running = false;
  s.scheduled = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), &s), running_.end());
  auto pos = std::lower_bound(waiting_.begin(), waiting_.end(), &s,
                              [](const Seq* a, const Seq* b) { return a->order < b->order; });
  waiting_.insert(pos, &s);
  ++m_.num_preemptions_total;
}

int64_t EngineCore::long_prefill_threshold() const {
  if (config_.long_prefill_token_threshold > 0) return config_.long_prefill_token_threshold;
  return std::max(1, config_.max_num_batched_tokens / 4);
}

EngineCore::Admit EngineCore::try_admit(Seq& s, int64_t& budget, bool contended, int& long_prefills) {
  const int bs = kv_->block_size();
  std::vector<int32_t> hit_blocks;
  std::vector<uint64_t> hit_hashes;
  int max_blocks = static_cast<int>((static_cast<int64_t>(s.tokens.size()) - 1) / bs);
  const bool lookup = !s.scoring();  // cached positions have no logits to score
  if (lookup) kv_->find_cached_prefix(s.tokens, max_blocks, hit_blocks, hit_hashes);
  const int64_t hit = static_cast<int64_t>(hit_blocks.size()) * bs;
  // A long prompt waits while max_num_partial_prefills long ones prefill (short ones go ahead),
  // and under contention prefills at most the threshold per step.
  const int64_t threshold = long_prefill_threshold();
  const bool is_long = static_cast<int64_t>(s.tokens.size()) - hit > threshold;
  if (is_long && long_prefills >= config_.max_num_partial_prefills) return Admit::kSkipped;
  s.num_computed = hit;
  int64_t n = fit_sample_rows(s, prefill_chunk(s, contended && is_long ? std::min(budget, threshold) : budget));
  if (n <= 0) {  // the step's sampled rows are spent: the next step
    s.num_computed = 0;
    return Admit::kSkipped;
  }
  kv_->acquire(hit_blocks);
  s.block_table = hit_blocks;
  if (!ensure_blocks(s, hit + n)) {
    kv_->release(s.block_table);
    s.block_table.clear();
    s.num_computed = 0;
    return Admit::kNoRoom;
  }
  if (is_long) ++long_prefills;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  // The slot starts over in this step's forward, from the hit's snapshot when there is one (the
  // hit blocks are held, so their snapshot stays put until then).
  s.fresh = true;
  s.restore = -1;
  if (hit > 0) {
    kv_->touch_snapshot(hit_blocks.back());
    s.restore = kv_->snapshot(hit_blocks.back());
  }
  s.block_hashes = hit_hashes;
  s.running = true;
  auto pos = std::lower_bound(running_.begin(), running_.end(), &s,
                              [](const Seq* a, const Seq* b) { return a->order < b->order; });
  running_.insert(pos, &s);
  if (kv_->prefix_caching() && lookup) {
    m_.prefix_cache_queries_total += static_cast<int64_t>(s.tokens.size());
    m_.prefix_cache_hits_total += hit;
  }
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.usage.cached_tokens = hit;
    m_.prompt_tokens_total += s.prompt_len;
  }
  s.num_verify = 0;
  s.scheduled = n;
  budget -= n;
  sample_budget_ -= chunk_sample_rows(s, n);
  scheduled_.push_back(&s);
  return Admit::kAdmitted;
}

void EngineCore::expire_deadlines() {
  const auto now = Clock::now();
  done_.clear();
  for (const auto& [id, s] : seqs_)
    if (s->deadline <= now) done_.push_back(s.get());
  for (Seq* s : done_) finish(*s, FinishReason::kTimeout, "", nullptr);
  done_.clear();
}

Status EngineCore::step() {
  ++steps_;
  const auto t_step = Clock::now();
  if (work_after_step_) m_.engine_between_steps_s += seconds_between(last_step_end_, t_step);
  struct StepEnd {  // every return: when it ended and whether work is left
    EngineCore& c;
    ~StepEnd() {
      c.last_step_end_ = Clock::now();
      c.work_after_step_ = c.has_work();
    }
  } step_end{*this};
  expire_deadlines();
  if (!has_work()) return Status();
  if (spec_enabled()) plan_verify();
  int64_t budget = config_.max_num_batched_tokens;
  sample_budget_ = runner_->max_sample_rows();
  scheduled_.clear();
  for (Seq* s : running_) s->scheduled = 0;

  // Running requests: decodes (and verifies) first, then partial prefills, in arrival order. While
  // anyone else runs or waits, a long prefill takes at most long_prefill_threshold() tokens, so
  // decodes and new arrivals get into every step; at most max_num_partial_prefills long ones go.
  const bool contended = running_.size() + waiting_.size() > 1;
  const int64_t threshold = long_prefill_threshold();
  int long_prefills = 0;
  order_.assign(running_.begin(), running_.end());  // reserved at start-up: no allocation
  const std::vector<Seq*>& order = order_;
  for (int pass = 0; pass < 2; ++pass) {
    for (Seq* s : order) {
      if (budget <= 0) break;
      if (!s->running || s->scheduled > 0) continue;
      bool decode = s->num_computed + 1 == static_cast<int64_t>(s->tokens.size());
      if ((pass == 0) != decode) continue;
      int64_t n, rows;
      if (decode) {
        if (sample_budget_ < 1) continue;
        s->num_verify = static_cast<int>(std::min<int64_t>({s->num_verify, budget - 1, sample_budget_ - 1}));
        n = rows = 1 + s->num_verify;
      } else {
        s->num_verify = 0;
        const bool is_long = static_cast<int64_t>(s->tokens.size()) - s->num_computed > threshold;
        if (is_long && long_prefills >= config_.max_num_partial_prefills) continue;
        n = fit_sample_rows(*s, prefill_chunk(*s, contended && is_long ? std::min(budget, threshold) : budget));
        if (n <= 0) continue;
        rows = chunk_sample_rows(*s, n);
        if (is_long) ++long_prefills;
      }
      bool fits = true;
      while (!ensure_blocks(*s, s->num_computed + n)) {
        Seq* victim = nullptr;
        for (auto it = running_.rbegin(); it != running_.rend(); ++it)
          if (*it != s && (*it)->scheduled == 0) {
            victim = *it;
            break;
          }
        if (!victim) {
          fits = false;
          break;
        }
        preempt(*victim);
      }
      if (!fits) {
        preempt(*s);
        continue;
      }
      s->scheduled = n;
      budget -= n;
      sample_budget_ -= rows;
      scheduled_.push_back(s);
    }
  }
  // New (and preempted) requests, first come first served, except that a long prompt over the
  // partial-prefill limit lets the ones behind it go ahead. No KV room stops admission.
  for (size_t i = 0; i < waiting_.size() && budget > 0 && !free_slots_.empty();) {
    Admit a = try_admit(*waiting_[i], budget, contended, long_prefills);
    if (a == Admit::kNoRoom) break;
    if (a == Admit::kSkipped) ++i;  // (admitted ones leave waiting_: i is already the next)
  }

  if (!scheduled_.empty()) {
    // ---- build the batch ----
    step_tokens_.clear();
    batch_.clear();
    for (Seq* s : scheduled_) {
      int64_t real = s->scheduled - s->num_verify;
      step_tokens_.insert(step_tokens_.end(), s->tokens.begin() + s->num_computed,
                          s->tokens.begin() + s->num_computed + real);
      step_tokens_.insert(step_tokens_.end(), s->draft.tokens.begin(), s->draft.tokens.begin() + s->num_verify);
    }
    size_t off = 0;
    samples_.clear();
    for (Seq* s : scheduled_) {
      RunnerSeq r;
      r.slot = s->slot;
      r.start_pos = s->num_computed;
      r.tokens = std::span<const int32_t>(step_tokens_.data() + off, static_cast<size_t>(s->scheduled));
      r.block_table = s->block_table;
      r.collect_taps = spec_enabled();
      r.reset = s->fresh;
      r.restore = s->restore;
      s->fresh = false;
      s->restore = -1;
      s->sample_begin = -1;
      s->score_rows = 0;
      if (s->scoring()) {
        // Every row samples: the row of prompt token p scores token p + 1; the prompt's last row
        // draws the first output token (or, with max_tokens 0, is a placeholder score row).
        r.sample_rows = static_cast<int>(s->scheduled);
        r.sample_begin = s->sample_begin = static_cast<int>(samples_.rows.size());
        for (int64_t p = s->num_computed; p < s->num_computed + s->scheduled; ++p) {
          if (p + 1 < s->prompt_len) {
            SampleRowsBuilder::append_score(s->tokens[p + 1], s->sp.prompt_logprobs, p + 1, samples_);
            ++s->score_rows;
          } else if (s->sp.max_tokens == 0) {
            SampleRowsBuilder::append_score(s->tokens[p], 0, p, samples_);
          } else {
            rows_builder_.append(s->sp, s->pen, s->constraint.get(), s->seed, static_cast<int64_t>(s->tokens.size()),
                                 {}, false, samples_);
          }
        }
      } else if (s->num_computed + s->scheduled - s->num_verify == static_cast<int64_t>(s->tokens.size())) {  // not a chunk
        r.sample_rows = 1 + s->num_verify;
        r.sample_begin = s->sample_begin = static_cast<int>(samples_.rows.size());
        rows_builder_.append(s->sp, s->pen, s->constraint.get(), s->seed, static_cast<int64_t>(s->tokens.size()),
                             std::span<const int32_t>(s->draft.tokens.data(), static_cast<size_t>(s->num_verify)),
                             s->draft.sampled, samples_);
      }
      batch_.push_back(r);
      off += static_cast<size_t>(s->scheduled);
    }
    auto t0 = Clock::now();
    m_.engine_schedule_s += seconds_between(t_step, t0);
    ++m_.engine_steps_total;
    Status st = runner_->forward(batch_, &samples_, out_);
    double dt = seconds_since(t0);
    m_.engine_forward_s += dt;
    if (!st.ok()) {
      TLOG_ERROR("engine", "forward failed: {}", st.to_string());
      std::vector<Seq*> failed = scheduled_;
      for (Seq* s : failed) finish(*s, FinishReason::kError, "model forward failed: " + st.message(), nullptr);
      return st;
    }
    if (planner_) planner_->observe_forward(static_cast<int>(scheduled_.size()), static_cast<int64_t>(off), dt);

    // ---- sample / verify, then what each sequence keeps, in one call ----
    draft_reqs_.clear();
    draft_seqs_.clear();
    commits_.clear();
    done_.assign(scheduled_.begin(), scheduled_.end());  // process_output may finish (and free) requests
    const auto t_out = Clock::now();
    for (size_t i = 0; i < done_.size(); ++i) process_output(*done_[i], out_, i, draft_reqs_);
    const auto t_commit = Clock::now();
    m_.engine_outputs_s += seconds_between(t_out, t_commit);
    Status cs = runner_->commit(commits_);
    const auto t_draft = Clock::now();
    m_.engine_commit_s += seconds_between(t_commit, t_draft);
    if (!cs.ok()) {
      TLOG_ERROR("engine", "commit failed: {}", cs.to_string());
      std::vector<Seq*> failed = running_;
      for (Seq* s : failed) finish(*s, FinishReason::kError, "model commit failed: " + cs.message(), nullptr);
      return cs;
    }

    // ---- draft the next step's proposals ----
    if (!draft_reqs_.empty()) {
      // Which requests draft for the next step (auto: only where it is expected to pay).
      draft_states_.clear();
      draft_limits_.clear();
      for (Seq* d : draft_seqs_) {
        draft_states_.push_back(&d->spec);
        draft_limits_.push_back(verify_limit(*d));
      }
      planner_->choose_drafts(draft_states_, draft_limits_, pending_prefill_tokens(), draft_pick_);
      size_t kept = 0;
      for (size_t i = 0; i < draft_seqs_.size(); ++i) {
        if (!draft_pick_[i]) continue;
        draft_seqs_[kept] = draft_seqs_[i];
        draft_reqs_[kept] = draft_reqs_[i];
        ++kept;
      }
      draft_seqs_.resize(kept);
      draft_reqs_.resize(kept);
      if (!draft_reqs_.empty()) {
        auto t1 = Clock::now();
        Status ds = runner_->draft_propose(draft_reqs_, proposals_);
        planner_->observe_draft(static_cast<int>(draft_reqs_.size()), seconds_since(t1));
        if (!ds.ok()) {
          TLOG_WARN("engine", "draft failed ({}); continuing without drafts this step", ds.to_string());
        } else {
          for (size_t i = 0; i < draft_seqs_.size(); ++i) {
            std::swap(draft_seqs_[i]->draft, proposals_[i]);
            draft_seqs_[i]->has_draft = true;
          }
        }
      }
    }
    m_.engine_draft_s += seconds_since(t_draft);
  }

  m_.num_requests_running = static_cast<int64_t>(running_.size());
  m_.num_requests_waiting = static_cast<int64_t>(waiting_.size());
  if (options_.check_integrity_each_step) {
    Status st = check_integrity();
    if (!st.ok()) {
      TLOG_ERROR("engine", "integrity check failed after step {}: {}", steps_, st.message());
      return st;
    }
  }
  return Status();
}

// ================================ outputs ================================

void EngineCore::process_output(Seq& s, const RunnerOutput& out, size_t index, std::vector<DraftQuery>& drafts) {
  const int64_t n = s.scheduled;
  const int ell = s.num_verify;
  const int64_t real = n - ell;
  const int64_t old = s.num_computed;
  s.num_computed = old + n;
  const bool taps = spec_enabled();

  if (s.prompt_len >= kLongPrefillTokens && old < s.prompt_len) log_long_prefill(s, old);
  if (s.scoring() && s.sample_begin >= 0) {
    const SampleRowResult* res = out.samples.data() + s.sample_begin;
    for (int i = 0; i < s.score_rows; ++i) {
      TokenLogprob& lp = s.prompt_lp.emplace_back();
      lp.token = res[i].token;
      lp.logprob = res[i].token_logprob;
      lp.rank = res[i].token_rank;
      for (int k = 0; k < res[i].num_top; ++k) lp.top.emplace_back(res[i].top_ids[k], res[i].top_logprobs[k]);
    }
    if (s.num_computed < s.prompt_len) {  // more of the prompt to come
      commits_.push_back({s.slot, static_cast<int>(index), s.num_computed, taps ? n : 0, cache_blocks(s)});
      return;
    }
    s.prompt_scored = true;
    if (s.sp.max_tokens == 0) {  // the prompt scored, nothing to generate
      RequestEvent ev;
      ev.prompt_logprobs = std::move(s.prompt_lp);
      commits_.push_back({s.slot, static_cast<int>(index), s.num_computed, 0, -1});
      finish(s, FinishReason::kLength, "", &ev);
      return;
    }
    s.sample_begin += s.score_rows;  // the first output token's row
  }
  if (s.sample_begin < 0) {  // prefill chunk, nothing to sample
    commits_.push_back({s.slot, static_cast<int>(index), s.num_computed, taps ? n : 0, cache_blocks(s)});
    return;
  }

  // The runner's sampler decided every row: row j < ell accepts draft j or replaces it (and the
  // rest is dropped); the row after the last accepted draft gives one more token.
  const SampleRowResult* res = out.samples.data() + s.sample_begin;
  RequestEvent ev;
  ev.request_id = s.id;
  if (s.prompt_scored && !s.got_first) ev.prompt_logprobs = std::move(s.prompt_lp);
  FinishReason fin = FinishReason::kNone;
  int accepted = 0;
  for (int j = 0; j <= ell && fin == FinishReason::kNone; ++j) {
    const SampleRowResult& r = res[j];
    const int32_t tok = r.token;
    const bool took_draft = j < ell && r.accepted;
    if (took_draft) ++accepted;
    // Commit the token.
    s.tokens.push_back(tok);
    ++s.usage.completion_tokens;
    ++m_.generation_tokens_total;
    s.pen.add_output(tok);
    if (s.constraint) s.constraint->accept_token(tok);
    bool stop_token = (!s.sp.ignore_eos && tok == info_.eos_token_id) ||
                      std::find(s.sp.stop_token_ids.begin(), s.sp.stop_token_ids.end(), tok) != s.sp.stop_token_ids.end();
    if (stop_token) {
      fin = FinishReason::kStop;
    } else {
      ev.tokens.push_back(tok);
      if (s.sp.logprobs >= 0) {
        TokenLogprob& lp = ev.logprobs.emplace_back();
        lp.token = tok;
        lp.logprob = r.token_logprob;
        for (int k = 0; k < r.num_top; ++k) lp.top.emplace_back(r.top_ids[k], r.top_logprobs[k]);
      }
      if (s.text->push(tok, ev.text)) fin = FinishReason::kStop;
      else if (s.output_len() >= s.sp.max_tokens) fin = FinishReason::kLength;
      else if (static_cast<int64_t>(s.tokens.size()) >= info_.max_model_len) fin = FinishReason::kLength;
    }
    if (!took_draft) break;
  }

  // The target cache keeps the real tokens and the accepted drafts (the commit rolls back the rest).
  const int64_t keep = old + real + accepted;
  s.num_computed = keep;
  if (ell > 0) {
    ++m_.spec_decode_num_drafts_total;
    m_.spec_decode_num_draft_tokens_total += ell;
    m_.spec_decode_num_accepted_tokens_total += accepted;
    for (int k = 0; k < accepted; ++k) ++m_.spec_decode_num_accepted_tokens_per_pos_total[k];
    s.usage.draft_tokens += ell;
    s.usage.accepted_draft_tokens += accepted;
    planner_->observe_verify(&s.spec, ell, accepted, s.draft.confidence);
  }
  s.has_draft = false;
  s.num_verify = 0;

  if (fin != FinishReason::kNone) {
    commits_.push_back({s.slot, static_cast<int>(index), keep, 0, -1});
    finish(s, fin, "", &ev);
    return;
  }
  // Only rows whose target state is final (the real tokens and the accepted drafts) enter the draft.
  commits_.push_back({s.slot, static_cast<int>(index), keep, taps ? keep - old : 0, cache_blocks(s)});
  emit_and_maybe_finish(s, ev, FinishReason::kNone);
  if (spec_enabled()) {
    DraftQuery d;
    d.slot = s.slot;
    d.anchor_token = s.tokens.back();
    d.anchor_pos = s.num_computed;
    d.temperature = config_.speculative.draft_sample_method == DraftSampleMethod::kSample ? s.sp.temperature : 0.0;
    d.seed = s.seed;
    drafts.push_back(d);
    draft_seqs_.push_back(&s);
  }
}

int EngineCore::cache_blocks(Seq& s) {
  if (!kv_->prefix_caching()) return -1;
  const int bs = kv_->block_size();
  const int full = static_cast<int>(s.num_computed / bs);
  kv_->register_full_blocks(s.tokens, s.block_table, s.block_hashes, full);
  if (full > 0 && s.num_computed % bs == 0) {
    int owner = kv_->cached_block(s.block_hashes[full - 1]);
    if (owner >= 0 && !kv_->has_snapshot(owner) && kv_->num_snapshots() > 0) return kv_->take_snapshot(owner);
  }
  return -1;
}

void EngineCore::emit_and_maybe_finish(Seq& s, RequestEvent& ev, FinishReason finish_reason) {
  auto now = Clock::now();
  if (!s.got_first && !ev.tokens.empty()) {
    s.got_first = true;
    ev.ttft_s = std::chrono::duration<double>(now - s.arrival).count();
    push_sample(m_.ttft_s, ev.ttft_s);
  } else if (!ev.tokens.empty()) {
    push_sample(m_.itl_s, std::chrono::duration<double>(now - s.last_event).count());
  }
  s.last_event = now;
  if (ev.tokens.empty() && ev.text.empty() && ev.prompt_logprobs.empty() && finish_reason == FinishReason::kNone) return;
  if (s.cb) s.cb(ev);
}

void EngineCore::finish(Seq& s, FinishReason reason, const std::string& error, RequestEvent* ev_in) {
  RequestEvent local;
  RequestEvent& ev = ev_in ? *ev_in : local;
  ev.request_id = s.id;
  if (reason != FinishReason::kError) s.text->finish(ev.text);
  ev.finish = reason;
  ev.error = error;
  ev.usage = s.usage;
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) ++m_.request_success_total;
  push_sample(m_.e2e_s, seconds_since(s.arrival));
  release(s);
  remove_from_queues(&s);
  std::unique_ptr<Seq> keep = std::move(seqs_[s.id]);
  seqs_.erase(s.id);
  m_.num_requests_running = static_cast<int64_t>(running_.size());
  m_.num_requests_waiting = static_cast<int64_t>(waiting_.size());
  emit_and_maybe_finish(*keep, ev, reason);
}

// ================================ integrity / metrics ================================

Status EngineCore::check_integrity() {
  std::fill(expected_refs_.begin(), expected_refs_.end(), 0);
  std::vector<bool> slot_used(config_.max_num_seqs, false);
  for (const auto& [id, s] : seqs_) {
    for (int32_t b : s->block_table) {
      if (b < 0 || b >= kv_->num_blocks())
        return make_error(StatusCode::kInternal, "request {} holds block id {} out of range", id, b);
      ++expected_refs_[b];
    }
    if (s->running) {
      if (s->slot < 0 || s->slot >= config_.max_num_seqs || slot_used[s->slot])
        return make_error(StatusCode::kInternal, "request {} has bad or shared slot {}", id, s->slot);
      slot_used[s->slot] = true;
      int64_t need = (s->num_computed + kv_->block_size() - 1) / kv_->block_size();
      if (static_cast<int64_t>(s->block_table.size()) < need)
        return make_error(StatusCode::kInternal, "request {} has {} computed tokens but {} blocks", id,
                          s->num_computed, s->block_table.size());
    } else if (!s->block_table.empty() || s->slot >= 0 || s->num_computed != 0) {
      return make_error(StatusCode::kInternal, "waiting request {} holds blocks or a slot", id);
    }
  }
  if (running_.size() + free_slots_.size() != static_cast<size_t>(config_.max_num_seqs))
    return make_error(StatusCode::kInternal, "{} running + {} free slots != {}", running_.size(), free_slots_.size(),
                      config_.max_num_seqs);
  if (running_.size() + waiting_.size() != seqs_.size())
    return make_error(StatusCode::kInternal, "{} running + {} waiting != {} requests", running_.size(),
                      waiting_.size(), seqs_.size());
  int64_t leaked = 0;
  Status st = kv_->check(expected_refs_, &leaked);
  m_.kv_blocks_leaked = leaked;
  return st;
}

// Long prefills are the one place a request is silent for minutes (1M tokens), so their progress
// goes to the log (at most every kProgressEvery seconds) and to /metrics.
void EngineCore::log_long_prefill(Seq& s, int64_t old) {
  constexpr double kProgressEvery = 5.0;
  const auto now = Clock::now();
  if (old == 0 || s.prefill_start == Clock::time_point()) {
    s.prefill_start = s.prefill_logged = now;
    TLOG_INFO("engine", "request {}: long prefill of {} prompt tokens started", s.id, s.prompt_len);
  }
  const int64_t done = std::min(s.num_computed, s.prompt_len);
  const double el = std::chrono::duration<double>(now - s.prefill_start).count();
  if (done >= s.prompt_len) {
    TLOG_INFO("engine", "request {}: prefill of {} tokens done in {:.1f} s ({:.0f} tok/s)", s.id, s.prompt_len, el,
              el > 0 ? s.prompt_len / el : 0.0);
  } else if (std::chrono::duration<double>(now - s.prefill_logged).count() >= kProgressEvery) {
    s.prefill_logged = now;
    TLOG_INFO("engine", "request {}: prefill {}/{} tokens ({:.1f}%), {:.1f} s, {:.0f} tok/s", s.id, done,
              s.prompt_len, 100.0 * done / s.prompt_len, el, el > 0 ? done / el : 0.0);
  }
}

EngineMetrics EngineCore::metrics(bool drain_latencies) {
  m_.prefill_tokens_pending = 0;
  m_.long_prefill_done_tokens = 0;
  m_.long_prefill_prompt_tokens = 0;
  for (const Seq* s : running_) {  // arrival order: the first long one is the oldest
    if (s->num_computed >= s->prompt_len) continue;
    m_.prefill_tokens_pending += s->prompt_len - s->num_computed;
    if (s->prompt_len >= kLongPrefillTokens && m_.long_prefill_prompt_tokens == 0) {
      m_.long_prefill_done_tokens = s->num_computed;
      m_.long_prefill_prompt_tokens = s->prompt_len;
    }
  }
  for (const Seq* s : waiting_) m_.prefill_tokens_pending += s->prompt_len;
  m_.device_allocations_after_start = runner_->device_allocations_after_start();
  m_.device_wait_s = runner_->device_wait_seconds();
  m_.device_submit_s = runner_->device_submit_seconds();
  const int64_t graphs = runner_->device_graph_instantiations();
  // metrics() runs on the engine thread after every step, between two steps, where the device waits
  // for the host: the free memory (cudaMemGetInfo, a driver call) is read at most every
  // kDeviceMemoryPollS while work is left, and always once the engine has none, so an idle engine's
  // metrics (and every test's, taken after its requests) are current.
  const Clock::time_point now = Clock::now();
  if (!has_work() || free_read_ == Clock::time_point{} || seconds_between(free_read_, now) >= kDeviceMemoryPollS) {
    free_now_ = runner_->device_free_bytes();
    free_read_ = now;
  }
  m_.device_graphs_after_start = graphs >= 0 && graphs_at_start_ >= 0 ? graphs - graphs_at_start_ : -1;
  m_.device_bytes_taken_after_start = free_now_ >= 0 && free_at_start_ >= 0 ? free_at_start_ - free_now_ : 0;
  m_.num_requests_running = static_cast<int64_t>(running_.size());
  m_.num_requests_waiting = static_cast<int64_t>(waiting_.size());
  m_.kv_blocks_total = kv_->num_blocks();
  m_.kv_blocks_free = kv_->num_free();
  m_.kv_cache_usage_perc = 1.0 - static_cast<double>(kv_->num_free()) / kv_->num_blocks();
  EngineMetrics snap = m_;
  if (drain_latencies) {
    m_.ttft_s.clear();
    m_.itl_s.clear();
    m_.e2e_s.clear();
  }
  return snap;
}

std::vector<int32_t> EngineCore::block_table(const std::string& request_id) const {
  auto it = seqs_.find(request_id);
  return it == seqs_.end() ? std::vector<int32_t>{} : it->second->block_table;
}

int64_t EngineCore::num_computed(const std::string& request_id) const {
  auto it = seqs_.find(request_id);
  return it == seqs_.end() ? -1 : it->second->num_computed;
}

}  // namespace tandem
