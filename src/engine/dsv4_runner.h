// The model runners over the real DeepSeek-V4 model, loaded from a checkpoint directory
// (config.json, safetensors, tokenizer.json): the CPU oracle (src/model/model.h, dsv4_runner.cpp)
// and the device-resident CUDA model (cuda_runner.cpp). What they share is slot_runner.h.
#pragma once

#include <memory>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace tandem {

class DataComm;

// rank / size / comm: this process's place in a tensor-parallel group (the model binds only its
// shard and issues its activations' collectives on `comm`, the data plane, which must outlive the
// runner; the step plans travel on the control plane, outside the runner). The defaults are the
// whole model in one process.
Result<std::unique_ptr<ModelRunner>> create_dsv4_runner(const EngineConfig& config, int tp_rank = 0, int tp_size = 1,
                                                        DataComm* comm = nullptr);

// The device-resident runner (src/engine/cuda_runner.cpp); an error when the build has no CUDA
// runner or no GPU is visible. cuda_runner_available(): built with it and a GPU is visible.
// tp_rank / tp_size / comm: as for create_dsv4_runner, with the device data plane
// (src/model/cuda/device_comm.h); device: the CUDA ordinal this rank runs on (the caller keeps it
// current on every thread that calls the runner: src/engine/parallel/device_tp.h).
Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig& config, int tp_rank = 0, int tp_size = 1,
                                                        DataComm* comm = nullptr, int device = 0);
bool cuda_runner_available();

}  // namespace tandem
