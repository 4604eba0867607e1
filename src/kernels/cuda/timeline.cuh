// Per-CTA phase timestamps of a kernel (an instrument: `tandem bench-kernels --only moe` prints and
// stores the decode MoE's). A kernel given a null base records nothing and pays one predicate per
// mark. A record is kSlots 64-bit words per CTA, for the CTAs below kCtas: word 0 holds the SM id
// (low 32 bits) and a kernel-defined count (high 32 bits); the others are %globaltimer readings
// (nanoseconds, one clock for every SM; its update interval depends on the GPU) at the points the
// kernel names, zero where a point was not reached.
#pragma once

#include <cstdint>

namespace tandem::kernels::cuda::timeline {

constexpr int kSlots = 16;
constexpr int kCtas = 1024;

#ifdef __CUDACC__
__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t smid() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
// This CTA's record in `base` (kCtas records), or null (no base, or past kCtas).
__device__ __forceinline__ uint64_t* record(uint64_t* base) {
  return base && blockIdx.x < static_cast<unsigned>(kCtas) ? base + static_cast<uint64_t>(blockIdx.x) * kSlots
                                                           : nullptr;
}
__device__ __forceinline__ void mark(uint64_t* rec, int slot) {
  if (rec) rec[slot] = now();
}
__device__ __forceinline__ void finish(uint64_t* rec, uint32_t count) {
  if (rec) rec[0] = (static_cast<uint64_t>(count) << 32) | smid();
}
#endif

}  // namespace tandem::kernels::cuda::timeline
