// The device data plane (DataComm of src/common/comm.h on the GPU): one DeviceComm per rank
// process, created at start-up over the control plane, routing each collective to one of the
// paths below by operation and message size. The routing table is decided at start-up from
// facts every rank exchanges (same host? which GPU? peer access? NCCL version?), so it is the
// same on every rank and for every run, printed at start-up and reported by `tandem audit`.
//
// Paths (each stream-ordered and capturable in a CUDA graph: no host synchronization and no
// allocation inside a call; all calls of one DeviceComm must use one stream):
//  - standin:        one rank: all-reduce and broadcast do nothing, all-gather is a copy.
//  - peer-oneshot:   ranks on one host whose GPUs reach rank 0's GPU (or share one GPU): each
//                    rank copies its input into its part of an exchange region (rank 0's GPU
//                    memory, opened by the others through CUDA IPC), signals every peer with an
//                    epoch flag, waits for theirs, then reads every rank's part and sums in rank
//                    order (rank 0 first, fp32, bf16 rounded once), so every rank gets bitwise the
//                    same result. Epochs live on the device, so a replayed graph needs no host. A
//                    wait is bounded (peer_timeout_s): past it the kernel stops waiting and raises
//                    an error flag the host reads; never a hang. Decode-sized messages (up to
//                    max_peer_bytes per call). The region is rank 0's so that the server never
//                    touches the memory of a worker that died.
//  - nccl-symmetric: NCCL (>= 2.27) on a registered symmetric window, staged through it, where
//                    every rank is on one host on its own GPU with peer access. All-reduce only.
//  - nccl:           NCCL's ring/tree collectives, any size, any topology (NVLink, PCIe, network).
//                    bf16 all-reduces are staged through fp32 so they too accumulate in fp32.
//
// Order of the sums: peer-oneshot sums in rank order; the NCCL paths in NCCL's order, which is the
// same on every rank (NCCL computes each element once and distributes it) and the same for every
// run of the same message size and communicator. NVLink multicast (NVLS) is never used: every
// process sets NCCL_NVLS_ENABLE=0 before NCCL starts.
//
// Failure: a lost peer (the control plane's failure), an NCCL asynchronous error, a peer wait
// that timed out, or a step that lasted longer than step_timeout_s fails the DeviceComm for good:
// its watchdog thread aborts NCCL (ncclCommAbort) and tells the peer kernels to stop waiting, and
// marks the control plane failed, so /health and the next call see it. After that every call
// fails fast; the caller must not replay graphs that contain its collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/comm.h"
#include "common/status.h"

namespace tandem {

enum class CommPath : uint8_t { kStandin, kPeerOneShot, kNcclSymmetric, kNccl };
const char* comm_path_name(CommPath p);  // "standin", "peer-oneshot", "nccl-symmetric", "nccl"

enum class CommOp : uint8_t { kAllReduce, kAllGather, kBroadcast };
const char* comm_op_name(CommOp op);  // "all_reduce", "all_gather", "broadcast"

struct DeviceCommOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // this rank's CUDA device ordinal (in this process's CUDA_VISIBLE_DEVICES)
  // Which paths may carry collectives: "auto" (the routing rule above), "nccl" (NCCL only),
  // "peer" (peer-oneshot for everything it can carry, NCCL for the rest), "symmetric" (the window
  // for all-reduces up to its size, NCCL for the rest).
  std::string paths = "auto";
  // The peer-oneshot path carries messages up to this many bytes per rank (its buffers: two of
  // this size per rank); "peer" forces it for larger ones in chunks of this size. Also the size
  // of the NCCL staging buffer (bf16 all-reduces, symmetric window), chunked likewise.
  size_t max_peer_bytes = size_t{1} << 20;
  std::string nccl_library;  // "" = the loader's search (nccl_lib.h)
  // Test only: ranks share GPUs. NCCL refuses two ranks of one host on one GPU, so each rank gets
  // its own NCCL_HOSTID (NCCL then talks over its network transport on loopback: slow, for
  // correctness only); the peer path works on a shared GPU through CUDA IPC.
  bool shared_gpus = false;
  // Test only: try the symmetric window even where the topology check says NCCL cannot use it
  // (a refusal is reported, not an error).
  bool try_symmetric_anywhere = false;
  double peer_timeout_s = 10.0;   // one peer-oneshot wait (in the kernel)
  double init_timeout_s = 120.0;  // NCCL start-up, window registration, a call's enqueue
  double step_timeout_s = 0.0;    // watchdog: step_begin() .. step_end() longer than this fails (0 = off)
};

// One row of the routing table: messages of `op` of up to max_bytes (SIZE_MAX: any) take `path`.
struct CommRoute {
  CommOp op;
  size_t max_bytes;
  CommPath path;
};

class DeviceComm : public DataComm {
 public:
  // DataComm: rank(), size(), path() (the routing table in one line), all_reduce_sum,
  // all_gather, broadcast. Pointers are device pointers; `stream` a cudaStream_t. Errors are
  // returned for bad arguments (kInvalidArgument) and once the communicator failed (kUnavailable);
  // a collective that fails on the device is reported by failure() and by the next call.

  // Where a message of `bytes` per rank goes.
  virtual CommPath route(CommOp op, size_t bytes) const = 0;
  virtual std::vector<CommRoute> routes() const = 0;
  // The facts the routing was decided from ("2 ranks on one host, GPUs 0,1, peer access; NCCL
  // 2.28.9 from /path"), and each path that is not available with the reason.
  virtual std::string topology() const = 0;
  virtual std::vector<std::pair<CommPath, std::string>> unavailable() const = 0;
  // Test access to one path alone (nullptr when it is not available).
  virtual DataComm* path_comm(CommPath p) = 0;
  // Device memory held for the collectives (exchange buffers, staging, window), for the memory plan.
  virtual size_t device_bytes() const = 0;

  // Empty while healthy; otherwise the first reason it failed. Cheap; any thread.
  virtual std::string failure() const = 0;
  // Fails the communicator for good and releases every wait (any thread).
  virtual void abort(const std::string& reason) = 0;
  // The caller's host-side wait on this communicator's stream (a step): the watchdog fails a
  // step that lasts longer than step_timeout_s (a collective that would hang).
  virtual void step_begin() = 0;
  virtual void step_end() = 0;
};

// Collective over `control` (every rank calls it at the same point, with options that differ
// only in rank and device): exchanges the ranks' facts, loads NCCL (not for one rank), creates
// the NCCL communicator (unique id over the control plane), the peer buffers (IPC handles over
// the control plane) and the symmetric window where possible, runs every path once eagerly (NCCL
// connects lazily; graph capture must not be the first use), logs the routing table, and starts
// the watchdog. `control` must outlive the DeviceComm; the DeviceComm marks it failed when it
// fails and fails when it does. control may be null for one rank.
Result<std::unique_ptr<DeviceComm>> create_device_comm(const DeviceCommOptions& options, ControlComm* control);

}  // namespace tandem
