// Tensor parallelism through the CUDA runner (src/engine/parallel/device_tp.h): TP=2 and TP=4
// rank processes on this machine's GPUs (sharing one through --tp-share-gpus when there are fewer
// GPUs than ranks) against TP=1 through CUDA:
//  - greedy tokens through the engine equal TP=1's on the make-tiny presets that shard, except
//    where TP=1's top-2 logit margin at the first differing token is below what the measured
//    logits difference can flip (each such divergence is printed with its margin);
//  - speculative greedy (DSpark, K = the block and K below it) equals plain greedy under TP=2;
//  - `tandem logits` with TP=2 and TP=4 stays within the make-tiny presets' CUDA-vs-CPU limits of
//    TP=1's logits, and is bitwise equal across repeated runs and across ranks;
//  - a killed and a stopped GPU worker fail the head within 5 s; a mismatched rank is refused.
// Part of `make test-gpu` (test_cuda as one process) and of tools/gpu-tp-tests.sh.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cuda/cuda_test_util.h"
#include "engine/engine.h"
#include "io/safetensors.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

#define TP_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                 \
    if (const char* why_ = ::tandem::kernels::cuda_testing::no_gpu_reason()) GTEST_SKIP() << why_; \
  } while (0)

std::string run_cmd(const std::string& cmd) {
  const std::string log = (fs::temp_directory_path() / ("tandem_tp_cmd_" + std::to_string(getpid()) + ".log")).string();
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return rc == 0 ? std::string() : "command failed: " + cmd + "\n" + ss.str();
}

std::string tmp_dir(const std::string& what) {
  const fs::path d = fs::temp_directory_path() / ("tandem-tpcuda-" + what + "-" + std::to_string(getpid()));
  fs::create_directories(d);
  return d.string();
}

// A make-tiny checkpoint, made once per preset and seed for this process.
std::string tiny(const std::string& preset, int seed = 3) {
  const std::string dir = tmp_dir("ckpt-" + preset + "-" + std::to_string(seed));
  if (!fs::exists(dir + "/config.json")) {
    const std::string err = run_cmd(std::string(TANDEM_BINARY) + " make-tiny " + dir + " --preset " + preset +
                                    " --seed " + std::to_string(seed));
    EXPECT_EQ(err, "");
  }
  return dir;
}

EngineConfig cuda_config(const std::string& dir, int tp, int port) {
  EngineConfig ec;
  ec.model_dir = dir;
  ec.device = "cuda";
  ec.max_num_seqs = 2;
  ec.max_num_batched_tokens = 256;
  ec.block_size = 256;
  ec.max_model_len = 1024;
  ec.kv_cache_memory = int64_t{64} << 20;
  ec.max_cudagraph_capture_size = 2;
  ec.tensor_parallel_size = tp;
  ec.tp_share_gpus = true;  // only takes effect where there are fewer GPUs than ranks
  ec.master_port = port;
  ec.distributed_timeout_s = 120;
  ec.worker_binary = TANDEM_BINARY;
  return ec;
}

struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  bool done = false;
  bool wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
  }
};

std::shared_ptr<Pending> submit(Engine& e, const std::string& id, const std::vector<int32_t>& prompt, int max_tokens) {
  auto p = std::make_shared<Pending>();
  Request req;
  req.request_id = id;
  req.prompt_tokens = prompt;
  req.sampling.temperature = 0;
  req.sampling.max_tokens = max_tokens;
  req.sampling.ignore_eos = true;
  Status st = e.submit(std::move(req), [p](const RequestEvent& ev) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->tokens.insert(p->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finish != FinishReason::kNone) {
      p->finish = ev.finish;
      p->error = ev.error;
      p->done = true;
      p->cv.notify_all();
    }
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p;
}

std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> ps;
  for (int salt : {1, 2, 3}) {
    std::vector<int32_t> t;
    for (int i = 0; i < 20 + 9 * salt; ++i) t.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 5) % 400 + 3));
    ps.push_back(t);
  }
  return ps;
}

// Greedy tokens of every prompt (all in flight together), or the engine's start-up error.
Result<std::vector<std::vector<int32_t>>> generate(const EngineConfig& ec, int max_tokens) {
  auto e = Engine::create(ec);
  if (!e.ok()) return e.status();
  std::vector<std::shared_ptr<Pending>> ps;
  const auto pr = prompts();
  for (size_t i = 0; i < pr.size(); ++i) ps.push_back(submit(**e, "r" + std::to_string(i), pr[i], max_tokens));
  std::vector<std::vector<int32_t>> out;
  for (auto& p : ps) {
    EXPECT_TRUE(p->wait(300)) << "request did not finish";
    EXPECT_EQ(p->finish, FinishReason::kLength) << p->error;
    out.push_back(p->tokens);
  }
  (*e)->shutdown(5);
  return out;
}

// ---- logits through `tandem logits` ----

struct Logits {
  std::vector<float> v;
  int64_t rows = 0, V = 0;
};

Logits read_logits(const std::string& path) {
  Logits l;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.status().message();
  if (!f.ok()) return l;
  const TensorView* t = (*f)->find("logits");
  EXPECT_TRUE(t != nullptr) << path;
  if (!t) return l;
  l.rows = t->shape[0];
  l.V = t->shape[1];
  l.v.resize(static_cast<size_t>(t->numel()));
  std::memcpy(l.v.data(), t->data, l.v.size() * 4);
  return l;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs `tandem logits --device cuda` with TP = tp; "" or the failure with its log.
std::string logits_cli(const std::string& dir, const std::string& tokens, const std::string& out, int tp, int port,
                       const std::string& extra = "") {
  return run_cmd(std::string(TANDEM_BINARY) + " logits --device cuda --model " + dir + " --tokens-file " + tokens +
                 " --out " + out + " --tensor-parallel-size " + std::to_string(tp) + " --tp-share-gpus --master-port " +
                 std::to_string(port) + " " + extra);
}

struct RowStats {
  double max_rel = 0, mean_rel = 0, max_abs = 0, top1 = 0;
};
RowStats compare(const Logits& a, const Logits& b) {
  RowStats s;
  int64_t agree = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    double mx = 0, mb = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t v = 0; v < a.V; ++v) {
      const float x = a.v[r * a.V + v], y = b.v[r * a.V + v];
      mx = std::max(mx, std::fabs(static_cast<double>(x) - y));
      mb = std::max(mb, std::fabs(static_cast<double>(x)));
      if (x > a.v[r * a.V + ia]) ia = v;
      if (y > b.v[r * a.V + ib]) ib = v;
    }
    s.max_abs = std::max(s.max_abs, mx);
    const double rel = mx / std::max(mb, 1e-6);
    s.max_rel = std::max(s.max_rel, rel);
    s.mean_rel += rel / static_cast<double>(a.rows);
    agree += ia == ib;
  }
  s.top1 = static_cast<double>(agree) / static_cast<double>(std::max<int64_t>(a.rows, 1));
  return s;
}

// A greedy divergence between TP=1 and TP=N at generated token p of prompt i is acceptable only
// where TP=1's top-2 margin at that position is below twice the largest logit difference there
// (a difference of two logits can move by at most that much). Checked on the logits of both,
// teacher-forced with TP=1's tokens.
void check_divergence(const std::string& dir, const std::string& label, int tp, int port, size_t i,
                      const std::vector<int32_t>& ref, const std::vector<int32_t>& got) {
  size_t p = 0;
  while (p < ref.size() && p < got.size() && ref[p] == got[p]) ++p;
  if (p == ref.size() && ref.size() == got.size()) {
    std::printf("[cuda tp] %s tp=%d prompt %zu: %zu greedy tokens equal TP=1's\n", label.c_str(), tp, i, ref.size());
    return;
  }
  const auto pr = prompts()[i];
  const std::string work = tmp_dir("div");
  std::ofstream(work + "/t.json") << nlohmann::json({{"prompt", pr}, {"decode", std::vector<int32_t>(ref.begin(), ref.begin() + p)}}).dump();
  ASSERT_EQ(logits_cli(dir, work + "/t.json", work + "/a.safetensors", 1, port), "");
  ASSERT_EQ(logits_cli(dir, work + "/t.json", work + "/b.safetensors", tp, port), "");
  const Logits a = read_logits(work + "/a.safetensors"), b = read_logits(work + "/b.safetensors");
  ASSERT_EQ(a.v.size(), b.v.size());
  const int64_t row = static_cast<int64_t>(pr.size() + p) - 1;
  ASSERT_LT(row, a.rows);
  const float* x = a.v.data() + row * a.V;
  const float* y = b.v.data() + row * a.V;
  int64_t t1 = 0, t2 = -1;
  double diff = 0;
  for (int64_t v = 0; v < a.V; ++v) {
    diff = std::max(diff, std::fabs(static_cast<double>(x[v]) - y[v]));
    if (x[v] > x[t1]) t1 = v;
  }
  for (int64_t v = 0; v < a.V; ++v)
    if (v != t1 && (t2 < 0 || x[v] > x[t2])) t2 = v;
  const double margin = static_cast<double>(x[t1]) - x[t2];
  const bool explained = margin < 2 * diff;
  std::printf("[cuda tp] %s tp=%d prompt %zu: first divergence at generated token %zu (TP=1 %d, TP=%d %d): "
              "TP=1 top-2 margin %.4g, max |logit diff| %.4g: %s\n",
              label.c_str(), tp, i, p, p < ref.size() ? ref[p] : -1, tp, p < got.size() ? got[p] : -1, margin, diff,
              explained ? "within the measured difference" : "NOT explained by the logits difference");
  EXPECT_TRUE(explained) << label << " tp=" << tp << " prompt " << i << " diverges at token " << p
                         << " with a top-2 margin " << margin << " above twice the logits difference " << diff;
  fs::remove_all(work);
}

// ---- the tests ----

TEST(TpCuda, GreedyTp2AndTp4MatchTp1OnTheTinyPresets) {
  TP_SKIP_WITHOUT_GPU();
  // The presets whose shapes divide by the TP size (small and the built-in model do not shard).
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {
      {"tp8", {2, 4}}, {"default", {2}}, {"preview", {2}}, {"long", {2}}};
  int port = 18800;
  for (const auto& [preset, sizes] : cases) {
    const std::string dir = tiny(preset);
    auto ref = generate(cuda_config(dir, 1, port), 24);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    for (int tp : sizes) {
      port += 4;
      auto got = generate(cuda_config(dir, tp, port), 24);
      ASSERT_TRUE(got.ok()) << preset << " tp=" << tp << ": " << got.status().to_string();
      ASSERT_EQ(got->size(), ref->size());
      for (size_t i = 0; i < ref->size(); ++i) check_divergence(dir, preset, tp, port + 2, i, (*ref)[i], (*got)[i]);
    }
  }
}

// The built-in model has 3 output groups: TP=2 and TP=4 are refused by name at start-up.
TEST(TpCuda, BuiltinModelRefusesSizesItsShapesDoNotDivide) {
  TP_SKIP_WITHOUT_GPU();
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  for (int tp : {2, 4}) {
    auto got = generate(cuda_config(dir, tp, 18840 + 4 * tp), 8);
    ASSERT_FALSE(got.ok()) << "the built-in model sharded over " << tp << " ranks";
    EXPECT_NE(got.status().message().find("not divisible"), std::string::npos) << got.status().message();
    std::printf("[cuda tp] builtin tp=%d refused: %s\n", tp, got.status().message().c_str());
  }
}

TEST(TpCuda, SpeculativeGreedyEqualsPlainGreedyUnderTp2) {
  TP_SKIP_WITHOUT_GPU();
  const std::string dir = tiny("tp8");
  auto plain = generate(cuda_config(dir, 2, 18860), 40);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (int k : {5, 2}) {  // the whole draft block, and K below it
    EngineConfig ec = cuda_config(dir, 2, 18864 + 2 * k);
    ec.speculative.method = "dspark";
    ec.speculative.num_speculative_tokens = k;
    ec.speculative.verify_mode = VerifyMode::kFixed;
    auto spec = generate(ec, 40);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    EXPECT_EQ(*spec, *plain) << "TP=2 speculative greedy (K=" << k << ") differs from TP=2 plain greedy";
  }
}

TEST(TpCuda, LogitsTp2AndTp4CloseToTp1BitwiseAcrossRunsAndRanks) {
  TP_SKIP_WITHOUT_GPU();
  const std::string dir = tiny("tp8");
  const std::string work = tmp_dir("logits");
  nlohmann::json t = {{"decode", {12, 13, 14, 15, 16, 17}}};
  std::vector<int32_t> pr = prompts()[2];
  t["prompt"] = pr;
  std::ofstream(work + "/t.json") << t.dump();
  ASSERT_EQ(logits_cli(dir, work + "/t.json", work + "/tp1.safetensors", 1, 18880), "");
  const Logits ref = read_logits(work + "/tp1.safetensors");
  for (int tp : {2, 4}) {
    const std::string out = work + "/tp" + std::to_string(tp) + ".safetensors";
    const std::string err = logits_cli(dir, work + "/t.json", out, tp, 18882 + 2 * tp, "--tp-write-every-rank");
    ASSERT_EQ(err, "");
    const Logits got = read_logits(out);
    ASSERT_EQ(got.v.size(), ref.v.size());
    const RowStats s = compare(ref, got);
    std::printf("[cuda tp] logits tp8 tp=%d vs tp=1: rows %lld max rel %.3g mean rel %.3g max abs %.3g top-1 %.4f\n", tp,
                static_cast<long long>(ref.rows), s.max_rel, s.mean_rel, s.max_abs, s.top1);
    // The make-tiny presets' CUDA-vs-CPU limits (tests/cuda/model_test.cpp kConditioned): only the
    // order of the sums differs between TP sizes.
    EXPECT_LE(s.max_rel, 0.06);
    EXPECT_LE(s.mean_rel, 0.03);
    EXPECT_GE(s.top1, 0.90);
    for (int r = 1; r < tp; ++r)
      EXPECT_TRUE(slurp(out + ".rank" + std::to_string(r)) == slurp(out)) << "rank " << r << " of TP=" << tp
                                                                          << " has other logits than rank 0";
    const std::string again = work + "/again" + std::to_string(tp) + ".safetensors";
    ASSERT_EQ(logits_cli(dir, work + "/t.json", again, tp, 18892 + 2 * tp), "");
    EXPECT_TRUE(slurp(again) == slurp(out)) << "a repeated TP=" << tp << " run differs";
  }
  fs::remove_all(work);
}

// The rank processes this test process started.
std::vector<pid_t> worker_pids() {
  std::vector<pid_t> pids;
  std::ifstream f("/proc/self/task/" + std::to_string(getpid()) + "/children");
  pid_t p;
  while (f >> p) pids.push_back(p);
  return pids;
}

// A lost GPU worker: the head turns unhealthy, fails the request in flight and any later one
// within 5 s, naming the rank. `sig` SIGKILL (killed) or SIGSTOP (alive but silent).
void lose_a_worker(int sig, int port) {
  const std::string dir = tiny("tp8");
  auto e = Engine::create(cuda_config(dir, 2, port));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const auto pids = worker_pids();
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_TRUE((*e)->healthy());
  auto long_req = submit(**e, "long", prompts()[0], 900);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  kill(pids[0], sig);
  EXPECT_TRUE(long_req->wait(5.0)) << "the in-flight request still runs 5 s after the worker was lost";
  while ((*e)->healthy() && Clock::now() - t0 < std::chrono::seconds(6))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[cuda tp] %s GPU worker: head unhealthy after %.2f s: %s\n", sig == SIGKILL ? "killed" : "stopped",
              waited, (*e)->unhealthy_reason().c_str());
  EXPECT_FALSE((*e)->healthy());
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(long_req->finish, FinishReason::kError);
  EXPECT_NE((*e)->unhealthy_reason().find("rank 1"), std::string::npos) << (*e)->unhealthy_reason();
  auto late = submit(**e, "late", prompts()[1], 4);
  EXPECT_TRUE(late->wait(5.0)) << "a request after the failure should fail, not hang";
  EXPECT_EQ(late->finish, FinishReason::kError);
  kill(pids[0], SIGKILL);
  (*e)->shutdown(1);
}

TEST(TpCuda, KilledGpuWorkerFailsTheHeadWithinFiveSeconds) {
  TP_SKIP_WITHOUT_GPU();
  lose_a_worker(SIGKILL, 18900);
}

TEST(TpCuda, StoppedGpuWorkerFailsTheHeadWithinFiveSeconds) {
  TP_SKIP_WITHOUT_GPU();
  lose_a_worker(SIGSTOP, 18904);
}

// A second "node" on this host with another checkpoint is refused at start-up, naming the key.
TEST(TpCuda, MismatchedGpuRankIsRefused) {
  TP_SKIP_WITHOUT_GPU();
  const std::string dir = tiny("tp8"), other = tiny("default");
  const int port = 18908;
  const pid_t node1 = fork();
  ASSERT_GE(node1, 0);
  if (node1 == 0) {
    const std::string p = std::to_string(port);
    execl(TANDEM_BINARY, TANDEM_BINARY, "serve", "--model", other.c_str(), "--device", "cuda", "--tp-share-gpus",
          "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
          "--master-port", p.c_str(), "--distributed-timeout", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  EngineConfig ec = cuda_config(dir, 2, port);
  ec.nnodes = 2;
  ec.distributed_timeout_s = 60;
  auto e = Engine::create(ec);
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_NE(msg.find("rank 1 has checkpoint.config"), std::string::npos) << msg;
  int st = 0;
  ASSERT_EQ(waitpid(node1, &st, 0), node1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << "node 1 should exit non-zero when refused";
}

}  // namespace
}  // namespace tandem
