// Synthetic weights generated on the device (synthetic_weights.cpp): the structure CudaModel runs
// (DWeights), built from the per-rank tensor plan (model/shard_plan.h) with seeded values
// (synthetic_fill.h) instead of a checkpoint.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"
#include "io/model_config.h"
#include "model/cuda/cuda_impl.h"
#include "model/shard_plan.h"

namespace tandem::cuda_model {

struct SyntheticBuild {
  DWeights w;
  int64_t arena_bytes = 0;     // device bytes (fp32 vectors and int32 expert tables included)
  int64_t tensors = 0;         // catalog tensors generated (this rank's)
  int64_t target_tensors = 0;  // of those, the target's (the rest are the DSpark draft's)
};

// Lays out (and, with a non-null `arena`, generates on `stream`) every tensor this rank holds in
// `plan`: first call with arena null to learn arena_bytes and the shapes, then with the arena.
// Values: linears N(0, 1/fan_in) through their stored formats (FP8 codes of std 16 and MXFP4
// nibbles of std 2 under power-of-two E8M0 scales in the kernels' native range), norms ~1, mHC
// mixes of unit size, a random router (tokens spread over experts as a load-balanced router's),
// distinct hash-layer expert ids.
Result<SyntheticBuild> build_synthetic_weights(const ModelConfig& config, const model::ShardPlan& plan, uint8_t* arena,
                                               uint64_t seed, cudaStream_t stream);

}  // namespace tandem::cuda_model
