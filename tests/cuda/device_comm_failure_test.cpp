// Failure of the device data plane (src/model/cuda/device_comm.h) with two rank processes: rank 1
// is killed, stopped, or stops calling collectives while rank 0 keeps calling them and waiting on
// its stream. Rank 0 must get its stream back and see the failure (naming the lost rank) within
// the bound of each case, never hang; later calls fail fast. On NCCL the release is ncclCommAbort
// from the watchdog; on peer-oneshot the kernel's abort flag (a lost peer) or its own timeout (a
// peer that never arrives).
#include <csignal>
#include <fstream>

#include "cuda/cuda_test_util.h"
#include "cuda/device_comm_test_util.h"

namespace tandem::devcomm_testing {
namespace {

constexpr size_t kCount = 8 * 4096;

// ---- a rank process ----

void rank_process_failure() {
  const RankEnv e = rank_env();
  ASSERT_EQ(e.scenario.rfind("fail-", 0), 0u) << e.scenario;
  auto control = connect_control(e);
  ASSERT_TRUE(control.ok()) << control.status().message();
  DeviceCommOptions o = rank_options(e);
  o.peer_timeout_s = std::atof(env_or("TANDEM_DEVCOMM_PEER_TIMEOUT", "10"));
  o.step_timeout_s = std::atof(env_or("TANDEM_DEVCOMM_STEP_TIMEOUT", "0"));
  auto comm = create_device_comm(o, control->get());
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  DeviceComm& dc = **comm;
  std::printf("[devcomm] rank %d: %s\n", e.rank, dc.path().c_str());
  cudaStream_t s;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  kernels::cuda::DeviceBuffer<float> buf(kCount);
  std::vector<float> x = kernels::cuda_testing::randn(kCount, 11 + e.rank, 1.0f, false);
  TANDEM_CUDA_CHECK(cudaMemcpy(buf.get(), x.data(), kCount * 4, cudaMemcpyHostToDevice));
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(dc.all_reduce_sum(buf.get(), kCount, CommDtype::kF32, s).ok());
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  ASSERT_EQ(dc.failure(), "");
  Status st = (*control)->barrier(std::chrono::seconds(60));
  ASSERT_TRUE(st.ok()) << st.message();
  std::ofstream out(e.out);
  out << "start_ms " << now_ms() << "\n";
  out.flush();
  std::fflush(stdout);
  if (e.rank == e.size - 1) {  // the victim
    // The moment it is lost, written (to the kernel: a kill cannot lose it) before the signal: no
    // failure the survivor sees can precede it. The parent's waitpid is no such bound: a killed
    // process closes its sockets (NCCL's peer sees that at once) well before it is reaped, after
    // the driver has torn down its GPU context.
    out << "lost_ms " << now_ms() << "\n";
    out.flush();
    if (e.scenario == "fail-kill") raise(SIGKILL);
    if (e.scenario == "fail-stop") raise(SIGSTOP);
    // fail-absent: alive (heartbeats go on) but never enters the next collective.
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::_Exit(0);
  }
  // The survivor: collectives until one fails or the communicator reports the failure.
  Status last;
  int calls = 0;
  const int64_t t0 = now_ms();
  while (now_ms() - t0 < 30000) {
    dc.step_begin();
    last = dc.all_reduce_sum(buf.get(), kCount, CommDtype::kF32, s);
    if (last.ok()) TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));  // must return: never a hang
    dc.step_end();
    ++calls;
    if (!last.ok() || !dc.failure().empty()) break;
  }
  const int64_t detected = now_ms();
  const std::string why = !dc.failure().empty() ? dc.failure() : last.message();
  std::printf("[devcomm] rank %d: failure seen after %d calls, %lld ms after the start: %s\n", e.rank, calls,
              static_cast<long long>(detected - t0), why.c_str());
  // Later calls fail fast with the reason.
  const int64_t t1 = now_ms();
  const Status again = dc.all_reduce_sum(buf.get(), kCount, CommDtype::kF32, s);
  out << "detected_ms " << detected << "\n";
  out << "again " << (again.code() == StatusCode::kUnavailable ? "unavailable" : "other") << " " << now_ms() - t1 << "\n";
  out << "failure " << why << "\n";
  out.close();
  std::fflush(stdout);
  // The peer is gone or stopped: leave without the collective teardown (bounded, but not this
  // test's subject), with gtest's verdict as the exit code.
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

[[maybe_unused]] const bool kFailureRegistered = register_rank_process_test("Failure", rank_process_failure);

// ---- the tests ----

struct Outcome {
  int64_t latency_ms = -1;  // survivor's detection minus the victim's loss (its own timestamp, or the start)
  std::string failure, again;
};

// Two ranks on `paths`; rank 1 is the victim of `scenario`. Waits for rank 0 (bounded), then
// removes rank 1 and reports.
Outcome run_failure(const std::string& scenario, const std::string& paths, std::map<std::string, std::string> env = {}) {
  Outcome oc;
  RankGroup g(2, "DeviceCommRankProcess.Failure", scenario, paths, env);
  RankProc& survivor = g.procs()[0];
  RankProc& victim = g.procs()[1];
  const auto t0 = std::chrono::steady_clock::now();
  while (!survivor.done && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 120) {
    g.poll();  // records the victim's death or stop as it happens
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool finished = survivor.done;
  g.kill_rank(1);
  g.wait(10);
  EXPECT_TRUE(finished) << "rank 0 did not come back within 120 s (a hang)" << g.logs();
  EXPECT_TRUE(RankGroup::exited_ok(survivor)) << "rank 0: " << RankGroup::describe(survivor) << g.logs();
  const auto r = RankGroup::results(survivor);
  if (!r.count("detected_ms") || !r.count("start_ms")) {
    ADD_FAILURE() << "rank 0 recorded no detection" << g.logs();
    return oc;
  }
  const auto v = RankGroup::results(victim);
  if (scenario != "fail-absent" && !v.count("lost_ms")) {
    ADD_FAILURE() << "rank 1 recorded no lost_ms" << g.logs();
    return oc;
  }
  const int64_t detected = std::atoll(r.at("detected_ms").c_str());
  const int64_t from = std::atoll((scenario == "fail-absent" ? r.at("start_ms") : v.at("lost_ms")).c_str());
  oc.latency_ms = detected - from;
  if (scenario != "fail-absent" && victim.exited_ms > 0)  // 0: rank 0 finished before the parent saw it
    std::printf("[cuda devcomm] %s on %s: the parent saw rank 1 %s %lld ms after it signalled itself\n",
                scenario.c_str(), paths.c_str(), scenario == "fail-kill" ? "exit" : "stop",
                static_cast<long long>(victim.exited_ms - from));
  oc.failure = r.count("failure") ? r.at("failure") : "";
  oc.again = r.count("again") ? r.at("again") : "";
  std::printf("[cuda devcomm] %s on %s: rank 0 saw the failure %lld ms after %s: %s\n", scenario.c_str(),
              paths.c_str(), static_cast<long long>(oc.latency_ms),
              scenario == "fail-absent" ? "its first unanswered call" : "rank 1 was lost", oc.failure.c_str());
  EXPECT_EQ(oc.again.substr(0, 11), "unavailable") << "a call after the failure must fail fast: " << oc.again;
  if (::testing::Test::HasFailure()) std::printf("%s\n", g.logs().c_str());
  return oc;
}

TEST(DeviceCommFailure, KilledRankOnNccl) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-kill", "nccl");
  EXPECT_GE(oc.latency_ms, 0);
  EXPECT_LE(oc.latency_ms, 5000);
  EXPECT_NE(oc.failure.find("rank 1"), std::string::npos) << oc.failure;
}

TEST(DeviceCommFailure, KilledRankOnPeerMemory) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-kill", "peer");
  EXPECT_GE(oc.latency_ms, 0);
  EXPECT_LE(oc.latency_ms, 5000);
  EXPECT_NE(oc.failure.find("rank 1"), std::string::npos) << oc.failure;
}

TEST(DeviceCommFailure, StoppedRankOnNccl) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-stop", "nccl");
  EXPECT_GE(oc.latency_ms, 0);
  EXPECT_LE(oc.latency_ms, 5000);
  EXPECT_NE(oc.failure.find("rank 1"), std::string::npos) << oc.failure;
}

TEST(DeviceCommFailure, StoppedRankOnPeerMemory) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-stop", "peer");
  EXPECT_GE(oc.latency_ms, 0);
  EXPECT_LE(oc.latency_ms, 5000);
  EXPECT_NE(oc.failure.find("rank 1"), std::string::npos) << oc.failure;
}

// A live rank that never enters the collective (ranks diverged): heartbeats go on, so only the
// bounds release the survivor: the peer kernel's own timeout (1 s here) ...
TEST(DeviceCommFailure, AbsentPeerTimesOutInTheKernel) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-absent", "peer", {{"TANDEM_DEVCOMM_PEER_TIMEOUT", "1"}});
  EXPECT_GE(oc.latency_ms, 900);
  EXPECT_LE(oc.latency_ms, 4000);
  EXPECT_NE(oc.failure.find("waited more than 1.0 s for rank 1"), std::string::npos) << oc.failure;
}

// ... and on NCCL the watchdog's step limit (2 s here), which aborts the communicator.
TEST(DeviceCommFailure, AbsentPeerOnNcclIsAbortedByTheWatchdog) {
  TANDEM_REQUIRE_GPU();
  const Outcome oc = run_failure("fail-absent", "nccl", {{"TANDEM_DEVCOMM_STEP_TIMEOUT", "2"}});
  EXPECT_GE(oc.latency_ms, 1900);
  EXPECT_LE(oc.latency_ms, 6000);
  EXPECT_NE(oc.failure.find("a step has waited"), std::string::npos) << oc.failure;
}

}  // namespace
}  // namespace tandem::devcomm_testing
