// The mHC mixing projection shared by hc_pre and hc_head (hc_mix.cu): split-K partials of the
// flattened streams' dots with every fn row, plus the fp64 sum of squares, for the finishing
// kernels (hc_common.cuh's finish_mix), and the finishing kernels' launch shapes. Declared apart so
// the op test can run every launch shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

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

// The finishing kernels of hc_pre, hc_pre_pack (decode_gemm.h) and hc_head: kToken: one CTA per
// token; kSplit: kHcSplit CTAs per token, each collapsing a slice of the columns (hc_pre_pack's in
// one thread-block cluster, whose CTAs read the whole row from each other's shared memory for the
// RMSNorm), one of them running the Sinkhorn; kAuto: kSplit up to kHcSplitMaxTokens tokens (a
// decode step: one CTA cannot stream a token's hc x dim floats quickly), kToken above. Every shape
// gives the same bits.
enum class HcFinishShape { kAuto, kToken, kSplit };
constexpr int kHcSplit = 8;  // the portable cluster size
constexpr int64_t kHcSplitMaxTokens = 16;

// cuda_ops.h's hc_pre / hc_head with the finishing kernel's shape chosen.
void hc_pre(const HcPreParams& p, cudaStream_t s, HcFinishShape shape);
void hc_head(const HcHeadParams& p, cudaStream_t s, HcFinishShape shape);

}  // namespace tandem::kernels::cuda
