// The device data plane (src/model/cuda/device_comm.h) against host-computed results: every path
// (the routed composite, NCCL, the symmetric window where NCCL accepts it, peer-oneshot), every
// collective (all-reduce fp32 and bf16, all-gather, broadcast) for 1, 6, 8 and 48 rows of 4096,
// eagerly and replayed in a CUDA graph, with TP = 2 and TP = 4 rank processes (on one GPU they
// share it: NCCL over loopback, peer memory through CUDA IPC). Checked:
//  - peer-oneshot (and any path with 2 ranks, where a sum is one IEEE addition): bitwise equal to
//    the host's fp32 sum in rank order (bf16 rounded once); NCCL with more ranks: within the bound
//    of an fp32 sum in any order, (n - 1) * 2^-24 * sum |x| (+ half a bf16 ulp for bf16);
//  - all-gather and broadcast: byte-exact; NaN and inf positions kept;
//  - bitwise equal across ranks (hashes compared by the parent), across repeated eager runs, and
//    between a graph replay and the eager run; other graph replays with fresh inputs are right.
#include <cmath>
#include <fstream>

#include "cuda/cuda_test_util.h"
#include "cuda/device_comm_test_util.h"

namespace tandem::devcomm_testing {
namespace {

using kernels::cuda_testing::fast_uniform;

constexpr int64_t kWidth = 4096;
constexpr int kRows[] = {1, 6, 8, 48};
enum class Op { kSumF32, kSumBf16, kGather, kBroadcast };
const char* op_name(Op op) {
  switch (op) {
    case Op::kSumF32: return "all_reduce_f32";
    case Op::kSumBf16: return "all_reduce_bf16";
    case Op::kGather: return "all_gather_f32";
    case Op::kBroadcast: return "broadcast_f32";
  }
  return "?";
}

// Rank r's input for a case seed: never zero, bf16-representable for bf16; rank 0 carries +inf
// at element 11 and the last rank a NaN at element 7 (the sum keeps both classes).
std::vector<float> rank_input(int rank, int size, uint64_t seed, size_t n, bool bf16) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    float x = fast_uniform(seed * 977 + static_cast<uint64_t>(rank) * 131 + 7, i) * 4.0f;
    if (bf16) x = num::round_bf16(x);
    v[i] = x == 0.0f ? 0.25f : x;
  }
  if (n > 11 && rank == 0) v[11] = INFINITY;
  if (n > 7 && rank == size - 1) v[7] = NAN;
  return v;
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

// Half the spacing of bf16 values around |x|.
double half_ulp_bf16(double x) {
  const double a = std::fabs(x);
  const int e = a > 0 ? std::max(std::ilogb(a), -126) : -126;
  return std::ldexp(1.0, e - 7) * 0.5;
}

struct SumCheck {
  bool bitwise = true;       // equal to the host's rank-order sum
  bool classes = true;       // NaN/inf where the host has them
  double worst = 0;          // max |err| / bound over finite elements
  size_t first_diff = SIZE_MAX, worst_at = 0;
  float got_first = 0, want_first = 0;
};

SumCheck check_sum(const std::vector<float>& got, const std::vector<std::vector<float>>& in, bool bf16) {
  SumCheck c;
  const int size = static_cast<int>(in.size());
  for (size_t i = 0; i < got.size(); ++i) {
    float ro = in[0][i];
    double exact = in[0][i], abs_sum = std::fabs(in[0][i]);
    for (int p = 1; p < size; ++p) {
      ro += in[p][i];
      exact += in[p][i];
      abs_sum += std::fabs(in[p][i]);
    }
    if (bf16) ro = num::round_bf16(ro);
    if (std::isnan(ro) || std::isinf(ro)) {
      if (std::isnan(ro) ? !std::isnan(got[i]) : got[i] != ro) c.classes = false;
      continue;
    }
    if (num::f32_bits(got[i]) != num::f32_bits(ro) && c.first_diff == SIZE_MAX) {
      c.first_diff = i;
      c.got_first = got[i];
      c.want_first = ro;
    }
    if (num::f32_bits(got[i]) != num::f32_bits(ro)) c.bitwise = false;
    double bound = (size - 1) * std::ldexp(1.0, -24) * abs_sum;
    if (bf16) bound += half_ulp_bf16(std::max(std::fabs(static_cast<double>(got[i])), std::fabs(exact)));
    const double err = std::fabs(static_cast<double>(got[i]) - exact);
    const double ratio = bound > 0 ? err / bound : (err > 0 ? 1e30 : 0);
    if (!std::isfinite(got[i])) c.classes = false;
    if (ratio > c.worst) {
      c.worst = ratio;
      c.worst_at = i;
    }
  }
  return c;
}

class CaseRunner {
 public:
  // Buffers for the largest case, allocated once (a graph keeps the addresses it captured).
  CaseRunner(const RankEnv& e, cudaStream_t s, std::ofstream& out)
      : e_(e), s_(s), out_(out), buf_(48 * kWidth * 4), out_buf_(48 * kWidth * 4 * static_cast<size_t>(e.size)) {}

  void run_path(const std::string& name, DataComm* c, bool must_be_rank_order) {
    for (Op op : {Op::kSumF32, Op::kSumBf16, Op::kGather, Op::kBroadcast})
      for (int rows : kRows) {
        run_case(name, c, op, rows, must_be_rank_order);
        if (::testing::Test::HasFatalFailure()) return;
      }
  }

 private:
  size_t n_of(int rows) const { return static_cast<size_t>(rows) * kWidth; }

  // Uploads this rank's input for `seed` (and poisons a gather's output).
  void upload(Op op, int rows, uint64_t seed) {
    const size_t n = n_of(rows);
    const bool bf16 = op == Op::kSumBf16;
    std::vector<float> x = rank_input(e_.rank, e_.size, seed, n, bf16);
    if (bf16) {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = num::f32_to_bf16(x[i]);
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(buf_.get(), h.data(), n * 2, cudaMemcpyHostToDevice, s_));
    } else {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(buf_.get(), x.data(), n * 4, cudaMemcpyHostToDevice, s_));
    }
    if (op == Op::kGather) TANDEM_CUDA_CHECK(cudaMemsetAsync(out_buf_.get(), 0xff, n * 4 * e_.size, s_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

  Status call(DataComm* c, Op op, int rows) {
    const size_t n = n_of(rows);
    switch (op) {
      case Op::kSumF32: return c->all_reduce_sum(buf_.get(), n, CommDtype::kF32, s_);
      case Op::kSumBf16: return c->all_reduce_sum(buf_.get(), n, CommDtype::kBf16, s_);
      case Op::kGather: return c->all_gather(buf_.get(), n * 4, out_buf_.get(), s_);
      case Op::kBroadcast: return c->broadcast(buf_.get(), n * 4, e_.size - 1, s_);
    }
    return Status();
  }

  // The result as floats (bf16 widened) and its raw bytes' hash.
  std::vector<float> download(Op op, int rows, uint64_t& hash) {
    const size_t n = n_of(rows);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s_));
    if (op == Op::kSumBf16) {
      std::vector<uint16_t> h(n);
      TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), buf_.get(), n * 2, cudaMemcpyDeviceToHost));
      hash = fnv1a(h.data(), n * 2);
      std::vector<float> f(n);
      for (size_t i = 0; i < n; ++i) f[i] = num::bf16_to_f32(h[i]);
      return f;
    }
    const size_t m = op == Op::kGather ? n * e_.size : n;
    std::vector<float> f(m);
    TANDEM_CUDA_CHECK(cudaMemcpy(f.data(), op == Op::kGather ? out_buf_.get() : buf_.get(), m * 4,
                                 cudaMemcpyDeviceToHost));
    hash = fnv1a(f.data(), m * 4);
    return f;
  }

  // Checks one result against the host; returns the worst err/bound (sums) for the summary.
  double check(const std::string& what, Op op, int rows, uint64_t seed, const std::vector<float>& got,
               bool must_be_rank_order) {
    const size_t n = n_of(rows);
    const bool bf16 = op == Op::kSumBf16;
    std::vector<std::vector<float>> in;
    for (int p = 0; p < e_.size; ++p) in.push_back(rank_input(p, e_.size, seed, n, bf16));
    if (op == Op::kSumF32 || op == Op::kSumBf16) {
      const SumCheck c = check_sum(got, in, bf16);
      EXPECT_TRUE(c.classes) << what << ": NaN/inf positions differ from the host's";
      EXPECT_LE(c.worst, 1.0) << what << ": element " << c.worst_at << " = " << got[c.worst_at]
                              << " is outside the fp32 any-order bound (err/bound " << c.worst << ")";
      if (must_be_rank_order || e_.size == 2) {
        EXPECT_TRUE(c.bitwise) << what << ": not bitwise the rank-order sum; first at " << c.first_diff << ": got "
                               << c.got_first << " want " << c.want_first;
      }
      return c.worst;
    }
    std::vector<float> want;
    if (op == Op::kGather)
      for (int p = 0; p < e_.size; ++p) want.insert(want.end(), in[p].begin(), in[p].end());
    else
      want = in[e_.size - 1];
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (num::f32_bits(got[i]) != num::f32_bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i])) &&
          bad++ == 0)
        first = i;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements differ; first at " << first
                       << ": got " << got[first] << " want " << want[first];
    return 0;
  }

  void run_case(const std::string& path, DataComm* c, Op op, int rows, bool must_be_rank_order) {
    const uint64_t seed = 1000 * static_cast<uint64_t>(op) + rows;
    const std::string key = path + "/" + op_name(op) + "/r" + std::to_string(rows);
    // Eager, twice with the same input.
    uint64_t h[2] = {0, 0};
    double worst = 0, eager_ms = 0;
    for (int k = 0; k < 2; ++k) {
      upload(op, rows, seed);
      const auto t0 = std::chrono::steady_clock::now();
      Status st = call(c, op, rows);
      ASSERT_TRUE(st.ok()) << key << " eager: " << st.message();
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(s_));
      eager_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 2;
      std::vector<float> got = download(op, rows, h[k]);
      worst = std::max(worst, check(key + " eager run " + std::to_string(k), op, rows, seed, got, must_be_rank_order));
      out_ << key << "/eager" << k << " " << std::hex << h[k] << std::dec << "\n";
    }
    EXPECT_EQ(h[0], h[1]) << key << ": two eager runs of the same input differ";
    // Captured once, replayed three times (the first with the eager run's input).
    upload(op, rows, seed);
    cudaGraph_t g;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    Status st = call(c, op, rows);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(s_, &g));
    ASSERT_TRUE(st.ok()) << key << " capture: " << st.message();
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
    double graph_ms = 0;
    for (int k = 0; k < 3; ++k) {
      upload(op, rows, seed + 17 * k);
      const auto t0 = std::chrono::steady_clock::now();
      TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, s_));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(s_));
      graph_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 3;
      uint64_t hr = 0;
      std::vector<float> got = download(op, rows, hr);
      worst = std::max(worst, check(key + " graph replay " + std::to_string(k), op, rows, seed + 17 * k, got,
                                    must_be_rank_order));
      if (k == 0) {
        EXPECT_EQ(hr, h[0]) << key << ": the graph replay differs from the eager run";
      }
      out_ << key << "/graph" << k << " " << std::hex << hr << std::dec << "\n";
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
    std::printf("[cuda devcomm] tp=%d %s %s rows=%d: eager %.3f ms, graph %.3f ms%s\n", e_.size, path.c_str(),
                op_name(op), rows, eager_ms, graph_ms,
                (op == Op::kSumF32 || op == Op::kSumBf16) ? fmt::format(", max err/bound {:.3f}", worst).c_str() : "");
    std::fflush(stdout);
  }

  RankEnv e_;
  cudaStream_t s_;
  std::ofstream& out_;
  kernels::cuda::DeviceBuffer<uint8_t> buf_, out_buf_;
};

// ---- a rank process ----

void rank_process_matrix() {
  const RankEnv e = rank_env();
  ASSERT_EQ(e.scenario, "matrix");
  auto control = connect_control(e);
  ASSERT_TRUE(control.ok()) << control.status().message();
  DeviceCommOptions o = rank_options(e);
  o.max_peer_bytes = static_cast<size_t>(std::atol(env_or("TANDEM_DEVCOMM_PEER_BYTES", "262144")));
  o.init_timeout_s = 60;
  // Only one path's cases (the symmetric window tried where the topology check says no).
  const std::string only = env_or("TANDEM_DEVCOMM_ONLY", "");
  o.try_symmetric_anywhere = only == "nccl-symmetric";
  auto comm = create_device_comm(o, control->get());
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  DeviceComm& dc = **comm;
  std::printf("[devcomm] rank %d: %s\n[devcomm] rank %d: %s\n", e.rank, dc.topology().c_str(), e.rank, dc.path().c_str());
  for (const auto& [p, why] : dc.unavailable()) std::printf("[devcomm] %s unavailable: %s\n", comm_path_name(p), why.c_str());
  std::ofstream out(e.out);
  if (!only.empty()) {
    DataComm* c = dc.path_comm(only == "nccl-symmetric" ? CommPath::kNcclSymmetric : CommPath::kNccl);
    if (!c) {
      for (const auto& [p, why] : dc.unavailable())
        if (comm_path_name(p) == only) out << "unavailable " << why << "\n";
      out.close();
      ASSERT_TRUE((*control)->barrier(std::chrono::seconds(120)).ok());
      return;
    }
    cudaStream_t s;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CaseRunner run(e, s, out);
    run.run_path(only, c, false);
    out.close();
    EXPECT_TRUE((*control)->barrier(std::chrono::seconds(120)).ok());
    comm->reset();
    TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
    return;
  }
  // The routing rule: decode sizes take the one-shot path where it exists, larger ones NCCL.
  const bool has_peer = dc.path_comm(CommPath::kPeerOneShot) != nullptr;
  EXPECT_EQ(dc.route(CommOp::kAllReduce, o.max_peer_bytes), has_peer ? CommPath::kPeerOneShot
                                                            : dc.path_comm(CommPath::kNcclSymmetric)
                                                                  ? CommPath::kNcclSymmetric
                                                                  : CommPath::kNccl);
  EXPECT_EQ(dc.route(CommOp::kAllReduce, o.max_peer_bytes + 1), CommPath::kNccl);
  EXPECT_EQ(dc.route(CommOp::kAllGather, 64), has_peer ? CommPath::kPeerOneShot : CommPath::kNccl);
  // Ranks sharing a GPU reach each other through CUDA IPC: the one-shot path must exist.
  if (o.shared_gpus) {
    EXPECT_TRUE(has_peer) << "peer-oneshot is missing for ranks on one GPU";
  }
  cudaStream_t s;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CaseRunner run(e, s, out);
  run.run_path("routed", &dc, false);
  for (CommPath p : {CommPath::kNccl, CommPath::kNcclSymmetric, CommPath::kPeerOneShot}) {
    if (::testing::Test::HasFatalFailure()) break;
    DataComm* c = dc.path_comm(p);
    if (!c) continue;
    run.run_path(comm_path_name(p), c, p == CommPath::kPeerOneShot);
  }
  EXPECT_EQ(dc.failure(), "");
  out << "symmetric " << (dc.path_comm(CommPath::kNcclSymmetric) ? "yes" : "no") << "\n";
  out.close();
  // Nobody frees its exchange buffer while a peer may still read it.
  Status st = (*control)->barrier(std::chrono::seconds(120));
  EXPECT_TRUE(st.ok()) << st.message();
  comm->reset();
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

[[maybe_unused]] const bool kMatrixRegistered = register_rank_process_test("Matrix", rank_process_matrix);

// ---- the tests ----

// Returns rank 0's results (empty on failure).
std::map<std::string, std::string> run_matrix(int size, const std::map<std::string, std::string>& env = {}) {
  RankGroup g(size, "DeviceCommRankProcess.Matrix", "matrix", "auto", env);
  const bool finished = g.wait(600);
  EXPECT_TRUE(finished) << "the ranks did not finish within 600 s" << g.logs();
  if (!finished) return {};
  bool ok = true;
  for (const RankProc& p : g.procs()) {
    EXPECT_TRUE(RankGroup::exited_ok(p)) << "rank " << p.rank << ": " << RankGroup::describe(p);
    ok = ok && RankGroup::exited_ok(p);
  }
  // Rank 0's measurements for the run's record.
  std::istringstream log0(RankGroup::read_file(g.procs()[0].log));
  for (std::string line; std::getline(log0, line);)
    if (line.rfind("[cuda devcomm]", 0) == 0 || line.rfind("[devcomm]", 0) == 0) std::printf("%s\n", line.c_str());
  const auto r0 = RankGroup::results(g.procs()[0]);
  if (r0.count("unavailable")) return r0;
  EXPECT_GT(r0.size(), env.empty() ? 100u : 60u) << "rank 0 recorded too few cases";
  for (size_t r = 1; r < g.procs().size(); ++r) {
    const auto rr = RankGroup::results(g.procs()[r]);
    EXPECT_EQ(rr.size(), r0.size()) << "rank " << r << " recorded a different set of cases";
    size_t differ = 0;
    for (const auto& [k, v] : r0) {
      auto it = rr.find(k);
      if (it == rr.end() || it->second != v) {
        if (differ++ < 10) ADD_FAILURE() << "case " << k << ": rank " << r << " has " << (it == rr.end() ? "nothing" : it->second)
                                         << ", rank 0 has " << v << " (results must be bitwise equal across ranks)";
      }
    }
    EXPECT_EQ(differ, 0u) << "cases whose results differ between rank 0 and rank " << r;
    ok = ok && differ == 0;
  }
  if (!ok || ::testing::Test::HasFailure()) std::printf("%s\n", g.logs().c_str());
  return r0;
}

TEST(DeviceCommTp, TwoRanksEveryPathEveryCollective) {
  TANDEM_REQUIRE_GPU();
  run_matrix(2);
}
TEST(DeviceCommTp, FourRanksEveryPathEveryCollective) {
  TANDEM_REQUIRE_GPU();
  run_matrix(4);
}
// The symmetric window, tried even where the topology check would not (ranks sharing a GPU: NCCL
// sees separate hosts). Where NCCL accepts it, every case must be right; where it refuses, every
// rank must have come back from the refusal (no hang, no crash) with NCCL's reason, printed.
TEST(DeviceCommTp, TwoRanksSymmetricWindowRightOrCleanlyRefused) {
  TANDEM_REQUIRE_GPU();
  const auto r0 = run_matrix(2, {{"TANDEM_DEVCOMM_ONLY", "nccl-symmetric"}});
  if (r0.count("unavailable")) {
    EXPECT_FALSE(r0.at("unavailable").empty());
    std::printf("[cuda devcomm] nccl-symmetric refused on this topology: %s\n", r0.at("unavailable").c_str());
  }
}

// One rank: the stand-in (no NCCL, no control plane), eager and in a graph; argument errors.
TEST(DeviceComm, OneRankStandin) {
  TANDEM_REQUIRE_GPU();
  DeviceCommOptions o;
  auto comm = create_device_comm(o, nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  DeviceComm& dc = **comm;
  EXPECT_EQ(dc.route(CommOp::kAllReduce, 1 << 20), CommPath::kStandin);
  EXPECT_EQ(dc.path(), "all_reduce: standin; all_gather: standin; broadcast: standin");
  const size_t n = 6 * kWidth;
  std::vector<float> x = rank_input(0, 1, 5, n, false);
  kernels::cuda::DeviceBuffer<float> a(n), b(n);
  cudaStream_t s;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int graph = 0; graph < 2; ++graph) {
    // On the collectives' stream: a non-blocking stream does not wait for the legacy default
    // stream, so a plain cudaMemset (asynchronous to the host) could still be writing b's NaN
    // pattern while the all-gather copies into it.
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(a.get(), x.data(), n * 4, cudaMemcpyHostToDevice, s));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xff, n * 4, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    if (graph) TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ASSERT_TRUE(dc.all_reduce_sum(a.get(), n, CommDtype::kF32, s).ok());
    ASSERT_TRUE(dc.broadcast(a.get(), n * 4, 0, s).ok());
    ASSERT_TRUE(dc.all_gather(a.get(), n * 4, b.get(), s).ok());
    if (graph) {
      TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t ge;
      TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, s));
      TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
      TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
    }
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> ga(n), gb(n);
    TANDEM_CUDA_CHECK(cudaMemcpy(ga.data(), a.get(), n * 4, cudaMemcpyDeviceToHost));
    TANDEM_CUDA_CHECK(cudaMemcpy(gb.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(kernels::cuda_testing::same_bits(ga, x)) << (graph ? "graph" : "eager");
    EXPECT_TRUE(kernels::cuda_testing::same_bits(gb, x)) << (graph ? "graph" : "eager");
  }
  // Bad arguments are errors, not crashes.
  EXPECT_EQ(dc.all_reduce_sum(nullptr, 4, CommDtype::kF32, s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dc.broadcast(a.get(), 16, 1, s).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(dc.all_reduce_sum(nullptr, 0, CommDtype::kF32, s).ok());
  // A failed communicator fails fast and says why.
  dc.abort("test abort");
  EXPECT_EQ(dc.failure(), "test abort");
  EXPECT_EQ(dc.all_reduce_sum(a.get(), n, CommDtype::kF32, s).code(), StatusCode::kUnavailable);
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(DeviceComm, BadOptionsAreRefused) {
  TANDEM_REQUIRE_GPU();
  DeviceCommOptions o;
  o.paths = "fast";
  EXPECT_EQ(create_device_comm(o, nullptr).status().code(), StatusCode::kInvalidArgument);
  o = DeviceCommOptions();
  o.device = 4096;
  EXPECT_EQ(create_device_comm(o, nullptr).status().code(), StatusCode::kInvalidArgument);
  o = DeviceCommOptions();
  o.size = 2;
  o.rank = 1;
  EXPECT_EQ(create_device_comm(o, nullptr).status().code(), StatusCode::kInvalidArgument);  // no control plane
}

}  // namespace
}  // namespace tandem::devcomm_testing
