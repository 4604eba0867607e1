// The sm_90 warp-specialized grouped expert GEMMs (moe_prefill_ws.cu) behind moe_prefill.h's
// TcBackend::kWgmmaWs: one launch per GEMM (up with SwiGLU, or down), persistent over the tile list
// the routing stage wrote (tiles x column blocks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

struct MoeWsArgs {
  bool up = false;                  // up: w1/w3 + SwiGLU -> act; down: w2 -> pair_out
  const uint8_t* a = nullptr;       // [pairs, k] e4m3 codes, row = sorted slot
  const float* a_scale = nullptr;   // [k / 128, a_scale_ld]
  int64_t a_scale_ld = 0;
  kernels::WeightRef b, b3;         // MXFP4 [n_local * n, k] (b3: up's w3)
  int64_t k = 0, n = 0;             // K of this GEMM; weight rows per expert
  int64_t pairs = 0;                // tokens * topk (rows of a, act and pair_out)
  const int32_t* slot_pair = nullptr;   // [pairs] sorted slot -> pair
  const int32_t* offsets = nullptr;     // [n_local + 1]
  const int32_t* tiles = nullptr;       // [max_tiles][2] (local expert, first slot)
  const int32_t* tile_count = nullptr;  // device scalar
  int64_t max_tiles = 0;
  int n_local = 0, topk = 0;
  const float* route_w = nullptr;   // up: [pairs]
  float limit = 0.0f;
  uint16_t* act = nullptr;          // up out: [pairs, n] bf16, row = sorted slot
  float* pair_out = nullptr;        // down out: [pairs, n], row = pair
};

// Shared-memory limits (idempotent; moe_prefill_init calls it on an sm_90 device).
void moe_ws_init();
void moe_group_ws(const MoeWsArgs& a, cudaStream_t st);

}  // namespace tandem::cuda_model
