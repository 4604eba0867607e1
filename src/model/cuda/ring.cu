// Ring writes (ring.h): one block per row, bytes copied by the block's threads.
#include "model/cuda/ring.h"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/model_device.cuh"

namespace tandem::cuda_model {
namespace {

__global__ void ring_commit_kernel(RingCommitArgs a) {
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  const int seq = a.m.row_seq[t];
  const int64_t t_in = t - a.m.seq_row0[seq];
  if (t_in < static_cast<int64_t>(a.m.seq_len[seq]) - a.ring) return;
  const int64_t p = a.m.positions[t];
  uint8_t* dst = slot_base(a.slot_state, a.slot_bytes, a.m.seq_slot[seq]) + a.ring_off + (p % a.ring) * a.bytes_per_row;
  for (int64_t b = threadIdx.x; b < a.bytes_per_row; b += blockDim.x) dst[b] = a.src[t * a.bytes_per_row + b];
}

__global__ void ring_write_kernel(RingWriteArgs a) {
  const int64_t t = a.first + blockIdx.x;
  if (t >= a.n) return;
  uint8_t* dst = a.ring_base + ((a.pos0 + t) % a.ring) * a.bytes_per_row;
  for (int64_t b = threadIdx.x; b < a.bytes_per_row; b += blockDim.x) dst[b] = a.src[t * a.bytes_per_row + b];
}

}  // namespace

void ring_commit(const RingCommitArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  ring_commit_kernel<<<static_cast<unsigned>(a.rows), 128, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void ring_write(const RingWriteArgs& a, cudaStream_t s) {
  if (a.n <= a.first) return;
  ring_write_kernel<<<static_cast<unsigned>(a.n - a.first), 128, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
