// The device implementation of the sampling op (kernels/sampling.h): one thread-block cluster per row
// (8 CTAs, each a slice of the vocabulary) turns the row's logits into its processed distribution
// and decides the row's token exactly as the host implementation (kernels/cpu/sampling.cpp) does,
// with the same counter-based RNG.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sampling.h"

namespace tandem::kernels::cuda {

// Scratch bytes sample_rows_device needs for `max_rows` rows of `vocab` (allocate once at start-up):
// the part of each CTA's slice of the processed logits (float) that does not stay in shared memory
// when many rows run (none up to a vocabulary of 90,112; about 30% of the 129,280 vocabulary), and
// each CTA's list of top-p candidates (16-bit offsets, up to a quarter of the slice) and a top-k
// row's mask of live ids (a bit per id); 236 KB a row at 129,280 (156 KB of it z's part).
size_t sample_rows_scratch_bytes(int max_rows, int64_t vocab);

// Runs `n` rows (every pointer is device memory; n <= the scratch's max_rows). Capturable in a
// CUDA graph: no allocation, no synchronization, no host reads.
struct SampleRowsArgs {
  SampleInputs in;                     // logits [rows of the step, vocab] etc., device pointers
  const SampleRow* rows = nullptr;     // [n]
  int n = 0;
  void* scratch = nullptr;             // sample_rows_scratch_bytes(>= n, in.vocab) bytes
  SampleRowResult* out = nullptr;      // [n]
};
void sample_rows_device(const SampleRowsArgs& a, cudaStream_t stream);

// Rows of `vocab` the device runs at once (clusters resident together) in a launch of `rows` rows
// (a launch of more than 32 keeps less of each slice in shared memory, to fit 4 CTAs per SM), for
// the benchmark's report; -1 when the occupancy query fails.
int sample_rows_active_clusters(int64_t vocab, int rows);

}  // namespace tandem::kernels::cuda
