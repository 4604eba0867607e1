// Shared by the decode MoE's two files (moe_decode.cu: experts, buffers, the whole call;
// moe_decode_route.cu: the gate + routing kernel): the kernels' geometry, the buffers' counter
// layout and the launch helpers.
#pragma once

#include <algorithm>
#include <atomic>

#include "common/check.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gate.cuh"
#include "kernels/cuda/timeline.cuh"
#include "model/cuda/moe_decode.h"

namespace tandem::cuda_model::moe_internal {

namespace kc = kernels::cuda;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kc::kWarp;
constexpr int kRows = 16;                  // output columns (weight rows) per warp task
constexpr int kChunk = 32;                 // job rows per item (2 m16 tiles)
constexpr int kMaxTopk = 16;
constexpr int kMaxUnits = 4;
// One warp's ring slot, one matrix's stage: FP8 128 k x 16 rows (2 KB, lane-private pieces), or
// MXFP4 256 k (or 128 k when a unit is not a multiple of 256) x 16 rows (up to 2 KB, rows of 16-byte
// chunks XOR-swizzled so that the per-lane quarter-group reads hit 32 distinct banks) followed by
// the 16 rows' E8M0 scales (8 bytes a row).
constexpr int kMxDataBytes = 2048;
constexpr int kSlotBytes = kMxDataBytes + kRows * 8;
constexpr int kMaxRing = 6;  // the most ring stages the experts kernels' wait handles
// The experts kernels' ring: two stages a warp. Measured against 3, 4 and 6 (as many as half an SM
// held) in the twentieth session, the shallow ring is the fastest at 1, 8 and 16 tokens (the rank's
// MoE layer 64.0 -> 60.6 us at one token, 276 -> 271 at 8, 450 -> 444 at 16; PERFORMANCE.md): with
// six, every warp's whole ring is requested the moment the routing is known (25 MB at one token, the
// routed up weights entire); likely (not measured) each warp's first stage then waits behind most of it.
constexpr int kExpertRing = 2;
static_assert(kExpertRing >= 2 && kExpertRing <= kMaxRing, "the kernels' ring waits");
constexpr int kMaxJobs = 1 + kc::kMoeGateMaxExperts;
// counters: [0] the gate ticket, [1] the shared rows' act_quant blocks done (kSdone: the up kernel
// adds, the early down item polls, the gate zeroes it each call), [32, 32 + dim/16) combine.
constexpr int kSdone = 1;
constexpr int kCombine0 = 32;

inline int64_t max_active_of(const MoeDecodeDims& d, int64_t tokens) {
  return std::min<int64_t>(d.n_experts, tokens * d.topk);
}
__host__ __device__ inline int64_t chunks_of(int64_t rows) { return (rows + kChunk - 1) / kChunk; }
inline int64_t quant0_of(const MoeDecodeDims& d) { return kCombine0 + d.dim / kRows; }
inline int64_t counter_count(const MoeDecodeDims& d) {
  return quant0_of(d) + (1 + max_active_of(d, d.max_tokens)) * chunks_of(d.max_tokens) * (d.inter / 128);
}
inline size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Largest power of two <= kMaxUnits (up) or kMaxUnitsDown (down) dividing k / 128 (units are whole
// FP8 scale blocks and whole MXFP4 stages). Down: w2's k (inter, 2048) is half of w1's, and at 4
// units a warp task was 2 MXFP4 stages, its fixed costs (item decode, reduction, epilogue) as large
// as its stream; at 2 units each task is 4 stages and an item 4 tiles.
constexpr int kMaxUnitsDown = 2;
inline int units_of(int64_t k, bool up) {
  const int64_t blocks = k / 128;
  const int most = up ? kMaxUnits : kMaxUnitsDown;
  int u = 1;
  while (u < most && blocks % (2 * u) == 0) u *= 2;
  return u;
}

// The gate kernel's split (moe_decode_route.cu). A warp task is 8 gate rows x 128 k (2 KB of
// weight, held in registers); a CTA's 8 warps are `tpc` row tiles x `upc` consecutive k units (upc:
// the largest power of two <= 8 dividing dim / 128), so the CTA adds a tile's units in unit order
// in shared memory; a row's k is then covered by `kb` CTAs whose partial sums the routing CTA adds
// in kb order. Depends on dim and the expert count alone (never on tokens).
constexpr int kGateRows = 8;
constexpr int kGateUnitK = 128;
constexpr int kGateMaxKb = 8;
struct GateSplit {
  int upc = 1, tpc = 8, kb = 1;
  int groups = 1;  // CTAs per k block: row tiles / tpc, rounded up
  int grid() const { return groups * kb; }
};
inline GateSplit gate_split(int64_t dim, int n_experts) {
  GateSplit g;
  const int64_t units = dim / kGateUnitK;
  while (g.upc < kWarps && units % (2 * g.upc) == 0) g.upc *= 2;
  g.tpc = kWarps / g.upc;
  g.kb = static_cast<int>(units / g.upc);
  const int tiles = (n_experts + kGateRows - 1) / kGateRows;
  g.groups = (tiles + g.tpc - 1) / g.tpc;
  return g;
}
// Dynamic shared memory of the gate kernel: the larger of its per-warp partial tiles and the
// routing CTA's scratch (8 tokens' logits and selection values, the grouping's per-expert arrays,
// the pairs of up to kRoutePairs (token, slot) pairs).
constexpr int kRoutePairs = 1024;
size_t route_smem(int n_experts, int expert_count);

template <typename Kernel, typename... Args>
void launch(Kernel* kern, dim3 grid, size_t smem, bool pdl, cudaStream_t s, Args&&... args) {
  if (pdl) {
    kc::launch_pdl(kern, grid, dim3(kThreads), smem, s, std::forward<Args>(args)...);
  } else {
    kern<<<grid, kThreads, smem, s>>>(std::forward<Args>(args)...);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

// The kernel's dynamic shared memory limit, raised once per kernel (first, eager call).
inline void allow_smem(const void* kern, std::atomic<bool>& done) {
  if (done.load()) return;
  kc::decode_allow_smem(kern);
  done = true;
}

}  // namespace tandem::cuda_model::moe_internal
