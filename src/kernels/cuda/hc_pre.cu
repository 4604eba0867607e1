// mHC hc_pre: split-K mixing projection (hc_common.cuh), then one CTA per token finishes the
// mixes, runs the Sinkhorn normalization (hc <= 5: one warp lane per matrix element, sums gathered
// by shuffles in the CPU's order; wider: one thread) while warps 1.. collapse the streams (that
// needs only the pre weights).
// hc_pre_pack (decode_gemm.h): the same CTA then normalizes and quantizes its x row
// (decode_act.cuh's pack_row), one kernel less per layer half on the decode path.
// At a few tokens (hc_mix.h's HcFinishShape::kSplit) kHcSplit CTAs finish each token instead, each
// collapsing a slice of the columns (hc_pre_pack: a thread-block cluster, the RMSNorm's sum read
// from the CTAs' shared memory in pack_row's order) while a ninth warp of CTA 0 runs the Sinkhorn.
// hc_pre_pack with a HcCombSide: the finishing kernels skip the Sinkhorn, and comb_kernel (a warp per
// token: the same finish_mix, then the same sinkhorn()) runs it on the side stream.
// The finishing kernels touch their weights (scale, base, the norm weight) before the dependency
// wait: those L2 round trips then overlap the mix instead of following it.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_act.cuh"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/hc_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

static_assert(hc::kThreads == pack::kThreads, "pack_row needs the finishing CTA's 256 threads");

// pre[j] and (if `post`) p.post[t][j] from token t's mixes.
__device__ __forceinline__ void pre_post(const HcPreParams& p, const float* mix, int64_t t, int j, float* pre,
                                         bool post) {
  const int hc = p.hc;
  pre[j] = add_rn(hc::sigmoid(add_rn(mul_rn(mix[j], p.scale[0]), p.base[j])), p.hc_eps);
  if (post) p.post[t * hc + j] = mul_rn(2.0f, hc::sigmoid(add_rn(mul_rn(mix[j + hc], p.scale[1]), p.base[j + hc])));
}

// The comb of token t (p.comb[t]) from its mixes, by one whole warp (every lane calls it).
__device__ __forceinline__ void sinkhorn(const HcPreParams& p, const float* mix, int64_t t, int lane) {
  const int hc = p.hc;
  if (hc * hc <= kWarp) {
    // Lane l owns C[l / hc][l % hc]; row and column sums gather the hc values by shuffles
    // and add them in the CPU's index order, so every element sees the CPU's arithmetic.
    const bool own = lane < hc * hc;
    const int j = own ? lane / hc : 0, k = own ? lane % hc : 0;
    auto row_sum = [&](float v) {
      float s = 0.0f;
      for (int kk = 0; kk < hc; ++kk) s = add_rn(s, __shfl_sync(0xffffffffu, v, j * hc + kk));
      return s;
    };
    auto col_sum = [&](float v) {
      float s = 0.0f;
      for (int jj = 0; jj < hc; ++jj) s = add_rn(s, __shfl_sync(0xffffffffu, v, jj * hc + k));
      return s;
    };
    float c = own ? add_rn(mul_rn(mix[2 * hc + lane], p.scale[2]), p.base[2 * hc + lane]) : 0.0f;
    float m = __shfl_sync(0xffffffffu, c, j * hc);
    for (int kk = 1; kk < hc; ++kk) {
      const float v = __shfl_sync(0xffffffffu, c, j * hc + kk);
      m = v > m ? v : m;
    }
    c = exp_cr(sub_rn(c, m));
    c = add_rn(div_rn(c, row_sum(c)), p.hc_eps);
    c = div_rn(c, add_rn(col_sum(c), p.hc_eps));
    for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
      c = div_rn(c, add_rn(row_sum(c), p.hc_eps));
      c = div_rn(c, add_rn(col_sum(c), p.hc_eps));
    }
    if (own) p.comb[t * hc * hc + lane] = c;
  } else if (lane == 0) {
    // Wide streams (hc > 5): the same arithmetic on one thread.
    float c[kMaxHc * kMaxHc];
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k)
        c[j * hc + k] = add_rn(mul_rn(mix[2 * hc + j * hc + k], p.scale[2]), p.base[2 * hc + j * hc + k]);
    for (int j = 0; j < hc; ++j) {
      float m = c[j * hc];
      for (int k = 1; k < hc; ++k) m = c[j * hc + k] > m ? c[j * hc + k] : m;
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) {
        c[j * hc + k] = exp_cr(sub_rn(c[j * hc + k], m));
        s = add_rn(s, c[j * hc + k]);
      }
      for (int k = 0; k < hc; ++k) c[j * hc + k] = add_rn(div_rn(c[j * hc + k], s), p.hc_eps);
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s = add_rn(s, c[j * hc + k]);
        for (int j = 0; j < hc; ++j) c[j * hc + k] = div_rn(c[j * hc + k], add_rn(s, p.hc_eps));
      }
    };
    col_norm();
    for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s = add_rn(s, c[j * hc + k]);
        for (int k = 0; k < hc; ++k) c[j * hc + k] = div_rn(c[j * hc + k], add_rn(s, p.hc_eps));
      }
      col_norm();
    }
    for (int i = 0; i < hc * hc; ++i) p.comb[t * hc * hc + i] = c[i];
  }
}

// Brings the 128-byte lines of x[0, n) into L1, a line per thread (the finishing kernels, before
// their dependency wait: weights are written by no kernel of the step, launch.cuh's rule 1).
__device__ __forceinline__ void prefetch_l1(const float* x, int64_t n) {
  if (n <= 0) return;
  const uintptr_t first = reinterpret_cast<uintptr_t>(x) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(x + n);
  for (uintptr_t a = first + threadIdx.x * uintptr_t{128}; a < end; a += blockDim.x * uintptr_t{128})
    asm volatile("prefetch.global.L1 [%0];" ::"l"(a));
}

// The weights a finishing CTA reads after the mixes: scale, base and, with the pack, the norm
// weight's columns [c0, c0 + n).
__device__ __forceinline__ void prefetch_weights(const HcPreParams& p, const float* norm_weight, int64_t c0,
                                                 int64_t n) {
  prefetch_l1(p.scale, 3);
  prefetch_l1(p.base, (2 + p.hc) * p.hc);
  if (norm_weight) prefetch_l1(norm_weight + c0, n);
}

// comb of token blockIdx.x alone (hc_pre_pack's HcCombSide), one warp: finish_mix (every mix, the
// finishing kernel's arithmetic), then sinkhorn(). Launched after the mix completes (a full
// dependency: no PDL); `stage` as the finishing kernels'.
__global__ void __launch_bounds__(kWarp) comb_kernel(HcPreParams p, const double* partial, int ksplit) {
  extern __shared__ double stage[];  // hc::stage_bytes
  __shared__ float mix[(2 + kMaxHc) * kMaxHc];
  const int nmix = (2 + p.hc) * p.hc;
  hc::finish_mix(partial, blockIdx.x, nmix, ksplit, p.hc * p.dim, p.norm_eps, stage, mix);
  sinkhorn(p, mix, blockIdx.x, threadIdx.x);
}

// kPack: hc_pre_pack's tail (pk used); else hc_pre alone (pk unused). comb: this kernel runs the
// Sinkhorn (else comb_kernel does, on the side stream).
template <bool kPack>
__global__ void __launch_bounds__(hc::kThreads)
    hc_pre_finish(HcPreParams p, const double* partial, int ksplit, HcPrePackArgs pk, bool comb) {
  prefetch_weights(p, kPack ? pk.norm_weight : nullptr, 0, p.dim);
  pdl_enter();
  __shared__ float pre[kMaxHc];
  extern __shared__ double stage[];  // hc::stage_bytes
  __shared__ float mix[(2 + kMaxHc) * kMaxHc];
  const int hc = p.hc;
  const int nmix = (2 + hc) * hc;
  const int64_t HD = hc * p.dim;
  const int64_t t = blockIdx.x;
  hc::finish_mix(partial, t, nmix, ksplit, HD, p.norm_eps, stage, mix);
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < hc) pre_post(p, mix, t, threadIdx.x, pre, true);
  __syncthreads();  // pre
  float* x = p.x + t * p.dim;
  if (threadIdx.x >= kWarp) {
    // Warps 1.. collapse the streams (which needs pre only) while warp 0 runs the Sinkhorn.
    hc::collapse(p.h + t * HD, p.dim, pre, hc, p.dim, x, true, threadIdx.x - kWarp, blockDim.x - kWarp);
  } else if (comb) {
    sinkhorn(p, mix, t, lane);
  }
  if constexpr (kPack) {
    // pack_row reads x[t] by 128-column blocks, which other threads' collapse wrote: the barrier
    // makes those writes visible. stage is free since finish_mix (its last barrier): the block sum's.
    __syncthreads();
    pack::pack_row(x, p.dim, pk.norm_weight, pk.eps, x, pk.codes + t * p.dim, pk.scales + t * (p.dim / pack::kBlock),
                   stage);
  }
}

// ---- kSplit: kHcSplit CTAs per token (hc_mix.h). CTA r of token t collapses columns [r * slice,
// (r + 1) * slice) of x[t] (clamped to dim). Warps 0..7 do the columns; warp 8 of CTA 0 runs the
// Sinkhorn meanwhile (only comb needs it). hc_pre_pack's CTAs form a cluster: each collapses its
// slice into shared memory, and after a cluster barrier every CTA sums the squares of the whole row
// in pack_row's order (thread i of 256: elements i, i + 256, ... of the row, then the block sum's
// tree), reading the elements from the CTA that holds them; then it normalizes and quantizes its
// own 128-column blocks with pack_row's per-block code. Same bits as hc_pre_finish.

constexpr int kSplitThreads = hc::kThreads + kWarp;
// The streams a finishing thread loads before the partials (hc_pre_finish_split): up to kEarlyHc
// streams of kEarlyCols columns (dim 4096 over 8 CTAs of 256 threads: 2).
constexpr int kEarlyHc = 4;
constexpr int kEarlyCols = 2;
constexpr int kSinkhornWarp = hc::kThreads / kWarp;
// hc_pre_pack's slice: whole 128-column blocks, at most this many columns (dim <= kMaxPackDim).
constexpr int64_t kMaxSlice = (kMaxPackDim / pack::kBlock + kHcSplit - 1) / kHcSplit * pack::kBlock;

int64_t split_slice(int64_t dim, bool pack) {
  const int64_t unit = pack ? pack::kBlock : 4;
  return (dim + unit * kHcSplit - 1) / (unit * kHcSplit) * unit;
}

// The cluster barrier in two halves (arrive: release of this thread's writes; wait: acquire of every
// thread's in the cluster). Each thread alternates them.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}

// The shared-memory address `p` of this CTA as seen in cluster CTA `rank`'s shared memory window.
__device__ __forceinline__ const float* cluster_peer(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<const float*>(__cluster_map_shared_rank(p, static_cast<unsigned>(rank)));
#else
  return p;
#endif
}

// block_sum (device.cuh) over warps 0..7 only (warp 8 is elsewhere): the same tree, a named barrier.
__device__ __forceinline__ double sum_256(double v, double* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = warp_sum(v);
  asm volatile("bar.sync 1, %0;" ::"n"(hc::kThreads) : "memory");
  if (lane == 0) red[wid] = v;
  asm volatile("bar.sync 1, %0;" ::"n"(hc::kThreads) : "memory");
  const double r = lane < hc::kThreads / kWarp ? red[lane] : 0.0;
  return warp_sum(r);
}

template <bool kPack>
__global__ void __launch_bounds__(kSplitThreads)
    hc_pre_finish_split(HcPreParams p, const double* partial, int ksplit, HcPrePackArgs pk, int64_t slice, bool comb) {
  {
    const int64_t r = blockIdx.x % kHcSplit, c0 = r * slice < p.dim ? r * slice : p.dim;
    prefetch_weights(p, kPack ? pk.norm_weight : nullptr, c0, p.dim - c0 < slice ? p.dim - c0 : slice);
  }
  pdl_enter();
  __shared__ float pre[kMaxHc];
  extern __shared__ double stage[];  // hc::stage_bytes
  __shared__ float mix[(2 + kMaxHc) * kMaxHc];
  __shared__ float xs[kPack ? kMaxSlice : 1];  // kPack: this CTA's slice of x[t], collapsed
  const int hc = p.hc;
  const int nmix = (2 + hc) * hc;
  const int64_t dim = p.dim, HD = hc * dim;
  const int64_t t = blockIdx.x / kHcSplit;
  const int r = static_cast<int>(blockIdx.x % kHcSplit);  // == the cluster rank (1-D clusters of kHcSplit)
  const int64_t c0 = r * slice < dim ? r * slice : dim;
  const int64_t n = dim - c0 < slice ? dim - c0 : slice;
  // The slice's streams (written by the kernel before this one) in registers now, so that their L2
  // round trip overlaps the partials' below instead of following it (the decode shapes: at most 4
  // streams and two columns a thread; others load in hc::collapse).
  const bool early_h = hc <= kEarlyHc && n <= kEarlyCols * hc::kThreads && threadIdx.x < hc::kThreads;
  float hv[kEarlyHc][kEarlyCols];
  if (early_h) {
    const float* hs = p.h + t * HD + c0;
#pragma unroll
    for (int i = 0; i < kEarlyHc; ++i)
#pragma unroll
      for (int u = 0; u < kEarlyCols; ++u) {
        const int64_t d = threadIdx.x + static_cast<int64_t>(u) * hc::kThreads;
        hv[i][u] = i < hc && d < n ? hs[i * dim + d] : 0.0f;
      }
  }
  // Every CTA finishes the mixes and pre itself (a few KB from L2); CTA 0 writes post and comb.
  hc::finish_mix(partial, t, nmix, ksplit, HD, p.norm_eps, stage, mix);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x < hc) pre_post(p, mix, t, threadIdx.x, pre, r == 0);
  __syncthreads();  // pre; the last block-wide barrier (warp 8 leaves the column work)
  if (warp == kSinkhornWarp) {
    if constexpr (kPack) cluster_arrive();  // warp 8 reads no peer's slice: it releases both barriers at once
    if (r == 0 && comb) sinkhorn(p, mix, t, lane);
    if constexpr (kPack) {
      __syncwarp();
      cluster_wait();
      cluster_arrive();
      cluster_wait();
    }
    return;
  }
  float* const xo = kPack ? xs : p.x + t * dim + c0;
  if (early_h) {
    // hc::collapse's arithmetic on the registers: streams in order from 0, no FMA, bf16-rounded.
#pragma unroll
    for (int u = 0; u < kEarlyCols; ++u) {
      const int64_t d = threadIdx.x + static_cast<int64_t>(u) * hc::kThreads;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kEarlyHc; ++i)
        if (i < hc) sum = add_rn(sum, mul_rn(pre[i], hv[i][u]));
      if (d < n) xo[d] = round_bf16(sum);
    }
  } else {
    hc::collapse(p.h + t * HD + c0, dim, pre, hc, n, xo, true, threadIdx.x, hc::kThreads);
  }
  if constexpr (kPack) {
    cluster_arrive();  // this slice is in shared memory
    cluster_wait();    // and every other CTA's
    // pack_row's sum of squares: element k lives in CTA k / slice at k % slice. kU loads in flight.
    constexpr int kU = 8;
    double ss = 0.0;
    for (int64_t k0 = threadIdx.x; k0 < dim; k0 += kU * hc::kThreads) {
      float v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int k = static_cast<int>(k0) + u * hc::kThreads;  // dim <= kMaxPackDim
        v[u] = 0.0f;
        if (k < dim) {
          const int q = k / static_cast<int>(slice);
          v[u] = *cluster_peer(xs + (k - q * static_cast<int>(slice)), q);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (k0 + static_cast<int64_t>(u) * hc::kThreads < dim) ss += static_cast<double>(v[u]) * v[u];
    }
    ss = sum_256(ss, stage);  // stage is free since finish_mix's last barrier
    cluster_arrive();         // this CTA is done reading the others' slices
    const float rs = pack::rms_scale(ss, dim, pk.eps);
    for (int64_t b = warp; b < n / pack::kBlock; b += hc::kThreads / kWarp)
      pack::pack_block(xs + b * pack::kBlock, c0 + b * pack::kBlock, pk.norm_weight, rs, p.x + t * dim,
                       pk.codes + t * dim, pk.scales + t * (dim / pack::kBlock));
    cluster_wait();  // no CTA exits (its shared memory) while another may still read its slice
  }
}

template <bool kPack>
void launch(const HcPreParams& p, const HcPrePackArgs& pk, HcFinishShape shape, cudaStream_t s) {
  TANDEM_CHECK(p.hc <= kMaxHc);
  TANDEM_CHECK_MSG(p.tokens < (int64_t{1} << 31) / kHcSplit, "hc_pre: too many tokens");
  const int nmix = (2 + p.hc) * p.hc;
  const int64_t HD = p.hc * p.dim;
  const int ksplit = hc_mix_ksplit(HD, nmix);
  const double* partial =
      pk.partials ? pk.partials : hc::launch_mix(p.h, p.fn, p.tokens, nmix, HD, ksplit, s);
  const size_t smem = hc::stage_bytes(nmix, ksplit);
  const HcCombSide* side = pk.comb_side;
  if (side) {
    // The comb's branch: after the mix (a full dependency), beside the finishing kernel.
    TANDEM_CHECK(side->stream && side->fork && side->join && side->stream != s);
    TANDEM_CUDA_CHECK(cudaEventRecord(side->fork, s));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->fork, 0));
    comb_kernel<<<static_cast<unsigned>(p.tokens), kWarp, smem, side->stream>>>(p, partial, ksplit);
    TANDEM_CUDA_LAUNCH_CHECK();
    TANDEM_CUDA_CHECK(cudaEventRecord(side->join, side->stream));
  }
  const bool comb = side == nullptr;
  if (shape == HcFinishShape::kAuto) shape = p.tokens <= kHcSplitMaxTokens ? HcFinishShape::kSplit : HcFinishShape::kToken;
  if (shape == HcFinishShape::kToken) {
    launch_pdl(hc_pre_finish<kPack>, static_cast<unsigned>(p.tokens), hc::kThreads, smem, s, p, partial, ksplit, pk,
               comb);
  } else {
    const int64_t slice = split_slice(p.dim, kPack);
    const unsigned grid = static_cast<unsigned>(p.tokens * kHcSplit);
    if constexpr (kPack) {
      TANDEM_CHECK(slice <= kMaxSlice);
      launch_pdl_cluster(hc_pre_finish_split<true>, grid, kSplitThreads, smem, kHcSplit, s, p, partial, ksplit, pk,
                         slice, comb);
    } else {
      launch_pdl(hc_pre_finish_split<false>, grid, kSplitThreads, smem, s, p, partial, ksplit, pk, slice, comb);
    }
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void hc_pre(const HcPreParams& p, cudaStream_t s, HcFinishShape shape) {
  validate(p);
  if (p.tokens == 0) return;
  launch<false>(p, HcPrePackArgs{}, shape, s);
}

void hc_pre(const HcPreParams& p, cudaStream_t s) { hc_pre(p, s, HcFinishShape::kAuto); }

void hc_pre_pack(const HcPreParams& p, const HcPrePackArgs& pack, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK_MSG(p.dim % pack::kBlock == 0 && p.dim <= kMaxPackDim, "hc_pre_pack: dim");
  TANDEM_CHECK(pack.norm_weight && pack.codes && pack.scales);
  launch<true>(p, pack, pack.finish, s);
}

std::vector<SmemBound> hc_smem_bounds() {
  // The finishing CTA (and comb_kernel) stages one token's partials: hc::stage_bytes, at most hc::kMaxStage doubles
  // (hc_mix_ksplit caps ksplit so); 3.2 KB for hc 4 x 4096.
  const int64_t most = hc::kMaxStage * static_cast<int64_t>(sizeof(double));
  const std::string shape = "(nmix + 1) x ksplit partials at hc_mix_ksplit's cap";
  return {{"hc_pre_finish", most, shape, ""},
          {"hc_pre_finish_split", most, shape, ""},
          {"comb_kernel", most, shape, ""},
          {"hc_head_finish", most, shape, ""}};
}

}  // namespace tandem::kernels::cuda
