// DeviceComm (device_comm.h): start-up (facts exchanged over the control plane, the paths created
// in the same order on every rank, each creation ending in an agreement round so that every rank
// reaches the same routing table), the routing of each call, the eager warm-up, and the watchdog
// that turns a lost peer, an NCCL error, a timed-out peer wait or an overlong step into an abort.
#include "model/cuda/device_comm.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "model/cuda/device_comm_impl.h"

namespace tandem {

const char* comm_path_name(CommPath p) {
  switch (p) {
    case CommPath::kStandin: return "standin";
    case CommPath::kPeerOneShot: return "peer-oneshot";
    case CommPath::kNcclSymmetric: return "nccl-symmetric";
    case CommPath::kNccl: return "nccl";
  }
  return "?";
}
const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kBroadcast: return "broadcast";
  }
  return "?";
}

namespace devcomm {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  return make_error(StatusCode::kUnavailable, "{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// ---- control-plane helpers ----

Result<std::vector<std::vector<uint8_t>>> control_all_gather(ControlComm& control, const std::vector<uint8_t>& mine) {
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(control.size()));
  for (int r = 0; r < control.size(); ++r) {
    std::vector<uint8_t> b;
    if (r == control.rank()) b = mine;
    TANDEM_RETURN_IF_ERROR(control.broadcast(b, r));
    all[static_cast<size_t>(r)] = std::move(b);
  }
  return all;
}

Result<bool> control_all_agree(ControlComm& control, bool ok, const std::string& reason, std::string* why) {
  const std::string m = std::string(1, ok ? '\1' : '\0') + (ok ? std::string() : reason);
  const std::vector<uint8_t> mine(m.begin(), m.end());
  TANDEM_ASSIGN_OR_RETURN(auto all, control_all_gather(control, mine));
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == 1) continue;
    if (why) *why = fmt::format("rank {}: {}", r, all[r].empty() ? std::string("(no answer)")
                                                                    : std::string(all[r].begin() + 1, all[r].end()));
    return false;
  }
  return true;
}

// ---- one rank ----

namespace {

class StandinComm : public PathComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string path() const override { return comm_path_name(kind()); }
  CommPath kind() const override { return CommPath::kStandin; }
  Status all_reduce_sum(void*, size_t, CommDtype, CommStream) override { return Status(); }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    if (in == out || bytes == 0) return Status();
    return cuda_status(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
                       "cudaMemcpyAsync (all_gather of one rank)");
  }
  Status broadcast(void*, size_t, int, CommStream) override { return Status(); }
  std::string failure() const override { return ""; }
  void abort() override {}
};

}  // namespace

Result<std::unique_ptr<PathComm>> create_standin_comm(int) { return std::unique_ptr<PathComm>(new StandinComm()); }

}  // namespace devcomm

namespace {

using namespace devcomm;
using Clock = std::chrono::steady_clock;

std::string format_size(size_t b) {
  if (b == SIZE_MAX) return "any size";
  if (b >= (size_t{1} << 20) && b % (size_t{1} << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

// ---- facts ----

std::string host_identity() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(name) + "/" + boot;
}

Result<RankFacts> local_facts(const DeviceCommOptions& o) {
  RankFacts f;
  f.rank = o.rank;
  f.device = o.device;
  f.host = host_identity();
  char bus[64] = {0};
  TANDEM_RETURN_IF_ERROR(cuda_status(cudaDeviceGetPCIBusId(bus, sizeof bus, o.device), "cudaDeviceGetPCIBusId"));
  f.pci_bus = bus;
  cudaDeviceProp p{};
  TANDEM_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&p, o.device), "cudaGetDeviceProperties"));
  std::string u = "GPU-";
  for (int i = 0; i < 16; ++i) u += fmt::format("{:02x}", static_cast<uint8_t>(p.uuid.bytes[i]));
  f.gpu_uuid = u;
  f.gpu_name = p.name;
  return f;
}

std::vector<uint8_t> serialize(const RankFacts& f, const DeviceCommOptions& o) {
  // The options every rank must share ride along, so a mismatch is refused by name.
  const std::string s =
      fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{} {} {} {}", f.rank, f.device, f.host, f.pci_bus, f.gpu_uuid, f.gpu_name,
                  o.paths, o.max_peer_bytes, o.shared_gpus ? 1 : 0, o.try_symmetric_anywhere ? 1 : 0);
  return std::vector<uint8_t>(s.begin(), s.end());
}

bool parse(const std::vector<uint8_t>& b, RankFacts& f, std::string& shared_opts) {
  std::vector<std::string> v;
  std::stringstream in(std::string(b.begin(), b.end()));
  std::string line;
  while (std::getline(in, line)) v.push_back(line);
  if (v.size() != 7) return false;
  f.rank = std::atoi(v[0].c_str());
  f.device = std::atoi(v[1].c_str());
  f.host = v[2];
  f.pci_bus = v[3];
  f.gpu_uuid = v[4];
  f.gpu_name = v[5];
  shared_opts = v[6];
  return true;
}

// NCCL reads its environment once, at its first call: set before loading it.
void set_nccl_env(const DeviceCommOptions& o, const std::string& host) {
  // NVLink multicast (NVLS) stays off in every process: see device_comm.h.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (!o.shared_gpus) return;
  // Test mode: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"); with a
  // host id of its own per rank it treats them as hosts and talks over loopback sockets.
  setenv("NCCL_HOSTID", fmt::format("tandem-rank{}-{}", o.rank, std::hash<std::string>()(host)).c_str(), 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
}

class DeviceCommImpl final : public DeviceComm {
 public:
  DeviceCommImpl(DeviceCommOptions o, ControlComm* control) : o_(std::move(o)), control_(control) {}

  ~DeviceCommImpl() override {
    stop_ = true;
    if (watch_.joinable()) watch_.join();
    // Every rank's last kernels read rank 0's exchange region: nobody frees before every rank's
    // device is idle (a bounded barrier; skipped once the group failed, when a peer may be gone).
    if (peer_ && control_ && !failed_ && control_->failure().empty()) {
      cudaDeviceSynchronize();
      cudaGetLastError();
      (void)control_->barrier(std::chrono::seconds(5));
    }
    // NCCL first: its abort drops the symmetric window before the window's memory is freed, and
    // no shutdown waits on a peer that already left.
    if (nccl_) nccl_->abort();
    if (peer_) peer_->abort();
    sym_.reset();
    peer_.reset();
    nccl_.reset();
    standin_.reset();
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  std::string path() const override {
    std::string s;
    for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kBroadcast}) {
      s += fmt::format("{}{}:", s.empty() ? "" : "; ", comm_op_name(op));
      bool first = true;
      for (const CommRoute& r : routes_) {
        if (r.op != op) continue;
        s += fmt::format("{} {}{}", first ? "" : ",", comm_path_name(r.path),
                         r.max_bytes == SIZE_MAX ? "" : " (<= " + format_size(r.max_bytes) + ")");
        first = false;
      }
    }
    return s;
  }

  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) override {
    TANDEM_RETURN_IF_ERROR(usable());
    if (count == 0) return Status();
    if (!data) return invalid_argument("all_reduce_sum: null data for {} elements", count);
    return checked(
        by(route(CommOp::kAllReduce, count * comm_dtype_bytes(dtype)))->all_reduce_sum(data, count, dtype, stream));
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    TANDEM_RETURN_IF_ERROR(usable());
    if (bytes == 0) return Status();
    if (!in || !out) return invalid_argument("all_gather: null buffer for {} bytes", bytes);
    return checked(by(route(CommOp::kAllGather, bytes))->all_gather(in, bytes, out, stream));
  }
  Status broadcast(void* data, size_t bytes, int root, CommStream stream) override {
    TANDEM_RETURN_IF_ERROR(usable());
    if (root < 0 || root >= o_.size) return invalid_argument("broadcast: root {} outside [0, {})", root, o_.size);
    if (bytes == 0) return Status();
    if (!data) return invalid_argument("broadcast: null data for {} bytes", bytes);
    return checked(by(route(CommOp::kBroadcast, bytes))->broadcast(data, bytes, root, stream));
  }

  CommPath route(CommOp op, size_t bytes) const override {
    for (const CommRoute& r : routes_)
      if (r.op == op && bytes <= r.max_bytes) return r.path;
    return CommPath::kNccl;  // every table ends with an any-size row; not reached
  }
  std::vector<CommRoute> routes() const override { return routes_; }
  std::string topology() const override { return topology_; }
  std::vector<std::pair<CommPath, std::string>> unavailable() const override { return unavailable_; }
  DataComm* path_comm(CommPath p) override { return by(p); }
  size_t device_bytes() const override {
    size_t b = 0;
    for (PathComm* p : {standin_.get(), peer_.get(), sym_.get(), nccl_.get()})
      if (p) b += p->device_bytes();
    return b;
  }

  std::string failure() const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) return failure_;
    }
    // Between the watchdog's polls: what a path already knows.
    for (PathComm* p : {peer_.get(), nccl_.get()})
      if (p) {
        std::string f = p->failure();
        if (!f.empty()) return f;
      }
    return "";
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) return;
      failure_ = reason;
      failed_ = true;
    }
    TLOG_ERROR("comm", "rank {}: device collectives failed: {}", o_.rank, reason);
    for (PathComm* p : {peer_.get(), sym_.get(), nccl_.get()})
      if (p) p->abort();
    if (control_) control_->fail(reason);
  }

  void step_begin() override {
    step_start_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count() | 1;
  }
  void step_end() override { step_start_ns_ = 0; }

  // ---- start-up (create_device_comm) ----
  Status start(const std::vector<RankFacts>& facts);
  Status set_one_rank();

 private:
  // kUnavailable once the group failed. A path's own failure (NCCL's asynchronous error, a peer
  // wait that timed out) fails the group here at once rather than at the watchdog's next poll, so
  // no call after a failure reaches a path (comm.h: every later call fails fast).
  Status usable() {
    if (!failed_)
      for (PathComm* p : {peer_.get(), nccl_.get()}) {
        if (!p) continue;
        const std::string f = p->failure();
        if (f.empty()) continue;
        abort(f);
        break;
      }
    if (!failed_) return Status();
    return Status(StatusCode::kUnavailable, "tensor parallel group failed: " + failure());
  }
  // A path call's error: the group's failure when a path failed (NCCL reports a lost peer through
  // the call as well as asynchronously), else the call's own error.
  Status checked(Status st) {
    if (st.ok()) return st;
    Status u = usable();
    return u.ok() ? st : u;
  }
  PathComm* by(CommPath p) const {
    switch (p) {
      case CommPath::kStandin: return standin_.get();
      case CommPath::kPeerOneShot: return peer_.get();
      case CommPath::kNcclSymmetric: return sym_.get();
      case CommPath::kNccl: return nccl_.get();
    }
    return nullptr;
  }
  void build_routes();
  Status renew_failed_nccl(ControlComm& control);
  Status warm_up();
  void watch();

  DeviceCommOptions o_;
  ControlComm* control_;
  std::unique_ptr<PathComm> standin_, peer_, sym_, nccl_;
  std::vector<CommRoute> routes_;
  std::string topology_;
  std::vector<std::pair<CommPath, std::string>> unavailable_;
  mutable std::mutex mu_;
  std::string failure_;
  std::atomic<bool> failed_{false}, stop_{false};
  std::atomic<int64_t> step_start_ns_{0};
  std::atomic<double> step_limit_s_{0.0};
  std::thread watch_;
};

Status DeviceCommImpl::set_one_rank() {
  TANDEM_ASSIGN_OR_RETURN(standin_, create_standin_comm(o_.device));
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kBroadcast})
    routes_.push_back({op, SIZE_MAX, CommPath::kStandin});
  topology_ = fmt::format("one rank on GPU {}", o_.device);
  return Status();
}

Status DeviceCommImpl::start(const std::vector<RankFacts>& facts) {
  ControlComm& control = *control_;
  bool one_host = true, shared = false;
  for (const RankFacts& f : facts) {
    one_host = one_host && f.host == facts[0].host;
    for (const RankFacts& g : facts)
      if (g.rank < f.rank && g.gpu_uuid == f.gpu_uuid && g.host == f.host) shared = true;
  }
  std::vector<std::string> hosts;
  for (const RankFacts& f : facts)
    if (std::find(hosts.begin(), hosts.end(), f.host) == hosts.end()) hosts.push_back(f.host);

  TANDEM_ASSIGN_OR_RETURN(nccl_, create_nccl_comm(o_, control));

  const bool want_peer = o_.paths == "auto" || o_.paths == "peer";
  if (want_peer) {
    std::string no;
    if (o_.size > kMaxPeerRanks) no = fmt::format("{} ranks (the path serves up to {})", o_.size, kMaxPeerRanks);
    else if (!one_host) no = fmt::format("the ranks are on {} hosts", hosts.size());
    if (no.empty()) {
      auto p = create_peer_comm(o_, facts, control);
      if (p.ok()) peer_ = std::move(p).value();
      else no = p.status().message();
    }
    if (!peer_) {
      if (o_.paths == "peer") return make_error(StatusCode::kUnavailable, "--tp-collectives peer: {}", no);
      unavailable_.push_back({CommPath::kPeerOneShot, no});
    }
  }
  const bool want_sym = o_.paths == "auto" || o_.paths == "symmetric";
  if (want_sym) {
    std::string no;
    if (!one_host) no = fmt::format("the ranks are on {} hosts (NCCL's symmetric kernels need one NVLink domain)", hosts.size());
    else if (shared) no = "ranks share a GPU (test mode: NCCL sees separate hosts and uses its network transport)";
    if (no.empty() || o_.try_symmetric_anywhere) {
      auto s = create_symmetric_comm(*nccl_, o_, control);
      if (s.ok()) {
        sym_ = std::move(s).value();
      } else {
        no = s.status().message() + (no.empty() ? "" : " [" + no + "]");
        TANDEM_RETURN_IF_ERROR(renew_failed_nccl(control));
      }
    }
    if (!sym_) {
      if (o_.paths == "symmetric") return make_error(StatusCode::kUnavailable, "--tp-collectives symmetric: {}", no);
      unavailable_.push_back({CommPath::kNcclSymmetric, no});
    }
  }
  build_routes();
  std::string gpus;
  for (const RankFacts& f : facts) gpus += fmt::format("{}{} {}", gpus.empty() ? "" : ", ", f.pci_bus, f.gpu_name);
  topology_ = fmt::format("{} ranks on {} host{}{}; GPUs: {}; {}", o_.size, hosts.size(), hosts.size() == 1 ? "" : "s",
                          shared ? ", sharing GPUs (test mode)" : "", gpus, nccl_description(*nccl_));
  // The watchdog runs from here on: a rank that fails its warm-up must not leave the others
  // waiting in a collective (the warm-up is bounded like a step of init_timeout_s).
  step_limit_s_ = o_.init_timeout_s;
  watch_ = std::thread([this] { watch(); });
  step_begin();
  Status st = warm_up();
  step_end();
  step_limit_s_ = o_.step_timeout_s;
  TANDEM_RETURN_IF_ERROR(st);
  TLOG_INFO("comm", "rank {}: {}", o_.rank, topology_);
  TLOG_INFO("comm", "rank {}: collectives: {}", o_.rank, path());
  for (const auto& [p, why] : unavailable_) TLOG_INFO("comm", "rank {}: {} not used: {}", o_.rank, comm_path_name(p), why);
  return Status();
}

// A window NCCL refused may have failed its communicator for good (on a non-blocking one the
// registration runs as a group job whose error becomes the communicator's sticky asynchronous
// error): then every rank replaces it (collective, like the first; every rank learns whether any
// rank's communicator failed).
Status DeviceCommImpl::renew_failed_nccl(ControlComm& control) {
  const std::string f = nccl_->failure();
  std::string why;
  TANDEM_ASSIGN_OR_RETURN(bool all_ok, control_all_agree(control, f.empty(), f, &why));
  if (all_ok) return Status();
  TLOG_WARN("comm", "rank {}: the refused window failed NCCL's communicator ({}); starting a new one", o_.rank, why);
  nccl_->abort();
  nccl_.reset();
  TANDEM_ASSIGN_OR_RETURN(nccl_, create_nccl_comm(o_, control));
  return Status();
}

void DeviceCommImpl::build_routes() {
  const size_t cap = o_.max_peer_bytes;
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kBroadcast}) {
    if (o_.paths == "peer") {
      routes_.push_back({op, SIZE_MAX, CommPath::kPeerOneShot});
      continue;
    }
    if (o_.paths == "symmetric" && op == CommOp::kAllReduce) {
      routes_.push_back({op, SIZE_MAX, CommPath::kNcclSymmetric});
      continue;
    }
    if (o_.paths == "auto") {
      // Decode-sized messages: the one-shot path (one kernel, no proxy); where it is missing, the
      // symmetric window for all-reduces. Not tuned yet on two GPUs (issue 22: correct first).
      if (peer_) routes_.push_back({op, cap, CommPath::kPeerOneShot});
      else if (sym_ && op == CommOp::kAllReduce) routes_.push_back({op, cap, CommPath::kNcclSymmetric});
    }
    routes_.push_back({op, SIZE_MAX, CommPath::kNccl});
  }
}

// Every size class once, eagerly, through the routing table: NCCL connects lazily and picks its
// algorithm and protocol by size, so graph capture must never be a path's first use.
Status DeviceCommImpl::warm_up() {
  constexpr size_t kMax = size_t{16} << 20;
  cudaStream_t s = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  Status st = cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate (warm-up)");
  if (st.ok()) st = cuda_status(cudaMalloc(&a, kMax), "cudaMalloc (warm-up)");
  if (st.ok()) st = cuda_status(cudaMalloc(&b, kMax), "cudaMalloc (warm-up)");
  if (st.ok()) st = cuda_status(cudaMemsetAsync(a, 0, kMax, s), "cudaMemsetAsync");
  if (st.ok()) st = cuda_status(cudaMemsetAsync(b, 0, kMax, s), "cudaMemsetAsync");
  for (size_t n = 256; st.ok() && n <= kMax; n *= 4) {
    st = all_reduce_sum(b, n / 4, CommDtype::kF32, s);
    if (st.ok()) st = all_reduce_sum(b, n / 2, CommDtype::kBf16, s);
    const size_t g = std::max<size_t>(16, n / static_cast<size_t>(o_.size) / 16 * 16);
    if (st.ok()) st = all_gather(a, g, b, s);
    if (st.ok()) st = broadcast(a, n, 0, s);
  }
  if (s) {
    const Status sync = cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize (warm-up)");
    if (st.ok()) st = sync;
  }
  if (st.ok()) {
    const std::string f = failure();
    if (!f.empty()) st = Status(StatusCode::kUnavailable, f);
  }
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  if (s) cudaStreamDestroy(s);
  return st.with_context("warming up the collectives");
}

void DeviceCommImpl::watch() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (failed_) continue;
    std::string why;
    if (control_) {
      const std::string f = control_->failure();
      if (!f.empty()) why = "the group failed: " + f;
    }
    for (PathComm* p : {peer_.get(), nccl_.get()})
      if (why.empty() && p) why = p->failure();
    const int64_t t0 = step_start_ns_;
    const double limit = step_limit_s_;
    if (why.empty() && t0 != 0 && limit > 0) {
      const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
      const double waited = static_cast<double>(now - t0) * 1e-9;
      if (waited > limit)
        why = fmt::format("rank {}: a step has waited {:.1f} s on the device (limit {:.0f} s): a collective is hanging",
                          o_.rank, waited, limit);
    }
    if (!why.empty()) abort(why);
  }
}

}  // namespace

Result<std::unique_ptr<DeviceComm>> create_device_comm(const DeviceCommOptions& options, ControlComm* control) {
  DeviceCommOptions o = options;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    return invalid_argument("device comm: rank {} outside a group of {}", o.rank, o.size);
  if (o.paths != "auto" && o.paths != "nccl" && o.paths != "peer" && o.paths != "symmetric")
    return invalid_argument("--tp-collectives '{}' must be auto, nccl, peer or symmetric", o.paths);
  if (o.max_peer_bytes < 4096 || o.max_peer_bytes > (size_t{1} << 30))
    return invalid_argument("--tp-peer-max-bytes {} must be in [4096, 1 GiB]", o.max_peer_bytes);
  o.max_peer_bytes = (o.max_peer_bytes + 4095) / 4096 * 4096;
  if (!(o.peer_timeout_s > 0) || !(o.init_timeout_s > 0) || o.step_timeout_s < 0)
    return invalid_argument("device comm: timeouts must be positive");
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cudaGetLastError();
    return make_error(StatusCode::kUnavailable, "tensor parallelism on GPUs: no CUDA device is visible");
  }
  if (o.device < 0 || o.device >= ndev)
    return invalid_argument("rank {} needs CUDA device {}, but {} {} visible", o.rank, o.device, ndev,
                            ndev == 1 ? "is" : "are");
  TANDEM_RETURN_IF_ERROR(cuda_status(cudaSetDevice(o.device), "cudaSetDevice"));
  auto c = std::make_unique<DeviceCommImpl>(o, control);
  if (o.size == 1) {
    TANDEM_RETURN_IF_ERROR(c->set_one_rank());
    return std::unique_ptr<DeviceComm>(std::move(c));
  }
  if (!control || control->size() != o.size || control->rank() != o.rank)
    return invalid_argument("device comm: rank {} of {} needs the control plane of the same group", o.rank, o.size);

  // Facts (and the options every rank must share) from every rank.
  auto mine = local_facts(o);
  if (!mine.ok()) return mine.status();
  TANDEM_ASSIGN_OR_RETURN(auto all, control_all_gather(*control, serialize(*mine, o)));
  std::vector<RankFacts> facts(all.size());
  std::string opts0;
  for (size_t r = 0; r < all.size(); ++r) {
    std::string opts;
    if (!parse(all[r], facts[r], opts)) return make_error(StatusCode::kDataLoss, "rank {} sent malformed facts", r);
    if (r == 0) opts0 = opts;
    else if (opts != opts0)
      return make_error(StatusCode::kFailedPrecondition,
                        "rank {} has collective options '{}' where rank 0 has '{}' (--tp-collectives, "
                        "--tp-peer-max-bytes, --tp-share-gpus must match)",
                        r, opts, opts0);
  }
  for (const RankFacts& f : facts)
    for (const RankFacts& g : facts)
      if (g.rank < f.rank && g.host == f.host && g.gpu_uuid == f.gpu_uuid && !o.shared_gpus)
        return make_error(StatusCode::kFailedPrecondition,
                          "ranks {} and {} are both on GPU {} ({}): give every rank of a host its own GPU "
                          "(ranks per node <= visible GPUs); the test-only --tp-share-gpus lets them share",
                          g.rank, f.rank, f.pci_bus, f.gpu_name);

  set_nccl_env(o, mine->host);
  TANDEM_RETURN_IF_ERROR(c->start(facts));
  return std::unique_ptr<DeviceComm>(std::move(c));
}

}  // namespace tandem
