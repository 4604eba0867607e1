// mHC hc_head: the split-K mixing projection (hc_common.cuh), then `split` CTAs per token (1, or
// hc_mix.h's kHcSplit at a few tokens), each finishing the mixes and the sigmoid weights itself
// and collapsing its slice of the columns on all threads.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hc_common.cuh"
#include "kernels/cuda/hc_mix.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

// CTA r of token t collapses columns [r * slice, (r + 1) * slice) (clamped to dim).
__global__ void __launch_bounds__(hc::kThreads)
    hc_head_finish(HcHeadParams p, const double* partial, int ksplit, int split, int64_t slice) {
  pdl_enter();
  __shared__ float pre[kMaxHc];
  extern __shared__ double stage[];  // hc::stage_bytes
  __shared__ float mix[kMaxHc];
  const int hc = p.hc;
  const int64_t HD = hc * p.dim;
  const int64_t t = blockIdx.x / split;
  const int64_t r = blockIdx.x % split;
  hc::finish_mix(partial, t, hc, ksplit, HD, p.norm_eps, stage, mix);
  for (int j = threadIdx.x; j < hc; j += blockDim.x)
    pre[j] = add_rn(hc::sigmoid(add_rn(mul_rn(mix[j], p.scale[0]), p.base[j])), p.hc_eps);
  __syncthreads();
  const int64_t c0 = r * slice < p.dim ? r * slice : p.dim;
  const int64_t n = p.dim - c0 < slice ? p.dim - c0 : slice;
  hc::collapse(p.h + t * HD + c0, p.dim, pre, hc, n, p.y + t * p.dim + c0, p.round_bf16, threadIdx.x, blockDim.x);
}

}  // namespace

void hc_head(const HcHeadParams& p, cudaStream_t s, HcFinishShape shape) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK(p.hc <= kMaxHc);
  TANDEM_CHECK_MSG(p.tokens < (int64_t{1} << 31) / kHcSplit, "hc_head: too many tokens");
  const int64_t HD = p.hc * p.dim;
  const int ksplit = hc_mix_ksplit(HD, p.hc);
  const double* partial = hc::launch_mix(p.h, p.fn, p.tokens, p.hc, HD, ksplit, s);
  if (shape == HcFinishShape::kAuto) shape = p.tokens <= kHcSplitMaxTokens ? HcFinishShape::kSplit : HcFinishShape::kToken;
  const int split = shape == HcFinishShape::kSplit ? kHcSplit : 1;
  const int64_t slice = (p.dim + 4 * split - 1) / (4 * split) * 4;  // columns per CTA, a multiple of 4
  launch_pdl(hc_head_finish, static_cast<unsigned>(p.tokens * split), hc::kThreads, hc::stage_bytes(p.hc, ksplit), s,
             p, partial, ksplit, split, slice);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void hc_head(const HcHeadParams& p, cudaStream_t s) { hc_head(p, s, HcFinishShape::kAuto); }

}  // namespace tandem::kernels::cuda
