// The sm_90 warp-specialized dense GEMMs (gemm_ws.cu), behind gemm_tc.h's TcBackend::kWgmmaWs: the
// launchers fp8_gemm_tc / bf16_gemm_tc call after validating their arguments.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_tc.h"

namespace tandem::kernels::cuda {

// Shared-memory limits of the kernels (called once by tc_init on an sm_90 device).
void ws_init();
void fp8_gemm_ws(const Fp8GemmArgs& g, cudaStream_t s);
void bf16_gemm_ws(const Bf16GemmArgs& g, cudaStream_t s);

}  // namespace tandem::kernels::cuda
