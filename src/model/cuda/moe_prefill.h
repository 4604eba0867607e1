// Routed experts of a prefill step grouped by expert, on the tensor cores: the (token, slot) pairs
// routed to this rank's experts sorted by expert (CUB radix sort, stable: ascending pair index
// within an expert), each pair's token quantized per 128 (the reference's act_quant) into its
// sorted slot, the slots cut into tiles of 128 pairs, then per tile
//   up:   g = bf16(xq . W1_e^T), u = bf16(xq . W3_e^T),
//         a = bf16(silu(min(g, limit)) * clamp(u, +-limit) * route weight)   [bf16]
//   down: a quantized per 128 (act_quant), out = bf16(aq . W2_e^T) -> pair_out[pair]
// with MXFP4 weights dequantized exactly to e4m3 in shared memory and fp32 accumulation promoted
// every 128 of K (bound: kernels/cuda/gemm_tc.h). sm_90: warp-specialized persistent kernels over
// the tile list (moe_prefill_ws.cu: TMA loads, converter warps, wgmma consumers); elsewhere the
// portable main loop of kernels/cuda/tc_gemm.cuh. moe_combine_local then adds each token's pairs in
// ascending expert id (the CPU's order) plus the shared expert. A pair's result depends on its
// token, expert and weight only. Every launch is sized from host row counts only
// (graph-capturable); nothing allocates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gemm_tc.h"
#include "kernels/ops.h"

namespace tandem::cuda_model {

constexpr int kMoeTileRows = 128;  // pairs per tile

// Device scratch of one MoE prefill, carved from one allocation (moe_prefill_scratch_bytes).
struct MoePrefillScratch {
  int64_t max_tokens = 0, dim = 0, inter = 0;
  int topk = 0, n_local = 0;
  uint32_t* keys = nullptr;        // [2][max_pairs] sort keys in / out (local expert, n_local = elsewhere)
  int32_t* pairs = nullptr;        // [2][max_pairs] pair ids in / out (out: the sorted slot -> pair)
  void* sort_temp = nullptr;       // CUB temporary storage
  size_t sort_temp_bytes = 0;
  int32_t* offsets = nullptr;      // [n_local + 1] first sorted slot of each local expert
  int32_t* tiles = nullptr;        // [max_tiles][2] (local expert, first slot)
  int32_t* tile_count = nullptr;   // [1]
  uint8_t* x_codes = nullptr;      // [max_pairs, dim] e4m3: the token of sorted slot s in row s
  float* x_scales = nullptr;       // [dim / 128, round_up(max_pairs, 4)]
  uint16_t* act = nullptr;         // [max_pairs, inter] bf16 SwiGLU outputs
  uint8_t* act_codes = nullptr;    // [max_pairs, inter] e4m3
  float* act_scales = nullptr;     // [inter / 128, round_up(max_pairs, 4)]
  int64_t max_pairs() const { return max_tokens * topk; }
  int64_t max_tiles() const { return (max_pairs() + kMoeTileRows - 1) / kMoeTileRows + n_local; }
};
size_t moe_prefill_scratch_bytes(int64_t max_tokens, int topk, int n_local, int64_t dim, int64_t inter);
MoePrefillScratch moe_prefill_scratch(void* base, int64_t max_tokens, int topk, int n_local, int64_t dim,
                                      int64_t inter);

struct MoePrefillArgs {
  const float* x = nullptr;            // [tokens, dim] the experts' input (quantized here)
  const int32_t* expert_ids = nullptr; // [tokens, topk] global expert ids
  const float* weights = nullptr;      // [tokens, topk] route weights
  int64_t tokens = 0;
  int topk = 0;
  int expert_begin = 0, n_local = 0;   // this rank's experts; pairs routed elsewhere are skipped
  kernels::WeightRef w1, w2, w3;       // kMxfp4, local experts concatenated by rows:
                                       // w1/w3 [n_local * inter, dim], w2 [n_local * dim, inter]
  int64_t dim = 0, inter = 0;          // multiples of 128
  float limit = 0.0f;                  // swiglu_limit (<= 0: no clamp)
  float* pair_out = nullptr;           // [tokens * topk, dim]: rows of local pairs written
};
// True when the grouped path can run these weights (MXFP4 whose 128-wide K blocks fit e4m3: see
// mxfp4_blocks_fit_e4m3; dims multiples of 128; scratch large enough).
bool moe_prefill_supported(const MoePrefillArgs& a, const MoePrefillScratch& s);
// Sets the kernels' shared-memory limits (idempotent; at start-up, outside graph capture).
void moe_prefill_init();
void moe_prefill(const MoePrefillArgs& a, const MoePrefillScratch& s, kernels::cuda::TcBackend backend,
                 cudaStream_t st);
// The three stages moe_prefill runs, for benchmarks and tests: the routing sort, tile table and x
// quantization in slot order; up + SwiGLU into s.act; act quantization + down into pair_out.
void moe_prefill_route(const MoePrefillArgs& a, const MoePrefillScratch& s, cudaStream_t st);
void moe_prefill_up(const MoePrefillArgs& a, const MoePrefillScratch& s, kernels::cuda::TcBackend backend,
                    cudaStream_t st);
void moe_prefill_down(const MoePrefillArgs& a, const MoePrefillScratch& s, kernels::cuda::TcBackend backend,
                      cudaStream_t st);

// y[t] = bf16(sum of pair_out[t * topk + j] over the token's pairs routed to local experts, in
// ascending expert id, + shared[t]); with shared == null, y[t] = that fp32 sum unrounded (the
// routed part before a tensor-parallel all-reduce).
void moe_combine_local(const float* pair_out, const int32_t* expert_ids, const float* shared, int64_t tokens,
                       int topk, int64_t dim, int expert_begin, int n_local, float* y, cudaStream_t s);

// Host check of an MXFP4 scale grid [rows, k / 32]: in every 128-wide K block of every row the four
// E8M0 scales span at most 11 (so the block's values are e4m3-exact after one power of two is
// factored out) and none is the NaN code 255.
bool mxfp4_blocks_fit_e4m3(const uint8_t* scale, int64_t rows, int64_t k);

}  // namespace tandem::cuda_model
