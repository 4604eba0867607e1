// decode_act_pack: the activation operand of the FP8 decode GEMVs, optionally fused with the
// RMSNorm that produces it. One 256-thread CTA per row, no shared row buffer (any dim, no
// shared-memory limit); the row's arithmetic is decode_act.cuh's pack_row, which repeats the
// rms_norm and act_quant ops operation for operation, so y, codes and scales are bit for bit those
// of the two ops run one after the other.
#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/decode_act.cuh"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

using pack::kBlock;
using pack::kThreads;

__global__ void __launch_bounds__(kThreads) act_pack_kernel(const DecodeActPackArgs a) {
  __shared__ double red[32];
  // The norm weights of this warp's blocks (every row's) in registers before the dependency wait
  // (launch.cuh's rule 1: no kernel writes them), so their load overlaps the previous kernel instead
  // of following the row's sum of squares. Rows of more blocks read them in pack_block.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nb = a.dim / kBlock;
  const bool pre = a.norm_weight && nb <= pack::kPreBlocks * (kThreads / kWarp);
  float wv[pack::kPreBlocks][pack::kPer];
  if (pre) {
#pragma unroll
    for (int j = 0; j < pack::kPreBlocks; ++j) {
      const int64_t b = warp + j * (kThreads / kWarp);
#pragma unroll
      for (int i = 0; i < pack::kPer; ++i) wv[j][i] = b < nb ? a.norm_weight[b * kBlock + lane + i * kWarp] : 0.0f;
    }
  }
  pdl_trigger();
  pdl_wait();
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    float* y = a.y ? a.y + r * a.ldy : nullptr;
    const float* x = a.x + r * a.ldx;
    uint8_t* codes = a.codes + r * a.ldc;
    uint8_t* scales = a.scales + r * a.lds;
    if (pre) pack::pack_row(x, a.dim, a.norm_weight, a.eps, y, codes, scales, red, wv);
    else pack::pack_row(x, a.dim, a.norm_weight, a.eps, y, codes, scales, red);
    // The next row's block sum reuses red: block_sum opens with a barrier, nothing else is shared.
  }
}

}  // namespace

void decode_act_pack(const DecodeActPackArgs& p, cudaStream_t s) {
  if (p.rows == 0) return;
  TANDEM_CHECK_MSG(p.dim > 0 && p.dim % kBlock == 0 && p.dim <= kMaxPackDim, "decode_act_pack: dim");
  TANDEM_CHECK(p.x && p.codes && p.scales);
  DecodeActPackArgs a = p;
  if (a.ldx <= 0) a.ldx = a.dim;
  if (a.ldy <= 0) a.ldy = a.dim;
  if (a.ldc <= 0) a.ldc = a.dim;
  if (a.lds <= 0) a.lds = a.dim / kBlock;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(a.rows, 65535));
  if (a.pdl) {
    launch_pdl(act_pack_kernel, dim3(grid), dim3(kThreads), 0, s, a);
  } else {
    act_pack_kernel<<<grid, kThreads, 0, s>>>(a);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace tandem::kernels::cuda
