// The sm_90 warp-specialized dense GEMMs (gemm_ws.cu), behind gemm_tc.h's TcBackend::kWgmmaWs
// (cluster 1: one CTA per tile), kWgmmaWsMc2 (2: clusters of 2 x 1 CTAs sharing the weight tile) and
// kWgmmaWsMc4 (4: 2 x 2 CTAs sharing the weight and the activation tiles): the launchers
// fp8_gemm_tc / bf16_gemm_tc call after validating their arguments.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_tc.h"

namespace tandem::kernels::cuda {

// Shared-memory limits of the kernels and the clusters the device holds (called once by tc_init on
// an sm_90 device).
void ws_init();
// True when the device launches both kernels (FP8, bf16) in clusters of `cluster` CTAs (1, 2, 4;
// cached per device).
bool ws_cluster_available(int cluster);
// Clusters of `cluster` (2 or 4) CTAs the device holds at once with the FP8 / bf16 kernel (0: none):
// a cluster launch's grid is `cluster` times this at most (the bench prints it).
int ws_max_clusters(bool fp8, int cluster);
// The largest cluster size up to `cluster` whose launch for an m x n GEMM (batch batches) takes no
// more rounds of the persistent grid than one CTA per tile does (rows 97..128 with n of 128 tiles:
// 1 round alone, 2 in pairs whose second CTA has no rows). Every size gives the same bits.
int ws_cluster_for_shape(bool fp8, int cluster, int64_t m, int64_t n, int64_t batch);
void fp8_gemm_ws(const Fp8GemmArgs& g, int cluster, cudaStream_t s);
void bf16_gemm_ws(const Bf16GemmArgs& g, int cluster, cudaStream_t s);

}  // namespace tandem::kernels::cuda
