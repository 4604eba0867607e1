// The sm_90 warp-specialized dense GEMMs (gemm_ws.cu), behind gemm_tc.h's TcBackend::kWgmmaWs,
// kWgmmaWsMc2, kWgmmaWsMc4 and kWgmmaWsWide2 (WsForm below): the launchers fp8_gemm_tc /
// bf16_gemm_tc call after validating their arguments.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_tc.h"

namespace tandem::kernels::cuda {

// A form of the kernels: CTAs per cluster (1; 2: 2 x 1 CTAs on two row blocks of one column block,
// sharing the weight tile; 4: 2 x 2, also sharing the activation tiles) and, for FP8, 128 x 256
// tiles (clusters of 2 only; bf16 tiles are 128 x 256 in every form). Every form gives the same bits.
struct WsForm {
  int cluster = 1;
  bool wide = false;
};

// Shared-memory limits of the kernels and the clusters the device holds (called once by tc_init on
// an sm_90 device).
void ws_init();
// True when the device launches both kernels (FP8, bf16) in form f (cached per device).
bool ws_form_available(WsForm f);
// Clusters of form f the device holds at once with the FP8 / bf16 kernel (0: none, or f.cluster 1):
// a cluster launch's grid is f.cluster times this at most (the bench prints it).
int ws_max_clusters(bool fp8, WsForm f);
// The first of `asked`, (FP8 wide: the 128-wide form of 2), then smaller clusters, whose launch for
// an m x n GEMM (batch batches) costs no more than one CTA per 128-wide tile does, in rounds of the
// persistent grid times tile width (rows 97..128 against 128 column blocks: 1 round alone, 2 in
// pairs whose second CTA has no rows). Every form gives the same bits.
WsForm ws_form_for_shape(bool fp8, WsForm asked, int64_t m, int64_t n, int64_t batch);
void fp8_gemm_ws(const Fp8GemmArgs& g, WsForm f, cudaStream_t s);
// bf16: f.cluster only (wide is the bf16 kernel's only tile).
void bf16_gemm_ws(const Bf16GemmArgs& g, int cluster, cudaStream_t s);

}  // namespace tandem::kernels::cuda
