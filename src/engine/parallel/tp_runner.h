// Tensor parallelism across processes: rank 0 (the head) serves HTTP, schedules and samples; every
// other rank (a worker) runs the same model on its shard. The head's ModelRunner is a TpHeadRunner:
// each call (allocate, forward, draft propose; a step's commit rides on the next of them) is
// broadcast to the workers as one plan on the control plane (ControlComm), then run locally; the
// model's own collectives on the data plane (DataComm) keep the ranks in lock-step. Workers run
// run_tp_worker() on a Dsv4Runner of their rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/comm.h"
#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace tandem {

// Processes this rank started and watches (local workers); a process that exits fails the group.
class WorkerProcesses;

// Rank 0: spawns the local workers (re-exec of this binary as `tandem tp-worker`), waits for every
// rank (local and remote) to connect and match, then builds the head runner.
Result<std::unique_ptr<ModelRunner>> create_tp_head_runner(const EngineConfig& config);

// `tandem tp-worker`: one worker rank; returns the process exit code (0 after a clean shutdown).
int run_tp_worker_process(const EngineConfig& config, int rank);

// `tandem serve --nnodes N --node-rank R` with R > 0: starts this node's ranks as workers and
// waits for them; returns the exit code (non-zero if any failed).
int run_tp_node(const EngineConfig& config, const std::function<bool()>& stop_requested);

// The head's runner over a connected control plane and its local runner, and a worker's plan loop
// (returns 0 after a shutdown plan, 1 on a failure): what the functions above build on. Tests join
// the two in one process.
std::unique_ptr<ModelRunner> make_tp_head_runner(std::unique_ptr<ControlComm> control,
                                                 std::unique_ptr<ModelRunner> local);
int tp_worker_loop(ControlComm& control, ModelRunner& runner);

// ---- commands whose ranks all run the same program (`tandem logits`) ----
// There are no step plans: every rank reads the same inputs (rank 0 broadcasts them over comm())
// and makes the same model calls, whose collectives keep the ranks in step.
using TpRankArgs = std::function<std::vector<std::string>(int rank)>;  // a rank's command line

class TpGroup {
 public:
  TpGroup(std::unique_ptr<WorkerProcesses> procs, std::unique_ptr<Comm> comm);
  // Rank 0 gives the ranks it started a moment to finish, then ends them.
  ~TpGroup();
  Comm& comm() { return *comm_; }

 private:
  std::unique_ptr<WorkerProcesses> procs_;
  std::unique_ptr<Comm> comm_;
};

// The `tandem` binary ranks run: --worker-binary's, else this executable.
std::string tp_worker_binary(const EngineConfig& config);

// Joins the group as `rank` (with "auto" already resolved in config.device): rank 0 first starts
// the other ranks of its node as args_for(rank). Same layout checks, fingerprint comparison and
// failure on a lost rank as serve's.
Result<std::unique_ptr<TpGroup>> join_tp_group(const EngineConfig& config, int rank, const TpRankArgs& args_for);

// A node other than 0: starts this node's ranks as args_for(rank) and waits for them; returns the
// exit code (non-zero if any failed). run_tp_node is this with `tandem tp-worker` ranks.
int run_tp_node_ranks(const EngineConfig& config, const TpRankArgs& args_for, const std::function<bool()>& stop_requested);

// What every rank must agree on (build, checkpoint revision and structure, flags), as key/value
// pairs compared at start-up.
Result<std::vector<std::pair<std::string, std::string>>> tp_fingerprint(const EngineConfig& config);

}  // namespace tandem
