// Streaming copy and read for the benchmarks' ceilings (bandwidth.h): grid-stride over 16-byte
// vectors, 8 independent loads issued before their first use, 4 CTAs of 512 threads per SM.
#include "kernels/cuda/bandwidth.h"

#include "common/check.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                         int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) __stcs(dst + i + u * stride, v[u]);
  }
  for (; i < n; i += stride) __stcs(dst + i, __ldcs(src + i));
}

__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ src, int64_t n,
                                                         unsigned long long* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);  // practically never taken, but not provably
}

// Pieces of 16 bytes: per 2 KB step 128 pieces, 4 per lane; piece p of a step is row p / (span / 16)
// of the tile, bytes (p % (span / 16)) * 16 of the step's span.
constexpr int kTileThreads = 256, kSteps = 4;
template <int TR>
__global__ void __launch_bounds__(kTileThreads, 2) read_tiles_kernel(const uint8_t* __restrict__ src, int64_t rows,
                                                                      int64_t row_bytes, unsigned long long* sink) {
  constexpr int kSpan = 2048 / TR, kPer = kSpan / 16;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kTileThreads / 32);
  const int64_t tiles = rows / TR;
  uint32_t acc = 0;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kTileThreads / 32) + (threadIdx.x >> 5); w < tiles; w += warps) {
    const uint8_t* base = src + w * TR * row_bytes;
    for (int64_t k0 = 0; k0 < row_bytes; k0 += kSteps * kSpan) {
      uint4 v[kSteps][4];
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int p = lane + 32 * q;
          v[st][q] = __ldcs(reinterpret_cast<const uint4*>(base + (p / kPer) * row_bytes + k0 + st * kSpan +
                                                           (p % kPer) * 16));
        }
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc ^= v[st][q].x ^ v[st][q].y ^ v[st][q].z ^ v[st][q].w;
    }
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);
}

unsigned grid_of() {
  int dev = 0, sms = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return static_cast<unsigned>(4 * sms);
}

}  // namespace

void stream_copy(const void* src, void* dst, size_t bytes, cudaStream_t s) {
  TANDEM_CHECK(bytes % 128 == 0 && (reinterpret_cast<uintptr_t>(src) & 15u) == 0 &&
               (reinterpret_cast<uintptr_t>(dst) & 15u) == 0);
  copy_kernel<<<grid_of(), kThreads, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                             static_cast<int64_t>(bytes / 16));
  TANDEM_CUDA_LAUNCH_CHECK();
}

void stream_read(const void* src, size_t bytes, uint64_t* sink, cudaStream_t s) {
  TANDEM_CHECK(bytes % 128 == 0 && (reinterpret_cast<uintptr_t>(src) & 15u) == 0);
  read_kernel<<<grid_of(), kThreads, 0, s>>>(static_cast<const uint4*>(src), static_cast<int64_t>(bytes / 16),
                                             reinterpret_cast<unsigned long long*>(sink));
  TANDEM_CUDA_LAUNCH_CHECK();
}

void stream_read_tiles(const void* src, int64_t rows, int64_t row_bytes, int tile_rows, uint64_t* sink,
                       cudaStream_t s) {
  TANDEM_CHECK(rows % tile_rows == 0 && row_bytes % (kSteps * 2048 / tile_rows) == 0 &&
               (reinterpret_cast<uintptr_t>(src) & 15u) == 0);
  const unsigned grid = grid_of() / 2;  // two CTAs per SM, as the decode GEMV
  const auto* p = static_cast<const uint8_t*>(src);
  auto* k = reinterpret_cast<unsigned long long*>(sink);
  switch (tile_rows) {
    case 16: read_tiles_kernel<16><<<grid, kTileThreads, 0, s>>>(p, rows, row_bytes, k); break;
    case 8: read_tiles_kernel<8><<<grid, kTileThreads, 0, s>>>(p, rows, row_bytes, k); break;
    case 4: read_tiles_kernel<4><<<grid, kTileThreads, 0, s>>>(p, rows, row_bytes, k); break;
    case 2: read_tiles_kernel<2><<<grid, kTileThreads, 0, s>>>(p, rows, row_bytes, k); break;
    case 1: read_tiles_kernel<1><<<grid, kTileThreads, 0, s>>>(p, rows, row_bytes, k); break;
    default: TANDEM_CHECK_MSG(false, "stream_read_tiles: tile_rows must be 1, 2, 4, 8 or 16");
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
