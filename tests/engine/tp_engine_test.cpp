// Tensor parallelism through the engine: `Engine::create` with --tensor-parallel-size 2 starts a
// worker process (the tandem binary, `tp-worker`) and forwards every step plan to it. Greedy and
// speculative greedy output equal the one-process engine; a killed worker fails the head within
// 5 s (health, in-flight request, clear error); a worker with another checkpoint is refused.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "engine/engine.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string make_tiny(const std::string& preset, int seed) {
  const std::string dir = (fs::temp_directory_path() /
                           ("tandem-tpe-" + preset + "-" + std::to_string(seed) + "-" + std::to_string(getpid())))
                              .string();
  if (fs::exists(dir + "/config.json")) return dir;
  const std::string cmd = std::string(TANDEM_BINARY) + " make-tiny " + dir + " --seed " + std::to_string(seed) +
                          " --preset " + preset + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

EngineConfig config(const std::string& dir, int tp, int port) {
  EngineConfig ec;
  ec.model_dir = dir;
  ec.device = "cpu";  // the CPU's ranks (tests/cuda/tp_cuda_test.cpp covers GPUs)
  ec.max_num_seqs = 2;
  ec.max_num_batched_tokens = 256;
  ec.block_size = 128;
  ec.max_model_len = 1024;
  ec.num_threads = 1;
  ec.tensor_parallel_size = tp;
  ec.master_port = port;
  ec.distributed_timeout_s = 60;
  ec.worker_binary = TANDEM_BINARY;
  return ec;
}

struct Result1 {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  bool done = false;
};

// Submits and returns a handle to poll (events arrive on the engine thread).
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  Result1 r;
  bool wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return r.done; });
  }
};

std::shared_ptr<Pending> submit(Engine& e, const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  auto p = std::make_shared<Pending>();
  Request req;
  req.request_id = id;
  req.prompt_tokens = std::move(prompt);
  req.sampling.temperature = 0;
  req.sampling.max_tokens = max_tokens;
  req.sampling.ignore_eos = true;
  Status st = e.submit(std::move(req), [p](const RequestEvent& ev) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->r.tokens.insert(p->r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finish != FinishReason::kNone) {
      p->r.finish = ev.finish;
      p->r.error = ev.error;
      p->r.done = true;
      p->cv.notify_all();
    }
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 5) % 400 + 3));
  return t;
}

// The worker processes this test process started (children running tp-worker).
std::vector<pid_t> worker_pids() {
  std::vector<pid_t> pids;
  std::ifstream f("/proc/self/task/" + std::to_string(getpid()) + "/children");
  pid_t p;
  while (f >> p) pids.push_back(p);
  return pids;
}

class TpEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new std::string(make_tiny("tp8", 3)); }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* TpEngine::dir_ = nullptr;

std::vector<std::vector<int32_t>> generate(const EngineConfig& ec, int max_tokens) {
  auto e = Engine::create(ec);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  auto a = submit(**e, "a", prompt(40, 1), max_tokens);
  auto b = submit(**e, "b", prompt(23, 2), max_tokens);
  EXPECT_TRUE(a->wait(120) && b->wait(120));
  EXPECT_EQ(a->r.finish, FinishReason::kLength) << a->r.error;
  EXPECT_EQ(b->r.finish, FinishReason::kLength) << b->r.error;
  (*e)->shutdown(5);
  return {a->r.tokens, b->r.tokens};
}

// DSpark with K drafts per step, verify_mode fixed.
EngineConfig speculative(EngineConfig ec, int k) {
  ec.speculative.method = "dspark";
  ec.speculative.num_speculative_tokens = k;
  ec.speculative.verify_mode = VerifyMode::kFixed;
  return ec;
}

TEST_F(TpEngine, GreedyAndSpeculativeGreedyEqualOneProcess) {
  const auto ref = generate(config(*dir_, 1, 0), 20);
  ASSERT_EQ(ref.size(), 2u);
  const auto tp2 = generate(config(*dir_, 2, 18580), 20);
  EXPECT_EQ(tp2, ref) << "TP=2 greedy differs from TP=1";
  const auto tp2_spec = generate(speculative(config(*dir_, 2, 18582), 5), 20);
  EXPECT_EQ(tp2_spec, ref) << "TP=2 speculative greedy differs from TP=1 greedy";
  EXPECT_TRUE(worker_pids().empty()) << "workers left running after shutdown";
}

// K below the checkpoint's draft block (3 of tp8's 5): every rank drafts K tokens, so the draft's
// collectives agree in size (the allocate plan carries K), and the output is TP=1's greedy output.
TEST_F(TpEngine, SpeculativeWithKBelowTheDraftBlockEqualsOneProcess) {
  const auto ref = generate(config(*dir_, 1, 0), 16);
  ASSERT_EQ(ref.size(), 2u);
  const auto tp2_spec = generate(speculative(config(*dir_, 2, 18648), 3), 16);
  EXPECT_EQ(tp2_spec, ref) << "TP=2 speculative greedy (K=3 of a 5-token block) differs from TP=1 greedy";
  EXPECT_TRUE(worker_pids().empty()) << "workers left running after shutdown";
}

TEST_F(TpEngine, KilledWorkerFailsTheHeadWithinFiveSeconds) {
  setenv("NCCL_SOCKET_IFNAME", "tandem-test-if0", 1);
  auto e = Engine::create(config(*dir_, 2, 18584));
  unsetenv("NCCL_SOCKET_IFNAME");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const auto pids = worker_pids();
  ASSERT_EQ(pids.size(), 1u);
  {
    // NCCL_* variables reach the workers (they inherit the head's environment).
    std::ifstream env("/proc/" + std::to_string(pids[0]) + "/environ");
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    EXPECT_NE(all.find("NCCL_SOCKET_IFNAME=tandem-test-if0"), std::string::npos);
  }
  ASSERT_TRUE((*e)->healthy());
  auto long_req = submit(**e, "long", prompt(30, 3), 900);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  kill(pids[0], SIGKILL);
  ASSERT_TRUE(long_req->wait(5.0)) << "in-flight request still running 5 s after the worker died";
  while ((*e)->healthy() && Clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_FALSE((*e)->healthy());
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(long_req->r.finish, FinishReason::kError);
  EXPECT_NE(long_req->r.error.find("rank 1"), std::string::npos) << long_req->r.error;
  EXPECT_NE((*e)->unhealthy_reason().find("killed by signal 9"), std::string::npos) << (*e)->unhealthy_reason();
  // A new request fails too, with the same clear reason, instead of hanging.
  auto late = submit(**e, "late", prompt(5, 4), 4);
  ASSERT_TRUE(late->wait(5.0));
  EXPECT_EQ(late->r.finish, FinishReason::kError);
  (*e)->shutdown(1);
}

// A hung worker (stopped: its process is alive but silent) is caught by the heartbeats.
TEST_F(TpEngine, HungWorkerFailsTheHeadWithinFiveSeconds) {
  auto e = Engine::create(config(*dir_, 2, 18596));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const auto pids = worker_pids();
  ASSERT_EQ(pids.size(), 1u);
  const auto t0 = Clock::now();
  kill(pids[0], SIGSTOP);
  while ((*e)->healthy() && Clock::now() - t0 < std::chrono::seconds(6))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_FALSE((*e)->healthy());
  EXPECT_LT(waited, 5.0);
  EXPECT_NE((*e)->unhealthy_reason().find("rank 1 stopped answering"), std::string::npos) << (*e)->unhealthy_reason();
  auto late = submit(**e, "late", prompt(5, 4), 4);
  ASSERT_TRUE(late->wait(5.0)) << "a request after the failure should fail, not hang";
  EXPECT_EQ(late->r.finish, FinishReason::kError);
  kill(pids[0], SIGKILL);
  (*e)->shutdown(1);
}

// Two "nodes" on one host: the head (node 0, one rank) and a `tandem serve --node-rank 1` started
// by hand with a different checkpoint.
TEST_F(TpEngine, MismatchedWorkerIsRefusedNamingTheDifference) {
  const std::string other = make_tiny("default", 3);
  const int port = 18588;
  pid_t node1 = fork();
  ASSERT_GE(node1, 0);
  if (node1 == 0) {
    const std::string p = std::to_string(port);
    execl(TANDEM_BINARY, TANDEM_BINARY, "serve", "--model", other.c_str(), "--device", "cpu", "--tensor-parallel-size",
          "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", p.c_str(), "--threads", "1",
          "--distributed-timeout", "30", static_cast<char*>(nullptr));
    _exit(127);
  }
  EngineConfig ec = config(*dir_, 2, port);
  ec.nnodes = 2;
  ec.distributed_timeout_s = 30;
  auto e = Engine::create(ec);
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_NE(msg.find("rank 1 has checkpoint.config"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checkpoint.structure"), std::string::npos) << msg;
  int st = 0;
  ASSERT_EQ(waitpid(node1, &st, 0), node1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << "node 1 should exit non-zero when refused";
  std::error_code ec2;
  fs::remove_all(other, ec2);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// `tandem logits` and `tandem run` take the same tensor-parallel flags as serve: TP=2 and TP=4
// write the same logits file as TP=1 (the CPU sums in rank order and rounds like one process)
// and generate the same text.
TEST_F(TpEngine, LogitsAndRunTakeTheTensorParallelFlags) {
  const std::string dir = fs::temp_directory_path() / ("tandem-tpe-logits-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir + "/t.json") << R"({"prompt":[1,5,9,33,70,2,8,100,101,7,3,44],"decode":[12,13,14]})";
  std::string ref_logits, ref_text;
  for (int tp : {1, 2, 4}) {
    const std::string out = dir + "/l" + std::to_string(tp) + ".safetensors";
    const std::string common = " --model " + *dir_ + " --device cpu --threads 1 --tensor-parallel-size " +
                               std::to_string(tp) + " --master-port " + std::to_string(18600 + 2 * tp);
    std::string cmd = std::string(TANDEM_BINARY) + " logits --tokens-file " + dir + "/t.json --out " + out + common +
                      " > " + dir + "/log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(dir + "/log");
    const std::string text_file = dir + "/run" + std::to_string(tp) + ".txt";
    cmd = std::string(TANDEM_BINARY) + " run --prompt 'hello world' --max-tokens 12 --temperature 0" + common + " > " +
          text_file + " 2> " + dir + "/log";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(dir + "/log");
    if (tp == 1) {
      ref_logits = slurp(out);
      ref_text = slurp(text_file);
      ASSERT_GT(ref_logits.size(), 1000u);
      ASSERT_FALSE(ref_text.empty());
    } else {
      EXPECT_TRUE(slurp(out) == ref_logits) << "tandem logits with TP=" << tp << " differs from TP=1";
      EXPECT_EQ(slurp(text_file), ref_text) << "tandem run with TP=" << tp << " differs from TP=1";
    }
  }
  EXPECT_TRUE(worker_pids().empty()) << "ranks left running";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_F(TpEngine, MissingNodeIsNamedAfterTheTimeout) {
  EngineConfig ec = config(*dir_, 2, 18592);
  ec.nnodes = 2;
  ec.distributed_timeout_s = 1.5;
  auto e = Engine::create(ec);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("rank 1 (node 1) did not connect"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace tandem
