// Attention with the sink on the device: the target's MQA attention (attention.cu: the sliding
// window of this step's rows or the slot's ring of KV records, plus the compressed entries: the
// indexer's top-k with ratio 4, every visible entry with ratio 128) and DSpark's draft attention
// (attention_draft.cu: context ring plus the whole block). The CPU: DsV4Model::Impl::attend
// (src/model/forward.cpp) via model::attend, fed by attention_target / draft_propose.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// Keys per chunk and heads per thread block of the target attention (see attention.cu).
constexpr int kAttnChunk = 64;
constexpr int kAttnHeadTile = 16;

// Target attention of every row over its key list: the window [pos-W+1, pos] (this step's fp32 rows
// for positions of the step, else the slot's ring records), then the compressed entries (the top-k
// list in its order when topk != null, else every visible entry j < (pos+1)/ratio in order); ids of
// the list that are negative or not yet visible are masked. All heads of the rank share each key.
//
// Numerics (one definition for every row count and launch shape, so a row's bits depend only on the
// row): the list is cut into chunks of kAttnChunk consecutive keys. Chunk c: s_i = fl(q.k_i) *
// fl(1/sqrt(hd)) (bf16 tensor cores, fp32 accumulation), m_c = max s_i, p_i = exp(s_i - m_c) in
// fp32, z_c = sum p_i (fixed tree), o_c = sum p_i v_i (p_i split exactly into three bf16 terms, bf16
// tensor cores, fp32 accumulation in key order). The chunks are folded in list order: m' = max(m,
// m_c), o = o e^(m-m') + o_c e^(m_c-m'), z likewise (m = -inf, z = 0, o = 0 before chunk 0);
// out = bf16(o / (z + exp(sink - m))). The CPU (model::attend) takes one global max and sums in key
// order; the two agree to fp32 rounding (tests/cuda/attention_test.cpp states the bound).
//
// Launch shapes (equal bits): a thread block per (chunk, 16 heads, row) writing each chunk's
// (m_c, z_c, o_c) to `partial`, then a fold kernel per (row, head); or, when the step's rows fill
// the GPU or the partials do not fit, a thread block per (row, 16 heads) folding its chunks as it
// goes. Shared memory: about 90 KiB per block at hd 512, whatever the context length.
struct AttnArgs {
  const float* q = nullptr;          // [rows, heads, hd] bf16 values (after RoPE)
  const float* step_kv = nullptr;    // [rows, hd] this step's KV values (after the cache round trip)
  const uint8_t* slot_state = nullptr;  // [max_slots, slot_bytes]
  int64_t slot_bytes = 0;
  int64_t win_off = 0;               // the window ring in a slot: [win_ring, rec.bytes]
  int win_ring = 0;
  int window = 128;
  int ratio = 0;                     // 0: window only
  const uint8_t* pool = nullptr;     // [num_blocks, block_bytes]
  int64_t block_bytes = 0;
  int64_t pool_main = 0;             // the layer's entries in a block: [bs/ratio, rec.bytes]
  const int32_t* topk = nullptr;     // [rows, topk_ld] entry ids (-1 = none), ratio 4 with indexer
  int topk_ld = 0;
  int topk_k = 0;
  const float* sink = nullptr;       // [heads]
  int heads = 64;
  int hd = 512;                      // 128, 256 or 512 (attention_supports_head_dim)
  KvRecordLayout rec;
  int max_keys = 0;                  // bound on keys per row (the launch covers ceil(max_keys/64) chunks)
  float* out = nullptr;              // [rows, heads, hd]
  // Optional (out_inv_freq != null): the inverse RoPE of each output head's last out_rope_dim dims
  // at the row's position, rounded to bf16, in the epilogue: the bits of rope(inverse, round_bf16)
  // on `out` after the attention (the same row::rope_pair on the same values), one launch fewer.
  const float* out_inv_freq = nullptr;  // [out_rope_dim / 2]
  int out_rope_dim = 0;              // even, <= hd
  StepMeta m;
  int64_t rows = 0;
  // Split-K scratch: attn_partial_floats(heads, hd, slots) floats for `partial_slots` (row, chunk)
  // pairs; null, or too few slots for rows * chunks, runs the folding blocks instead.
  float* partial = nullptr;
  int64_t partial_slots = 0;
  int sm_count = 0;                  // multiprocessors (0: the current device's)
  // Optional key-row scratch of key_rows_cap rows of hd bf16 values, for the folding blocks (steps
  // whose rows fill the GPU: prefill chunks). attention() then first writes, in one launch
  // (key_rows_kernel), this step's fp32 KV rows as bf16 rows and, with ratio > 0 when the step runs
  // at least 4 rows per sequence, every compressed entry its rows can see, for as many of the step's
  // `seqs` sequences as fit (entries_bound each): each key decoded once per step instead of once per
  // row and 16 heads, and such keys copied into shared memory without converting. The same values (a
  // record's decode is exact, a row's bf16 rounding the same), so the same bits.
  uint16_t* key_rows = nullptr;
  int64_t key_rows_cap = 0;
  int64_t seqs = 0;                  // sequences of the step (StepMeta's per-sequence arrays)
  int64_t entries_bound = 0;         // >= the entries any row sees ((position + 1) / ratio); 0: without a
                                     // top-k list max_keys - window, with one no entries in the scratch
  // Set by attention() (callers leave them 0): the step's rows are in key_rows [0, rows); the
  // entries of sequence s < kr_seqs at key_rows [rows + s * kr_comp, + kr_comp).
  int kr_step = 0;
  int kr_seqs = 0;
  int64_t kr_comp = 0;
};
void attention(const AttnArgs& a, cudaStream_t s);

bool attention_supports_head_dim(int hd);
// Floats of a split-K scratch of `slots` (row, chunk) pairs.
int64_t attn_partial_floats(int heads, int hd, int64_t slots);
// True when attention(a) runs split over chunks (with the fold kernel), false when each block folds
// its row's chunks itself.
bool attention_splits(const AttnArgs& a);

// DSpark draft attention: row r = (request b, block position t) attends to the request's context
// [max(0,P-W), P) (records, position p at ring row p % ring) and all K block rows (fp32, non-causal).
struct DraftAttnArgs {
  const float* q = nullptr;          // [B*K, heads, hd]
  const float* block_kv = nullptr;   // [B*K, hd]
  const uint8_t* ctx = nullptr;      // [slots, stages, ring, rec.bytes]; this stage's ring at ctx + slot*slot_stride + stage_off
  int64_t slot_stride = 0;
  int64_t stage_off = 0;
  const int32_t* req_slot = nullptr; // [B]
  const int64_t* req_pos = nullptr;  // [B] anchor position P
  int K = 5;
  int window = 128;
  int ring = 0;                      // rows of the ring, >= window (0: window)
  const float* sink = nullptr;       // [heads]
  int heads = 64;
  int hd = 512;
  KvRecordLayout rec;
  float* out = nullptr;              // [B*K, heads, hd]
  int64_t B = 0;
  // Optional (out_inv_freq != null): the output's inverse RoPE as AttnArgs::out_inv_freq, row r at
  // out_positions[r] (hd a multiple of 64).
  const int64_t* out_positions = nullptr;  // [B*K]
  const float* out_inv_freq = nullptr;     // [out_rope_dim / 2]
  int out_rope_dim = 0;                    // even, <= hd
};
// whole_list: decode every key of the list once into shared memory where the device holds it (the
// default); false: a chunk at a time in each pass (what a smaller device runs; tests compare both).
void draft_attention(const DraftAttnArgs& a, cudaStream_t s, bool whole_list = true);
// Tests only: the previous kernel, one block per (row, head), each head decoding every key itself
// (draft_attention's outputs equal its bit for bit); window + K <= 512, hd <= 1024.
void draft_attention_reference(const DraftAttnArgs& a, cudaStream_t s);
// Tests only: records [n, l.bytes] decoded by draft_attention's row decoder to out[n, l.head_dim]
// (kv_record_get's values bit for bit).
void draft_kv_decode_rows(const uint8_t* recs, int64_t n, const KvRecordLayout& l, float* out, cudaStream_t s);

}  // namespace tandem::cuda_model
