// decode_act_pack: the activation operand of the FP8 decode GEMVs, optionally fused with the
// RMSNorm that produces it. One 256-thread CTA per row: the row is staged in shared memory; the
// norm repeats rms_norm.cu's fp32 mode operation for operation (same thread count, so the same
// fp64 block sum) and the quantization repeats act_quant.cu's (same amax, scale and e4m3
// conversion), so y, codes and scales are bit for bit those of the two ops run one after the other.
#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // == rms_norm.cu's kThreads: the fp64 sum's order depends on it
constexpr int kBlock = 128;

__global__ void __launch_bounds__(kThreads) act_pack_kernel(const DecodeActPackArgs a) {
  extern __shared__ float row[];
  __shared__ double red[32];
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nb = a.dim / kBlock;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float* x = a.x + r * a.ldx;
    if (a.norm_weight) {
      double ss = 0.0;
      for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
        const float v = x[i];
        row[i] = v;
        ss += static_cast<double>(v) * v;
      }
      ss = block_sum(ss, red);  // contains __syncthreads: the row is staged before it is rewritten
      const float var = static_cast<float>(ss / static_cast<double>(a.dim));
      const float rs = div_rn(1.0f, sqrtf(add_rn(var, a.eps)));
      for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
        const float v = round_bf16(mul_rn(a.norm_weight[i], mul_rn(row[i], rs)));
        row[i] = v;
        if (a.y) a.y[r * a.ldy + i] = v;
      }
    } else {
      for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) row[i] = x[i];
    }
    __syncthreads();
    for (int64_t b = warp; b < nb; b += kThreads / kWarp) {
      const float* xs = row + b * kBlock;
      float amax = 0.0f;
      for (int i = lane; i < kBlock; i += kWarp) {
        const float v = fabsf(xs[i]);
        amax = v > amax ? v : amax;  // NaN compares false: ignored, as the act_quant op
      }
      amax = warp_max(amax);
      const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float sc = num::pow2_int(e);
      if (lane == 0) a.scales[r * a.lds + b] = num::e8m0_from_exponent(e);
      uint8_t* codes = a.codes + r * a.ldc + b * kBlock;
      for (int i = lane; i < kBlock; i += kWarp) {
        const float v = xs[i];
        const float q = clamp_std(div_rn(v, sc), -num::kE4m3Max, num::kE4m3Max);
        codes[i] = num::f32_to_e4m3(is_nan(v) ? v : q);
      }
    }
    __syncthreads();  // the row buffer is reused by the next row
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
  const size_t smem = static_cast<size_t>(a.dim) * sizeof(float);  // <= 48 KB: no opt-in needed
  if (a.pdl) {
    launch_pdl(act_pack_kernel, dim3(grid), dim3(kThreads), smem, s, a);
  } else {
    act_pack_kernel<<<grid, kThreads, smem, s>>>(a);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace tandem::kernels::cuda
