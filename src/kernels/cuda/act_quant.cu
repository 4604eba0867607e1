// Activation quantization round trips (FP8 e4m3 / FP4 e2m1 with power-of-two E8M0 block scales)
// and the elementwise bf16 rounding. Bit-exact with the CPU ops: the same numeric_core.h
// conversions, exact division by the power-of-two scale, no FMA contraction.
// One warp per (row, block): lanes stride the block, a warp max gives the block's amax.
#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerCta = 8;

using QuantArgs = QuantRowsArgs;

__device__ __forceinline__ float warp_amax(const float* x, int block, int lane) {
  float amax = 0.0f;
  for (int i = lane; i < block; i += kWarp) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;  // NaN compares false: ignored, as the CPU op
  }
  return warp_max(amax);  // never NaN here
}

__global__ void fp8_kernel(QuantArgs a) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t nb = a.cols / a.block;
  const int64_t total = a.rows * nb;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  for (int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5); gw < total; gw += warps) {
    const int64_t r = gw / nb, b = gw % nb;
    const float* xs = a.src + (r / a.rows_per_batch) * a.src_batch_stride + (r % a.rows_per_batch) * a.lds + b * a.block;
    float* xd = a.dst + r * a.ldd + b * a.block;
    const float amax = warp_amax(xs, a.block, lane);
    const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
    const float s = num::pow2_int(e);
    if (a.scales && lane == 0) a.scales[r * nb + b] = num::e8m0_from_exponent(e);
    uint8_t* codes = a.codes ? a.codes + r * a.cols + b * a.block : nullptr;
    __syncwarp();  // every lane has read the block before any lane writes it (in place)
    for (int i = lane; i < a.block; i += kWarp) {
      const float x = xs[i];
      const float v = clamp_std(div_rn(x, s), -num::kE4m3Max, num::kE4m3Max);
      const uint8_t c = num::f32_to_e4m3(is_nan(x) ? x : v);
      if (codes) codes[i] = c;
      xd[i] = mul_rn(num::e4m3_decode(c), s);
    }
  }
}

__global__ void fp4_kernel(QuantArgs a) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t nb = a.cols / a.block;
  const int64_t total = a.rows * nb;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  for (int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5); gw < total; gw += warps) {
    const int64_t r = gw / nb, b = gw % nb;
    const float* xs = a.src + r * a.lds + b * a.block;
    float* xd = a.dst + r * a.ldd + b * a.block;
    const float amax = warp_amax(xs, a.block, lane);
    const int e = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
    const float s = num::pow2_int(e);
    if (a.scales && lane == 0) a.scales[r * nb + b] = num::e8m0_from_exponent(e);
    uint8_t* codes = a.codes ? a.codes + r * (a.cols / 2) + b * (a.block / 2) : nullptr;
    __syncwarp();
    // Each lane owns element pairs so a packed code byte has one writer.
    for (int i = 2 * lane; i < a.block; i += 2 * kWarp) {
      uint8_t c[2];
      float out[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float x = xs[i + j];
        c[j] = num::f32_to_e2m1(clamp_std(div_rn(x, s), -num::kE2m1Max, num::kE2m1Max));
        out[j] = is_nan(x) ? x : mul_rn(num::e2m1_decode(c[j]), s);
      }
      if (codes) codes[i / 2] = static_cast<uint8_t>((c[0] & 0xf) | ((c[1] & 0xf) << 4));
      xd[i] = out[0];
      xd[i + 1] = out[1];
    }
  }
}

__global__ void round_bf16_kernel(float* x, int64_t rows, int64_t cols, int64_t ldx) {
  pdl_enter();
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float* p = x + (i / cols) * ldx + i % cols;
    *p = round_bf16(*p);
  }
}

}  // namespace

void act_quant_fp8_rows(const QuantRowsArgs& a, cudaStream_t s) {
  if (a.rows == 0 || a.cols == 0) return;
  launch_pdl(fp8_kernel, grid_for(a.rows * (a.cols / a.block), kWarpsPerCta), kWarpsPerCta * kWarp, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void act_quant_fp8(const ActQuantFp8Params& p, cudaStream_t s) {
  validate(p);
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.cols;
  act_quant_fp8_rows({p.x, ldx, p.rows, 0, p.x, ldx, p.rows, p.cols, p.block, p.codes, p.scales}, s);
}

void fp4_act_quant(const Fp4ActQuantParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0 || p.cols == 0) return;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.cols;
  const QuantArgs a{p.x, ldx, p.rows, 0, p.x, ldx, p.rows, p.cols, p.block, p.codes, p.scales};
  launch_pdl(fp4_kernel, grid_for(p.rows * (p.cols / p.block), kWarpsPerCta), kWarpsPerCta * kWarp, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void round_bf16(const RoundBf16Params& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0 || p.cols == 0) return;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.cols;
  launch_pdl(round_bf16_kernel, grid_for(p.rows * p.cols, 256 * 8), 256, 0, s, p.x, p.rows, p.cols, ldx);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
