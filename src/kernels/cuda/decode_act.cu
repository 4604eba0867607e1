// decode_act_pack: the activation operand of the FP8 decode GEMVs, optionally fused with the
// RMSNorm that produces it. One 256-thread CTA per row, no shared row buffer (any dim, no
// shared-memory limit): the norm's fp64 sum of squares repeats rms_norm.cu's fp32 mode operation
// for operation (same thread count and element order, so the same block sum), then each warp
// normalizes and quantizes whole 128-column blocks as act_quant.cu does (same amax, scale and e4m3
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
constexpr int kPer = kBlock / kWarp;  // values of a block per lane

__global__ void __launch_bounds__(kThreads) act_pack_kernel(const DecodeActPackArgs a) {
  __shared__ double red[32];
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nb = a.dim / kBlock;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float* x = a.x + r * a.ldx;
    float rs = 1.0f;
    if (a.norm_weight) {
      double ss = 0.0;
      for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
        const float v = x[i];
        ss += static_cast<double>(v) * v;
      }
      // Every thread has read its elements of x before any is rewritten (y may equal x): the
      // block sum's barriers order the reads above before the writes below.
      ss = block_sum(ss, red);
      const float var = static_cast<float>(ss / static_cast<double>(a.dim));
      rs = div_rn(1.0f, sqrtf(add_rn(var, a.eps)));
    }
    for (int64_t b = warp; b < nb; b += kThreads / kWarp) {
      const int64_t c0 = b * kBlock + lane;
      float v[kPer];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const float xv = x[c0 + i * kWarp];
        v[i] = a.norm_weight ? round_bf16(mul_rn(a.norm_weight[c0 + i * kWarp], mul_rn(xv, rs))) : xv;
        const float av = fabsf(v[i]);
        amax = av > amax ? av : amax;  // NaN compares false: ignored, as the act_quant op
      }
      amax = warp_max(amax);
      const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float sc = num::pow2_int(e);
      if (lane == 0) a.scales[r * a.lds + b] = num::e8m0_from_exponent(e);
      uint8_t* codes = a.codes + r * a.ldc;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const float q = clamp_std(div_rn(v[i], sc), -num::kE4m3Max, num::kE4m3Max);
        codes[c0 + i * kWarp] = num::f32_to_e4m3(is_nan(v[i]) ? v[i] : q);
        if (a.norm_weight && a.y) a.y[r * a.ldy + c0 + i * kWarp] = v[i];
      }
    }
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
