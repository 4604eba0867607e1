// Engine: the public API (engine.h) around EngineCore. One step-loop thread owns the core; submit
// and cancel post to an inbox it drains between steps, so a cancel takes effect before the next
// step and its final event comes from the loop thread like every other event.
#include "engine/engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/log.h"
#include "engine/parallel/tp_runner.h"
#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "engine/fake_model.h"
#include "io/catalog.h"
#include "io/official_configs.h"
#include "model/shard_plan.h"

namespace tandem {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kTimeout: return "timeout";
  }
  return "error";
}

namespace {

// EngineLoop owns the core and the step-loop thread; EngineImpl (the Engine handed out) holds it
// through a shared_ptr that the loop thread shares. Why: after a watchdog stall the step thread
// may be stuck inside the runner for good; the handle is then destroyed without joining it, and
// the loop's state must outlive the handle for as long as that thread might still return.
class EngineLoop : public std::enable_shared_from_this<EngineLoop> {
 public:
  EngineLoop(std::unique_ptr<EngineCore> core, double iteration_timeout_s)
      : core_(std::move(core)), iteration_timeout_s_(iteration_timeout_s) {
    metrics_ = core_->metrics(true);
  }

  void start() {
    auto self = shared_from_this();
    thread_ = std::thread([self] { self->loop(); });
    if (iteration_timeout_s_ > 0) watchdog_ = std::thread([this] { watch(); });
  }

  const ModelInfo& model_info() const { return core_->model_info(); }
  const Tokenizer& tokenizer() const { return core_->tokenizer(); }

  Status submit(Request request, EventCallback on_event) {
    TANDEM_RETURN_IF_ERROR(core_->validate(request));  // immutable config only: safe off-thread
    std::lock_guard<std::mutex> lock(mu_);
    if (stalled_) return Status(StatusCode::kUnavailable, "engine stalled (watchdog); restart the server");
    if (stopping_ || draining_) return Status(StatusCode::kUnavailable, "engine is shutting down");
    if (live_.count(request.request_id))
      return invalid_argument("request id '{}' is already in flight", request.request_id);
    if (queued_ >= kMaxQueued) return make_error(StatusCode::kResourceExhausted, "{} requests are already queued", queued_);
    auto live = std::make_shared<Live>();
    live->cb = std::move(on_event);
    live_[request.request_id] = live;
    ++queued_;
    inbox_.emplace_back(std::move(request), live);
    cv_.notify_one();
    return Status();
  }

  void cancel(const std::string& request_id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.count(request_id)) return;
    cancels_.push_back(request_id);
    cv_.notify_one();
  }

  EngineMetrics metrics() {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    EngineMetrics snap = metrics_;
    snap.watchdog_stalls_total = stalls_.load();
    metrics_.ttft_s.clear();
    metrics_.itl_s.clear();
    metrics_.e2e_s.clear();
    return snap;
  }

  bool healthy() const { return !failed_.load() && !stopped_.load() && core_->runner_health().ok(); }
  std::string unhealthy_reason() const {
    Status st = core_->runner_health();
    if (!st.ok()) return st.message();
    if (failed_.load()) return "engine integrity check failed or a step stalled (watchdog)";
    return stopped_.load() ? "engine stopped" : "";
  }

  void shutdown(double deadline_s) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopped_.load() && !thread_.joinable()) return;
      draining_ = true;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
      idle_cv_.wait_until(lock, deadline, [&] { return live_.empty(); });
      stopping_ = true;  // the loop cancels whatever is left
      cv_.notify_all();
      watch_cv_.notify_all();
    }
    if (watchdog_.joinable()) watchdog_.join();
    if (thread_.joinable()) {
      // A stalled step may never return: leave its thread (it holds this object alive).
      if (stalled_) thread_.detach();
      else thread_.join();
    }
    stopped_ = true;
  }

 private:
  static constexpr int kMaxQueued = 4096;
  static constexpr double kSummaryEvery = 10.0;

  // One request's callback, guarded so that exactly one final event reaches it even when the
  // watchdog fails the request while the step thread still holds it.
  struct Live {
    std::mutex mu;
    EventCallback cb;
    bool done = false;
  };

  void loop() {
    std::vector<std::pair<Request, std::shared_ptr<Live>>> inbox;
    std::vector<std::string> cancels;
    for (;;) {
      bool stop;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || core_->has_work(); });
        stop = stopping_;
        inbox.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
        inbox_.clear();
        cancels.swap(cancels_);
      }
      for (auto& entry : inbox) {
        Request& req = entry.first;
        // A named copy: clang 14 (the fuzz build) cannot capture a structured binding.
        std::shared_ptr<Live> live = entry.second;
        std::string id = req.request_id;
        auto wrapped = [this, id, live](const RequestEvent& ev) {
          {
            std::lock_guard<std::mutex> lk(live->mu);
            if (live->done) return;
            if (ev.finish != FinishReason::kNone) live->done = true;
            if (live->cb) live->cb(ev);
          }
          if (ev.finish != FinishReason::kNone) forget(id);
        };
        Status st = core_->add_request(std::move(req), wrapped);
        if (!st.ok()) {
          RequestEvent ev;
          ev.request_id = id;
          ev.finish = FinishReason::kError;
          ev.error = st.message();
          wrapped(ev);
        }
        std::lock_guard<std::mutex> lock(mu_);
        --queued_;
      }
      inbox.clear();
      for (const auto& id : cancels) core_->abort(id);
      cancels.clear();
      if (stop) {
        cancel_all();
        publish_metrics();
        return;
      }
      if (core_->has_work()) {
        ++step_no_;
        step_started_ns_ = now_ns();
        Status st = core_->step();
        step_started_ns_ = 0;
        if (!st.ok() && st.code() == StatusCode::kInternal && st.message().find("integrity") != std::string::npos) {
          failed_ = true;
        }
        if (stalled_) {
          // The stalled step came back late: its requests were already failed; stop stepping.
          TLOG_WARN("engine", "the stalled step returned after the watchdog fired; the engine stays unhealthy");
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stopping_; });
          cancel_all();
          return;
        }
      }
      publish_metrics();
      maybe_log_summary();
    }
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The watchdog: one step running longer than the iteration timeout fails every request in
  // flight (they would otherwise hang their clients) and marks the engine unhealthy, so /health
  // turns 503 and `tandem serve` exits for its supervisor to restart it.
  void watch() {
    const auto period = std::chrono::duration<double>(std::min(0.25, iteration_timeout_s_ / 4));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, period);
      if (stopping_ || stalled_) continue;
      const int64_t started = step_started_ns_.load();
      if (started == 0) continue;
      const double stuck_s = (now_ns() - started) * 1e-9;
      if (stuck_s < iteration_timeout_s_) continue;
      stalled_ = true;
      failed_ = true;
      ++stalls_;
      std::vector<std::pair<std::string, std::shared_ptr<Live>>> victims(live_.begin(), live_.end());
      live_.clear();
      idle_cv_.notify_all();
      lock.unlock();
      TLOG_ERROR("engine", "watchdog: step {} made no progress for {:.1f} s (--engine-iteration-timeout {}); failing {} "
                 "request(s); the engine is now unhealthy", step_no_.load(), stuck_s, iteration_timeout_s_, victims.size());
      for (auto& [id, live] : victims) {
        std::lock_guard<std::mutex> lk(live->mu);
        if (live->done) continue;
        live->done = true;
        RequestEvent ev;
        ev.request_id = id;
        ev.finish = FinishReason::kError;
        ev.error = fmt::format("engine step made no progress for {:.1f} s (watchdog); request failed", stuck_s);
        if (live->cb) live->cb(ev);
      }
      lock.lock();
    }
  }

  // One info line every kSummaryEvery seconds while there is traffic.
  void maybe_log_summary() {
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - last_summary_).count();
    if (dt < kSummaryEvery) return;
    EngineMetrics m;
    {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      m.generation_tokens_total = metrics_.generation_tokens_total;
      m.num_requests_running = metrics_.num_requests_running;
      m.num_requests_waiting = metrics_.num_requests_waiting;
      m.kv_cache_usage_perc = metrics_.kv_cache_usage_perc;
      m.spec_decode_num_draft_tokens_total = metrics_.spec_decode_num_draft_tokens_total;
      m.spec_decode_num_accepted_tokens_total = metrics_.spec_decode_num_accepted_tokens_total;
      m.num_preemptions_total = metrics_.num_preemptions_total;
    }
    int64_t gen = m.generation_tokens_total - last_gen_;
    int64_t drafted = m.spec_decode_num_draft_tokens_total - last_drafted_;
    int64_t accepted = m.spec_decode_num_accepted_tokens_total - last_accepted_;
    if (gen > 0 || m.num_requests_running > 0 || m.num_requests_waiting > 0)
      TLOG_INFO("engine", "running {} waiting {} | {:.1f} gen tok/s | KV {:.1f}% | draft acceptance {} | preemptions {}",
                m.num_requests_running, m.num_requests_waiting, gen / dt, 100.0 * m.kv_cache_usage_perc,
                drafted > 0 ? fmt::format("{:.1f}%", 100.0 * accepted / drafted) : std::string("-"),
                m.num_preemptions_total);
    last_summary_ = now;
    last_gen_ = m.generation_tokens_total;
    last_drafted_ = m.spec_decode_num_draft_tokens_total;
    last_accepted_ = m.spec_decode_num_accepted_tokens_total;
  }

  void cancel_all() {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, live] : live_) ids.push_back(id);
    }
    for (const auto& id : ids) core_->abort(id);
  }

  void forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(id);
    if (live_.empty()) idle_cv_.notify_all();
  }

  void publish_metrics() {
    EngineMetrics m = core_->metrics(true);
    std::lock_guard<std::mutex> lock(metrics_mu_);
    auto append = [](std::vector<double>& to, const std::vector<double>& from) {
      if (to.size() < 100000) to.insert(to.end(), from.begin(), from.end());
    };
    std::vector<double> ttft = std::move(metrics_.ttft_s), itl = std::move(metrics_.itl_s),
                        e2e = std::move(metrics_.e2e_s);
    metrics_ = std::move(m);
    append(ttft, metrics_.ttft_s);
    append(itl, metrics_.itl_s);
    append(e2e, metrics_.e2e_s);
    metrics_.ttft_s = std::move(ttft);
    metrics_.itl_s = std::move(itl);
    metrics_.e2e_s = std::move(e2e);
  }

  std::unique_ptr<EngineCore> core_;
  const double iteration_timeout_s_;
  std::thread thread_, watchdog_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_, watch_cv_;  // watch_cv_: the watchdog's own (cv_ is notify_one)
  std::deque<std::pair<Request, std::shared_ptr<Live>>> inbox_;
  std::vector<std::string> cancels_;
  std::map<std::string, std::shared_ptr<Live>> live_;
  int queued_ = 0;
  bool draining_ = false, stopping_ = false;
  std::atomic<bool> failed_{false}, stopped_{false}, stalled_{false};
  std::atomic<int64_t> step_started_ns_{0}, stalls_{0}, step_no_{0};
  std::mutex metrics_mu_;
  EngineMetrics metrics_;
  std::chrono::steady_clock::time_point last_summary_ = std::chrono::steady_clock::now();
  int64_t last_gen_ = 0, last_drafted_ = 0, last_accepted_ = 0;
};

class EngineImpl : public Engine {
 public:
  explicit EngineImpl(std::shared_ptr<EngineLoop> loop) : loop_(std::move(loop)) { loop_->start(); }
  ~EngineImpl() override { loop_->shutdown(0); }
  const ModelInfo& model_info() const override { return loop_->model_info(); }
  const Tokenizer& tokenizer() const override { return loop_->tokenizer(); }
  Status submit(Request request, EventCallback on_event) override {
    return loop_->submit(std::move(request), std::move(on_event));
  }
  void cancel(const std::string& request_id) override { loop_->cancel(request_id); }
  EngineMetrics metrics() override { return loop_->metrics(); }
  bool healthy() const override { return loop_->healthy(); }
  std::string unhealthy_reason() const override { return loop_->unhealthy_reason(); }
  void shutdown(double deadline_s) override { loop_->shutdown(deadline_s); }

 private:
  std::shared_ptr<EngineLoop> loop_;
};

// --synthetic without a GPU: the weights are generated on the device only. Refuses at once with
// the bytes rank 0 would need on this host and what the host has (a full-size model never fits a
// small machine; no allocation is attempted).
Status refuse_synthetic_on_cpu(const EngineConfig& config) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig c, synthetic_config(config.synthetic));
  TANDEM_ASSIGN_OR_RETURN(Catalog cat, build_catalog(c));
  TANDEM_ASSIGN_OR_RETURN(model::ShardPlan plan,
                          model::plan_shard(c, cat, {0, config.tensor_parallel_size}, /*load_draft=*/true));
  const int64_t need = static_cast<int64_t>(plan.held_bytes);
  auto avail = read_host_mem_available();
  if (avail.ok() && need > *avail)
    return make_error(StatusCode::kResourceExhausted,
                      "--synthetic {}: rank 0 of {} needs {} of memory for its weights alone, the host has {} available "
                      "(MemAvailable); synthetic weights are generated on a GPU (--device cuda)",
                      config.synthetic, config.tensor_parallel_size, format_bytes(need), format_bytes(*avail));
  return make_error(StatusCode::kUnimplemented,
                    "--synthetic {}: synthetic weights are generated on a GPU only (--device cuda); rank 0 of {} would "
                    "hold {} of weights",
                    config.synthetic, config.tensor_parallel_size, format_bytes(need));
}

}  // namespace

Result<std::unique_ptr<Engine>> create_engine_with_runner(std::unique_ptr<ModelRunner> runner,
                                                          const EngineConfig& config) {
  TANDEM_ASSIGN_OR_RETURN(auto core, EngineCore::create(std::move(runner), config));
  if (config.engine_iteration_timeout_s < 0)
    return invalid_argument("--engine-iteration-timeout {} must be >= 0", config.engine_iteration_timeout_s);
  return std::unique_ptr<Engine>(
      new EngineImpl(std::make_shared<EngineLoop>(std::move(core), config.engine_iteration_timeout_s)));
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  if (config.device != "auto" && config.device != "cpu" && config.device != "cuda")
    return invalid_argument("--device '{}' is not auto, cpu or cuda", config.device);
  std::unique_ptr<ModelRunner> runner;
  if (config.model_dir.empty() || config.model_dir.rfind("fake:", 0) == 0) {
    // No checkpoint: the deterministic toy model (tests, server development).
    if (config.tensor_parallel_size != 1)
      return invalid_argument("--tensor-parallel-size {} needs a checkpoint (--model DIR)", config.tensor_parallel_size);
    FakeModelConfig fc;
    runner = std::make_unique<FakeModelRunner>(fc);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(config.model_dir, ec))
      return not_found("--model {}: no such directory{}", config.model_dir,
                       std::filesystem::exists(config.model_dir, ec) ? " (it is a file)" : "");
    // auto: the GPU when this build has the CUDA runner and a GPU is visible, else the CPU.
    const bool cuda = config.device == "cuda" || (config.device == "auto" && cuda_runner_available());
    if (!config.synthetic.empty() && !cuda) return refuse_synthetic_on_cpu(config);
    if (!config.synthetic.empty() && config.tensor_parallel_size > 1)
      return make_error(StatusCode::kUnimplemented,
                        "--synthetic {} with --tensor-parallel-size {}: the worker ranks cannot generate synthetic "
                        "weights yet (one rank of a group is measured with tandem bench-model --synthetic NAME "
                        "--tensor-parallel-size N --rank R)",
                        config.synthetic, config.tensor_parallel_size);
    if (config.tensor_parallel_size > 1) {
      TANDEM_ASSIGN_OR_RETURN(runner, create_tp_head_runner(config));  // on the CPU or the GPUs
    } else if (cuda) {
      TANDEM_ASSIGN_OR_RETURN(runner, create_cuda_runner(config));
    } else {
      TANDEM_ASSIGN_OR_RETURN(runner, create_dsv4_runner(config));
    }
  }
  return create_engine_with_runner(std::move(runner), config);
}

}  // namespace tandem
