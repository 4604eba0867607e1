// A tensor-parallel rank on its GPU (device_tp.h): the device data plane and the wrapped CUDA
// runner. Built only with the CUDA runner (TANDEM_HAVE_CUDA_RUNNER).
#include "engine/parallel/device_tp.h"

#include <algorithm>

#include "common/log.h"
#include "engine/dsv4_runner.h"

#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/device_comm.h"

namespace tandem {
namespace {

std::string size_text(size_t b) {
  if (b >= (size_t{1} << 20) && b % (size_t{1} << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

// Every call on the rank's device; calls that wait on the device are steps for the data plane's
// watchdog; once the group failed, calls fail fast (or do nothing) instead of replaying graphs
// whose collectives were aborted.
class DeviceRankRunner : public ModelRunner {
 public:
  DeviceRankRunner(int rank, int device, std::unique_ptr<DeviceComm> comm, std::unique_ptr<ModelRunner> inner)
      : rank_(rank), device_(device), comm_(std::move(comm)), inner_(std::move(inner)) {}
  ~DeviceRankRunner() override {
    on_device();
    inner_.reset();  // the model goes before the communicator it uses
    comm_.reset();
  }

  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_model_len() const override { return inner_->max_model_len(); }
  int32_t eos_token_id() const override { return inner_->eos_token_id(); }
  int32_t noise_token_id() const override { return inner_->noise_token_id(); }
  std::string device() const override { return inner_->device(); }
  const Tokenizer& tokenizer() const override { return inner_->tokenizer(); }
  Status check_kv_cache_dtype(const std::string& dtype) const override { return inner_->check_kv_cache_dtype(dtype); }
  int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const override {
    return inner_->kv_bytes_per_block(block_size, dtype);
  }
  int64_t slot_state_bytes() const override { return inner_->slot_state_bytes(); }

  // Loading and capturing are not timed (a full checkpoint loads for minutes); a lost peer still
  // fails the group through the control plane.
  Status allocate(const RunnerAllocation& a) override {
    on_device();
    TANDEM_RETURN_IF_ERROR(usable());
    Status st = inner_->allocate(a);
    return st.ok() ? usable() : st;
  }
  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override {
    on_device();
    TANDEM_RETURN_IF_ERROR(usable());
    comm_->step_begin();
    Status st = inner_->forward(batch, samples, out);
    comm_->step_end();
    return st.ok() ? usable() : st;
  }
  // Rollbacks, draft context (projected locally) and snapshots: no collective, so not a step.
  Status commit(std::span<const SlotCommit> commits) override {
    on_device();
    TANDEM_RETURN_IF_ERROR(usable());
    return inner_->commit(commits);
  }
  bool has_draft() const override { return inner_->has_draft(); }
  int num_draft_tokens() const override { return inner_->num_draft_tokens(); }
  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    on_device();
    TANDEM_RETURN_IF_ERROR(usable());
    comm_->step_begin();
    Status st = inner_->draft_propose(reqs, out);
    comm_->step_end();
    return st.ok() ? usable() : st;
  }

  Status health() const override {
    TANDEM_RETURN_IF_ERROR(usable());
    return inner_->health();
  }

  // The CUDA runner's facts with this rank's number and its collectives.
  DeviceFacts device_facts() const override {
    on_device();
    DeviceFacts f = inner_->device_facts();
    f.rank = rank_;
    std::string all_reduce;
    for (const CommRoute& r : comm_->routes()) {
      const std::string limit = r.max_bytes == SIZE_MAX ? "" : " <= " + size_text(r.max_bytes);
      f.collectives.routes.push_back(fmt::format("{}{}: {}", comm_op_name(r.op), limit, comm_path_name(r.path)));
      if (r.op == CommOp::kAllReduce)
        all_reduce += fmt::format("{}{}{}", all_reduce.empty() ? "" : ", ", comm_path_name(r.path),
                                  limit.empty() ? "" : " (" + limit.substr(1) + ")");
    }
    for (const auto& [p, why] : comm_->unavailable())
      f.collectives.unavailable.push_back(fmt::format("{}: {}", comm_path_name(p), why));
    f.collectives.topology = comm_->topology();
    for (KernelPath& k : f.kernels)
      if (k.op_class == "all_reduce") k.path = "cuda:" + all_reduce;
    return f;
  }
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    on_device();
    inner_->plan_memory(alloc, plan);
    plan.add(kPoolComm, inner_->device(), static_cast<int64_t>(comm_->device_bytes()),
             "collective buffers (peer exchange region, NCCL staging, window)", /*already_counted=*/true);
  }
  int64_t device_allocations_after_start() const override { return inner_->device_allocations_after_start(); }

 private:
  // The engine calls from its own threads; CUDA's current device is per thread.
  void on_device() const { TANDEM_CUDA_CHECK(cudaSetDevice(device_)); }
  Status usable() const {
    const std::string f = comm_->failure();
    if (f.empty()) return Status();
    return Status(StatusCode::kUnavailable, "tensor parallel group failed: " + f);
  }

  int rank_;
  int device_;
  std::unique_ptr<DeviceComm> comm_;
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace

Result<int> tp_device_for_rank(const EngineConfig& c, int rank) {
  const int ndev = kernels::cuda::device_count();
  if (ndev == 0) return make_error(StatusCode::kUnavailable, "--device cuda: no CUDA device is visible");
  const int per_node = std::max(1, c.tensor_parallel_size / std::max(1, c.nnodes));
  const int local = rank % per_node;
  if (local < ndev) return local;
  if (c.tp_share_gpus) return local % ndev;
  return invalid_argument(
      "rank {} is local rank {} of {} on its node, but {} GPU{} visible (CUDA_VISIBLE_DEVICES): run at most {} "
      "rank{} per node (--tensor-parallel-size / --nnodes), or, for tests only, --tp-share-gpus",
      rank, local, per_node, ndev, ndev == 1 ? " is" : "s are", ndev, ndev == 1 ? "" : "s");
}

Result<std::unique_ptr<DeviceComm>> create_rank_device_comm(const EngineConfig& c, int rank, int device,
                                                            ControlComm& control) {
  DeviceCommOptions o;
  o.rank = rank;
  o.size = c.tensor_parallel_size;
  o.device = device;
  o.paths = c.tp_collectives;
  o.max_peer_bytes = static_cast<size_t>(c.tp_peer_max_bytes);
  o.nccl_library = c.nccl_library;
  o.shared_gpus = c.tp_share_gpus;
  o.init_timeout_s = c.distributed_timeout_s;
  // A step that waits longer than ranks may take to connect is a hang, not a slow step.
  o.step_timeout_s = c.distributed_timeout_s;
  auto comm = create_device_comm(o, &control);
  if (!comm.ok()) return comm.status().with_context(fmt::format("rank {}: device collectives", rank));
  return std::move(comm).value();
}

Result<std::unique_ptr<ModelRunner>> create_cuda_rank_runner(const EngineConfig& c, int rank, Comm& control) {
  TANDEM_ASSIGN_OR_RETURN(const int device, tp_device_for_rank(c, rank));
  auto comm = create_rank_device_comm(c, rank, device, control);
  if (!comm.ok()) return comm.status();
  TLOG_INFO("tp", "rank {} on GPU {}: collectives {}", rank, device, (*comm)->path());
  DataComm* dc = comm->get();
  auto inner = create_cuda_runner(c, rank, c.tensor_parallel_size, dc, device);
  if (!inner.ok()) return inner.status();
  return std::unique_ptr<ModelRunner>(new DeviceRankRunner(rank, device, std::move(comm).value(), std::move(inner).value()));
}

}  // namespace tandem

#else  // no CUDA runner in this build

namespace tandem {
Result<int> tp_device_for_rank(const EngineConfig&, int) {
  return make_error(StatusCode::kUnimplemented, "--device cuda: this build has no CUDA runner");
}
Result<std::unique_ptr<ModelRunner>> create_cuda_rank_runner(const EngineConfig&, int, Comm&) {
  return make_error(StatusCode::kUnimplemented,
                    "--device cuda: this build has no CUDA runner (the CUDA toolkit was not found at build time)");
}
}  // namespace tandem

#endif
