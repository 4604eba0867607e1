// Activation quantization round trips (FP8 e4m3 / FP4 e2m1 with power-of-two E8M0 block scales)
// and the elementwise bf16 rounding. Bit-exact with the CPU ops: the same numeric_core.h
// conversions, exact division by the power-of-two scale, no FMA contraction.
// One warp per (row, block): lanes stride the block, a warp max gives the block's amax (the FP4
// block's body: row::fp4_block_warp, row_math.cuh).
#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerCta = 8;

using QuantArgs = QuantRowsArgs;

using row::warp_amax;

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
    uint8_t* codes = a.codes ? a.codes + r * (a.cols / 2) + b * (a.block / 2) : nullptr;
    uint8_t* scale = a.scales ? a.scales + r * nb + b : nullptr;
    row::fp4_block_warp(a.src + r * a.lds + b * a.block, a.dst + r * a.ldd + b * a.block, a.block, lane, codes, scale);
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
