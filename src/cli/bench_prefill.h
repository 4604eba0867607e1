// `tandem bench-kernels`, prefill part (bench_prefill.cpp): the prefill chunk's row kernels at 4,096
// rows of one rank of TP=2 (norm_rope's query heads, indexer query heads and key rows, the FP8
// activation quantization, the fp32 -> bf16 copy, hc_pre_pack and its mix and finish alone,
// hc_post), each beside its bytes floor.
#pragma once

#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>

#include "cli/bench_long_context.h"

namespace tandem::bench_kernels {

// Prints a table; returns its rows as JSON.
nlohmann::json prefill_kernels(cudaStream_t s, double copy_bps, const TimeCalls& time_calls);

}  // namespace tandem::bench_kernels
#endif
