// mHC hc_pre: split-K mixing projection (hc_common.cuh), then one CTA per token finishes the
// mixes, runs the Sinkhorn normalization (hc <= 5: one warp lane per matrix element, sums gathered
// by shuffles in the CPU's order; wider: one thread) while warps 1.. collapse the streams (that
// needs only the pre weights).
// hc_pre_pack (decode_gemm.h): the same CTA then normalizes and quantizes its x row
// (decode_act.cuh's pack_row), one kernel less per layer half on the decode path.
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

// kPack: hc_pre_pack's tail (pk used); else hc_pre alone (pk unused).
template <bool kPack>
__global__ void __launch_bounds__(hc::kThreads)
    hc_pre_finish(HcPreParams p, const double* partial, int ksplit, HcPrePackArgs pk) {
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
  if (threadIdx.x < hc) {
    const int j = threadIdx.x;
    pre[j] = add_rn(hc::sigmoid(add_rn(mul_rn(mix[j], p.scale[0]), p.base[j])), p.hc_eps);
    p.post[t * hc + j] = mul_rn(2.0f, hc::sigmoid(add_rn(mul_rn(mix[j + hc], p.scale[1]), p.base[j + hc])));
  }
  __syncthreads();  // pre
  float* x = p.x + t * p.dim;
  if (threadIdx.x >= kWarp) {
    // Warps 1.. collapse the streams (which needs pre only) while warp 0 runs the Sinkhorn.
    hc::collapse(p.h + t * HD, pre, hc, p.dim, x, true, threadIdx.x - kWarp, blockDim.x - kWarp);
  } else if (hc * hc <= kWarp) {
    // Warp 0, lane l owns C[l / hc][l % hc]; row and column sums gather the hc values by shuffles
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
  } else if (threadIdx.x == 0) {
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
  if constexpr (kPack) {
    // pack_row reads x[t] by 128-column blocks, which other threads' collapse wrote: the barrier
    // makes those writes visible. stage is free since finish_mix (its last barrier): the block sum's.
    __syncthreads();
    pack::pack_row(x, p.dim, pk.norm_weight, pk.eps, x, pk.codes + t * p.dim, pk.scales + t * (p.dim / pack::kBlock),
                   stage);
  }
}

template <bool kPack>
void launch(const HcPreParams& p, const HcPrePackArgs& pk, cudaStream_t s) {
  TANDEM_CHECK(p.hc <= kMaxHc);
  TANDEM_CHECK_MSG(p.tokens < (int64_t{1} << 31), "hc_pre: too many tokens");
  const int nmix = (2 + p.hc) * p.hc;
  const int64_t HD = p.hc * p.dim;
  const int ksplit = hc_mix_ksplit(HD, nmix);
  const double* partial = hc::launch_mix(p.h, p.fn, p.tokens, nmix, HD, ksplit, s);
  launch_pdl(hc_pre_finish<kPack>, static_cast<unsigned>(p.tokens), hc::kThreads, hc::stage_bytes(nmix, ksplit), s, p,
             partial, ksplit, pk);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void hc_pre(const HcPreParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  launch<false>(p, HcPrePackArgs{}, s);
}

void hc_pre_pack(const HcPreParams& p, const HcPrePackArgs& pack, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK_MSG(p.dim % pack::kBlock == 0 && p.dim <= kMaxPackDim, "hc_pre_pack: dim");
  TANDEM_CHECK(pack.norm_weight && pack.codes && pack.scales);
  launch<true>(p, pack, s);
}

std::vector<SmemBound> hc_smem_bounds() {
  // The finishing CTA stages one token's partials: hc::stage_bytes, at most hc::kMaxStage doubles
  // (hc_mix_ksplit caps ksplit so); 3.2 KB for hc 4 x 4096.
  const int64_t most = hc::kMaxStage * static_cast<int64_t>(sizeof(double));
  const std::string shape = "(nmix + 1) x ksplit partials at hc_mix_ksplit's cap";
  return {{"hc_pre_finish", most, shape, ""}, {"hc_head_finish", most, shape, ""}};
}

}  // namespace tandem::kernels::cuda
