// Tensor parallelism on GPUs, one rank's side: which GPU the rank runs on, its device data plane
// (src/model/cuda/device_comm.h) created over the rank's control plane, and the CUDA runner of
// its shard. The process layout, step plans, fingerprints and heartbeats are the CPU's
// (tp_runner.h); only the model runner and the collectives differ.
//
// GPUs: a rank's CUDA ordinal is its local rank on its node (rank % ranks per node), counted in
// this process's CUDA_VISIBLE_DEVICES, which must be the same for every rank of a node (the peer
// path opens rank 0's memory). A node needs as many visible GPUs as it runs ranks, unless the
// test-only --tp-share-gpus lets ranks share them.
#pragma once

#include <memory>

#include "common/comm.h"
#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace tandem {

// This rank's CUDA device ordinal, or an error naming the flags when its node has too few GPUs.
Result<int> tp_device_for_rank(const EngineConfig& config, int rank);

#ifdef TANDEM_HAVE_CUDA_RUNNER
class DeviceComm;
// The rank's device data plane over `control` (collective), on GPU `device` (tp_device_for_rank),
// with the options the flags give (--tp-collectives, --tp-peer-max-bytes, --nccl-library,
// --tp-share-gpus; --distributed-timeout bounds start-up and a step). For commands that drive a
// model directly (`tandem logits`); runners get theirs from create_cuda_rank_runner.
Result<std::unique_ptr<DeviceComm>> create_rank_device_comm(const EngineConfig& config, int rank, int device,
                                                            ControlComm& control);
#endif

// The ModelRunner of rank `rank` on its GPU (collective: every rank of the group calls it at the
// same point, after its control plane connected): the device data plane over `control`, then a
// CUDA runner of the rank's shard (ModelOptions tp_rank/tp_size/comm), wrapped so that every call
// runs on the rank's device, fails fast once the group failed (so no graph with a dead
// communicator is replayed) and is watched by the data plane's step watchdog. `control` must
// outlive the runner. An error where the build has no CUDA runner.
Result<std::unique_ptr<ModelRunner>> create_cuda_rank_runner(const EngineConfig& config, int rank, Comm& control);

}  // namespace tandem
