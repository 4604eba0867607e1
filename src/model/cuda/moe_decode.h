// The MoE sub-block at decode size on the device (moe_decode.cu), in three kernels: the gate GEMV
// spread over the whole GPU (k split over CTAs) whose last CTA adds the partial sums and routes
// the tokens (sqrt-softplus scores, bias-corrected top-k or hash routing) and groups the step's
// (token, expert) pairs by distinct expert; the experts' up projections
// (routed MXFP4 w1/w3 and the FP8 shared expert) with the clamped SwiGLU and act_quant of its rows;
// the down projections (w2) with the combine in ascending expert order. Each expert's weights are
// read once per step however many tokens chose it, and a token's result does not depend on the
// other tokens of the step (the decode GEMV's accumulation scheme, decode_gemm.h).
//
// Numerics follow DsV4Model::Impl::moe (src/model/forward.cpp) and the ops it composes: routing
// exactly as the CUDA moe_gate op (one shared device routine), the expert linears' outputs rounded
// to bf16, SwiGLU as the CUDA swiglu op, act_quant(., 128) before w2 as the act_quant op, the
// routed outputs summed in ascending expert id from 0, plus the shared expert, rounded to bf16.
// Each expert matrix's k is cut into fixed units (moe_decode_units: from its k and side alone) whose fp32
// partials are added in unit order. Under tensor parallelism a rank holds experts
// [expert_begin, expert_begin + expert_count) (global ids) and skips the others; `routed_only`
// then leaves the routed sum for the all-reduce.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// Device scratch of one MoE call, sized for `max_tokens` rows at start-up (moe_decode_bytes).
struct MoeDecodeBuffers {
  float* gate_logits = nullptr;    // [T, n_experts]
  float* gate_partial = nullptr;   // [kb, T, n_experts] the gate's k-block partial sums (kb <= 8)
  int32_t* expert_ids = nullptr;   // [T, topk] global expert ids (as MoeGateParams)
  float* weights = nullptr;        // [T, topk] routing weights
  int32_t* active = nullptr;       // [1 + max_active + (max_active + 1)]: count, local expert ids
                                   // (ascending), pair offsets
  int32_t* pair_token = nullptr;   // [T * topk] token of each pair, grouped by active expert
  float* pair_weight = nullptr;    // [T * topk]
  int32_t* token_pair = nullptr;   // [T, topk] pair of (token, slot), -1 for another rank's expert
  int32_t* combine_order = nullptr;  // [T, topk] a token's pairs in ascending expert id (-1 as above)
  float* act = nullptr;            // [T * topk + T, inter] SwiGLU outputs: pairs, then shared rows
  uint8_t* act_codes = nullptr;    // [T * topk + T, inter] act_quant codes of `act`
  uint8_t* act_scales = nullptr;   // [T * topk + T, inter / 128]
  float* pair_out = nullptr;       // [T * topk, dim] routed w2 outputs (bf16 values)
  float* shared_out = nullptr;     // [T, dim] shared expert output (bf16 values)
  // Arrival counters of the kernels' last-arriver steps (the gate's routing CTA, each 128-column
  // block's act_quant, each 16-column tile's combine). Zero before the first call
  // (moe_decode_init); every call leaves them zero.
  int32_t* counters = nullptr;
};

struct MoeDecodeDims {
  int64_t dim = 0;          // hidden size (w1/w3 k, w2 n)
  int64_t inter = 0;        // moe_intermediate_size
  int n_experts = 0;        // global routed experts (gate rows)
  int topk = 0;
  int64_t max_tokens = 0;   // rows the buffers are sized for
};
// Bytes of every MoeDecodeBuffers array for `d` (one allocation, carved by moe_decode_carve); the
// counters are the last moe_decode_bytes - moe_decode_data_bytes bytes.
size_t moe_decode_bytes(const MoeDecodeDims& d);
size_t moe_decode_data_bytes(const MoeDecodeDims& d);
MoeDecodeBuffers moe_decode_carve(const MoeDecodeDims& d, void* base);
// Zeroes the counters (once, after the allocation; not needed between calls).
void moe_decode_init(const MoeDecodeDims& d, const MoeDecodeBuffers& b, cudaStream_t s);

// k units of an expert matrix with k columns (up, w1/w3: k = dim, at most 4; down, w2: k = inter,
// at most 2), shared or routed: the error bound's k split (tests).
int moe_decode_units(int64_t k, bool up);
// The gate logits' k split in the decode GEMV bound's terms (decode_gemm.h): the gate adds 128-k
// tensor-core partials in a fixed two-level order (a CTA's units, then the CTAs' sums), so a
// partial passes through at most moe_gate_k_split(dim) - 1 fp32 additions.
int moe_gate_k_split(int64_t dim);

struct MoeDecodeArgs {
  MoeDecodeDims dims;
  int64_t tokens = 0;                  // rows of this call (<= dims.max_tokens)
  const float* x = nullptr;            // [tokens, dim] ffn-normed input (bf16 values)
  const uint8_t* x_codes = nullptr;    // [tokens, dim] act_quant(x, 128) codes (decode_act_pack)
  const uint8_t* x_scales = nullptr;   // [tokens, dim / 128]
  const int32_t* token_ids = nullptr;  // [tokens] (hash layers; validated by the caller)
  // gate
  kernels::WeightRef gate;             // [n_experts, dim] bf16
  const float* bias = nullptr;         // [n_experts] score layers, null in hash layers
  const int32_t* tid2eid = nullptr;    // [vocab, topk] hash layers
  float route_scale = 1.5f;
  // routed experts held by this rank, concatenated: expert e (global) is local e - expert_begin
  kernels::WeightRef w1, w3;           // MXFP4 [expert_count * inter, dim]
  kernels::WeightRef w2;               // MXFP4 [expert_count * dim, inter]
  int expert_begin = 0;
  int expert_count = 0;
  // shared expert (optional: sh_w1.data == null skips it)
  kernels::WeightRef sh_w1, sh_w3;     // FP8 [inter, dim]
  kernels::WeightRef sh_w2;            // FP8 [dim, inter]
  float swiglu_limit = 10.0f;          // <= 0: no clamp
  MoeDecodeBuffers buf;
  float* y = nullptr;                  // [tokens, dim] out
  bool routed_only = false;            // y = routed sum (fp32, unrounded), shared left in buf.shared_out
  bool pdl = true;
  // Instrument (bench-kernels): per-CTA phase timestamps (kernels/cuda/timeline.cuh) of the three
  // kernels, in three regions of timeline::kCtas records each (gate + routing, up, down); null: none.
  uint64_t* timeline = nullptr;
  // Instrument (tests, bench-kernels): the routing's general tail at every token count instead of
  // the lean one it takes up to 8 tokens (moe_decode_route.cu); the same results.
  bool general_route = false;
};

// True when moe_decode handles these weights (formats and alignment; never depends on tokens).
bool moe_decode_supports(const MoeDecodeArgs& a);

// The whole sub-block: gate + routing, experts up (+ act_quant), experts down (+ combine).
void moe_decode(const MoeDecodeArgs& a, cudaStream_t s);

// The three kernels, for tests and the benchmark (in this order; each reads what the previous
// one wrote into a.buf). moe_decode runs the shared expert's up projection before the experts-up
// kernel's dependency wait (its predecessor is the gate + routing kernel, which lets it start only
// past its own wait), and a down CTA's first shared-expert item before the experts-down kernel's
// wait (once the up kernel has counted every shared row block quantized); moe_experts_up and
// moe_experts_down alone run them after the wait. Both give the same bits for
// every (token, slot) pair (its row is token_pair's: the order of an expert's pairs is the routing
// atomics', so two calls may store the same pair at different rows).
void moe_gate_route(const MoeDecodeArgs& a, cudaStream_t s);    // -> gate_logits, ids, weights, groups
void moe_experts_up(const MoeDecodeArgs& a, cudaStream_t s);    // -> act, act_codes, act_scales
void moe_experts_down(const MoeDecodeArgs& a, cudaStream_t s);  // -> pair_out, shared_out, y

}  // namespace tandem::cuda_model
