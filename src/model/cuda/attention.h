// Attention with the sink on the device: the target's (sliding window of this step's rows or the
// slot's ring of KV records, plus the compressed entries: the indexer's top-k with ratio 4, every
// visible entry with ratio 128) and DSpark's draft attention (context ring plus the whole block).
// The CPU: DsV4Model::Impl::attend (src/model/forward.cpp), fed by attention_target / draft_propose.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// Attention of every row and head (global max, fp32 probabilities, sink in the denominator, bf16
// output) over: the window [pos-W+1, pos] (this step's fp32 rows or the slot's ring records) and
// the compressed entries (the top-k list when topk != null, else every visible entry (pos+1)/ratio).
struct AttnArgs {
  const float* q = nullptr;          // [rows, heads, hd]
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
  int hd = 512;
  KvRecordLayout rec;
  int max_keys = 0;                  // bound on keys per row (shared memory)
  float* out = nullptr;              // [rows, heads, hd]
  StepMeta m;
  int64_t rows = 0;
};
void attention(const AttnArgs& a, cudaStream_t s);

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
  const float* sink = nullptr;       // [heads]
  int heads = 64;
  int hd = 512;
  KvRecordLayout rec;
  float* out = nullptr;              // [B*K, heads, hd]
  int64_t B = 0;
};
void draft_attention(const DraftAttnArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
