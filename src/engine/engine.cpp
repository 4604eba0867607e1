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
#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "engine/fake_model.h"

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

class EngineImpl : public Engine {
 public:
  explicit EngineImpl(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {
    metrics_ = core_->metrics(true);
    thread_ = std::thread([this] { loop(); });
  }
  ~EngineImpl() override { shutdown(0); }

  const ModelInfo& model_info() const override { return core_->model_info(); }
  const Tokenizer& tokenizer() const override { return core_->tokenizer(); }

  Status submit(Request request, EventCallback on_event) override {
    TANDEM_RETURN_IF_ERROR(core_->validate(request));  // immutable config only: safe off-thread
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || draining_) return Status(StatusCode::kUnavailable, "engine is shutting down");
    if (!live_ids_.insert(request.request_id).second)
      return invalid_argument("request id '{}' is already in flight", request.request_id);
    if (queued_ >= kMaxQueued) {
      live_ids_.erase(request.request_id);
      return make_error(StatusCode::kResourceExhausted, "{} requests are already queued", queued_);
    }
    ++queued_;
    inbox_.emplace_back(std::move(request), std::move(on_event));
    cv_.notify_one();
    return Status();
  }

  void cancel(const std::string& request_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_ids_.count(request_id)) return;
    cancels_.push_back(request_id);
    cv_.notify_one();
  }

  EngineMetrics metrics() override {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    EngineMetrics snap = metrics_;
    metrics_.ttft_s.clear();
    metrics_.itl_s.clear();
    metrics_.e2e_s.clear();
    return snap;
  }

  bool healthy() const override { return !failed_.load() && !stopped_.load(); }

  void shutdown(double deadline_s) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopped_.load() && !thread_.joinable()) return;
      draining_ = true;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
      idle_cv_.wait_until(lock, deadline, [&] { return live_ids_.empty(); });
      stopping_ = true;  // the loop cancels whatever is left
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    stopped_ = true;
  }

 private:
  static constexpr int kMaxQueued = 4096;
  static constexpr double kSummaryEvery = 10.0;

  void loop() {
    std::vector<std::pair<Request, EventCallback>> inbox;
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
      for (auto& [req, cb] : inbox) {
        std::string id = req.request_id;
        auto wrapped = [this, id, cb = std::move(cb)](const RequestEvent& ev) {
          if (cb) cb(ev);
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
        Status st = core_->step();
        if (!st.ok() && st.code() == StatusCode::kInternal && st.message().find("integrity") != std::string::npos) {
          failed_ = true;
        }
      }
      publish_metrics();
      maybe_log_summary();
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
      ids.assign(live_ids_.begin(), live_ids_.end());
    }
    for (const auto& id : ids) core_->abort(id);
  }

  void forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ids_.erase(id);
    if (live_ids_.empty()) idle_cv_.notify_all();
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
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<Request, EventCallback>> inbox_;
  std::vector<std::string> cancels_;
  std::set<std::string> live_ids_;
  int queued_ = 0;
  bool draining_ = false, stopping_ = false;
  std::atomic<bool> failed_{false}, stopped_{false};
  std::mutex metrics_mu_;
  EngineMetrics metrics_;
  std::chrono::steady_clock::time_point last_summary_ = std::chrono::steady_clock::now();
  int64_t last_gen_ = 0, last_drafted_ = 0, last_accepted_ = 0;
};

}  // namespace

Result<std::unique_ptr<Engine>> create_engine_with_runner(std::unique_ptr<ModelRunner> runner,
                                                          const EngineConfig& config) {
  TANDEM_ASSIGN_OR_RETURN(auto core, EngineCore::create(std::move(runner), config));
  return std::unique_ptr<Engine>(new EngineImpl(std::move(core)));
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  if (config.tensor_parallel_size != 1)
    return make_error(StatusCode::kUnimplemented,
                      "--tensor-parallel-size {}: this build runs the model in one process (use 1)",
                      config.tensor_parallel_size);
  if (config.device != "auto" && config.device != "cpu" && config.device != "cuda")
    return invalid_argument("--device '{}' is not auto, cpu or cuda", config.device);
  std::unique_ptr<ModelRunner> runner;
  if (config.model_dir.empty() || config.model_dir.rfind("fake:", 0) == 0) {
    // No checkpoint: the deterministic toy model (tests, server development).
    FakeModelConfig fc;
    runner = std::make_unique<FakeModelRunner>(fc);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(config.model_dir, ec))
      return not_found("--model {}: no such directory{}", config.model_dir,
                       std::filesystem::exists(config.model_dir, ec) ? " (it is a file)" : "");
    if (config.device == "cuda")
      return make_error(StatusCode::kUnimplemented, "--device cuda: the CUDA runner is not built yet; use cpu");
    TANDEM_ASSIGN_OR_RETURN(runner, create_dsv4_runner(config));
  }
  return create_engine_with_runner(std::move(runner), config);
}

}  // namespace tandem
