// The DeepSeek-V4 kernels of the device runner that are not generic ops (those are
// src/kernels/cuda, behind kernels::Ops): paged KV records, the compressor state machine, the
// lightning indexer over paged FP4 keys, attention over the window ring + compressed entries with
// the sink, routed experts per (token, expert) pair with a deterministic combine, DSpark's draft
// pieces. Every per-sequence quantity (start position, slot, block table) is read from device step
// buffers, so a step's launches do not depend on host values beyond the row counts (graph-capturable).
// Each has a CPU counterpart in src/model/forward.cpp / dspark.cpp and is checked through the
// whole-model comparison in tests/cuda/model_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"
#include "model/cuda/kv_record.h"

namespace tandem::cuda_model {

// Device view of one step (all arrays device memory, sized for the largest step at start-up).
struct StepMeta {
  const int32_t* tokens = nullptr;      // [rows]
  const int64_t* positions = nullptr;   // [rows] absolute position of each row
  const int32_t* row_seq = nullptr;     // [rows] index of the row's sequence in the step
  const int64_t* seq_start = nullptr;   // [seqs] start_pos (first new position)
  const int32_t* seq_row0 = nullptr;    // [seqs] first row of the sequence
  const int32_t* seq_len = nullptr;     // [seqs] new tokens of the sequence
  const int32_t* seq_slot = nullptr;    // [seqs] slot id
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks] pool block ids
  int max_blocks = 0;
  int block_size = 256;
};

// Device slot state layout: byte offsets of one layer's rings inside a slot's state.
struct LayerState {
  int64_t win_off = 0;     // window ring of KV records [win_ring, rec.bytes]
  int64_t comp_off = -1;   // compressor rows ring, fp32 [comp_ring, 2*comp_chans]
  int64_t icomp_off = -1;  // indexer compressor rows ring
  int64_t pool_main = -1;  // byte offset inside a pool block of the layer's entries [bs/ratio, rec.bytes]
  int64_t pool_idx = -1;   // indexer keys [bs/4, key.bytes]
};

// h[r][k][:] = embedding row ids[r] for every hc stream k (hc 1: h[r][:]). The weight holds the
// vocabulary rows [vocab_begin, vocab_end) (a tensor-parallel rank's share): ids outside get zeros.
void embed_rows(const kernels::WeightRef& embed, const int32_t* ids, int64_t rows, int hc, int64_t dim,
                int64_t vocab_begin, int64_t vocab_end, float* h, cudaStream_t s);
// h[r][k][:] = x[r][:] for every hc stream k.
void replicate_hc(const float* x, int64_t rows, int hc, int64_t dim, float* h, cudaStream_t s);

// x[rows, ldx]: the cache dtype's round trip on the NoPE dims (as the CPU's kv_nope), records of
// every row written to rec[rows, l.bytes].
void kv_quantize(float* x, int64_t rows, int64_t ldx, const KvRecordLayout& l, uint8_t* rec, cudaStream_t s);
// x[rows, dim]: fp4_act_quant(x, 32) round trip, key records to rec[rows, l.bytes].
void index_key_quantize(float* x, int64_t rows, const IndexKeyLayout& l, uint8_t* rec, cudaStream_t s);

// rows_out[t] = [kv[t] (C), gate[t] + ape[pos % ratio] (C)]
void comp_rows_build(const float* kv, const float* gate, const float* ape, const StepMeta& m, int64_t rows,
                     int64_t chans, int ratio, float* rows_out, cudaStream_t s);

// For each row that completes a compressed entry ((pos+1) % ratio == 0): gated pooling over the
// entry's candidate rows (this step's rows or the slot ring), bf16 result into entry[t], the entry's
// position ratio*j into entry_pos[t], flag[t] = 1; other rows get flag 0 and entry_pos 0.
struct CompressArgs {
  const float* step_rows = nullptr;  // [rows, 2*chans]
  uint8_t* slot_state = nullptr;     // all slots
  int64_t slot_bytes = 0;
  int64_t ring_off = 0;              // byte offset of this compressor's ring in a slot
  int ring = 0;
  int64_t chans = 0;                 // coff * d
  int ratio = 4;
  int64_t d = 512;
  bool overlap = true;
};
void compress_entries(const CompressArgs& a, const StepMeta& m, int64_t rows, float* entry, int64_t* entry_pos,
                      int32_t* flag, cudaStream_t s);
// Copies the records of flagged rows into the pool at the entry's block.
void store_entries(const uint8_t* rec, int64_t rec_bytes, const int32_t* flag, const int64_t* entry_pos,
                   const StepMeta& m, int64_t rows, int ratio, uint8_t* pool, int64_t block_bytes, int64_t pool_off,
                   cudaStream_t s);

// Ring commits after the layer's attention: rows t of a sequence with t >= len - ring go to
// ring slot pos % ring (bytes_per_row bytes each, from src[t]).
void ring_commit(const uint8_t* src, int64_t bytes_per_row, const StepMeta& m, int64_t rows, uint8_t* slot_state,
                 int64_t slot_bytes, int64_t ring_off, int ring, cudaStream_t s);

// Writes rows [first, n) of src (bytes_per_row each, positions pos0 + t) to ring[(pos0 + t) % ring].
void ring_write(const uint8_t* src, int64_t bytes_per_row, int64_t first, int64_t n, int64_t pos0, uint8_t* ring_base,
                int ring, cudaStream_t s);

// Lightning indexer over paged FP4 keys: scores[t][e] for e < (pos+1)/4, -inf past it, e < n_cols;
// bf16 numerics as kernels::IndexerScoreParams. visible[t] = (pos+1)/4 written too.
void indexer_scores_paged(const float* q, const float* w, const StepMeta& m, int64_t rows, int heads, int dim,
                          const uint8_t* pool, int64_t block_bytes, int64_t pool_idx, const IndexKeyLayout& kl,
                          float* scores, int64_t n_cols, int32_t* visible, cudaStream_t s);

// Attention of every row and head (the CPU's DsV4Model::Impl::attend numerics: global max,
// fp32 probabilities, sink in the denominator, bf16 output) over: the window [pos-W+1, pos] (this
// step's fp32 rows or the slot's ring records) and the compressed entries (the top-k list when
// topk != null, else every visible entry (pos+1)/ratio).
struct AttnArgs {
  const float* q = nullptr;          // [rows, heads, hd]
  const float* step_kv = nullptr;    // [rows, hd] this step's KV values (after the cache round trip)
  const uint8_t* slot_state = nullptr;
  int64_t slot_bytes = 0;
  int64_t win_off = 0;
  int win_ring = 0;
  int window = 128;
  int ratio = 0;                     // 0: window only
  const uint8_t* pool = nullptr;
  int64_t block_bytes = 0;
  int64_t pool_main = 0;
  const int32_t* topk = nullptr;     // [rows, topk_ld] entry ids (-1 = none), ratio 4 with indexer
  int topk_ld = 0;
  int topk_k = 0;
  const float* sink = nullptr;       // [heads]
  int heads = 64;
  int hd = 512;
  KvRecordLayout rec;
  int max_keys = 0;                  // bound on keys per row (shared memory)
  float* out = nullptr;              // [rows, heads, hd]
};
void attention(const AttnArgs& a, const StepMeta& m, int64_t rows, cudaStream_t s);

// DSpark draft attention: row r = (request b, block position t) attends to the request's context
// ring [max(0,P-W), P) (records, ring index p % W) and all K block rows (fp32, non-causal).
struct DraftAttnArgs {
  const float* q = nullptr;          // [B*K, heads, hd]
  const float* block_kv = nullptr;   // [B*K, hd]
  const uint8_t* ctx = nullptr;      // [slots, stages, W, rec.bytes]; this stage's ring at ctx + slot*slot_stride + stage_off
  int64_t slot_stride = 0;
  int64_t stage_off = 0;
  const int32_t* req_slot = nullptr; // [B]
  const int64_t* req_pos = nullptr;  // [B] anchor position P
  int K = 5;
  int window = 128;
  const float* sink = nullptr;
  int heads = 64;
  int hd = 512;
  KvRecordLayout rec;
  float* out = nullptr;
};
void draft_attention(const DraftAttnArgs& a, int64_t B, cudaStream_t s);

// Routed experts per (token, expert) pair: the experts [begin, end) this rank holds live in one
// array (expert e's W1/W3 rows [(e-begin)*inter, ...), W2 rows [(e-begin)*dim, ...)); pairs routed
// to other ranks' experts contribute nothing here (their rows are written as zeros).
struct ExpertRange {
  int64_t begin = 0, end = 0;  // global expert ids held
};
// gact[i] = bf16(silu(min(x1,limit)) * clamp(x3) * weight[i]), x1/x3 = xq[i/topk] . W1/W3_e rows.
void moe_pairs_up(const float* xq, const int32_t* expert_ids, const float* weights, int64_t pairs, int topk,
                  const kernels::WeightRef& w1_all, const kernels::WeightRef& w3_all, int64_t inter, int64_t dim,
                  float limit, ExpertRange held, float* gact, cudaStream_t s);
// out[i] = bf16(gq[i] . W2_e rows) [pairs, dim]
void moe_pairs_down(const float* gq, const int32_t* expert_ids, int64_t pairs, const kernels::WeightRef& w2_all,
                    int64_t inter, int64_t dim, ExpertRange held, float* out, cudaStream_t s);
// y[t] = bf16(sum over the token's held pairs in ascending expert id of out[pair] + shared[t]);
// shared == null: y[t] = that sum in fp32, unrounded (a rank's partial sum before the all-reduce).
void moe_combine(const float* pair_out, const int32_t* expert_ids, const float* shared, int64_t tokens, int topk,
                 int64_t dim, ExpertRange held, float* y, cudaStream_t s);
// y[i] = bf16(y[i] + shared[i]) (the reduced routed sum plus the shared expert).
void moe_add_shared(float* y, const float* shared, int64_t n, cudaStream_t s);

// taps[dst_row[t]][col_off + d] = bf16(mean_k h[t][k][d]) for rows with dst_row[t] >= 0.
void taps_mean(const float* h, const int32_t* dst_row, int64_t rows, int hc, int64_t dim, float* taps, int64_t td,
               int64_t col_off, cudaStream_t s);

// x[i] = bf16(x[i] * scale)
void scale_round(float* x, int64_t n, float scale, cudaStream_t s);
// Mean over hc of nothing else: copies a [rows, cols] block with strides (device memcpy2D).
// positions[i] = base[i / per] + i % per (draft block positions)
void block_positions(const int64_t* base, int64_t count, int per, int64_t* positions, cudaStream_t s);
// positions[i] = start + i
void iota_positions(int64_t start, int64_t count, int64_t* positions, cudaStream_t s);
// ids[b*K + t] = t == 0 ? anchor[b] : noise
void draft_block_ids(const int32_t* anchor, int64_t B, int K, int32_t noise, int32_t* ids, cudaStream_t s);

// One Markov step of every request's draft block (position i): e = markov_w1.row(prev[b]) (dense),
// then the caller runs bias = e @ markov_w2^T; this kernel: z = base[b*K+i] + bias[b]; conf[b*K+i] =
// dot([y[b*K+i], e], conf_w); token = argmax z (greedy) or an inverse-CDF draw from softmax(z/T)
// with rng_uniform(seed[b], P_b + 1 + i, RngStream::kDraft) (kernels/sampling.h: the drafted
// token's position, the CPU draft's key); prev[b] = token; q[b*K+i] = probs.
void markov_gather(const kernels::WeightRef& w1, const int32_t* prev, int64_t B, int64_t rank, float* e,
                   cudaStream_t s);
struct MarkovStepArgs {
  const float* base = nullptr;   // [B*K, V]
  const float* bias = nullptr;   // [B, V]
  const float* e = nullptr;      // [B, rank]
  const float* y = nullptr;      // [B*K, dim] hc_head output (before the norm)
  const float* conf_w = nullptr; // [dim + rank]
  const double* temperature = nullptr;  // [B]
  const uint64_t* seed = nullptr;       // [B]
  const int64_t* pos = nullptr;         // [B] anchor positions
  int64_t V = 0, dim = 0, rank = 0;
  int K = 5, i = 0;
  int32_t* prev = nullptr;       // [B] in: previous token, out: this position's token
  int32_t* tokens = nullptr;     // [B, K]
  float* conf = nullptr;         // [B, K] raw projection
  float* logits = nullptr;       // [B, K, V] z (Markov-corrected)
  float* probs = nullptr;        // optional [B, K, V]
};
void markov_step(const MarkovStepArgs& a, int64_t B, cudaStream_t s);

}  // namespace tandem::cuda_model
