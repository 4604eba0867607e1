// The ModelRunner over the real DeepSeek-V4 model (src/model/model.h, CPU forward + DSpark draft),
// loaded from a checkpoint directory (config.json, safetensors, tokenizer.json).
#pragma once

#include <memory>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/model.h"

namespace tandem {

class Comm;
class DataComm;

// rank / size / comm: this process's place in a tensor-parallel group (the model binds only its
// shard; comm must outlive the runner). The defaults are the whole model in one process.
Result<std::unique_ptr<ModelRunner>> create_dsv4_runner(const EngineConfig& config, int tp_rank = 0, int tp_size = 1,
                                                        Comm* comm = nullptr);

// The device-resident runner (src/engine/cuda_runner.cpp); an error when the build has no CUDA
// runner or no GPU is visible. cuda_runner_available(): built with it and a GPU is visible.
// tp_rank / tp_size / comm: as for create_dsv4_runner, with the device data plane
// (src/model/cuda/device_comm.h); device: the CUDA ordinal this rank runs on (the caller keeps it
// current on every thread that calls the runner: src/engine/parallel/device_tp.h).
Result<std::unique_ptr<ModelRunner>> create_cuda_runner(const EngineConfig& config, int tp_rank = 0, int tp_size = 1,
                                                        DataComm* comm = nullptr, int device = 0);
bool cuda_runner_available();

// What both model runners (CPU and CUDA) translate between the engine and the model: the step
// batch in (logits for the rows that sample: none, the last, or all), where each sequence's first
// sampled row sits in the step's logits (-1: none), a draft's result as a proposal (confidence =
// sigmoid of the head's raw projection).
LogitsMode logits_mode(const RunnerSeq& r);
void to_step_batch(std::span<const RunnerSeq> batch, bool has_draft, StepBatch& out);
void first_sampled_row(std::span<const RunnerSeq> batch, std::span<const int64_t> logits_row, std::vector<int64_t>& out);
void to_draft_proposal(const DraftResult& r, bool sampled, DraftProposal& p);

}  // namespace tandem
