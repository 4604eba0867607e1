// The CPU backend of both planes (Comm = ControlComm + DataComm, src/common/comm.h): ranks talk
// over ZeroMQ TCP sockets in a star around rank 0, which sums (in rank order) and relays; step
// plans and the activations' collectives share the sockets, in call order. Chosen over MPI because start-up and failure are
// ours to control: ranks may start in any order (connects retry), every wait polls with a timeout,
// and a heartbeat on its own socket tells a dead or stopped peer from a slow one; MPI would need
// an mpirun launcher and aborts or hangs the job when a rank dies.
//
// Rank 0 binds master_port (collectives) and master_port + 1 (heartbeats) on master_addr; the
// others connect. At start-up every rank sends a fingerprint (build, checkpoint, options) and rank 0
// refuses the job when any differs from its own, naming the key.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/comm.h"
#include "common/status.h"

namespace tandem {

struct ZmqCommOptions {
  int rank = 0;
  int size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // and master_port + 1
  double connect_timeout_s = 60.0;     // rank 0: all ranks' hellos; others: rank 0's answer
  double heartbeat_timeout_s = 3.0;    // a peer silent this long is failed
  double op_timeout_s = 60.0;          // one collective waiting on a peer (0 = no limit)
  // Compared across ranks at start-up (key, value); a difference refuses the job.
  std::vector<std::pair<std::string, std::string>> fingerprint;
  // Says where rank r runs, for the message naming a rank that never connected ("node 1").
  std::vector<std::string> rank_hosts;
  // Rank 0, while waiting for the others: a non-empty answer aborts start-up with that reason
  // (the launcher reports a local worker that already exited).
  std::function<std::string()> abort_check;
};

Result<std::unique_ptr<Comm>> create_zmq_comm(const ZmqCommOptions& options);

// Rank != 0 only: waits (polling the communicator's failure state) for the next broadcast from
// rank 0 without the collective timeout: a worker idles as long as the head does.
Status zmq_wait_broadcast(ControlComm& comm, std::vector<uint8_t>& bytes);

}  // namespace tandem
