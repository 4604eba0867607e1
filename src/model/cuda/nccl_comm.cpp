// The NCCL paths of the device data plane (device_comm.h): plain NCCL collectives and the
// symmetric-window all-reduce. The communicator is non-blocking (config.blocking = 0): start-up,
// window registration and a collective's first (lazily connecting) enqueue return at once and are
// polled with a time bound, and the watchdog can ncclCommAbort it from its own thread while a
// kernel waits for a lost peer. One mutex serializes every call on the communicator with the
// abort, which frees it.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/check.h"
#include "common/log.h"
#include "model/cuda/device_comm_impl.h"
#include "model/cuda/nccl_lib.h"

namespace tandem::devcomm {

#if TANDEM_HAVE_NCCL_HEADER
namespace {

using Clock = std::chrono::steady_clock;

class NcclComm : public PathComm {
 public:
  NcclComm(const NcclLib& lib, const DeviceCommOptions& o, ControlComm& control)
      : lib_(lib), o_(o), control_(control), stage_bytes_((o.max_peer_bytes + 255) / 256 * 256) {}

  ~NcclComm() override {
    abort();
    if (stage_) cudaFree(stage_);
    cudaGetLastError();
  }

  // Collective: rank 0's unique id over the control plane, then the communicator and the staging
  // buffer. Every rank learns whether every rank succeeded.
  Status init() {
    std::vector<uint8_t> id_msg;
    if (o_.rank == 0) {
      ncclUniqueId id;
      const ncclResult_t r = lib_.GetUniqueId(&id);
      if (r == ncclSuccess) {
        id_msg.assign(1, 1);
        id_msg.insert(id_msg.end(), reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
      } else {
        const std::string why = lib_.error_text(r, nullptr);
        id_msg.assign(1, 0);
        id_msg.insert(id_msg.end(), why.begin(), why.end());
      }
    }
    TANDEM_RETURN_IF_ERROR(control_.broadcast(id_msg, 0));
    if (id_msg.empty() || id_msg[0] != 1 || id_msg.size() != 1 + sizeof(ncclUniqueId))
      return make_error(StatusCode::kUnavailable, "rank 0 could not create the NCCL unique id: {}",
                        std::string(id_msg.begin() + (id_msg.empty() ? 0 : 1), id_msg.end()));
    ncclUniqueId id;
    std::memcpy(&id, id_msg.data() + 1, sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    Status local;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const ncclResult_t r = lib_.CommInitRankConfig(&comm_, o_.size, id, o_.rank, &cfg);
      if (r != ncclSuccess && r != ncclInProgress) {
        local = make_error(StatusCode::kUnavailable, "ncclCommInitRankConfig: {}", lib_.error_text(r, comm_));
        if (comm_) lib_.CommAbort(comm_);
        comm_ = nullptr;
      }
    }
    if (local.ok()) local = wait(ncclInProgress, "NCCL start-up (ncclCommInitRankConfig)");
    if (local.ok()) local = cuda_status(cudaMalloc(&stage_, stage_bytes_), "cudaMalloc (NCCL staging)");
    std::string why;
    TANDEM_ASSIGN_OR_RETURN(bool all_ok, control_all_agree(control_, local.ok(), local.message(), &why));
    if (!all_ok) return make_error(StatusCode::kUnavailable, "NCCL start-up failed: {}", why);
    return Status();
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  std::string path() const override { return comm_path_name(kind()); }
  CommPath kind() const override { return CommPath::kNccl; }
  size_t device_bytes() const override { return stage_bytes_; }

  // fp32 in place; bf16 widened into the fp32 staging buffer chunk by chunk, summed by NCCL in
  // fp32, rounded back once (the contract: sums accumulate in fp32 whatever the element type).
  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == CommDtype::kF32)
      return enqueue([&](ncclComm_t c) { return lib_.AllReduce(data, data, count, ncclFloat32, ncclSum, c, s); },
                     "ncclAllReduce");
    uint16_t* p = static_cast<uint16_t*>(data);
    float* st = static_cast<float*>(stage_);
    const size_t chunk = stage_bytes_ / sizeof(float);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      launch_bf16_to_f32(p + off, st, n, s);
      TANDEM_RETURN_IF_ERROR(enqueue(
          [&](ncclComm_t c) { return lib_.AllReduce(st, st, n, ncclFloat32, ncclSum, c, s); }, "ncclAllReduce"));
      launch_f32_to_bf16(st, p + off, n, s);
    }
    return Status();
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return enqueue([&](ncclComm_t c) { return lib_.AllGather(in, out, bytes, ncclUint8, c, s); }, "ncclAllGather");
  }
  Status broadcast(void* data, size_t bytes, int root, CommStream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return enqueue([&](ncclComm_t c) { return lib_.Broadcast(data, data, bytes, ncclUint8, root, c, s); },
                   "ncclBroadcast");
  }

  std::string failure() const override {
    const std::string group = control_.failure();  // before mu_: never the control plane's lock inside ours
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_.empty() || !comm_) return first_error_;
    ncclResult_t st = ncclSuccess;
    const ncclResult_t q = lib_.CommGetAsyncError(comm_, &st);
    if (q != ncclSuccess) st = q;
    if (st != ncclSuccess && st != ncclInProgress)
      first_error_ = fmt::format("rank {}: NCCL reported {}{}", o_.rank, lib_.error_text(st, comm_), lost_peer(group));
    return first_error_;
  }
  void abort() override {
    aborted_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    if (!comm_) return;
    lib_.CommAbort(comm_);  // releases kernels waiting for a lost peer; frees the communicator
    comm_ = nullptr;
  }

  // One call on the communicator (under the lock), then its completion polled with a bound.
  template <typename F>
  Status enqueue(F&& call, const char* what) {
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!comm_) return make_error(StatusCode::kUnavailable, "{}: the NCCL communicator was aborted", what);
      r = call(comm_);
    }
    return wait(r, what);
  }
  const NcclLib& lib() const { return lib_; }
  const DeviceCommOptions& options() const { return o_; }

 private:
  // Completes the call that returned `r`: polls ncclCommGetAsyncError until it is no longer
  // ncclInProgress (done or failed), giving up after init_timeout_s, on an abort, or when the
  // control plane failed. Polled after ncclSuccess too: on a non-blocking communicator a call may
  // return ncclSuccess with its group job still running (ncclCommWindowRegister does, NCCL 2.28),
  // and the next call on the communicator then fails ("Attempt to use communicator before the
  // previous operation returned ncclSuccess"); the poll also joins NCCL's job thread.
  Status wait(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) {
      std::lock_guard<std::mutex> lock(mu_);
      return make_error(StatusCode::kUnavailable, "{}: {}", what, lib_.error_text(r, comm_));
    }
    const auto t0 = Clock::now();
    for (int spins = 0;; ++spins) {
      ncclResult_t st = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!comm_) return make_error(StatusCode::kUnavailable, "{}: the NCCL communicator was aborted", what);
        const ncclResult_t q = lib_.CommGetAsyncError(comm_, &st);
        if (q != ncclSuccess) st = q;
        if (st != ncclSuccess && st != ncclInProgress)
          return make_error(StatusCode::kUnavailable, "{}: {}", what, lib_.error_text(st, comm_));
      }
      if (st == ncclSuccess) return Status();
      if (aborted_) return make_error(StatusCode::kUnavailable, "{}: aborted", what);
      const std::string f = control_.failure();
      if (!f.empty()) return make_error(StatusCode::kUnavailable, "{}: the group failed: {}", what, f);
      if (std::chrono::duration<double>(Clock::now() - t0).count() > o_.init_timeout_s)
        return make_error(StatusCode::kUnavailable, "{} did not complete within {:.0f} s (a rank is missing?)", what,
                          o_.init_timeout_s);
      if (spins < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Which rank NCCL lost, as far as it can be known: NCCL's asynchronous error says what went
  // wrong ("remote process exited or there was a network error", with a socket address), never
  // which rank. The control plane may already know (the launcher saw a worker exit, a heartbeat
  // stopped: its failure names the rank); in a group of two the peer is the other rank; otherwise
  // the rank is not known yet (the control plane names it when its heartbeat times out).
  std::string lost_peer(const std::string& group) const {
    if (!group.empty()) return fmt::format("; the group: {}", group);
    if (o_.size == 2) return fmt::format("; its only peer is rank {}", 1 - o_.rank);
    return fmt::format("; NCCL does not say which of the {} other ranks failed, and the control plane has lost none yet",
                       o_.size - 1);
  }

  const NcclLib& lib_;
  DeviceCommOptions o_;
  ControlComm& control_;
  size_t stage_bytes_;
  void* stage_ = nullptr;  // fp32 staging for bf16 all-reduces [stage_bytes_]
  mutable std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  mutable std::string first_error_;
};

// All-reduces through a registered symmetric window (NCCL >= 2.27 picks its symmetric kernels for
// buffers inside one), staged by copies (fp32) or conversions (bf16) in chunks of the window.
class SymmetricComm : public PathComm {
 public:
  explicit SymmetricComm(NcclComm& nccl)
      : nccl_(nccl), lib_(nccl.lib()), bytes_((nccl.options().max_peer_bytes + 4095) / 4096 * 4096) {}
  // The composite aborts the NCCL communicator (which drops the window) before destroying this:
  // deregistering is collective and would wait for ranks that may be gone.
  ~SymmetricComm() override {
    if (buf_) lib_.MemFree(buf_);
  }

  // Collective: ncclMemAlloc + ncclCommWindowRegister, then the agreement round. A rank whose
  // NCCL has no windows (`can` false) still takes part in the round, so every rank agrees.
  Status init(ControlComm& control, Status can) {
    Status local = can;
    if (local.ok()) {
      const ncclResult_t r = lib_.MemAlloc(&buf_, bytes_);
      if (r != ncclSuccess) {
        buf_ = nullptr;
        local = make_error(StatusCode::kUnavailable, "ncclMemAlloc({} bytes): {}", bytes_, lib_.error_text(r, nullptr));
      }
    }
    if (local.ok()) {
      local = nccl_.enqueue(
          [&](ncclComm_t c) { return lib_.CommWindowRegister(c, buf_, bytes_, &win_, NCCL_WIN_COLL_SYMMETRIC); },
          "ncclCommWindowRegister");
      registered_ = local.ok();
    }
    std::string why;
    TANDEM_ASSIGN_OR_RETURN(bool all_ok, control_all_agree(control, local.ok(), local.message(), &why));
    if (!all_ok) {
      // Some rank has no window: deregistering here alone would wait for ranks that never call
      // it, so a window registered on this rank stays (and its memory with it) until NCCL ends.
      if (registered_) buf_ = nullptr;
      registered_ = false;
      return make_error(StatusCode::kUnavailable, "NCCL refused the symmetric window: {}", why);
    }
    return Status();
  }

  int rank() const override { return nccl_.rank(); }
  int size() const override { return nccl_.size(); }
  std::string path() const override { return comm_path_name(kind()); }
  CommPath kind() const override { return CommPath::kNcclSymmetric; }
  size_t device_bytes() const override { return bytes_; }

  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    float* w = static_cast<float*>(buf_);
    const size_t chunk = bytes_ / sizeof(float);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      if (dtype == CommDtype::kF32) {
        TANDEM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(w, static_cast<float*>(data) + off, n * sizeof(float),
                                                           cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"));
      } else {
        launch_bf16_to_f32(static_cast<uint16_t*>(data) + off, w, n, s);
      }
      TANDEM_RETURN_IF_ERROR(nccl_.enqueue(
          [&](ncclComm_t c) { return lib_.AllReduce(w, w, n, ncclFloat32, ncclSum, c, s); }, "ncclAllReduce (window)"));
      if (dtype == CommDtype::kF32) {
        TANDEM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(static_cast<float*>(data) + off, w, n * sizeof(float),
                                                           cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"));
      } else {
        launch_f32_to_bf16(w, static_cast<uint16_t*>(data) + off, n, s);
      }
    }
    return Status();
  }
  // Not routed here (the window carries all-reduces only); plain NCCL if called directly.
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    return nccl_.all_gather(in, bytes, out, stream);
  }
  Status broadcast(void* data, size_t bytes, int root, CommStream stream) override {
    return nccl_.broadcast(data, bytes, root, stream);
  }
  std::string failure() const override { return ""; }  // the NCCL path reports the communicator's errors
  void abort() override { registered_ = false; }       // the NCCL path's abort drops the window

 private:
  NcclComm& nccl_;
  const NcclLib& lib_;
  size_t bytes_;
  void* buf_ = nullptr;
  ncclWindow_t win_ = nullptr;
  bool registered_ = false;
};

}  // namespace

Result<std::unique_ptr<PathComm>> create_nccl_comm(const DeviceCommOptions& o, ControlComm& control) {
  auto lib = load_nccl(o.nccl_library);
  std::string why;
  TANDEM_ASSIGN_OR_RETURN(bool all_ok,
                          control_all_agree(control, lib.ok(), lib.ok() ? "" : lib.status().message(), &why));
  if (!all_ok) return make_error(StatusCode::kFailedPrecondition, "{}", why);
  auto c = std::make_unique<NcclComm>(**lib, o, control);
  TANDEM_RETURN_IF_ERROR(c->init());
  return std::unique_ptr<PathComm>(std::move(c));
}

std::string nccl_description(const PathComm& nccl) {
  const auto* n = dynamic_cast<const NcclComm*>(&nccl);
  if (!n) return "no NCCL";
  return fmt::format("NCCL {} ({})", n->lib().version_string(), n->lib().path);
}

Result<std::unique_ptr<PathComm>> create_symmetric_comm(PathComm& nccl, const DeviceCommOptions& o,
                                                        ControlComm& control) {
  auto* n = dynamic_cast<NcclComm*>(&nccl);
  TANDEM_CHECK_MSG(n != nullptr, "create_symmetric_comm needs create_nccl_comm's communicator");
  Status can;
  if (!n->lib().has_windows() || n->lib().version < 22700)
    can = make_error(StatusCode::kUnavailable, "rank {}'s NCCL {} has no symmetric windows (2.27 or newer is needed)",
                     o.rank, n->lib().version_string());
  auto c = std::make_unique<SymmetricComm>(*n);
  TANDEM_RETURN_IF_ERROR(c->init(control, can));
  return std::unique_ptr<PathComm>(std::move(c));
}

#else  // built without nccl.h: every rank has the same build (the start-up fingerprint), so all
       // ranks refuse alike without a control-plane round.

Result<std::unique_ptr<PathComm>> create_nccl_comm(const DeviceCommOptions&, ControlComm&) {
  return make_error(StatusCode::kUnimplemented,
                    "tensor parallelism on GPUs needs NCCL (libnccl.so.2), and this build found no nccl.h "
                    "(install NCCL's headers and rebuild)");
}
std::string nccl_description(const PathComm&) { return "no NCCL"; }
Result<std::unique_ptr<PathComm>> create_symmetric_comm(PathComm&, const DeviceCommOptions&, ControlComm&) {
  return make_error(StatusCode::kUnimplemented, "this build has no NCCL");
}

#endif  // TANDEM_HAVE_NCCL_HEADER

}  // namespace tandem::devcomm
