// Ring writes (ring.h): one block per row (and ring), copied by the block's threads in the widest
// word the layout allows.
#include "model/cuda/ring.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/model_device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

struct RingCommitBatchArgs {
  RingCommitArgs r[kMaxRingCommits];
  int word[kMaxRingCommits];  // bytes per copied word of each ring: 16, 8, 4 or 1
};

template <typename W>
__device__ __forceinline__ void copy_words(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(W));
  W* d = reinterpret_cast<W*>(dst);
  const W* q = reinterpret_cast<const W*>(src);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = q[i];
}

// Block (t, r): row t of ring r.
__global__ void ring_commit_kernel(const __grid_constant__ RingCommitBatchArgs b) {
  kernels::cuda::pdl_enter();
  const RingCommitArgs& a = b.r[blockIdx.y];
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  const int seq = a.m.row_seq[t];
  const int64_t t_in = t - a.m.seq_row0[seq];
  if (t_in < static_cast<int64_t>(a.m.seq_len[seq]) - a.ring) return;
  const int64_t p = a.m.positions[t];
  uint8_t* dst = slot_base(a.slot_state, a.slot_bytes, a.m.seq_slot[seq]) + a.ring_off + (p % a.ring) * a.bytes_per_row;
  const uint8_t* src = a.src + t * a.bytes_per_row;
  switch (b.word[blockIdx.y]) {
    case 16: return copy_words<uint4>(dst, src, a.bytes_per_row);
    case 8: return copy_words<uint2>(dst, src, a.bytes_per_row);
    case 4: return copy_words<uint32_t>(dst, src, a.bytes_per_row);
    default: return copy_words<uint8_t>(dst, src, a.bytes_per_row);
  }
}

// The widest word dividing every offset a commit's copies use.
int word_of(const RingCommitArgs& a) {
  const uint64_t all = static_cast<uint64_t>(a.bytes_per_row) | static_cast<uint64_t>(a.ring_off) |
                       static_cast<uint64_t>(a.slot_bytes) | reinterpret_cast<uintptr_t>(a.src) |
                       reinterpret_cast<uintptr_t>(a.slot_state);
  for (int w : {16, 8, 4})
    if (all % static_cast<uint64_t>(w) == 0) return w;
  return 1;
}

__global__ void ring_write_kernel(RingWriteArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = a.first + blockIdx.x;
  if (t >= a.n) return;
  uint8_t* dst = a.ring_base + ((a.pos0 + t) % a.ring) * a.bytes_per_row;
  for (int64_t b = threadIdx.x; b < a.bytes_per_row; b += blockDim.x) dst[b] = a.src[t * a.bytes_per_row + b];
}

}  // namespace

void ring_commit_batch(const RingCommitArgs* rings, int count, cudaStream_t s) {
  TANDEM_CHECK(count >= 0 && count <= kMaxRingCommits);
  RingCommitBatchArgs b{};
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) {
    b.r[i] = rings[i];
    b.word[i] = word_of(rings[i]);
    rows = std::max(rows, rings[i].rows);
  }
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(count));
  kernels::cuda::launch_pdl(ring_commit_kernel, grid, 128, 0, s, b);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void ring_commit(const RingCommitArgs& a, cudaStream_t s) { ring_commit_batch(&a, 1, s); }

void ring_write(const RingWriteArgs& a, cudaStream_t s) {
  if (a.n <= a.first) return;
  kernels::cuda::launch_pdl(ring_write_kernel, static_cast<unsigned>(a.n - a.first), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
