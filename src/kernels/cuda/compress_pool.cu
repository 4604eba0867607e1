// KV compressor gated pooling, one thread per (entry, channel): the channel's softmax over its
// candidates (previous block's first half with overlap, then the current block) in the CPU's
// candidate order and operation order; adjacent threads read adjacent channels (coalesced).
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

struct PoolArgs {
  CompressPoolParams p;
  int64_t ld, ldo, coff;
};

// Candidate c of entry j: row (relative to the first token row) and channel offset; false if absent.
__device__ __forceinline__ bool candidate(const PoolArgs& a, int64_t j, int c, int64_t& row, int64_t& choff) {
  const int ratio = a.p.ratio;
  if (a.p.overlap && c < ratio) {
    row = ratio * (j - 1) + c - a.p.first_pos;
    choff = 0;
    return j > 0;
  }
  const int i = a.p.overlap ? c - ratio : c;
  row = ratio * j + i - a.p.first_pos;
  choff = a.p.overlap ? a.p.d : 0;
  return true;
}

__device__ __forceinline__ float cand_score(const PoolArgs& a, int64_t row, int64_t col) {
  float s = a.p.score[row * a.ld + col];
  if (a.p.ape) s = add_rn(s, a.p.ape[((a.p.first_pos + row) % a.p.ratio) * a.coff * a.p.d + col]);
  return s;
}

__global__ void compress_pool_kernel(PoolArgs a) {
  const int64_t d = a.p.d, total = a.p.num_entries * d;
  const int ncand = static_cast<int>(a.coff * a.p.ratio);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t e = g / d, ch = g % d, j = a.p.first_entry + e;
    float m = -INFINITY;
    for (int c = 0; c < ncand; ++c) {
      int64_t row, choff;
      const float s = candidate(a, j, c, row, choff) ? cand_score(a, row, choff + ch) : -INFINITY;
      m = s > m ? s : m;
    }
    float z = 0.0f;
    for (int c = 0; c < ncand; ++c) {
      int64_t row, choff;
      if (candidate(a, j, c, row, choff)) z = add_rn(z, expf(sub_rn(cand_score(a, row, choff + ch), m)));
    }
    float acc = 0.0f;
    for (int c = 0; c < ncand; ++c) {
      int64_t row, choff;
      if (!candidate(a, j, c, row, choff)) continue;
      const float pr = div_rn(expf(sub_rn(cand_score(a, row, choff + ch), m)), z);
      acc = add_rn(acc, mul_rn(a.p.kv[row * a.ld + choff + ch], pr));
    }
    a.p.out[e * a.ldo + ch] = a.p.round_bf16 ? round_bf16(acc) : acc;
  }
}

}  // namespace

void compress_pool(const CompressPoolParams& p, cudaStream_t s) {
  validate(p);
  if (p.num_entries == 0) return;
  PoolArgs a{p, 0, 0, p.overlap ? 2 : 1};
  a.ld = p.ld > 0 ? p.ld : a.coff * p.d;
  a.ldo = p.ldo > 0 ? p.ldo : p.d;
  compress_pool_kernel<<<grid_for(p.num_entries * p.d, 128), 128, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
