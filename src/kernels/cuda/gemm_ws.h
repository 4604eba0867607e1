// The sm_90 warp-specialized dense GEMMs (gemm_ws.cu), behind gemm_tc.h's TcBackend::kWgmmaWs
// (multicast = false) and kWgmmaWsMc (true: 2-CTA clusters sharing the weight tile): the launchers
// fp8_gemm_tc / bf16_gemm_tc call after validating their arguments.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_tc.h"

namespace tandem::kernels::cuda {

// Shared-memory limits of the kernels and the clusters the device holds (called once by tc_init on
// an sm_90 device).
void ws_init();
// True when the device launches the multicast kernels in clusters of two (cached per device).
bool ws_multicast_available();
// Clusters of two the device holds at once with the FP8 / bf16 multicast kernel (0: none): the
// multicast launches' grid is twice this at most (the bench prints it).
int ws_multicast_clusters(bool fp8);
void fp8_gemm_ws(const Fp8GemmArgs& g, bool multicast, cudaStream_t s);
void bf16_gemm_ws(const Bf16GemmArgs& g, bool multicast, cudaStream_t s);

}  // namespace tandem::kernels::cuda
