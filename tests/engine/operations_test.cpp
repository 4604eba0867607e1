// Production operations in the engine: the start-up memory plan and its headroom floor, the
// watchdog over a stalled runner (requests fail, nothing hangs), long-prefill progress metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "engine/engine_core.h"
#include "engine/fake_model.h"
#include "harness.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST(MemoryPlan, ReadsMemAvailable) {
  namespace fs = std::filesystem;
  const std::string p = (fs::temp_directory_path() / ("tandem-meminfo-" + std::to_string(getpid()))).string();
  std::ofstream(p) << "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12345678 kB\n";
  auto a = read_host_mem_available(p);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a, int64_t{12345678} * 1024);
  std::ofstream(p) << "MemTotal: 1 kB\n";
  EXPECT_FALSE(read_host_mem_available(p).ok());
  fs::remove(p);
  EXPECT_FALSE(read_host_mem_available(p).ok());
  EXPECT_TRUE(read_host_mem_available().ok());  // this Linux host
}

TEST(MemoryPlan, HeadroomCheckGivesTheNumbers) {
  MemoryPlan plan;
  plan.add(kPoolWeights, "cuda:0", int64_t{80} << 30);
  plan.add(kPoolKv, "cuda:0", int64_t{40} << 30);
  plan.add(kPoolWeights, "host", int64_t{100} << 30, "mmap", /*already_counted=*/true);
  plan.add(kPoolActivations, "host", int64_t{2} << 30);
  plan.domains.push_back({"cuda:0", int64_t{130} << 30, int64_t{141} << 30, "runner"});
  plan.domains.push_back({"host", int64_t{10} << 30, -1, "MemAvailable"});
  plan.headroom_floor_bytes = int64_t{8} << 30;
  EXPECT_EQ(plan.planned_bytes("host"), int64_t{102} << 30);
  EXPECT_EQ(plan.to_allocate_bytes("host"), int64_t{2} << 30);
  EXPECT_TRUE(check_memory_headroom(plan).ok());  // 130-120 = 10 >= 8; 10-2 = 8 >= 8

  plan.headroom_floor_bytes = int64_t{11} << 30;
  Status st = check_memory_headroom(plan);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("cuda:0: 130.00 GiB available"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("120.00 GiB to allocate = 10.00 GiB left, under the floor of 11.00 GiB"),
            std::string::npos) << st.message();
  EXPECT_NE(st.message().find("host: 10.00 GiB"), std::string::npos) << st.message();
  EXPECT_NE(format_memory_report(plan).find("kv_pool"), std::string::npos);
}

TEST(MemoryPlan, EngineReportsPoolsAndRefusesUnderTheFloor) {
  FakeModelConfig fc;
  EngineConfig ec;
  ec.max_num_seqs = 4;
  ec.block_size = 16;
  ec.kv_cache_memory = 1 << 20;
  CoreOptions co;
  co.log_startup = false;
  auto core = EngineCore::create(std::make_unique<FakeModelRunner>(fc), ec, co);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const MemoryPlan& plan = (*core)->model_info().memory;
  int64_t kv = -1;
  for (const auto& p : plan.pools)
    if (p.name == kPoolKv) kv = p.bytes;
  FakeModelRunner probe(fc);
  EXPECT_EQ(kv, int64_t{(*core)->num_kv_blocks()} * probe.kv_bytes_per_block(16, (*core)->kv_cache_dtype()));
  ASSERT_NE(plan.find_domain("host"), nullptr);
  EXPECT_GT(plan.find_domain("host")->available_bytes, 0);
  ASSERT_EQ((*core)->model_info().ranks.size(), 1u);
  EXPECT_EQ((*core)->model_info().ranks[0].kernels.size(), audit_op_classes().size());

  ec.memory_headroom_floor = int64_t{1} << 50;  // a petabyte: no host has it
  auto refused = EngineCore::create(std::make_unique<FakeModelRunner>(fc), ec, co);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("under the floor of"), std::string::npos) << refused.status().message();
}

// The hook a device runner fills: its allocation count after start-up reaches the metrics.
class CountingRunner : public FakeModelRunner {
 public:
  explicit CountingRunner(FakeModelConfig c) : FakeModelRunner(c) {}
  int64_t device_allocations_after_start() const override { return allocations; }
  int64_t allocations = 0;
};

TEST(MemoryPlan, DeviceAllocationCounterReachesTheMetrics) {
  FakeModelConfig fc;
  EngineConfig ec;
  ec.block_size = 16;
  ec.kv_cache_memory = 1 << 20;
  CoreOptions co;
  co.log_startup = false;
  auto plain = EngineCore::create(std::make_unique<FakeModelRunner>(fc), ec, co);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->metrics(false).device_allocations_after_start, -1);  // not counted on the CPU
  auto runner = std::make_unique<CountingRunner>(fc);
  CountingRunner* r = runner.get();
  auto core = EngineCore::create(std::move(runner), ec, co);
  ASSERT_TRUE(core.ok());
  EXPECT_EQ((*core)->metrics(false).device_allocations_after_start, 0);
  r->allocations = 3;
  EXPECT_EQ((*core)->metrics(false).device_allocations_after_start, 3);
}

// The device's free memory (cudaMemGetInfo on the GPU: a driver call of 8-30 us measured, on the path
// between two steps) is read at most every 100 ms while the engine has work, and on every call once it
// has none: the counter moves under load only at the poll, and an idle engine's metrics are current.
class FreeMemoryRunner : public FakeModelRunner {
 public:
  explicit FreeMemoryRunner(FakeModelConfig c) : FakeModelRunner(c) {}
  int64_t device_free_bytes() const override {
    ++reads;
    return free;
  }
  mutable int reads = 0;
  int64_t free = int64_t{1} << 30;
};

TEST(MemoryPlan, DeviceFreeMemoryIsPolledUnderLoadAndReadWhenIdle) {
  FakeModelConfig fc;
  fc.has_draft = false;
  EngineConfig ec;
  ec.block_size = 16;
  ec.kv_cache_memory = 1 << 20;
  CoreOptions co;
  co.log_startup = false;
  auto runner = std::make_unique<FreeMemoryRunner>(fc);
  FreeMemoryRunner* r = runner.get();
  auto created = EngineCore::create(std::move(runner), ec, co);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  EngineCore& core = **created;
  const int64_t start = r->free;
  int reads = r->reads;  // start-up's
  // Idle: every call reads, so a change shows at once.
  r->free = start - 4096;
  EXPECT_EQ(core.metrics(false).device_bytes_taken_after_start, 4096);
  EXPECT_EQ(core.metrics(false).device_bytes_taken_after_start, 4096);
  EXPECT_EQ(r->reads, reads + 2);
  reads = r->reads;
  const auto t_read = std::chrono::steady_clock::now();
  // Under load: the first call after the idle reads reads again only once 100 ms have passed.
  Request q;
  q.request_id = "a";
  q.prompt_tokens = testing::make_prompt(20, 7, fc.vocab_size);
  q.sampling = testing::greedy_params(400);
  bool finished = false;
  ASSERT_TRUE(core.add_request(std::move(q), [&](const RequestEvent& ev) {
                    if (ev.finish != FinishReason::kNone) finished = true;
                  }).ok());
  ASSERT_TRUE(core.has_work());
  r->free = start - 8192;
  const int64_t taken = core.metrics(false).device_bytes_taken_after_start;
  if (std::chrono::steady_clock::now() - t_read < 90ms) {  // (a host that stalled this thread for 90 ms: no check)
    EXPECT_EQ(taken, 4096) << "read again within 100 ms under load";
    EXPECT_EQ(r->reads, reads);
  }
  reads = r->reads;
  std::this_thread::sleep_for(120ms);
  EXPECT_EQ(core.metrics(false).device_bytes_taken_after_start, 8192) << "not read again after 100 ms under load";
  EXPECT_EQ(r->reads, reads + 1);
  // Steps with metrics after each (the engine loop's order): at most one read per 100 ms of them.
  const auto t0 = std::chrono::steady_clock::now();
  int steps = 0;
  while (core.has_work() && steps < 400) {
    ASSERT_TRUE(core.step().ok());
    ++steps;
    core.metrics(true);
  }
  ASSERT_TRUE(finished);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[engine] %d steps in %.3f s: %d free-memory reads (the last with no work left)\n", steps, s,
              r->reads - reads - 1);
  EXPECT_LE(r->reads - reads - 1, static_cast<int>(s / 0.1) + 2);
  EXPECT_GT(steps, 10);
  // Done: the read of the call that found no work left is current.
  r->free = start;
  EXPECT_EQ(core.metrics(false).device_bytes_taken_after_start, 0);
}

// A fake runner whose forward blocks while `stall` is set, until released.
class StallingRunner : public FakeModelRunner {
 public:
  explicit StallingRunner(FakeModelConfig c) : FakeModelRunner(c) {}
  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    {
      std::unique_lock<std::mutex> lk(mu);
      if (stall) {
        entered = true;
        cv.wait(lk, [&] { return !stall; });
      }
    }
    return FakeModelRunner::forward(batch, samples, out);
  }
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    stall = false;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool stall = false;
  bool entered = false;
};

TEST(Watchdog, StalledStepFailsItsRequestsAndNothingHangs) {
  FakeModelConfig fc;
  fc.has_draft = false;
  auto runner = std::make_unique<StallingRunner>(fc);
  StallingRunner* r = runner.get();
  EngineConfig ec;
  ec.max_num_seqs = 2;
  ec.block_size = 16;
  ec.kv_cache_memory = 1 << 20;
  ec.engine_iteration_timeout_s = 0.3;
  auto engine = create_engine_with_runner(std::move(runner), ec);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();

  // A healthy request first: the watchdog leaves normal steps alone.
  auto run = [&](const std::string& id) {
    auto done = std::make_shared<std::promise<RequestEvent>>();
    Request req;
    req.request_id = id;
    req.prompt_tokens = {5, 6, 7};
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 4;
    req.sampling.ignore_eos = true;
    Status st = (*engine)->submit(std::move(req), [done](const RequestEvent& ev) {
      if (ev.finish != FinishReason::kNone) done->set_value(ev);
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
    return done->get_future();
  };
  auto ok = run("healthy");
  ASSERT_EQ(ok.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ok.get().finish, FinishReason::kLength);
  EXPECT_TRUE((*engine)->healthy());

  {
    std::lock_guard<std::mutex> lk(r->mu);
    r->stall = true;
  }
  auto a = run("a"), b = run("b");
  for (auto* f : {&a, &b}) {
    ASSERT_EQ(f->wait_for(10s), std::future_status::ready) << "the watchdog did not fail a stalled request";
    RequestEvent ev = f->get();
    EXPECT_EQ(ev.finish, FinishReason::kError);
    EXPECT_NE(ev.error.find("no progress"), std::string::npos) << ev.error;
  }
  EXPECT_FALSE((*engine)->healthy());
  EXPECT_EQ((*engine)->metrics().watchdog_stalls_total, 1);
  Request late;
  late.request_id = "late";
  late.prompt_tokens = {5};
  Status st = (*engine)->submit(std::move(late), [](const RequestEvent&) {});
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);

  // Shutting down while the step is still stuck returns (the stuck thread is left behind) ...
  auto t0 = std::chrono::steady_clock::now();
  (*engine)->shutdown(0.1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // ... and when the step finally returns, nothing is delivered twice or touches freed memory.
  engine->reset();
  r->release();
  std::this_thread::sleep_for(100ms);
}

TEST(LongPrefill, ProgressIsInTheMetrics) {
  FakeModelConfig fc;
  fc.has_draft = false;
  fc.max_model_len = 40000;
  EngineConfig ec;
  ec.max_num_seqs = 2;
  ec.block_size = 256;
  ec.max_num_batched_tokens = 1024;
  ec.kv_cache_memory = 64 << 20;
  ec.enable_prefix_caching = false;
  testing::Harness h(fc, ec);
  ASSERT_NE(h.core, nullptr);
  std::vector<int32_t> prompt(kLongPrefillTokens + 1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(2 + i % 50);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 2;
  sp.ignore_eos = true;
  ASSERT_TRUE(h.submit("long", prompt, sp).ok());
  ASSERT_TRUE(h.core->step().ok());
  ASSERT_TRUE(h.core->step().ok());
  EngineMetrics m = h.core->metrics(false);
  EXPECT_EQ(m.long_prefill_prompt_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(m.long_prefill_done_tokens, 2048);
  EXPECT_EQ(m.prefill_tokens_pending, static_cast<int64_t>(prompt.size()) - 2048);
  EXPECT_EQ(h.core->num_computed("long"), 2048);
  h.run();
  m = h.core->metrics(false);
  EXPECT_EQ(m.long_prefill_prompt_tokens, 0);
  EXPECT_EQ(m.prefill_tokens_pending, 0);
  EXPECT_EQ(h.results["long"].tokens.size(), 2u);
}

}  // namespace
}  // namespace tandem
