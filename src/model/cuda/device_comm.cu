// Kernels of the device data plane (device_comm_impl.h): the peer-memory one-shot collective and
// the bf16 <-> fp32 conversions that stage bf16 all-reduces for NCCL.
//
// The one-shot protocol, per call and per block b (every launch has kPeerBlocks blocks; block b
// of every rank handles the same byte range, so blocks never wait on other blocks of their own
// grid, only on block b of the peers):
//   e = ++epoch[b]; parity = e & 1
//   1. copy this rank's range into its half `parity` of the exchange region (on rank 0's GPU)
//   2. __syncthreads; thread 0: system fence, then store e into inbox[p][rank][b] of every peer p
//   3. threads 0..size-1 (not self) wait until inbox[self][p][b] >= e (acquire), bounded in time
//   4. __syncthreads; read every rank's half `parity` and sum in rank order / gather / copy
// Why two halves suffice: a rank writes half `parity` again at epoch e + 2, which it reaches only
// after epoch e + 1, whose step 3 saw every peer's signal e + 1, which every peer sent only after
// its epoch-e kernel (and so its step-4 reads of epoch e) had finished: stream order on each rank.
// A peer may already be at e + 1 when we wait at e (its signal then reads e + 1 >= e): it can
// not be at e + 2, which needs our signal e + 1.
#include "model/cuda/device_comm_kernels.h"

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/numeric_core.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::devcomm {
namespace {

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ size_t umin(size_t x, size_t y) { return x < y ? x : y; }

template <int U>
struct Unit;
template <>
struct Unit<16> {
  using T = uint4;
};
template <>
struct Unit<4> {
  using T = uint32_t;
};
template <>
struct Unit<2> {
  using T = uint16_t;
};
template <>
struct Unit<1> {
  using T = uint8_t;
};

// Reads of this rank's input and writes: plain. Reads of the exchange region (written by other
// processes, possibly on other GPUs): .cg, so no line an earlier call left in L1 can answer.
template <int U>
__device__ __forceinline__ typename Unit<U>::T load_local(const uint8_t* p) {
  return *reinterpret_cast<const typename Unit<U>::T*>(p);
}
template <int U>
__device__ __forceinline__ typename Unit<U>::T load_exchange(const uint8_t* p) {
  return __ldcg(reinterpret_cast<const typename Unit<U>::T*>(p));
}
template <int U>
__device__ __forceinline__ void store(uint8_t* p, typename Unit<U>::T v) {
  *reinterpret_cast<typename Unit<U>::T*>(p) = v;
}

// Sum of unit i over every rank's half, rank 0 first, in fp32 (bf16 widened, rounded once).
template <int U, bool kBf16>
__device__ __forceinline__ void sum_unit(const PeerArgs& a, size_t half, size_t off) {
  constexpr int kElems = kBf16 ? U / 2 : U / 4;
  static_assert(kElems >= 1, "a sum unit holds at least one element");
  float acc[kElems];
  for (int p = 0; p < a.size; ++p) {
    const typename Unit<U>::T v = load_exchange<U>(a.data[p] + half + off);
    float x[kElems];
    if constexpr (kBf16) {
      uint16_t h[kElems];
      memcpy(h, &v, U);
#pragma unroll
      for (int e = 0; e < kElems; ++e) x[e] = num::bf16_to_f32(h[e]);
    } else {
      memcpy(x, &v, U);
    }
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[e] = p == 0 ? x[e] : acc[e] + x[e];
  }
  typename Unit<U>::T r;
  if constexpr (kBf16) {
    uint16_t h[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) h[e] = num::f32_to_bf16(acc[e]);
    memcpy(&r, h, U);
  } else {
    memcpy(&r, acc, U);
  }
  store<U>(a.out + off, r);
}

template <int U>
__global__ void __launch_bounds__(kPeerThreads) peer_kernel(const PeerArgs a) {
  kernels::cuda::pdl_wait();  // launched the ordinary way this is a no-op; under PDL, the producer's writes first
  __shared__ uint64_t s_epoch;
  __shared__ volatile int s_skip;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    const uint64_t e = a.epoch[b] + 1;  // only block b of this rank touches epoch[b]
    a.epoch[b] = e;
    s_epoch = e;
    s_skip = *reinterpret_cast<volatile const uint32_t*>(a.state) != 0;
  }
  __syncthreads();
  const uint64_t e = s_epoch;
  const size_t half = (e & 1) ? a.capacity : 0;
  const size_t units = a.bytes / U;
  const size_t per = (units + kPeerBlocks - 1) / kPeerBlocks;
  const size_t lo = umin(units, static_cast<size_t>(b) * per), hi = umin(units, lo + per);

  // 1. This rank's range into its part of the exchange region (a broadcast needs only the root's).
  uint8_t* mine = a.data[a.rank] + half;
  if (a.mode != PeerMode::kBroadcast || a.rank == a.root)
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) store<U>(mine + i * U, load_local<U>(a.in + i * U));
  __syncthreads();

  // 2. Signal every peer: this block's range of epoch e is in place.
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int p = 0; p < a.size; ++p)
      if (p != a.rank) st_release_sys(a.inbox[p] + static_cast<size_t>(a.rank) * kPeerBlocks + b, e);
  }

  // 3. Wait for every peer's signal (every kind waits for all: the two-halves argument needs it).
  if (threadIdx.x < a.size && static_cast<int>(threadIdx.x) != a.rank && !s_skip) {
    const int p = threadIdx.x;
    const uint64_t* flag = a.inbox[a.rank] + static_cast<size_t>(p) * kPeerBlocks + b;
    const uint64_t t0 = global_ns();
    uint32_t spins = 0;
    while (ld_acquire_sys(flag) < e) {
      if ((++spins & 63u) != 0) continue;
      if (s_skip || *a.host_abort != 0 || *reinterpret_cast<volatile const uint32_t*>(a.state) != 0) {
        s_skip = 1;
        break;
      }
      if (global_ns() - t0 > a.timeout_ns) {
        *reinterpret_cast<volatile uint32_t*>(a.host_error) = static_cast<uint32_t>(p + 1);
        *reinterpret_cast<volatile uint32_t*>(a.state) = 1u;
        __threadfence_system();
        s_skip = 1;
        break;
      }
    }
  }
  __syncthreads();
  if (s_skip) return;  // failed: leave `out` as it is and touch no peer's memory

  // 4. Read every rank's range.
  if (a.mode == PeerMode::kSum) {
    if constexpr (U == 16) {
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (a.bf16) sum_unit<16, true>(a, half, i * 16);
        else sum_unit<16, false>(a, half, i * 16);
      }
    } else if constexpr (U == 4) {
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) sum_unit<4, false>(a, half, i * 4);
    } else if constexpr (U == 2) {
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) sum_unit<2, true>(a, half, i * 2);
    }
  } else if (a.mode == PeerMode::kGather) {
    for (int p = 0; p < a.size; ++p) {
      const uint8_t* src = a.data[p] + half;
      uint8_t* dst = a.out + static_cast<size_t>(p) * a.out_stride;
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) store<U>(dst + i * U, load_exchange<U>(src + i * U));
    }
  } else {  // kBroadcast
    if (a.rank != a.root) {
      const uint8_t* src = a.data[a.root] + half;
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) store<U>(a.out + i * U, load_exchange<U>(src + i * U));
    } else if (a.out != a.in) {
      for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) store<U>(a.out + i * U, load_local<U>(a.in + i * U));
    }
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ in, float* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = num::bf16_to_f32(in[i]);
}
__global__ void f32_to_bf16_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = num::f32_to_bf16(in[i]);
}

unsigned grid_of(size_t n) {
  const size_t g = (n + 255) / 256;
  return static_cast<unsigned>(g < 1 ? 1 : (g > 4096 ? 4096 : g));
}

}  // namespace

void launch_peer(const PeerArgs& a, cudaStream_t stream) {
  TANDEM_CHECK(a.size >= 1 && a.size <= kMaxPeerRanks && a.rank >= 0 && a.rank < a.size);
  TANDEM_CHECK(a.bytes <= a.capacity && a.bytes % static_cast<size_t>(a.unit) == 0);
  if (a.mode == PeerMode::kSum) {
    const int elem = a.bf16 ? 2 : 4;
    TANDEM_CHECK(a.unit == 16 || a.unit == elem);
  }
  switch (a.unit) {
    case 16: peer_kernel<16><<<kPeerBlocks, kPeerThreads, 0, stream>>>(a); break;
    case 4: peer_kernel<4><<<kPeerBlocks, kPeerThreads, 0, stream>>>(a); break;
    case 2: peer_kernel<2><<<kPeerBlocks, kPeerThreads, 0, stream>>>(a); break;
    case 1: peer_kernel<1><<<kPeerBlocks, kPeerThreads, 0, stream>>>(a); break;
    default: TANDEM_CHECK_MSG(false, "peer unit must be 16, 4, 2 or 1");
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

void launch_bf16_to_f32(const uint16_t* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_of(n), 256, 0, stream>>>(in, out, n);
  TANDEM_CUDA_LAUNCH_CHECK();
}
void launch_f32_to_bf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_of(n), 256, 0, stream>>>(in, out, n);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::devcomm
