// Inside the device data plane (device_comm.h): the interface each path implements, the facts
// ranks exchange at start-up, and the constructors of the paths. Only src/model/cuda/*comm*
// include this (the kernels' own header, device_comm_kernels.h, stays free of host-only headers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/comm.h"
#include "common/status.h"
#include "model/cuda/device_comm.h"
#include "model/cuda/device_comm_kernels.h"

namespace tandem::devcomm {

// ---- paths ----

// One way of carrying collectives. The composite (device_comm.cpp) validates arguments, routes
// and checks the failure state before calling; a path only moves bytes and reports device-side
// trouble through failure().
class PathComm : public DataComm {
 public:
  virtual CommPath kind() const = 0;
  // Device-side trouble seen without synchronizing (an NCCL asynchronous error, a peer wait that
  // timed out); "" when none. Polled by the watchdog.
  virtual std::string failure() const = 0;
  // Stops every wait of this path for good (watchdog thread; idempotent).
  virtual void abort() = 0;
  // Device memory this path holds (exchange buffers, staging, window).
  virtual size_t device_bytes() const { return 0; }
};

// What every rank tells the others at start-up (control-plane all-gather).
struct RankFacts {
  int rank = 0;
  int device = 0;         // ordinal in that rank's process
  std::string host;       // hostname + boot id: equal strings = one host (and one boot)
  std::string pci_bus;    // "0000:18:00.0"
  std::string gpu_uuid;   // "GPU-..." equal strings = one GPU
  std::string gpu_name;
};

// ---- control-plane helpers (device_comm.cpp) ----

// Every rank's `mine` in rank order (one broadcast per rank).
Result<std::vector<std::vector<uint8_t>>> control_all_gather(ControlComm& control, const std::vector<uint8_t>& mine);
// True on every rank when `ok` is true on every rank (an agreement round); `why` collects the
// first refusing rank's reason.
Result<bool> control_all_agree(ControlComm& control, bool ok, const std::string& reason, std::string* why);

// ---- path constructors ----

Result<std::unique_ptr<PathComm>> create_standin_comm(int device);

// Peer-memory one-shot (peer_comm.cpp). `facts` are every rank's; the caller has checked that all
// are on one host. Collective over `control`; an error means the path is not available here (the
// other ranks agree on that through control_all_agree inside).
Result<std::unique_ptr<PathComm>> create_peer_comm(const DeviceCommOptions& o, const std::vector<RankFacts>& facts,
                                                   ControlComm& control);

// NCCL (nccl_comm.cpp): loads the library (an agreement round: every rank must have it), then
// the communicator (collective). Its staging buffer of max_peer_bytes carries bf16 all-reduces in
// fp32 chunks. Built without nccl.h, it reports that instead.
Result<std::unique_ptr<PathComm>> create_nccl_comm(const DeviceCommOptions& o, ControlComm& control);
// "NCCL 2.28.9 (/path/libnccl.so.2)" of create_nccl_comm's communicator.
std::string nccl_description(const PathComm& nccl);
// The symmetric window on `nccl` (which must be create_nccl_comm's): an error means NCCL refused
// the window on this topology (every rank agrees before this returns).
Result<std::unique_ptr<PathComm>> create_symmetric_comm(PathComm& nccl, const DeviceCommOptions& o,
                                                        ControlComm& control);

// CUDA error as a Status (start-up calls that may legitimately fail on some topology).
Status cuda_status(cudaError_t e, const char* what);

}  // namespace tandem::devcomm
