// The attention's row finishing as one kernel: the query heads' RMSNorm and RoPE, the indexer's
// query heads' RoPE, Hadamard and FP4 round trip, the key rows' RMSNorm, RoPE and cache record (a
// KV record, or for the indexer's compressed keys a Hadamard rotation and an FP4 key record). It
// replaces the launches rms_norm (q heads), rms_norm (kv), rope (q), rope (kv), kv_quantize, rope
// (iq), hadamard (iq), fp4_act_quant (iq) of a layer's q/kv, and rms_norm, rope, [hadamard],
// kv_quantize / index_key_quantize of a compressor's entries (and then its store_entries), with
// their arithmetic (shared row bodies: kernels/cuda/row_math.cuh, kv_record.cuh, compressor.cuh), so
// its outputs equal theirs bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

struct NormRopeArgs {
  // Query heads (heads == 0: none): RMSNorm of each head in the bf16 chain (RmsNormMode::kBf16Chain,
  // no weight), then RoPE (rounded to bf16) on its last rope_dim dims.
  float* q = nullptr;                  // [tokens, heads, q_dim] in place
  int64_t heads = 0;
  int q_dim = 0;
  // The indexer's query heads (iheads == 0: none): RoPE (rounded to bf16) on the last rope_dim dims,
  // Hadamard (rounded to bf16), then the FP4 round trip (fp4_act_quant, blocks of 32), in place.
  float* iq = nullptr;                 // [tokens, iheads, iq_dim] (iq_dim a power of two <= 2048)
  int64_t iheads = 0;
  int iq_dim = 0;
  // Key rows (k == null: none): RMSNorm (fp64 sum of squares, k_norm, rounded to bf16), RoPE
  // (rounded to bf16) on the last rope_dim dims, then rotate ? Hadamard (rounded to bf16) + the
  // index key record (key) : the KV record (rec), each rewriting the row with its round trip.
  float* k = nullptr;                  // [tokens, k_dim] in place
  int k_dim = 0;
  const float* k_norm = nullptr;       // [k_dim]
  bool rotate = false;
  KvRecordLayout rec;                  // !rotate: rec.head_dim == k_dim
  IndexKeyLayout key;                  // rotate: key.dim == k_dim (a power of two <= 2048)
  uint8_t* records = nullptr;          // [tokens, rec.bytes] (!rotate) or [tokens, key.bytes] (rotate)
  // Optional (pool != null): a compressor's store_entries in the same launch: the record of key row t
  // with store_flag[t] != 0 also copied to its entry's pool slot (compressor.cuh's entry_slot at
  // positions[t], the entry's position), the bytes store_entries(records, ...) writes.
  const int32_t* store_flag = nullptr;  // [tokens]
  StepMeta m;                           // the step's rows (row_seq, block tables)
  int ratio = 0;
  uint8_t* pool = nullptr;              // [num_blocks, block_bytes]
  int64_t block_bytes = 0;
  int64_t pool_off = 0;
  // Both row kinds.
  const int64_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  int rope_dim = 64;
  int64_t tokens = 0;
  float eps = 1e-6f;                   // both RMSNorms
  // The kernels: 0 = by the row count (tokens >= kNormRopePrefillTokens: the prefill kernels);
  // 1 = one block per row (the decode kernel); 2..32 = the prefill kernels with up to this many query
  // heads per block (capped by what fits; the tests pin it). Every choice gives the same bits.
  int rows_per_block = 0;
};

constexpr int64_t kNormRopePrefillTokens = 128;

// Decode rows: one block per query head, indexer query head and key row. Prefill rows: several query
// heads per block, a warp per indexer query head, then the key rows as decode. Graph-capturable,
// launched with PDL (up to three launches).
void norm_rope(const NormRopeArgs& a, cudaStream_t s);

// The query heads per block the prefill kernel would take for `a` (1: it does not fit `a`'s shapes).
int norm_rope_q_rows_per_block(const NormRopeArgs& a);
// Whether the indexer's query heads fit the warp-per-row prefill kernel (iq_dim 64, 128 or 256).
bool norm_rope_iq_warp_fits(const NormRopeArgs& a);

}  // namespace tandem::cuda_model
