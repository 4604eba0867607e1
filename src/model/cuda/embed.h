// Token embedding of a step's rows into the hc residual streams (the CPU: DsV4Model::Impl::embed_rows
// then the copy into every stream, src/model/forward.cpp / dspark.cpp). Under tensor parallelism the
// embedding is vocabulary-parallel: a rank holds rows [vocab_begin, vocab_end), writes zeros for the
// other ids, all-reduces one stream's rows and spreads them with replicate_hc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// h[r][k][d] = embed[ids[r] - vocab_begin][d] for every stream k (exact: the stored bf16/fp32
// value) when vocab_begin <= ids[r] < vocab_end, else 0.
struct EmbedArgs {
  kernels::WeightRef embed;          // [vocab_end - vocab_begin, dim] (the held rows), device pointers
  const int32_t* ids = nullptr;      // [rows], validated token ids (global)
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  float* h = nullptr;                // [rows, hc, dim]
  int64_t vocab_begin = 0;           // the held rows (default: every id)
  int64_t vocab_end = std::numeric_limits<int64_t>::max();
};
void embed_rows(const EmbedArgs& a, cudaStream_t s);

// h[r][k][d] = x[r][d] for every stream k (the all-reduced vocabulary-parallel rows into the streams).
struct ReplicateHcArgs {
  const float* x = nullptr;          // [rows, dim]
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  float* h = nullptr;                // [rows, hc, dim]
};
void replicate_hc(const ReplicateHcArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
