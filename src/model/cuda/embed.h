// Token embedding of a step's rows into the hc residual streams (the CPU: DsV4Model::Impl::embed_rows
// then the copy into every stream, src/model/forward.cpp / dspark.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// h[r][k][d] = embed[ids[r]][d] for every stream k (exact: the stored bf16/fp32 value).
struct EmbedArgs {
  kernels::WeightRef embed;          // [vocab, dim], device pointers
  const int32_t* ids = nullptr;      // [rows], validated token ids
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  float* h = nullptr;                // [rows, hc, dim]
};
void embed_rows(const EmbedArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
