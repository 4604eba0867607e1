// The mHC mixing projection shared by hc_pre and hc_head (hc_mix.cu): split-K partials of the
// flattened streams' dots with every fn row, plus the fp64 sum of squares, for the finishing
// kernels (hc_common.cuh's finish_mix). Declared apart so the op test can run both launch shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels::cuda {

// kRows: a CTA per (mix row, K slice, 1 or 4 tokens) (decode's few tokens); kTiled: a CTA per
// (K slice, 8 or 16 tokens, share of the mix rows) that reads its tokens' h once for all rows
// (prefill). Both give the same bits: each partial is one CTA's fmaf chains per thread and the
// block_sum tree over 256 threads. kAuto picks by token count.
enum class HcMixShape { kAuto, kRows, kTiled };

// K slices of the projection (fixed by hd and nmix: the finish sums the partials in slice order).
int hc_mix_ksplit(int64_t hd, int nmix);

// partial[(t * (nmix + 1) + j) * ksplit + ks]: j < nmix: the fp32 dot of fn row j [nmix, hd] with
// h row t [tokens, hd] over K slice ks (stored exactly as double); j == nmix: the fp64 sum of
// squares of that slice. ksplit = hc_mix_ksplit(hd, nmix). Launched with PDL; allocates nothing.
// Returns the shape it ran (kTiled falls back to kRows where a slice is too long for it: hd >
// 2048 * ksplit).
HcMixShape hc_mix_partials(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, int ksplit,
                           double* partial, cudaStream_t s, HcMixShape shape = HcMixShape::kAuto);

}  // namespace tandem::kernels::cuda
