// The top-k of the indexer's scores per row on the device (the CPU: kernels::cpu::topk in
// DsV4Model::Impl::attention_target): the k largest scores of the row's visible entries with the
// CPU's order (NaN above everything, equal scores by lower id), returned as the selected ids in
// ascending order (the order in which the CPU's attention walks them) and -1 past min(k, visible).
//
// The scores are bf16; topk_key16 maps them to 16-bit keys in the selection's order, so three
// passes of (slices of 2048 entries x rows) blocks select exactly, whatever the ties:
//  1. each row's histogram of the keys' top byte (the indexer counts it while scoring, or a pass here);
//  2. per slice: the entries above the threshold byte counted and the next byte's histogram of those
//     in it (with suffix sums); the row's last block finds the exact threshold key T, how many entries
//     equal to T are taken (the R lowest ids), and every slice's output offset;
//  3. per slice: the selected ids written in id order at the slice's offset.
// Rows of one slice (n_cols <= kTopkSlice: contexts up to 8K positions) run the three passes in one
// block per row, one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/numeric_core.h"

namespace tandem::cuda_model {

constexpr int kTopkSlice = 2048;  // entries per block of passes 1-3

// Order key of a bf16 score: larger key = selected first; NaN above +inf (all NaNs equal), -0 == +0.
TANDEM_HD uint32_t topk_key16(uint16_t b) {
  if ((b & 0x7fffu) > 0x7f80u) return 0xffffu;
  if (b == 0x8000u) b = 0;
  return (b & 0x8000u) ? (~static_cast<uint32_t>(b) & 0xffffu) : (static_cast<uint32_t>(b) | 0x8000u);
}

// Working state. hist1, hist2 and ticket (max_rows rows) must be zero before the first call (one
// cudaMemset at start-up); every call leaves them zero again. `work` holds each call's per-slice
// counts and offsets: topk_work_bytes(rows, n_cols) of it are used.
struct TopkState {
  uint32_t* hist1 = nullptr;   // [max_rows, 256] pass 1 (the indexer's `hist`)
  uint32_t* hist2 = nullptr;   // [max_rows, 256]
  uint32_t* ticket = nullptr;  // [max_rows] blocks of pass 2 done
  int64_t max_rows = 0;
  uint8_t* work = nullptr;
  size_t work_bytes = 0;
};
size_t topk_counters_bytes(int64_t max_rows);  // hist1, hist2, ticket
TopkState topk_state(void* counters, int64_t max_rows, void* work, size_t work_bytes);
size_t topk_work_bytes(int64_t rows, int64_t n_cols);

struct IndexerTopkArgs {
  const uint16_t* scores = nullptr;  // [rows, lds] bf16 bits
  int64_t lds = 0;                   // a multiple of 8
  int64_t n_cols = 0;
  const int32_t* visible = nullptr;  // [rows] entries to choose from (clamped to [0, n_cols])
  int64_t rows = 0;                  // <= state.max_rows, <= 65535, topk_work_bytes(rows, n_cols) <= work_bytes
  int k = 512;
  int32_t* out = nullptr;            // [rows, ldo] ids, ascending, then -1
  int64_t ldo = 0;                   // >= k
  TopkState state;
  bool hist_ready = false;           // state.hist1 already holds this call's pass 1 (the indexer's)
  // n_cols <= kTopkSlice (one slice per row): the three passes as one launch of a block per row
  // (the same ids: the same decisions on the same counts); false runs the three (for tests).
  bool one_launch = true;
};
void indexer_topk(const IndexerTopkArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
