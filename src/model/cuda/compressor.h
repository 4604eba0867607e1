// The KV compressor state machine on the device (the CPU: run_compressor in
// DsV4Model::Impl::attention_target, src/model/forward.cpp, pooling with kernels::cpu::compress_pool):
// per-row compressor rows, the gated pooling of every entry a step completes (reading this step's
// rows or the slot's row ring; the two also as one launch, compress_step), and the store of the
// finished entries' records into the pool.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// out[t] = [kv[t] (chans), gate[t] + ape[pos_t % ratio] (chans)]   (fp32, one add per element)
struct CompRowsArgs {
  const float* kv = nullptr;         // [rows, chans] wkv output
  const float* gate = nullptr;       // [rows, chans] wgate output
  const float* ape = nullptr;        // [ratio, chans]
  StepMeta m;
  int64_t rows = 0;
  int64_t chans = 0;                 // coff * d
  int ratio = 4;
  float* out = nullptr;              // [rows, 2*chans]
};
void comp_rows_build(const CompRowsArgs& a, cudaStream_t s);

// For each row that completes a compressed entry ((pos+1) % ratio == 0): gated pooling over the
// entry's candidate rows (this step's rows or the slot ring), bf16 result into entry[t], the entry's
// position ratio*j into entry_pos[t], flag[t] = 1; other rows get flag 0, entry_pos 0 and zeros.
struct CompressArgs {
  const float* step_rows = nullptr;  // [rows, 2*chans] (comp_rows_build's output)
  uint8_t* slot_state = nullptr;     // all slots [max_slots, slot_bytes]
  int64_t slot_bytes = 0;
  int64_t ring_off = 0;              // byte offset of this compressor's ring in a slot: fp32 [ring, 2*chans]
  int ring = 0;
  int64_t chans = 0;                 // coff * d
  int ratio = 4;
  int64_t d = 512;
  bool overlap = true;
  StepMeta m;
  int64_t rows = 0;
  float* entry = nullptr;            // [rows, d] out
  int64_t* entry_pos = nullptr;      // [rows] out
  int32_t* flag = nullptr;           // [rows] out
};
void compress_entries(const CompressArgs& a, cudaStream_t s);

// comp_rows_build(rows) then compress_entries(entries) as one launch, with the same outputs bit for
// bit (rows.out, entry, entry_pos, flag): each block writes its row's compressor row and pools its
// entry reading this step's candidate rows from their operands (rows.kv, rows.gate + rows.ape, the
// same one add per element) instead of rows.out, so no block reads another's output.
// entries.step_rows is not read (null, or rows.out); rows.rows == entries.rows, rows.chans ==
// entries.chans, rows.ratio == entries.ratio.
void compress_step(const CompRowsArgs& rows, const CompressArgs& entries, cudaStream_t s);

// Copies the records of flagged rows into the pool at the entry's block:
// pool[block_tables[seq][pos / bs]] + pool_off + ((pos % bs) / ratio) * rec_bytes.
struct StoreEntriesArgs {
  const uint8_t* rec = nullptr;      // [rows, rec_bytes]
  int64_t rec_bytes = 0;
  const int32_t* flag = nullptr;     // [rows]
  const int64_t* entry_pos = nullptr;  // [rows]
  StepMeta m;
  int64_t rows = 0;
  int ratio = 4;
  uint8_t* pool = nullptr;           // [num_blocks, block_bytes]
  int64_t block_bytes = 0;
  int64_t pool_off = 0;
};
void store_entries(const StoreEntriesArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
