// Test-only entry points into the CPU oracle (DsV4Model) for the teacher-forced layer-by-layer
// comparison of tests/cuda/layer_test.cpp: run one step layer half by layer half from given residual
// streams, read the pieces a layer leaves in its scratch (indexer scores and top-k, MoE routing),
// and read or overwrite the per-slot rings, the paged pool and the DSpark context. forward() and
// draft_propose() run the same halves and pieces, so nothing here changes the normal path.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/model.h"

namespace tandem::model_testing {

// Where one layer's state lives in the CPU model, in floats (-1 when the layer has none).
struct CpuLayerState {
  int ratio = 0;
  bool has_indexer = false;
  int64_t win_off = 0, win_ring = 0;                      // slot: [win_ring, head_dim], row = pos % win_ring
  int64_t comp_off = -1, comp_ring = 0, comp_chans = 0;   // slot: [comp_ring, 2 * comp_chans] fp32 rows
  int64_t icomp_off = -1, icomp_ring = 0, icomp_chans = 0;
  int64_t pool_main = -1, pool_idx = -1;                  // block: [bs / ratio, head_dim], [bs / 4, index_head_dim]
};
CpuLayerState cpu_layer_state(const DsV4Model& m, int layer);
std::span<float> cpu_slot_floats(DsV4Model& m, int slot);  // one slot's rings (every layer)
std::span<float> cpu_pool_floats(DsV4Model& m);            // [num_blocks, cpu_block_floats]
int64_t cpu_block_floats(const DsV4Model& m);
// One slot's DSpark context windows [stages, sliding_window, head_dim] (pending rows projected first).
std::span<float> cpu_draft_context(DsV4Model& m, int slot);

// One step, layer half by layer half: begin validates the batch (as forward()) and embeds it into
// h [rows, hc * hidden]; each half reads and rewrites h; end advances the slot lengths. Between
// begin and end the batch must stay alive and unchanged.
Status cpu_begin_step(DsV4Model& m, const StepBatch& batch, std::vector<float>& h);
void cpu_attention_half(DsV4Model& m, int layer, const StepBatch& batch, float* h);
void cpu_ffn_half(DsV4Model& m, int layer, const StepBatch& batch, float* h);
void cpu_end_step(DsV4Model& m, const StepBatch& batch);
// Sets a slot's length (the state itself is whatever cpu_slot_floats holds).
void cpu_set_slot_length(DsV4Model& m, int slot, int64_t length);
// The LM head (hc_head, norm, head GEMM) over `rows` residual-stream rows: out [rows, vocab].
void cpu_logits(DsV4Model& m, const float* h, int64_t rows, std::vector<float>& out);

// After cpu_attention_half of a CSA layer: the last sequence's indexer scores [rows, cols] (cols =
// its visible entries at the step's end) and top-k ids [rows, index_topk].
void cpu_last_indexer(DsV4Model& m, int64_t rows, int64_t cols, std::vector<float>& scores,
                      std::vector<int32_t>& topk);
// After cpu_ffn_half (or cpu_draft_stage_ffn): gate logits [rows, n_routed_experts] and expert ids
// [rows, num_experts_per_tok] of the last MoE.
void cpu_last_routing(DsV4Model& m, int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts);
// The selection bias of a score-routed layer's gate (or draft stage's with draft = true); empty for
// hash-routed ones.
std::vector<float> cpu_gate_bias(const DsV4Model& m, int layer, bool draft = false);

// The CPU oracle's attention with every softmax weight moved by one ulp in a fixed pattern
// (model::set_softmax_jitter), until switched off: a spread run that varies the attention's fp32
// arithmetic by the size of a difference between two correct exp implementations (the GPU's
// attention sums its dot products on the tensor cores and uses CUDA's expf, within 2 ulp), which
// the GEMM instruction-set switch (kernels::cpu::set_gemm_isa) leaves untouched.
void cpu_set_softmax_jitter(bool on);

// The DSpark draft stage by stage: begin validates, flushes the pending context and embeds every
// request's block into h [B * K, hc * hidden]; finish runs the heads (results as draft_propose,
// greedy unless a request asks for a temperature).
Status cpu_draft_begin(DsV4Model& m, std::span<const DraftRequest> requests, std::vector<float>& h, int64_t* k_out);
void cpu_draft_stage_attention(DsV4Model& m, int stage, std::span<const DraftRequest> requests, int64_t K, float* h);
void cpu_draft_stage_ffn(DsV4Model& m, int stage, int64_t rows, float* h);
Status cpu_draft_finish(DsV4Model& m, std::span<const DraftRequest> requests, int64_t K, const float* h,
                        std::vector<DraftResult>& results);

}  // namespace tandem::model_testing
