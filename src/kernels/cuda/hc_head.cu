// mHC hc_head: the split-K mixing projection (hc_common.cuh), then one CTA per token: sigmoid
// weights on one thread, the stream collapse on all threads.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hc_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

__global__ void __launch_bounds__(hc::kThreads) hc_head_finish(HcHeadParams p, const double* partial, int ksplit) {
  pdl_enter();
  __shared__ float pre[kMaxHc];
  extern __shared__ double stage[];  // hc::stage_bytes
  __shared__ float mix[kMaxHc];
  const int hc = p.hc;
  const int64_t HD = hc * p.dim;
  const int64_t t = blockIdx.x;
  hc::finish_mix(partial, t, hc, ksplit, HD, p.norm_eps, stage, mix);
  for (int j = threadIdx.x; j < hc; j += blockDim.x)
    pre[j] = add_rn(hc::sigmoid(add_rn(mul_rn(mix[j], p.scale[0]), p.base[j])), p.hc_eps);
  __syncthreads();
  hc::collapse(p.h + t * HD, pre, hc, p.dim, p.y + t * p.dim, p.round_bf16, threadIdx.x, blockDim.x);
}

}  // namespace

void hc_head(const HcHeadParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK(p.hc <= kMaxHc);
  TANDEM_CHECK_MSG(p.tokens < (int64_t{1} << 31), "hc_head: too many tokens");
  const int64_t HD = p.hc * p.dim;
  const int ksplit = hc_mix_ksplit(HD, p.hc);
  const double* partial = hc::launch_mix(p.h, p.fn, p.tokens, p.hc, HD, ksplit, s);
  launch_pdl(hc_head_finish, static_cast<unsigned>(p.tokens), hc::kThreads, hc::stage_bytes(p.hc, ksplit), s, p,
             partial, ksplit);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
