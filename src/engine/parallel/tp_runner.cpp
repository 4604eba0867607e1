// TpHeadRunner, the worker loop, and the processes behind them (see tp_runner.h). The control
// plane carries one plan per runner call: [op u8][the pending slot commits][op fields]. A step's
// commit (SlotCommit: rollback, draft context) is applied on the head at once and travels with the
// next plan (the draft's or the next forward's), so a step is one forward plan plus one draft plan
// when it drafts, whatever the number of sequences. Workers apply plans in order to their own
// Dsv4Runner; the head runs the same call right after sending it, so all ranks enter the model's
// collectives (the data plane) together. Prefix-cache snapshots are numbered by the engine and
// kept by every rank's runner (on its device for a GPU rank): a commit's snapshot number travels
// with the commit and a restore's with the forward, so each rank saves and loads its own copy and
// no state bytes cross the control plane.
#include "engine/parallel/tp_runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/version.h"
#include "engine/dsv4_runner.h"
#include "engine/parallel/forwarding_runner.h"
#include "engine/parallel/device_tp.h"
#include "engine/parallel/zmq_comm.h"
#include "io/safetensors.h"
#include "io/sha256.h"

#ifndef TANDEM_GIT_COMMIT
#define TANDEM_GIT_COMMIT "unknown"
#endif

namespace tandem {

// ---- local worker processes ----

class WorkerProcesses {
 public:
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    bool done = false;
  };

  ~WorkerProcesses() { stop(2.0); }

  // fork + exec of this binary: `tandem tp-worker ...`; the child dies with its parent.
  Status spawn(const std::vector<std::string>& args, int rank) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return make_error(StatusCode::kUnavailable, "fork for rank {}: {}", rank, std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      close_range(3, ~0U, 0);  // not the head's HTTP listener or sockets: only stdio is inherited
      execv(argv[0], argv.data());
      _exit(127);
    }
    std::lock_guard<std::mutex> lock(mu_);
    children_.push_back({rank, pid, false});
    TLOG_INFO("tp", "started rank {} (pid {})", rank, pid);
    return Status();
  }

  // Starts watching: a child that exits while not stopping calls on_exit(reason) once.
  void watch(std::function<void(const std::string&)> on_exit) {
    on_exit_ = std::move(on_exit);
    thread_ = std::thread([this] {
      while (!quit_) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (Child& c : children_) {
            if (c.done) continue;
            int st = 0;
            if (waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
            c.done = true;
            if (stopping_) continue;
            const std::string why = WIFSIGNALED(st) ? fmt::format("was killed by signal {}", WTERMSIG(st))
                                                    : fmt::format("exited with status {}", WEXITSTATUS(st));
            const std::string msg = fmt::format("rank {} (pid {}) {}", c.rank, c.pid, why);
            first_exit_ = first_exit_.empty() ? msg : first_exit_;
            if (on_exit_) on_exit_(msg);
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }

  void stop_watch() {
    quit_ = true;
    if (thread_.joinable()) thread_.join();
    quit_ = false;
  }
  void expect_exit() { stopping_ = true; }

  std::string first_exit() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_exit_;
  }

  // Waits up to grace_s for the children to exit on their own, then kills them.
  void stop(double grace_s) {
    stopping_ = true;
    quit_ = true;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    for (Child& c : children_) {
      while (!c.done) {
        int st;
        if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
          c.done = true;
          break;
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > grace_s) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &st, 0);
          c.done = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  void terminate_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Child& c : children_)
      if (!c.done) kill(c.pid, SIGTERM);
  }

  // Exit code of run_tp_node: waits until every child exited or one failed.
  int wait_all(const std::function<bool()>& stop_requested) {
    int code = 0;
    for (;;) {
      bool all_done = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (Child& c : children_) {
          if (c.done) continue;
          int st = 0;
          if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
            c.done = true;
            const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (!ok) {
              TLOG_ERROR("tp", "rank {} (pid {}) {}", c.rank, c.pid,
                         WIFSIGNALED(st) ? fmt::format("was killed by signal {}", WTERMSIG(st))
                                         : fmt::format("exited with status {}", WEXITSTATUS(st)));
              code = 1;
            }
          } else {
            all_done = false;
          }
        }
      }
      if (all_done) return code;
      if (code != 0 || stop_requested()) {
        terminate_all();
        stop(5.0);
        return code != 0 ? code : 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  std::mutex mu_;
  std::vector<Child> children_;
  std::thread thread_;
  std::atomic<bool> quit_{false}, stopping_{false};
  std::function<void(const std::string&)> on_exit_;
  std::string first_exit_;
};

namespace {

enum class Op : uint8_t { kAllocate = 1, kForward, kDraftPropose, kShutdown };

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& b) : b_(b) { b_.clear(); }
  template <typename T>
  void put(const T& v) {
    const size_t n = b_.size();
    b_.resize(n + sizeof(T));
    std::memcpy(b_.data() + n, &v, sizeof(T));
  }
  template <typename T>
  void put_span(std::span<const T> v) {
    put<uint64_t>(v.size());
    const size_t n = b_.size();
    b_.resize(n + v.size_bytes());
    if (!v.empty()) std::memcpy(b_.data() + n, v.data(), v.size_bytes());
  }
  void put_str(const std::string& s) { put_span(std::span<const char>(s.data(), s.size())); }

 private:
  std::vector<uint8_t>& b_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  bool ok() const { return ok_; }
  template <typename T>
  T get() {
    T v{};
    if (!ok_ || p_ + sizeof(T) > b_.size()) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, b_.data() + p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  template <typename T>
  void get_vec(std::vector<T>& out) {
    const uint64_t n = get<uint64_t>();
    if (!ok_ || n > (b_.size() - p_) / sizeof(T)) {
      ok_ = false;
      out.clear();
      return;
    }
    out.resize(n);
    if (n) std::memcpy(out.data(), b_.data() + p_, n * sizeof(T));
    p_ += n * sizeof(T);
  }
  std::string get_str() {
    std::vector<char> v;
    get_vec(v);
    return std::string(v.begin(), v.end());
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t p_ = 0;
  bool ok_ = true;
};

// How long ranks may take to load their shards after an allocate (the watchers still catch a
// rank that dies or stops meanwhile).
constexpr auto kLoadTimeout = std::chrono::hours(1);

// A commit as it travels.
struct WireCommit {
  int32_t slot = 0;
  int32_t batch_index = 0;
  int64_t length = 0;
  int64_t context_rows = 0;
  int32_t snapshot = -1;
  int32_t pad = 0;  // no indeterminate bytes on the wire
};

class TpHeadRunner : public ForwardingRunner {
 public:
  // data_path: what carries a CPU rank's collectives (DataComm::path()), for the audit.
  TpHeadRunner(std::unique_ptr<WorkerProcesses> procs, std::unique_ptr<ControlComm> control,
               std::unique_ptr<ModelRunner> inner, std::string data_path = "")
      : ForwardingRunner(std::move(inner)),
        procs_(std::move(procs)),
        control_(std::move(control)),
        data_path_(std::move(data_path)) {}

  ~TpHeadRunner() override {
    // Tell the workers to exit; then give the local ones a moment before killing them.
    if (procs_) procs_->expect_exit();
    if (control_->failure().empty()) {
      begin_plan(Op::kShutdown);
      (void)send();
    }
    inner_.reset();  // the model's data plane is the same communicator: the model goes first
    if (procs_) procs_->stop(5.0);
    control_.reset();
  }


  Status allocate(const RunnerAllocation& a) override {
    Writer w = begin_plan(Op::kAllocate);
    w.put(a.num_blocks);
    w.put(a.block_size);
    w.put(a.max_slots);
    w.put(a.max_tokens_per_step);
    w.put(a.max_verify_tokens);
    w.put(a.num_draft_tokens);  // K: every rank drafts the same number of tokens (the collectives' sizes)
    w.put_str(a.kv_cache_dtype);
    w.put(a.num_snapshots);
    TANDEM_RETURN_IF_ERROR(send());
    TANDEM_RETURN_IF_ERROR(inner_->allocate(a));
    Status st = control_->barrier(kLoadTimeout);  // every rank has its shard before the first step
    if (!st.ok()) return st.with_context("waiting for the other ranks to load their shards");
    return Status();
  }

  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    Writer w = begin_plan(Op::kForward);
    w.put<uint32_t>(static_cast<uint32_t>(batch.size()));
    for (const RunnerSeq& s : batch) {
      w.put(s.slot);
      w.put(s.start_pos);
      w.put(s.sample_rows);
      w.put<uint8_t>(s.collect_taps);
      w.put<uint8_t>(s.reset);
      w.put_span(s.tokens);
      w.put_span(s.block_table);
      w.put(s.restore);
    }
    TANDEM_RETURN_IF_ERROR(send());
    return inner_->forward(batch, samples, out);  // the head samples; the workers only compute
  }

  // Applied here now; the workers get it at the head of the next plan, before that plan's work.
  Status commit(std::span<const SlotCommit> commits) override {
    TANDEM_RETURN_IF_ERROR(health());
    TANDEM_RETURN_IF_ERROR(inner_->commit(commits));
    for (const SlotCommit& c : commits)
      pending_.push_back({c.slot, c.batch_index, c.length, c.context_rows, c.snapshot, 0});
    return Status();
  }

  bool has_draft() const override { return inner_->has_draft(); }
  int num_draft_tokens() const override { return inner_->num_draft_tokens(); }
  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    Writer w = begin_plan(Op::kDraftPropose);
    w.put_span(reqs);
    TANDEM_RETURN_IF_ERROR(send());
    return inner_->draft_propose(reqs, out);
  }

  Status health() const override {
    const std::string f = control_->failure();
    if (f.empty()) return Status();
    return Status(StatusCode::kUnavailable, "tensor parallel group failed: " + f);
  }

  // Rank 0's facts and memory, from its own runner; on the CPU its all-reduce is the ZeroMQ star
  // (a GPU rank's runner reports its device collectives itself).
  DeviceFacts device_facts() const override {
    DeviceFacts f = inner_->device_facts();
    for (KernelPath& k : f.kernels)
      if (k.op_class == "all_reduce" && k.path.rfind("none", 0) == 0 && !data_path_.empty())
        k.path = "cpu:" + data_path_;
    return f;
  }
  void plan_memory(const RunnerAllocation& a, MemoryPlan& plan) const override { inner_->plan_memory(a, plan); }
  int64_t device_allocations_after_start() const override { return inner_->device_allocations_after_start(); }

 private:
  // A plan: the op, then the commits the workers have not applied yet.
  Writer begin_plan(Op op) {
    Writer w(plan_);
    w.put(op);
    w.put_span(std::span<const WireCommit>(pending_));
    pending_.clear();
    return w;
  }
  // A plan that cannot reach every rank fails the call that carries it (and the group, for good).
  Status send() { return control_->broadcast(plan_, 0); }

  std::unique_ptr<WorkerProcesses> procs_;
  std::unique_ptr<ControlComm> control_;
  std::vector<uint8_t> plan_;
  std::vector<WireCommit> pending_;
  std::string data_path_;
};

// Applies plans to `runner` until a shutdown plan (0) or a failure (1).
int worker_loop(ControlComm& comm, ModelRunner& runner) {
  std::vector<uint8_t> plan;
  std::vector<std::vector<int32_t>> toks, tables;
  std::vector<RunnerSeq> seqs;
  RunnerOutput out;
  std::vector<WireCommit> wire;
  std::vector<SlotCommit> commits;
  std::vector<DraftQuery> queries;
  std::vector<DraftProposal> proposals;
  for (;;) {
    Status st = zmq_wait_broadcast(comm, plan);
    if (!st.ok()) {
      TLOG_ERROR("tp", "rank {}: {}", comm.rank(), st.message());
      return 1;
    }
    Reader r(plan);
    const Op op = r.get<Op>();
    r.get_vec(wire);
    if (r.ok() && !wire.empty()) {
      commits.clear();
      for (const WireCommit& c : wire) commits.push_back({c.slot, c.batch_index, c.length, c.context_rows, c.snapshot});
      st = runner.commit(commits);
    }
    // A malformed plan or a failed commit skips the op: reported below.
    if (st.ok() && r.ok()) {
      switch (op) {
        case Op::kShutdown:
          TLOG_INFO("tp", "rank {}: shutdown from the head", comm.rank());
          return 0;
        case Op::kAllocate: {
          RunnerAllocation a;
          a.num_blocks = r.get<int>();
          a.block_size = r.get<int>();
          a.max_slots = r.get<int>();
          a.max_tokens_per_step = r.get<int>();
          a.max_verify_tokens = r.get<int>();
          a.num_draft_tokens = r.get<int>();
          a.kv_cache_dtype = r.get_str();
          a.num_snapshots = r.get<int>();
          if (!r.ok()) break;
          st = runner.allocate(a);
          if (st.ok()) st = comm.barrier(kLoadTimeout);
          break;
        }
        case Op::kForward: {
          const uint32_t n = r.get<uint32_t>();
          if (!r.ok() || n > (1u << 20)) {
            st = data_loss("malformed forward plan");
            break;
          }
          toks.resize(n);
          tables.resize(n);
          seqs.resize(n);
          for (uint32_t i = 0; i < n; ++i) {
            seqs[i].slot = r.get<int>();
            seqs[i].start_pos = r.get<int64_t>();
            seqs[i].sample_rows = r.get<int>();
            seqs[i].collect_taps = r.get<uint8_t>() != 0;
            seqs[i].reset = r.get<uint8_t>() != 0;
            r.get_vec(toks[i]);
            r.get_vec(tables[i]);
            seqs[i].restore = r.get<int>();
            seqs[i].tokens = toks[i];
            seqs[i].block_table = tables[i];
          }
          if (!r.ok()) break;
          st = runner.forward(seqs, nullptr, out);
          break;
        }
        case Op::kDraftPropose:
          r.get_vec(queries);
          if (r.ok()) st = runner.draft_propose(queries, proposals);
          break;
        default:
          st = data_loss("unknown plan op {}", static_cast<int>(op));
      }
    }
    if (st.ok() && !r.ok()) st = data_loss("malformed plan (op {})", static_cast<int>(op));
    if (!st.ok()) {
      TLOG_ERROR("tp", "rank {}: {}", comm.rank(), st.message());
      comm.fail(st.message());
      return 1;
    }
  }
}

// "auto" becomes what this host has, so that every rank gets a concrete device from its
// arguments (the fingerprint refuses a rank on another device).
EngineConfig with_device(const EngineConfig& c) {
  EngineConfig r = c;
  if (r.device == "auto") r.device = cuda_runner_available() ? "cuda" : "cpu";
  return r;
}

// One rank's runner: the CPU model over ZeroMQ, or the CUDA model over the device data plane
// (device_tp.h). Collective: every rank calls it right after its control plane connected.
Result<std::unique_ptr<ModelRunner>> create_rank_runner(const EngineConfig& c, int rank, Comm& comm) {
  if (c.device == "cuda") return create_cuda_rank_runner(c, rank, comm);
  return create_dsv4_runner(c, rank, c.tensor_parallel_size, &comm);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("tandem");
}

std::string short_hash(const std::string& s) { return sha256_hex(s).substr(0, 16); }

Result<std::string> file_hash(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string h, sha256_file_hex(path));
  return h.substr(0, 16);
}

Status validate_layout(const EngineConfig& c) {
  if (c.nnodes < 1) return invalid_argument("--nnodes {} must be >= 1", c.nnodes);
  if (c.node_rank < 0 || c.node_rank >= c.nnodes)
    return invalid_argument("--node-rank {} must be in [0, --nnodes {})", c.node_rank, c.nnodes);
  if (c.tensor_parallel_size % c.nnodes)
    return invalid_argument("--tensor-parallel-size {} is not divisible by --nnodes {} (ranks per node)",
                            c.tensor_parallel_size, c.nnodes);
  return Status();
}

ZmqCommOptions comm_options(const EngineConfig& c, int rank,
                            std::vector<std::pair<std::string, std::string>> fingerprint) {
  ZmqCommOptions o;
  o.rank = rank;
  o.size = c.tensor_parallel_size;
  o.master_addr = c.master_addr;
  o.master_port = c.master_port;
  o.connect_timeout_s = c.distributed_timeout_s;
  o.fingerprint = std::move(fingerprint);
  const int per_node = c.tensor_parallel_size / std::max(c.nnodes, 1);
  for (int r = 0; r < o.size; ++r)
    o.rank_hosts.push_back(r / per_node == 0 ? "this node" : fmt::format("node {}", r / per_node));
  return o;
}

std::vector<std::string> worker_args(const EngineConfig& c, int rank) {
  std::vector<std::string> a = {c.worker_binary.empty() ? self_exe() : c.worker_binary, "tp-worker", "--model", c.model_dir, "--rank", std::to_string(rank),
                                "--tensor-parallel-size", std::to_string(c.tensor_parallel_size), "--nnodes",
                                std::to_string(c.nnodes), "--master-addr", c.master_addr, "--master-port",
                                std::to_string(c.master_port), "--threads", std::to_string(c.num_threads),
                                "--max-num-seqs", std::to_string(c.max_num_seqs), "--max-num-batched-tokens",
                                std::to_string(c.max_num_batched_tokens), "--block-size", std::to_string(c.block_size),
                                "--kv-cache-dtype", c.kv_cache_dtype, "--device", c.device, "--distributed-timeout",
                                fmt::format("{}", c.distributed_timeout_s)};
  if (c.device == "cuda") {
    for (const std::string& f : {std::string("--tp-collectives"), c.tp_collectives, std::string("--tp-peer-max-bytes"),
                                 std::to_string(c.tp_peer_max_bytes)})
      a.push_back(f);
    if (!c.nccl_library.empty()) a.insert(a.end(), {"--nccl-library", c.nccl_library});
    if (c.tp_share_gpus) a.push_back("--tp-share-gpus");
  }
  if (!c.speculative.method.empty()) {
    a.push_back("--speculative-config");
    a.push_back(fmt::format(R"({{"method":"{}","num_speculative_tokens":{}}})", c.speculative.method,
                            c.speculative.num_speculative_tokens));
  }
  return a;
}

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> tp_fingerprint(const EngineConfig& c) {
  std::vector<std::pair<std::string, std::string>> fp;
  fp.emplace_back("build.version", version_string());
  fp.emplace_back("build.commit", TANDEM_GIT_COMMIT);
#ifdef NDEBUG
  const char* type = "release";
#else
  const char* type = "debug";
#endif
#ifdef TANDEM_HAVE_CUDA
  const char* cuda = "cuda";
#else
  const char* cuda = "cpu-only";
#endif
  fp.emplace_back("build.flags", fmt::format("{} {} gcc-compatible {}", type, cuda, __VERSION__));
  TANDEM_ASSIGN_OR_RETURN(std::string cfg_hash, file_hash(c.model_dir + "/config.json"));
  fp.emplace_back("checkpoint.config", cfg_hash);
  TANDEM_ASSIGN_OR_RETURN(std::string tok_hash, file_hash(c.model_dir + "/tokenizer.json"));
  fp.emplace_back("checkpoint.tokenizer", tok_hash);
  std::string revision = "none";
  if (std::ifstream f(c.model_dir + "/REVISION"); f) {
    std::getline(f, revision);
    if (revision.empty()) revision = "(empty)";
  }
  fp.emplace_back("checkpoint.revision", revision);
  // Structure: every tensor's name, dtype and shape (the headers only; no weight bytes are read).
  auto ck = Checkpoint::open(c.model_dir);
  if (!ck.ok()) return ck.status().with_context("loading " + c.model_dir);
  std::string s;
  for (const auto& [name, t] : (*ck)->tensors()) {
    s += name + ' ' + dtype_name(t->dtype);
    for (int64_t d : t->shape) s += ' ' + std::to_string(d);
    s += '\n';
  }
  fp.emplace_back("checkpoint.structure", fmt::format("{} tensors, {}", (*ck)->tensors().size(), short_hash(s)));
  fp.emplace_back("flag.tensor_parallel_size", std::to_string(c.tensor_parallel_size));
  fp.emplace_back("flag.nnodes", std::to_string(c.nnodes));
  fp.emplace_back("flag.max_num_seqs", std::to_string(c.max_num_seqs));
  fp.emplace_back("flag.max_num_batched_tokens", std::to_string(c.max_num_batched_tokens));
  fp.emplace_back("flag.block_size", std::to_string(c.block_size));
  fp.emplace_back("flag.kv_cache_dtype", c.kv_cache_dtype);
  fp.emplace_back("flag.device", c.device);
  if (c.device == "cuda")
    fp.emplace_back("flag.tp_collectives", fmt::format("{} peer<={} share_gpus={}", c.tp_collectives,
                                                       c.tp_peer_max_bytes, c.tp_share_gpus ? "on" : "off"));
  fp.emplace_back("flag.speculative", c.speculative.method.empty()
                                          ? std::string("off")
                                          : fmt::format("{} k={}", c.speculative.method,
                                                        c.speculative.num_speculative_tokens));
  return fp;
}

Result<std::unique_ptr<ModelRunner>> create_tp_head_runner(const EngineConfig& config) {
  const EngineConfig c = with_device(config);
  TANDEM_RETURN_IF_ERROR(validate_layout(c));
  if (c.node_rank != 0) return invalid_argument("--node-rank {}: only node 0 serves", c.node_rank);
  // On GPUs: this node has a GPU for each of its ranks (checked before any worker starts).
  if (c.device == "cuda") TANDEM_RETURN_IF_ERROR(tp_device_for_rank(c, c.tensor_parallel_size / c.nnodes - 1).status());
  TANDEM_ASSIGN_OR_RETURN(auto fp, tp_fingerprint(c));
  auto procs = std::make_unique<WorkerProcesses>();
  const int per_node = c.tensor_parallel_size / c.nnodes;
  for (int r = 1; r < per_node; ++r) TANDEM_RETURN_IF_ERROR(procs->spawn(worker_args(c, r), r));
  procs->watch(nullptr);
  ZmqCommOptions o = comm_options(c, 0, std::move(fp));
  WorkerProcesses* pp = procs.get();
  o.abort_check = [pp] { return pp->first_exit(); };
  TLOG_INFO("tp", "rank 0 of {} ({} per node, {} nodes): waiting for the other ranks on {}:{}",
            c.tensor_parallel_size, per_node, c.nnodes, c.master_addr, c.master_port);
  auto comm = create_zmq_comm(o);
  if (!comm.ok()) return comm.status();
  Comm* cp = comm->get();
  procs->stop_watch();
  procs->watch([cp](const std::string& why) { cp->fail(why); });
  // One communicator, two planes: the runner's plans on its control plane, the model's
  // activations' collectives on its data plane (the CPU model's: this communicator; a GPU rank's:
  // its device data plane, device_tp.h).
  auto inner = create_rank_runner(c, 0, *cp);
  if (!inner.ok()) return inner.status();
  TLOG_INFO("tp", "all {} ranks connected and matching", c.tensor_parallel_size);
  const std::string data_path = cp->path();
  return std::unique_ptr<ModelRunner>(
      new TpHeadRunner(std::move(procs), std::move(*comm), std::move(*inner), data_path));
}

std::unique_ptr<ModelRunner> make_tp_head_runner(std::unique_ptr<ControlComm> control,
                                                 std::unique_ptr<ModelRunner> local) {
  return std::make_unique<TpHeadRunner>(nullptr, std::move(control), std::move(local));
}

int tp_worker_loop(ControlComm& control, ModelRunner& runner) { return worker_loop(control, runner); }

int run_tp_worker_process(const EngineConfig& config, int rank) {
  const EngineConfig c = with_device(config);
  Status st = validate_layout(c);
  if (st.ok() && (rank < 1 || rank >= c.tensor_parallel_size))
    st = invalid_argument("--rank {} must be in [1, --tensor-parallel-size {})", rank, c.tensor_parallel_size);
  auto fp = st.ok() ? tp_fingerprint(c) : Result<std::vector<std::pair<std::string, std::string>>>(st);
  if (!fp.ok()) {
    TLOG_ERROR("tp", "rank {}: {}", rank, fp.status().message());
    return 1;
  }
  auto comm = create_zmq_comm(comm_options(c, rank, std::move(*fp)));
  if (!comm.ok()) {
    TLOG_ERROR("tp", "rank {}: {}", rank, comm.status().message());
    return 1;
  }
  auto runner = create_rank_runner(c, rank, **comm);
  if (!runner.ok()) {
    TLOG_ERROR("tp", "rank {}: {}", rank, runner.status().message());
    (*comm)->fail(runner.status().message());
    return 1;
  }
  TLOG_INFO("tp", "rank {} of {} joined the head at {}:{}", rank, c.tensor_parallel_size, c.master_addr,
            c.master_port);
  const int code = worker_loop(**comm, **runner);
  runner->reset();
  return code;
}

int run_tp_node(const EngineConfig& config, const std::function<bool()>& stop_requested) {
  const EngineConfig c = with_device(config);
  return run_tp_node_ranks(c, [&c](int r) { return worker_args(c, r); }, stop_requested);
}

int run_tp_node_ranks(const EngineConfig& c, const TpRankArgs& args_for, const std::function<bool()>& stop_requested) {
  Status st = validate_layout(c);
  if (!st.ok()) {
    TLOG_ERROR("tp", "{}", st.message());
    return 1;
  }
  WorkerProcesses procs;
  const int per_node = c.tensor_parallel_size / c.nnodes;
  for (int r = c.node_rank * per_node; r < (c.node_rank + 1) * per_node; ++r) {
    st = procs.spawn(args_for(r), r);
    if (!st.ok()) {
      TLOG_ERROR("tp", "{}", st.message());
      return 1;
    }
  }
  TLOG_INFO("tp", "node {} of {}: ranks {}..{} started; head at {}:{}", c.node_rank, c.nnodes, c.node_rank * per_node,
            (c.node_rank + 1) * per_node - 1, c.master_addr, c.master_port);
  return procs.wait_all(stop_requested);
}

// ---- same-program groups (tandem logits) ----

std::string tp_worker_binary(const EngineConfig& c) { return c.worker_binary.empty() ? self_exe() : c.worker_binary; }

TpGroup::TpGroup(std::unique_ptr<WorkerProcesses> procs, std::unique_ptr<Comm> comm)
    : procs_(std::move(procs)), comm_(std::move(comm)) {}

TpGroup::~TpGroup() {
  if (procs_) {
    procs_->expect_exit();
    procs_->stop(10.0);  // they finish the same calls as this rank
  }
  comm_.reset();
}

Result<std::unique_ptr<TpGroup>> join_tp_group(const EngineConfig& c, int rank, const TpRankArgs& args_for) {
  TANDEM_RETURN_IF_ERROR(validate_layout(c));
  if (rank < 0 || rank >= c.tensor_parallel_size)
    return invalid_argument("rank {} outside --tensor-parallel-size {}", rank, c.tensor_parallel_size);
  if (c.device == "cuda") TANDEM_RETURN_IF_ERROR(tp_device_for_rank(c, c.tensor_parallel_size / c.nnodes - 1).status());
  TANDEM_ASSIGN_OR_RETURN(auto fp, tp_fingerprint(c));
  std::unique_ptr<WorkerProcesses> procs;
  ZmqCommOptions o = comm_options(c, rank, std::move(fp));
  if (rank == 0) {
    procs = std::make_unique<WorkerProcesses>();
    for (int r = 1; r < c.tensor_parallel_size / c.nnodes; ++r) TANDEM_RETURN_IF_ERROR(procs->spawn(args_for(r), r));
    procs->watch(nullptr);
    WorkerProcesses* pp = procs.get();
    o.abort_check = [pp] { return pp->first_exit(); };
  }
  auto comm = create_zmq_comm(o);
  if (!comm.ok()) return comm.status();
  if (procs) {
    Comm* cp = comm->get();
    procs->stop_watch();
    procs->watch([cp](const std::string& why) { cp->fail(why); });
  }
  return std::make_unique<TpGroup>(std::move(procs), std::move(comm).value());
}

}  // namespace tandem
