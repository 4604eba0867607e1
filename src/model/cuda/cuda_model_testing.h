// Test-only entry points into the device model (CudaModel) for the teacher-forced layer-by-layer
// comparison of tests/cuda/layer_test.cpp, the counterpart of model/model_testing.h: run one step
// layer half by layer half from residual streams given on the host, read the pieces a layer leaves
// in its scratch (indexer scores and top-k, MoE routing), read or overwrite the slot rings, the
// paged pool and the DSpark context in their real bytes, and encode fp32 rows into KV records and
// FP4 indexer keys with the model's own encoders. forward() and draft_propose() run the same halves
// and pieces, so nothing here changes the normal path. Every call finishes its device work before
// returning (these are not for the step path).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/kv_record.h"

namespace tandem::model_testing {

// Where one layer's state lives in the device model, in bytes (-1 when the layer has none).
struct CudaLayerState {
  int ratio = 0;
  bool has_indexer = false;
  int64_t win_off = 0;                          // slot: [win_ring, rec.bytes] KV records
  int64_t comp_off = -1, comp_chans = 0;        // slot: [comp_ring, 2 * comp_chans] fp32 rows
  int comp_ring = 0;
  int64_t icomp_off = -1, icomp_chans = 0;
  int icomp_ring = 0;
  int64_t pool_main = -1, pool_idx = -1;        // block: [bs / ratio, rec.bytes], [bs / 4, key.bytes]
};
struct CudaStateLayout {
  cuda_model::KvRecordLayout rec;
  cuda_model::IndexKeyLayout key;
  int win_ring = 0;
  int64_t slot_bytes = 0, block_bytes = 0, draft_slot_bytes = 0;
  int draft_ring = 0;  // rows of a DSpark context ring (W + max_rollback)
  std::vector<CudaLayerState> layers;
};
CudaStateLayout cuda_state_layout(const CudaModel& m);
// The layout a CudaModel of this config and options has (host only, no device needed; a layer with
// compress ratio 4 has the indexer, as in every DeepSeek-V4 checkpoint).
CudaStateLayout cuda_state_layout_for(const ModelConfig& cfg, const ModelOptions& opt, bool has_draft);

// Raw state bytes: one slot's rings, the pool's num_blocks blocks, one slot's draft context.
void cuda_read_slot(CudaModel& m, int slot, std::vector<uint8_t>& out);
void cuda_write_slot(CudaModel& m, int slot, std::span<const uint8_t> in);
void cuda_read_pool(CudaModel& m, std::vector<uint8_t>& out);
void cuda_write_pool(CudaModel& m, std::span<const uint8_t> in);
void cuda_read_draft_context(CudaModel& m, int slot, std::vector<uint8_t>& out);
void cuda_write_draft_context(CudaModel& m, int slot, std::span<const uint8_t> in);
void cuda_set_slot_length(CudaModel& m, int slot, int64_t length);

// The model's encoders run on the device: rows [n, head_dim] -> KV records [n, rec.bytes] of the
// model's cache dtype (kv_quantize), rows [n, index_head_dim] -> FP4 keys [n, key.bytes].
void cuda_encode_kv(CudaModel& m, const float* rows, int64_t n, std::vector<uint8_t>& out);
void cuda_encode_index_keys(CudaModel& m, const float* rows, int64_t n, std::vector<uint8_t>& out);

// One step, layer half by layer half on h (the device's residual streams [rows, hc * hidden]):
// begin validates the batch against the device model's slot lengths and uploads the step plan;
// end advances the slot lengths.
Status cuda_begin_step(CudaModel& m, const StepBatch& batch);
// After cuda_begin_step: whether the step's GEMMs take the tensor cores (the forward's choice:
// a sequence adds more than tc_min_rows tokens, or more rows than the decode path holds).
bool cuda_step_tensor_cores(CudaModel& m);
// The last prepared step's plan: the bytes its copy uploads and each sequence's block-table width.
size_t cuda_step_plan_bytes(CudaModel& m);
int cuda_step_table_width(CudaModel& m);
void cuda_set_h(CudaModel& m, const float* h, int64_t rows);
void cuda_get_h(CudaModel& m, float* h, int64_t rows);
void cuda_attention_half(CudaModel& m, int layer, const StepBatch& batch);
void cuda_ffn_half(CudaModel& m, int layer, const StepBatch& batch);
void cuda_end_step(CudaModel& m);
// Under tensor parallelism: the all-reduce epilogues of the attention output and the MoE (bf16
// round; shared-expert add and round) as their own launches after the collective (round_bf16,
// moe_add_shared) instead of hc_post's load epilogue: the reference that forward's bits are tested
// against (eager steps; a graph keeps what it was captured with).
void cuda_set_epilogue_launches(CudaModel& m, bool on);
// The LM head over `rows` (<= the model's logits rows) residual-stream rows: out [rows, vocab].
void cuda_logits(CudaModel& m, const float* h, int64_t rows, std::vector<float>& out);

// After cuda_attention_half of a CSA layer: top-k ids [rows, index_topk]; the scores [rows, cols]
// when one indexer chunk covered the step (else `scores` is left empty and false returned).
bool cuda_last_indexer(CudaModel& m, int64_t rows, int64_t cols, std::vector<float>& scores,
                       std::vector<int32_t>& topk);
// After cuda_ffn_half (or cuda_draft_stage_ffn): gate logits [rows, n_routed_experts] and expert
// ids [rows, num_experts_per_tok].
void cuda_last_routing(CudaModel& m, int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts);

// The DSpark draft stage by stage (greedy heads): begin stages the requests and embeds their blocks
// into h [B * K, hc * hidden], K = draft_tokens(); finish returns tokens, raw confidences and the
// Markov-corrected logits.
Status cuda_draft_begin(CudaModel& m, std::span<const CudaModel::DraftQueryDev> requests);
void cuda_draft_stage_attention(CudaModel& m, int stage, int64_t requests);
void cuda_draft_stage_ffn(CudaModel& m, int stage, int64_t requests);
void cuda_draft_finish(CudaModel& m, int64_t requests, std::vector<DraftResult>& results);

}  // namespace tandem::model_testing
