// `tandem bench-kernels`, long-context part (bench_long_context.cpp): the target attention per layer
// kind (sliding window, CSA top-512 + window, HCA every 128th entry + window), the lightning indexer
// and its top-k at 4K, 160K and 1M positions for one rank of TP=2 (32 heads, 32 index heads), with
// decode state made of random valid records; each time beside the bound of the bytes it must read.
#pragma once

#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include <functional>

#include <nlohmann/json.hpp>

namespace tandem::bench_kernels {

// Median us of one call of `call(i)` (graph replays; bench_kernels.cpp's time_calls).
using TimeCalls = std::function<double(cudaStream_t, const std::function<void(int)>&)>;

// Prints a table; returns its rows and the long-context estimates as JSON. chunk_only: only the
// model's 4,096-row prefill chunk (indexer, top-512, attention per layer kind; no estimates).
nlohmann::json long_context(cudaStream_t s, double copy_bps, const TimeCalls& time_calls, bool chunk_only = false);

}  // namespace tandem::bench_kernels
#endif
