// Warp-level building blocks of the decode GEMV kernels (decode_gemm.cu, the MoE expert kernels of
// model/cuda/moe_decode.cu): mma.sync m16n8k16 with fp32 accumulators (portable to sm_90a,
// sm_100a, sm_120, sm_121), exact conversions of stored weight codes into the mma's 16-bit inputs,
// and the load flavours (weights streamed past L1, activations through L1 for the CTA's other warps).
//
// Fragment convention (PTX m16n8k16, g = lane / 4, t = lane % 4): A is [16 tokens x 16 k], B is
// [16 k x 8 weight rows] (at most 8 tokens, and the MoE's routed experts: A is [16 weight rows x 16
// k] and B [16 k x 8 tokens], the same k-slots). A thread holds A rows g and g+8 and B column g, each at the k-slots
// {2t, 2t+1, 2t+8, 2t+9}; it owns D[g][2t..2t+1] and D[g+8][2t..2t+1]. Because a dot product
// may visit k in any order, each kernel maps a thread's k-slots onto the k columns it loaded
// itself (the same map for A and B), so 16-byte weight loads feed the mma without shuffles.
//
// Numerics: the 16-bit inputs are exact images of the stored values (e4m3 and e2m1 codes are f16
// and bf16 values; bf16 weights are bf16), so every product is exact and the only roundings are
// the tensor core's accumulation. Each output element's result depends only on its own A row, B
// column and accumulator, never on its position in the tile or on the other rows of the call.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda::mma {

// D += A * B with f16 inputs (e4m3 / e2m1 codes).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// D += A * B with bf16 inputs (bf16 weights and activations, e4m3 weights as bf16).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 codes (low byte = first element) -> f16x2 (low half = first), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The high two e4m3 codes of a word -> f16x2, exact (the conversion reads the upper half directly).
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t four_codes) {
  uint32_t d;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, h;\n\t}" : "=r"(d) : "r"(four_codes));
  return d;
}

// (lo, hi) fp32 -> bf16x2, round to nearest even (exact for bf16-valued inputs).
__device__ __forceinline__ uint32_t f32x2_to_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// f16x2 -> (lo, hi) fp32, exact.
__device__ __forceinline__ float2 f16x2_to_f32x2(uint32_t h2) {
  float lo, hi;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
  return make_float2(lo, hi);
}

// Two e4m3 codes -> bf16x2, exact (e4m3 -> f16 -> f32 -> bf16, each step exact).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two_codes) {
  const float2 f = f16x2_to_f32x2(e4m3x2_to_f16x2(two_codes));
  return f32x2_to_bf16x2(f.x, f.y);
}

// Eight e2m1 values (one 32-bit word, element i in bits 4i..4i+3) -> four f16x2 of value * 2^-14 in
// natural order: h[0] = elements (0, 1) (low half first), h[1] = (2, 3), h[2] = (4, 5), h[3] = (6, 7).
// An e2m1 code's exponent and mantissa bits moved to f16 bits 9..11 (sign to bit 15) are exactly its
// value times 2^-14 (0.5 becomes the f16 subnormal 2^-15; the f16 mma takes subnormal inputs exactly).
// Such an f16's low byte is zero: the high bytes are built four at a time with shifts and masks, then
// spread with a zero byte between them (13 integer instructions, no conversion unit).
__device__ __forceinline__ void e2m1x8_to_f16x8(uint32_t w, uint32_t (&h)[4]) {
  const uint32_t ev = ((w << 1) & 0x0e0e0e0eu) | ((w << 4) & 0x80808080u);  // high bytes of elements 0, 2, 4, 6
  const uint32_t od = ((w >> 3) & 0x0e0e0e0eu) | (w & 0x80808080u);         // elements 1, 3, 5, 7
  const uint32_t lo = __byte_perm(ev, od, 0x5140);                          // elements 0, 1, 2, 3
  const uint32_t hi = __byte_perm(ev, od, 0x7362);                          // elements 4, 5, 6, 7
  h[0] = __byte_perm(lo, 0u, 0x1404);  // (zero, byte 0, zero, byte 1)
  h[1] = __byte_perm(lo, 0u, 0x3424);
  h[2] = __byte_perm(hi, 0u, 0x1404);
  h[3] = __byte_perm(hi, 0u, 0x3424);
}

// ---- loads ----
// Weights: read once per call, never reused by the CTA: keep them out of L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
// Activations: written by the previous kernel (so never the non-coherent path), read by every warp
// of the CTA that covers the same k range: ordinary cached loads.
__device__ __forceinline__ uint4 ld_act16(const void* p) { return *static_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 ld_act8(const void* p) { return *static_cast<const uint2*>(p); }
__device__ __forceinline__ float4 ld_act_f4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// Data other CTAs of the same launch wrote (k-split partials, SwiGLU rows read by the last
// arriver): L2 only, never a possibly stale L1 line of an earlier call.
__device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }

// ---- cp.async (sm_80 and later, every target): global -> shared without registers ----
// The weight stream of the decode kernels: each lane copies the 16-byte pieces it will itself read
// back, so the only synchronization is cp.async.wait_group in that lane (no barrier).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst_smem, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(smem_u32(dst_smem)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst_smem, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst_smem)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst_smem, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst_smem)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most n (0..7) of this thread's committed groups are pending.
__device__ __forceinline__ void cp_async_wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}
// The oldest of a ring's S stages in flight has landed (every iteration commits one group): the
// usual depth kUsual as a constant wait, any other through cp_async_wait's jump table.
template <int kUsual>
__device__ __forceinline__ void cp_async_wait_ring(int S) {
  if (S == kUsual) asm volatile("cp.async.wait_group %0;" ::"n"(kUsual - 1) : "memory");
  else cp_async_wait(S - 1);
}
// ldmatrix .x4 (sm_75 and later, every target): lanes 8i .. 8i + 7 give the shared addresses of the
// eight 16-byte rows of matrix i; lane (g, t) receives bytes 4t .. 4t + 3 of row g of matrix i in d[i].
// One instruction reads what four 4-byte loads per lane would.
__device__ __forceinline__ void ldsm_x4(uint32_t (&d)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(smem_addr)
               : "memory");
}
__device__ __forceinline__ uint4 lds128(const void* p) { return *static_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 lds64(const void* p) { return *static_cast<const uint2*>(p); }
__device__ __forceinline__ uint32_t lds32(const void* p) { return *static_cast<const uint32_t*>(p); }

// ---- power-of-two scales ----
// 2^d for any integer d: exact in [-149, 127], 0 below, 2^127 above (pathological scale gaps).
__device__ __forceinline__ float exp2i(int d) {
  d = d < -150 ? -150 : (d > 127 ? 127 : d);
  if (d >= -126) return __int_as_float((d + 127) << 23);
  return __int_as_float(0x00400000 >> (-127 - d));  // subnormal 2^d, 0 at d = -150
}

}  // namespace tandem::kernels::cuda::mma
