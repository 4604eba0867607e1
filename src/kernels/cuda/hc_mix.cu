// mHC mixing projection (hc_mix.h): split-K partials of fn . xf and sum(xf^2) in two launch
// shapes with the same bits. Every partial (token t, mix row j, K slice ks) is what a 256-thread
// CTA computes: thread i chains fmaf over k = k0 + i, k0 + i + 256, ... (fp64 for the squares),
// then block_sum's tree: xor butterflies 16, 8, 4, 2, 1 within each warp, then the same butterfly
// over the 8 warps' sums (lanes >= 8 zero). kRows runs that per (j, ks, tokens); kTiled keeps a
// tile of tokens' h slice in registers and runs every j over it, so h is read once rather than
// nmix + 1 times, and reduces 32 (j, token) sums per warp at once by a reduce-scatter butterfly
// (each level adds the same pairs as warp_sum's; fp addition commutes, so the bits are equal).
#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/hc_mix.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

// ---------------------------------------------------------------- kRows
// A CTA per (j, ks, kT tokens): the shape for a few decode tokens (many CTAs over the ~1.5 MB fn).
template <int kT>
__global__ void __launch_bounds__(kThreads) mix_rows_kernel(const float* h, const float* fn, int64_t tokens, int nmix,
                                                            int64_t hd, int ksplit, double* partial) {
  pdl_enter();
  __shared__ double red[32];
  const int j = blockIdx.x, ks = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * kT;
  const int64_t chunk = (hd + ksplit - 1) / ksplit;
  const int64_t k0 = ks * chunk, k1 = k0 + chunk < hd ? k0 + chunk : hd;
  const float* hr[kT];
#pragma unroll
  for (int tt = 0; tt < kT; ++tt) hr[tt] = h + (t0 + tt < tokens ? t0 + tt : tokens - 1) * hd;
  if (j < nmix) {
    const float* w = fn + static_cast<int64_t>(j) * hd;
    float acc[kT] = {};
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
      const float wv = w[k];
#pragma unroll
      for (int tt = 0; tt < kT; ++tt) acc[tt] = fmaf(hr[tt][k], wv, acc[tt]);
    }
#pragma unroll
    for (int tt = 0; tt < kT; ++tt) {
      const double v = static_cast<double>(block_sum(acc[tt], reinterpret_cast<float*>(red)));
      if (threadIdx.x == 0 && t0 + tt < tokens) partial[((t0 + tt) * (nmix + 1) + j) * ksplit + ks] = v;
    }
  } else {
    double acc[kT] = {};
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
#pragma unroll
      for (int tt = 0; tt < kT; ++tt) acc[tt] += static_cast<double>(hr[tt][k]) * hr[tt][k];
    }
#pragma unroll
    for (int tt = 0; tt < kT; ++tt) {
      const double v = block_sum(acc[tt], red);
      if (threadIdx.x == 0 && t0 + tt < tokens) partial[((t0 + tt) * (nmix + 1) + j) * ksplit + ks] = v;
    }
  }
}

// ---------------------------------------------------------------- kTiled
__device__ __forceinline__ float add_exact(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_exact(double a, double b) { return __dadd_rn(a, b); }

// One level (xor S) of the reduce-scatter over the warp: C values per lane in v[0, C). C > 1: the
// lane keeps the half its bit S selects (upper with the bit set), sends the other half to lane ^ S
// and adds what that lane sends for the kept half; C == 1: a plain butterfly level. Lane l adds
// its own value and lane l ^ S's for the same output at every level, as warp_sum does.
template <int S, int C, typename T, int N>
__device__ __forceinline__ void reduce_scatter_level(T (&v)[N], int lane) {
  if constexpr (C > 1) {
    constexpr int H = C / 2;
    const bool up = (lane & S) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const T send = up ? v[i] : v[i + H];
      const T keep = up ? v[i + H] : v[i];
      v[i] = add_exact(keep, __shfl_xor_sync(0xffffffffu, send, S));
    }
    if constexpr (S > 1) reduce_scatter_level<S / 2, H>(v, lane);
  } else {
    v[0] = add_exact(v[0], __shfl_xor_sync(0xffffffffu, v[0], S));
    if constexpr (S > 1) reduce_scatter_level<S / 2, 1>(v, lane);
  }
}

// The warp sums of N values per lane (N a power of two <= 32), each with warp_sum's bits: lane l
// ends with the sum of output l / (32 / N) in v[0].
template <typename T, int N>
__device__ __forceinline__ void reduce_scatter(T (&v)[N]) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two <= 32");
  reduce_scatter_level<16, N>(v, threadIdx.x & 31);
}

// block_sum's second stage as its thread 0 computes it: r = the 8 warps' sums in lanes 0..7, zeros
// above, then xor 16, 8, 4, 2, 1 (own value first): ((b0 + b4) + (b2 + b6)) + ((b1 + b5) + (b3 + b7))
// with b_l = (r_l + 0) + 0 (the zero lanes' contributions at levels 16 and 8).
template <typename T>
__device__ __forceinline__ T warps_total(const T* r, int stride) {
  static_assert(kWarps == 8, "the tree below is block_sum's for 8 warps");
  T b[kWarps];
#pragma unroll
  for (int l = 0; l < kWarps; ++l) b[l] = add_exact(add_exact(r[l * stride], T(0)), T(0));
  const T c0 = add_exact(b[0], b[4]), c1 = add_exact(b[1], b[5]), c2 = add_exact(b[2], b[6]),
          c3 = add_exact(b[3], b[7]);
  return add_exact(add_exact(c0, c2), add_exact(c1, c3));
}

constexpr int kBatch = 4;  // reduce-scatter groups between two barriers

// A CTA per (kT tokens, K slice ks, share jpart of the mix-row groups). Thread i holds h[t][k] for
// its k (k0 + i + 256 it, it < kIt) of the tile's tokens; a group is kJ = 32 / kT mix rows x kT
// tokens = 32 sums. Groups g = jpart, jpart + jsplit, ... (gridDim.z = jsplit <= the group count);
// jpart 0 also makes the sums of squares.
template <int kT, int kIt>
__global__ void __launch_bounds__(kThreads) mix_tiled_kernel(const float* __restrict__ h, const float* __restrict__ fn,
                                                             int64_t tokens, int nmix, int64_t hd, int ksplit,
                                                             double* __restrict__ partial) {
  constexpr int kJ = 32 / kT;
  static_assert(kJ * kT == 32, "a group is one warp's 32 sums");
  __shared__ float red[kBatch][kWarps][32];  // warp sums of the batch's groups
  __shared__ double redd[kWarps][kT];        // warp sums of the squares
  pdl_enter();
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int ks = blockIdx.y, jpart = blockIdx.z, jsplit = gridDim.z;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kT;
  const int64_t chunk = (hd + ksplit - 1) / ksplit;
  const int64_t k0 = ks * chunk, k1 = k0 + chunk < hd ? k0 + chunk : hd;

  float hv[kT][kIt];
#pragma unroll
  for (int tt = 0; tt < kT; ++tt) {
    const float* hr = h + (t0 + tt < tokens ? t0 + tt : tokens - 1) * hd;
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int64_t k = k0 + threadIdx.x + it * kThreads;
      hv[tt][it] = k < k1 ? hr[k] : 0.0f;
    }
  }

  if (jpart == 0) {
    double sq[kT];
#pragma unroll
    for (int tt = 0; tt < kT; ++tt) {
      sq[tt] = 0.0;
#pragma unroll
      for (int it = 0; it < kIt; ++it)
        if (k0 + threadIdx.x + it * kThreads < k1) sq[tt] += static_cast<double>(hv[tt][it]) * hv[tt][it];
    }
    reduce_scatter(sq);  // lane l: token l / (32 / kT)
    if (lane % (32 / kT) == 0) redd[wid][lane / (32 / kT)] = sq[0];
  }

  const int groups = (nmix + kJ - 1) / kJ;
  const int mine = (groups - jpart + jsplit - 1) / jsplit;
  for (int b0 = 0; b0 < mine; b0 += kBatch) {
#pragma unroll 1
    for (int b = 0; b < kBatch; ++b) {
      if (b0 + b >= mine) break;  // uniform over the CTA
      const int g = jpart + (b0 + b) * jsplit;
      float acc[32];  // [jj * kT + tt]
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) {
        const int j = g * kJ + jj;
#pragma unroll
        for (int tt = 0; tt < kT; ++tt) acc[jj * kT + tt] = 0.0f;
        if (j < nmix) {
          const float* w = fn + static_cast<int64_t>(j) * hd;
#pragma unroll
          for (int it = 0; it < kIt; ++it) {
            const int64_t k = k0 + threadIdx.x + it * kThreads;
            if (k < k1) {
              const float wv = w[k];
#pragma unroll
              for (int tt = 0; tt < kT; ++tt) acc[jj * kT + tt] = fmaf(hv[tt][it], wv, acc[jj * kT + tt]);
            }
          }
        }
      }
      reduce_scatter(acc);  // lane l: sum l = (jj, tt)
      red[b][wid][lane] = acc[0];
    }
    __syncthreads();
    if (threadIdx.x < kBatch * 32) {
      const int b = threadIdx.x >> 5, o = threadIdx.x & 31;
      const int g = jpart + (b0 + b) * jsplit;
      const int j = g * kJ + o / kT;
      const int64_t t = t0 + o % kT;
      if (b0 + b < mine && j < nmix && t < tokens)
        partial[(t * (nmix + 1) + j) * ksplit + ks] = static_cast<double>(warps_total(&red[b][0][o], 32));
    }
    __syncthreads();  // red is rewritten by the next batch
  }
  if (jpart == 0) {
    __syncthreads();  // redd complete (also where the CTA has no group: mine == 0 cannot happen, jsplit <= groups)
    if (threadIdx.x < kT && t0 + threadIdx.x < tokens)
      partial[((t0 + threadIdx.x) * (nmix + 1) + nmix) * ksplit + ks] = warps_total(&redd[0][threadIdx.x], kT);
  }
}

template <int kT, int kIt>
void launch_tiled(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, int ksplit, double* partial,
                  cudaStream_t s) {
  const int64_t ttiles = (tokens + kT - 1) / kT;
  TANDEM_CHECK_MSG(ttiles < (int64_t{1} << 31), "hc: too many tokens for one launch");
  const int groups = (nmix + (32 / kT) - 1) / (32 / kT);
  // Split the mix rows over CTAs where tiles x slices alone would leave the GPU mostly idle (tens of
  // tokens); each split re-reads h (from L2).
  constexpr int64_t kWantCtas = 256;
  int jsplit = 1;
  while (jsplit * 2 <= groups && ttiles * ksplit * jsplit < kWantCtas) jsplit *= 2;
  launch_pdl(mix_tiled_kernel<kT, kIt>, dim3(static_cast<unsigned>(ttiles), ksplit, jsplit), kThreads, 0, s, h, fn,
             tokens, nmix, hd, ksplit, partial);
}

}  // namespace

int hc_mix_ksplit(int64_t hd, int nmix) {
  // Partials of one token are staged by the finishing CTA: (nmix + 1) * ksplit doubles <= 4096.
  constexpr int64_t kMaxStage = 4096;
  int64_t s = hd / 1024;
  s = s < 1 ? 1 : (s > 32 ? 32 : s);
  const int64_t cap = kMaxStage / (nmix + 1);
  return static_cast<int>(s < cap ? s : (cap < 1 ? 1 : cap));
}

HcMixShape hc_mix_partials(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, int ksplit,
                           double* partial, cudaStream_t s, HcMixShape shape) {
  TANDEM_CHECK(tokens > 0 && nmix > 0 && hd > 0 && ksplit >= 1 && ksplit <= 65535);
  const int64_t chunk = (hd + ksplit - 1) / ksplit;
  const int64_t its = (chunk + kThreads - 1) / kThreads;  // k positions per thread
  if (shape == HcMixShape::kAuto) shape = tokens >= 8 ? HcMixShape::kTiled : HcMixShape::kRows;
  if (shape == HcMixShape::kTiled && its > 8) shape = HcMixShape::kRows;
  if (shape == HcMixShape::kTiled) {
    // 16 tokens x 4 k positions or 8 x 8 in registers (64 floats); 16 tokens halve the fn reads.
    if (its <= 4 && tokens >= 64) launch_tiled<16, 4>(h, fn, tokens, nmix, hd, ksplit, partial, s);
    else launch_tiled<8, 8>(h, fn, tokens, nmix, hd, ksplit, partial, s);
  } else {
    const int kt = tokens < 4 ? 1 : 4;  // one decode token: one block sum, not four of the same row
    const int64_t ttiles = (tokens + kt - 1) / kt;
    TANDEM_CHECK_MSG(ttiles <= 65535, "hc: too many tokens for one launch");
    const dim3 grid(nmix + 1, ksplit, static_cast<unsigned>(ttiles));
    if (kt == 1) launch_pdl(mix_rows_kernel<1>, grid, kThreads, 0, s, h, fn, tokens, nmix, hd, ksplit, partial);
    else launch_pdl(mix_rows_kernel<4>, grid, kThreads, 0, s, h, fn, tokens, nmix, hd, ksplit, partial);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
  return shape;
}

}  // namespace tandem::kernels::cuda
