// The sm_90a building blocks of the warp-specialized tensor-core GEMMs (gemm_ws.cu: dense FP8 and
// bf16; src/model/cuda/moe_prefill_ws.cu: grouped MXFP4 experts). One CTA per SM, persistent over a
// list of output tiles, 384 threads in three warpgroups:
//  * warpgroup 0, the producer: one thread issues the bulk tensor copies (TMA) of each K block's
//    operand tiles into a ring of shared-memory stages, each stage guarded by two mbarriers ("full":
//    the copies' bytes landed; "empty": every consumer warp is done reading). The grouped experts
//    run 512 threads: two producer warpgroups convert the MXFP4 weights into e4m3 tiles (a third
//    mbarrier per stage), their thread 0 also issuing the copies. setmaxnreg gives its registers to
//  * warpgroups 1 and 2, the consumers: 64 rows of the 128-row tile each, wgmma on the stage's tiles,
//    the FP8 promotion (fp32 partial of a K block scaled into the accumulator) after each block,
//    the epilogue straight from the accumulator registers.
// Producer and consumers walk the same (tile, K block) sequence, so a stage index and an mbarrier
// phase bit follow from one running counter on each side. Tiles in shared memory are the 128-byte
// rows of tc_gemm.cuh (16-byte chunk c of row r at chunk c ^ (r % 8)), which is both the TMA
// 128-byte swizzle and the layout the wgmma descriptors describe.
// A wait that cannot complete (a broken invariant) traps after about five seconds instead of hanging.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/tc_gemm.cuh"

namespace tandem::kernels::cuda::ws {

constexpr int kThreads = 384;       // producer warpgroup + two consumer warpgroups
constexpr int kConsumerWarps = 8;   // arrivals on an "empty" barrier per K block
constexpr long long kWaitTrapCycles = 1ll << 33;  // ~5 s at 1.7 GHz

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if TANDEM_TC_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tc::smem_u32(bar)), "r"(count) : "memory");
#endif
}
// Makes the initialized barriers visible to the copy engine and the other threads (then __syncthreads).
__device__ __forceinline__ void mbar_fence_init() {
#if TANDEM_TC_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if TANDEM_TC_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tc::smem_u32(bar)) : "memory");
#endif
}
// One arrival that also announces `bytes` of copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TANDEM_TC_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tc::smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok = 1;
#if TANDEM_TC_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(ok)
      : "r"(tc::smem_u32(bar)), "r"(parity)
      : "memory");
#endif
  return ok != 0;
}
// Until the phase of parity `parity` has completed (a fresh barrier counts its parity-1 phase as
// completed, so a producer's first pass over the "empty" barriers waits for nothing).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const long long t0 = clock64();
  for (uint32_t n = 1;; ++n) {
    if (mbar_try_wait(bar, parity)) return;
    if ((n & 255) == 0 && clock64() - t0 > kWaitTrapCycles) __trap();
  }
}

// ---------------------------------------------------------------- TMA
// Box (c0 = column in elements, c1 = row) of `map` -> shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#if TANDEM_TC_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          tc::smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(tc::smem_u32(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#if TANDEM_TC_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// ---------------------------------------------------------------- registers, wgmma groups
template <int N>
__device__ __forceinline__ void reg_alloc() {
#if TANDEM_TC_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void reg_dealloc() {
#if TANDEM_TC_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// All but the N most recently committed wgmma groups of this warp complete.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if TANDEM_TC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// d[128] (+)= A[64 x 16] . B[256 x 16]^T, bf16 inputs from 128-byte-swizzled K-major tiles.
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if TANDEM_TC_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// ---------------------------------------------------------------- stage ring
// The stage and phase bit of the running K-block counter on either side of the ring.
template <int kStages>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// ---------------------------------------------------------------- consumer accumulator layout
// Element i of a consumer's m64nN accumulator (i < N/2): row 16 w + lane/4 + 8 ((i >> 1) & 1) of
// the consumer's 64 rows, column 8 (i >> 2) + 2 (lane % 4) + (i & 1) (w = warp in the warpgroup).
__device__ __forceinline__ int acc_row(int i, int w, int lane) { return 16 * w + (lane >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int i, int lane) { return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); }

// ---------------------------------------------------------------- tile order
// Output tiles (batch b, row block mb, column block nb) of a persistent grid, grouped so the tiles in
// flight at once (one per SM) share row and column blocks in L2: within a batch, groups of up to 16
// row blocks, column-block-major inside a group.
struct DenseTile {
  int b, mb, nb;
};
__device__ __forceinline__ DenseTile dense_tile(int t, int mt, int nt) {
  constexpr int kGroup = 16;
  const int per_batch = mt * nt;
  DenseTile d;
  d.b = t / per_batch;
  const int r = t - d.b * per_batch;
  const int g = r / (kGroup * nt), first = g * kGroup;
  const int gm = min(kGroup, mt - first);
  const int local = r - g * kGroup * nt;
  d.nb = local / gm;
  d.mb = first + local % gm;
  return d;
}

}  // namespace tandem::kernels::cuda::ws
