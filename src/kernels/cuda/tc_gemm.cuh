// The portable tensor-core main loop (cp.async, every thread loading) shared by the prefill GEMMs
// (gemm_tc.cu: block-scaled FP8 and bf16) and the grouped MXFP4 expert GEMMs
// (src/model/cuda/moe_prefill.cu): a 128 x 128 output tile per CTA (tokens x weight rows), K in
// blocks of 128 bytes (128 e4m3 or 64 bf16 elements). FP8: each block is multiplied on the tensor
// cores into a fresh fp32 partial that is then scaled and added to the fp32 accumulator
// ("promotion" every 128 of K, as the block scales require and as Hopper's FP8 accumulation, which
// keeps fewer bits than fp32, needs). bf16: no scales, the tensor cores accumulate directly.
//
// Two MMA back ends over the same shared-memory tiles:
//  * wgmma (sm_90a): each warpgroup issues 4 x wgmma.m64n128k32.e4m3 (k16 bf16) per K block, both
//    operands from shared memory through 128-byte-swizzle descriptors;
//  * mma.sync.m16n8k32.e4m3 / m16n8k16.bf16 (sm_89 and later: sm_90a, sm_100a, sm_120, sm_121)
//    with ldmatrix: the two instructions' fragments cover the same bytes, so one loop serves both.
// Tiles are K-major rows of 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r & 7) (the
// wgmma 128B-swizzle atom, also conflict-free for ldmatrix, and the TMA 128B swizzle of tc_ws.cuh),
// loaded with cp.async (zero-filled outside the problem). MXFP4 weights are staged raw (4 bits)
// and converted by the threads that copied them into e4m3 with a per-(row, K block) power of two
// factored out (exact: every e2m1 value times 2^d, d in [-5, 6], is an e4m3 normal), the factor kept
// as the column's scale. sm_90 runs the warp-specialized TMA kernels of tc_ws.cuh instead; this loop
// is the other architectures' path (and a test reference on sm_90).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TANDEM_TC_WGMMA 1
#else
#define TANDEM_TC_WGMMA 0
#endif

namespace tandem::kernels::cuda::tc {

// Operand types of a main loop: A e4m3 x B e4m3 (block scales), A e4m3 x B MXFP4 (converted to
// e4m3 in shared memory, scales per column), A bf16 x B bf16 (no scales).
enum class Elem : uint8_t { kE4m3, kMxfp4, kBf16 };

constexpr int kThreads = 256;   // 8 warps = 2 math groups (warpgroups) of 64 tile rows each
constexpr int kTileRows = 128;  // tokens per CTA tile and weight rows per CTA tile
constexpr int kBK = 128;        // K per pipeline stage
constexpr int kTileBytes = kTileRows * kBK;  // one e4m3 operand tile: 16 KiB
constexpr int kRawBytes = kTileRows * kBK / 2;  // one raw MXFP4 weight tile: 8 KiB

// Shared-memory layout of one CTA (offsets from a 1024-byte aligned base).
template <bool kMxfp4, int kStages>
struct Smem {
  static constexpr int kA = 0;                                        // [kStages] A tiles
  static constexpr int kB = kA + kStages * kTileBytes;                // [kBBufs] e4m3 B tiles
  static constexpr int kBBufs = kMxfp4 ? 2 : kStages;                 // MXFP4: converted, double-buffered
  static constexpr int kRaw = kB + kBBufs * kTileBytes;               // [kStages] raw MXFP4 tiles
  static constexpr int kAScale = kRaw + (kMxfp4 ? kStages * kRawBytes : 0);  // [kStages][128] fp32
  static constexpr int kRawScale = kAScale + kStages * kTileRows * 4;  // [kStages][128 rows][4] E8M0 words
  static constexpr int kColScale = kRawScale + (kMxfp4 ? kStages * kTileRows * 16 : 0);  // [2][128] fp32
  static constexpr int kBytes = kColScale + (kMxfp4 ? 2 * kTileRows * 4 : 0);
  static constexpr int kAlloc = kBytes + 1024;  // slack to align the dynamic base to 1024 bytes
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The dynamic shared-memory base rounded up to 1024 bytes by pointer arithmetic on the __shared__
// array (not through an integer), so the compiler still knows every derived pointer is shared
// memory and emits ld/st.shared rather than generic accesses.
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}
// Byte offset of 16-byte chunk c of tile row r in the swizzled layout.
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// ---------------------------------------------------------------- asynchronous copies
// 16 bytes global -> shared; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory written by the generic proxy (stores, cp.async), read next by wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------- mma.sync (sm_89+)
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_e4m3(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// The bf16 instruction over the same fragment bytes (k16 of 2-byte elements = k32 of e4m3).
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
template <Elem kElem>
__device__ __forceinline__ void mma_elem(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kElem == Elem::kBf16) mma_bf16(d, a, b0, b1);
  else mma_e4m3(d, a, b0, b1);
}

// ---------------------------------------------------------------- wgmma (sm_90a)
// Descriptor of a K-major, 128-byte-swizzled operand starting at shared address `saddr` (the tile
// base 1024-aligned, plus 32 bytes per k32 step inside the 128-byte rows): 8-row atoms 1024 bytes
// apart (stride byte offset), leading byte offset unused for swizzled K-major layouts.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (static_cast<uint64_t>(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() {
#if TANDEM_TC_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if TANDEM_TC_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#if TANDEM_TC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// All but the most recently committed group complete.
__device__ __forceinline__ void wgmma_wait1() {
#if TANDEM_TC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous MMA.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// d[64] (+)= A[64 x 32] . B[128 x 32]^T, e4m3 inputs, f32 accumulators; scale_d = 0 ignores d.
__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if TANDEM_TC_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// d[64] (+)= A[64 x 16] . B[128 x 16]^T, bf16 inputs (32 bytes of K per row, as above), f32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if TANDEM_TC_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// ---------------------------------------------------------------- accumulator layout
// Each thread holds 64 fp32 values of its math group's 64 x 128 sub-tile; element i sits at tile
// row acc_row(i) (0..127) and tile column acc_col(i) (0..127). Elements 2q and 2q+1 are always
// adjacent columns of one row, and elements of n8 chunks 2p and 2p+1 (8 columns each) share rows.
//  wgmma:    i = 4j + 2h + c, j < 16:          row = 64g + 16w + lane/4 + 8h, col = 8j + 2(lane%4) + c
//  mma.sync: i = 4(4a + j) + 2h + c, a, j < 4: row = 64g + 16a + lane/4 + 8h, col = 32w + 8j + 2(lane%4) + c
// (g = math group, w = warp in the group).
template <bool kWgmma>
__device__ __forceinline__ int acc_row(int i) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = warp >> 2, w = warp & 3;
  const int h = (i >> 1) & 1;
  if constexpr (kWgmma) return 64 * g + 16 * w + (lane >> 2) + 8 * h;
  return 64 * g + 16 * (i >> 4) + (lane >> 2) + 8 * h;
}
template <bool kWgmma>
__device__ __forceinline__ int acc_col(int i) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = warp & 3;
  const int c = i & 1;
  if constexpr (kWgmma) return 8 * (i >> 2) + 2 * (lane & 3) + c;
  return 32 * w + 8 * ((i >> 2) & 3) + 2 * (lane & 3) + c;
}
// The n8 chunk (8 columns) element i belongs to: col / 8.
template <bool kWgmma>
__device__ __forceinline__ int acc_chunk(int i) {
  const int w = (threadIdx.x >> 5) & 3;
  if constexpr (kWgmma) return i >> 2;
  return 4 * w + ((i >> 2) & 3);
}

// ---------------------------------------------------------------- MXFP4 -> e4m3
// 2^e for e in [-149, 127] (subnormal below -126), exact.
__device__ __forceinline__ float pow2_any(int e) {
  if (e >= -126) return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
  if (e >= -149) return __uint_as_float(1u << (e + 149));
  return 0.0f;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// One 32-element group (16 raw bytes, element 0 in the lowest nibble) scaled by 2^d, d in [-5, 6]:
// 32 e4m3 bytes (two 16-byte chunks). The magnitudes come from an 8-entry byte table indexed by
// the nibbles' low three bits (prmt over (lo, hi)): e4m3 codes of the e2m1 magnitudes
// {0, .5, 1, 1.5, 2, 3, 4, 6} are 00 30 38 3c 40 44 48 4c, and adding 8d to the exponent field keeps
// every nonzero one a normal (0x08..0x7c), never NaN (0x7f). The signs (nibble bit 3) move to byte
// bit 7 with one more prmt per four elements: nibble 2j's sign is bit 7 of byte j of (word << 4),
// nibble 2j+1's is bit 7 of byte j of the word. Per 8 elements 9 integer instructions (the
// earlier form, a sign-replicating prmt per 4 elements, took about 13).
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t lo, uint32_t hi, uint32_t& o0, uint32_t& o1) {
  const uint32_t m = w & 0x77777777u, a = w << 4;
  o0 = prmt(lo, hi, m) | (prmt(a, w, 0x5140u) & 0x80808080u);
  o1 = prmt(lo, hi, m >> 16) | (prmt(a, w, 0x7362u) & 0x80808080u);
}
__device__ __forceinline__ void mxfp4_group_to_e4m3(const uint4& raw, int d, uint4& out0, uint4& out1) {
  const uint32_t add = static_cast<uint32_t>(d * 8);
  const uint32_t lo = 0x3C383000u + add * 0x01010100u;  // entry 0 (zero) untouched
  const uint32_t hi = 0x4C484440u + add * 0x01010101u;
  e2m1x8_to_e4m3(raw.x, lo, hi, out0.x, out0.y);
  e2m1x8_to_e4m3(raw.y, lo, hi, out0.z, out0.w);
  e2m1x8_to_e4m3(raw.z, lo, hi, out1.x, out1.y);
  e2m1x8_to_e4m3(raw.w, lo, hi, out1.z, out1.w);
}
// The reference exponent of a K block from its four E8M0 group scales (one little-endian word):
// the largest minus 6, so every group's shift d = s - ref lies in [-5, 6] when the four scales span
// at most 11 (checked when the weights are uploaded: mxfp4_blocks_fit_e4m3).
__device__ __forceinline__ int mxfp4_block_ref(uint32_t sc) {
  const int s0 = sc & 0xff, s1 = (sc >> 8) & 0xff, s2 = (sc >> 16) & 0xff, s3 = sc >> 24;
  return max(max(s0, s1), max(s2, s3)) - 6;
}

// ---------------------------------------------------------------- main loop
// Op (the operand source of one kernel) provides, per thread:
//   void load(uint8_t* smem, int stage, int kb) const
//       cp.async of K block kb into pipeline stage `stage`: the A tile (Smem::kA), its 128 scales
//       (Smem::kAScale, fp32), and the B tile (e4m3 into Smem::kB) or, MXFP4, the raw tile
//       (Smem::kRaw, row r at r*64) and each row's E8M0 word (Smem::kRawScale, 4 copies per row:
//       [row][q] for the four threads converting the row's four 32-element groups);
//   void convert(uint8_t* smem, int stage, int buf) const        (MXFP4 only)
//       turns the raw chunks this thread copied for `stage` into e4m3 B tile `buf` and its
//       column scales (Smem::kColScale);
//   float b_scale(int kb) const                                   (kE4m3 only)
//       the weight scale of K block kb (one 128-row weight block per CTA tile).
// bf16 tiles hold 64 elements of K per 128-byte row; no scales are loaded or applied.
// On return acc holds the tile in the layout of acc_row/acc_col.
template <bool kWgmma, Elem kElem, int kStages, class Op>
__device__ __forceinline__ void mainloop(uint8_t* smem, const Op& op, int nk, float (&acc)[64]) {
  constexpr bool kMxfp4 = kElem == Elem::kMxfp4;
  constexpr bool kScaled = kElem != Elem::kBf16;  // FP8: a fresh partial per K block, promoted
  using L = Smem<kMxfp4, kStages>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = warp >> 2, wq = warp & 3;
  float part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc[i] = 0.0f;
    part[i] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) op.load(smem, s, s);
    cp_async_commit();
  }
  // This thread's copies of K block 0 land before the first iteration's barrier (the loop below
  // waits for block kb+1 at the end of iteration kb, never for block 0). Without this wait block 0
  // was read while in flight: short K (one or two blocks, little else in flight to hide the
  // latency) under a loaded memory system read stale shared memory.
  cp_async_wait<kStages - 2>();
  if constexpr (kMxfp4) {
    if (nk > 0) op.convert(smem, 0, 0);
  }

  for (int kb = 0; kb < nk; ++kb) {
    const int st = kb % kStages;
    if constexpr (kWgmma) fence_proxy_async();
    // Stage kb (and converted tile kb) complete for every thread; iteration kb-1 finished
    // everywhere, so its stage and converted buffer may be refilled.
    __syncthreads();
    {
      const int nx = kb + kStages - 1;
      if (nx < nk) op.load(smem, nx % kStages, nx);
      cp_async_commit();
    }
    const int bbuf = kMxfp4 ? (kb & 1) : st;
    const uint8_t* sA = smem + L::kA + st * kTileBytes;
    const uint8_t* sB = smem + L::kB + bbuf * kTileBytes;
    float bs = 1.0f;
    if constexpr (kElem == Elem::kE4m3) bs = op.b_scale(kb);
    // FP8 multiplies into the fresh partial; bf16 straight into the accumulator.
    float (&dst)[64] = kScaled ? part : acc;

    if constexpr (kWgmma) {
      const uint32_t a0 = smem_u32(sA) + grp * 64 * 128, b0 = smem_u32(sB);
      fence_regs(dst);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (kScaled) wgmma_m64n128k32(dst, sw128_desc(a0 + 32 * s), sw128_desc(b0 + 32 * s), s);
        else wgmma_m64n128k16_bf16(dst, sw128_desc(a0 + 32 * s), sw128_desc(b0 + 32 * s), 1);
      }
      wgmma_commit();
    } else {
      if constexpr (kScaled) {
#pragma unroll
        for (int i = 0; i < 64; ++i) part[i] = 0.0f;
      }
      const uint32_t abase = smem_u32(sA), bbase = smem_u32(sB);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // B fragments of the warp's 32 columns (4 n8 chunks x 32 bytes of K), then A one m16 tile at
        // a time (fewer live registers than loading all of A first).
        uint32_t bf[4][2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int row = 32 * wq + 16 * p + (lane & 7) + (lane >> 4) * 8;
          uint32_t r[4];
          ldmatrix_x4(r, bbase + swz(row, 2 * s + ((lane >> 3) & 1)));
          bf[2 * p][0] = r[0];
          bf[2 * p][1] = r[1];
          bf[2 * p + 1][0] = r[2];
          bf[2 * p + 1][1] = r[3];
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          uint32_t af[4];
          const int row = 64 * grp + 16 * a + (lane & 7) + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(af, abase + swz(row, 2 * s + (lane >> 4)));
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_elem<kElem>(&dst[4 * (4 * a + j)], af, bf[j][0], bf[j][1]);
        }
      }
    }

    // While the tensor cores work: this thread's copies of K block kb+1 must have landed before
    // the next barrier; MXFP4 converts them into the other B buffer.
    if (kb + 1 < nk) {
      cp_async_wait<kStages - 2>();
      if constexpr (kMxfp4) op.convert(smem, (kb + 1) % kStages, (kb + 1) & 1);
    }

    if constexpr (kWgmma) {
      wgmma_wait0();
      fence_regs(dst);
    }
    if constexpr (kScaled) {
      // Promotion: acc += part * (activation scale of the row) * (weight scale of the column). Both
      // scales are powers of two, so the product and part * scale are exact and the fma rounds once.
      const float* as = reinterpret_cast<const float*>(smem + L::kAScale + st * kTileRows * 4);
      const float* cs = reinterpret_cast<const float*>(smem + L::kColScale + bbuf * kTileRows * 4);
#pragma unroll
      for (int i = 0; i < 64; i += 2) {
        const float ra = as[acc_row<kWgmma>(i)];
        float w0 = bs, w1 = bs;
        if constexpr (kMxfp4) {
          const float2 c2 = *reinterpret_cast<const float2*>(cs + acc_col<kWgmma>(i));
          w0 = c2.x;
          w1 = c2.y;
        }
        acc[i] = fmaf(part[i], ra * w0, acc[i]);
        acc[i + 1] = fmaf(part[i + 1], ra * w1, acc[i + 1]);
      }
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------- overlapped main loop (wgmma)
// The dense FP8 main loop with two partial accumulators: K block kb+1 is issued to the tensor
// cores before block kb is promoted, so the promotion's fp32 work overlaps the next block's MMAs
// (one more register array; K loop unrolled by two so both stay in registers). Same arithmetic and
// result as mainloop<true, Elem::kE4m3, ...>. Needs kStages >= 3.
template <int kStages, class Op>
__device__ __forceinline__ void issue_block(uint8_t* smem, int kb, float (&part)[64]) {
  using L = Smem<false, kStages>;
  const int grp = (threadIdx.x >> 5) >> 2;
  const int st = kb % kStages;
  const uint32_t a0 = smem_u32(smem + L::kA + st * kTileBytes) + grp * 64 * 128;
  const uint32_t b0 = smem_u32(smem + L::kB + st * kTileBytes);
  fence_regs(part);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) wgmma_m64n128k32(part, sw128_desc(a0 + 32 * s), sw128_desc(b0 + 32 * s), s);
  wgmma_commit();
}

template <int kStages, class Op>
__device__ __forceinline__ void overlap_step(uint8_t* smem, const Op& op, int kb, int nk, float (&cur)[64],
                                             float (&nxt)[64], float (&acc)[64]) {
  using L = Smem<false, kStages>;
  if (kb + 1 < nk) {
    cp_async_wait<kStages - 3>();  // this thread's copies of block kb+1 landed
    fence_proxy_async();
  }
  // Block kb+1 visible to every thread; iteration kb-1 finished everywhere (its MMAs too), so the
  // stage of block kb-1 may be refilled.
  __syncthreads();
  {
    const int nx = kb + kStages - 1;
    if (nx < nk) op.load(smem, nx % kStages, nx);
    cp_async_commit();
  }
  const float bs = op.b_scale(kb);
  if (kb + 1 < nk) {
    issue_block<kStages, Op>(smem, kb + 1, nxt);
    wgmma_wait1();  // block kb done, kb+1 in flight
  } else {
    wgmma_wait0();
  }
  fence_regs(cur);
  const float* as = reinterpret_cast<const float*>(smem + L::kAScale + (kb % kStages) * kTileRows * 4);
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = fmaf(cur[i], as[acc_row<true>(i)] * bs, acc[i]);
}

template <int kStages, class Op>
__device__ __forceinline__ void mainloop_overlap(uint8_t* smem, const Op& op, int nk, float (&acc)[64]) {
  static_assert(kStages >= 3, "the overlapped main loop keeps blocks kb and kb+1 resident");
  float p0[64], p1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc[i] = 0.0f;
    p0[i] = 0.0f;
    p1[i] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) op.load(smem, s, s);
    cp_async_commit();
  }
  if (nk <= 0) return;
  cp_async_wait<kStages - 2>();  // block 0
  fence_proxy_async();
  __syncthreads();
  issue_block<kStages, Op>(smem, 0, p0);
#pragma unroll 1
  for (int kb = 0; kb < nk; kb += 2) {
    overlap_step<kStages>(smem, op, kb, nk, p0, p1, acc);
    if (kb + 1 < nk) overlap_step<kStages>(smem, op, kb + 1, nk, p1, p0, acc);
  }
  cp_async_wait<0>();
}

}  // namespace tandem::kernels::cuda::tc
