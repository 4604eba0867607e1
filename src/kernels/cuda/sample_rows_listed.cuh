// The listed passes of the sampling op (sample_rows.cu): a top-p row's candidates (the ids with
// p > 0 after top-p), recorded once by the band's pass, and the passes that read them instead of
// scanning the slice (min-p's kept mass, the draws), in the batches the scans would form.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/sample_rows_cluster.cuh"

namespace tandem::kernels::cuda::sample_cluster {

// ---- the candidates of a top-p row, recorded once ----
// The ids at or above the top-p band (every id with p > 0 after top-p) are recorded by the pass
// that finds the band, in id order, into the CTA's region of the global scratch: warp w's at
// [w * stride, w * stride + sh.cand_n[w]) (offsets from beg, so slices up to 65,536 ids; a row
// where some warp has more than `stride` candidates has no list: its passes scan),
// and sh.seg[k] is where draw segment k's candidates begin among the CTA's candidates (the warps'
// lists one after the other; sh.seg[nseg] is their total). The passes after the select (min-p, the
// draw, the residual draw) then read these few ids instead of scanning the slice, in the same
// batches of 32 candidates as the scan would form, so their sums are the same bits.
struct CandList {
  const unsigned short* off = nullptr;  // this CTA's region; nullptr: no list (scan)
  int stride = 0;                       // entries of a warp's list
  // Offset of the p-th candidate of the CTA (p < the CTA's count).
  __device__ __forceinline__ unsigned at(const Shared& sh, unsigned p) const {
    int w = 0;
#pragma unroll
    for (int k = 0; k < kWarps - 1; ++k)
      if (w == k && p >= static_cast<unsigned>(sh.cand_n[k])) {
        p -= static_cast<unsigned>(sh.cand_n[k]);
        w = k + 1;
      }
    return off[static_cast<int64_t>(w) * stride + p];
  }
};

// Listed batches kListAhead at a time: their offsets, then their z, then their masses are loaded
// and computed together (independent), so a warp waits for one round trip per kListAhead batches
// rather than per batch.
constexpr int kListAhead = 4;

// warp_batches over this warp's recorded candidates: fn(v, x, ok) with x = z of id v, 32 at a time
// in id order (the batches warp_batches(wb, we, cand) forms when the list is exactly the
// candidates); ok false on the lanes past the end.
template <typename ZAt, typename Fn>
__device__ __forceinline__ void warp_listed(Ctx& c, const CandList& l, ZAt zat, Fn fn) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int n = c.sh.cand_n[wid];
  const unsigned short* o = l.off + static_cast<int64_t>(wid) * l.stride;
  for (int i0 = 0; i0 < n; i0 += 32 * kListAhead) {
    unsigned off[kListAhead];
    float x[kListAhead];
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) {
      const int i = i0 + 32 * g + lane;
      off[g] = i < n ? o[i] : 0u;
    }
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) x[g] = i0 + 32 * g + lane < n ? zat(off[g]) : -INFINITY;
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) {
      if (i0 + 32 * g >= n) break;  // warp-uniform
      const bool ok = i0 + 32 * g + lane < n;
      fn(c.beg + off[g], x[g], ok);
    }
  }
}

// The draw's segment sums (find false: st[k] for the segments lane i holds, has: segment k with
// candidates [s0, s1)) or the search in one segment (find true), over listed candidates: the
// batches of the warp's segments in one flat sequence, kListAhead at a time, each added exactly as
// draw_segment adds its batches (the same batches, the same operations, the same order).
template <typename ZAt, typename CandX, typename MassX>
__device__ void draw_listed(Ctx& c, const CandList& l, bool has, int k, unsigned s0, unsigned s1, ZAt zat,
                            CandX candx, MassX massx, bool find, double base, double sx, double target, double* st,
                            long long& found, long long& last_positive) {
  const int lane = threadIdx.x & 31;
  const int nb = has ? static_cast<int>((s1 - s0 + 31) / 32) : 0;
  int incl = nb;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const int fb = incl - nb;  // this lane's segment's first flat batch
  const int nflat = __shfl_sync(0xffffffffu, incl, 31);
  double run = 0.0;
  int cur = -1, kcur = 0;  // the lane whose segment is being summed, and its segment
  bool done = false;
  for (int f0 = 0; f0 < nflat && !done; f0 += kListAhead) {
    int si[kListAhead];
    unsigned off[kListAhead];
    bool in[kListAhead];
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) {
      const int f = f0 + g;
      const unsigned b = __ballot_sync(0xffffffffu, nb > 0 && fb <= f);
      si[g] = f < nflat && b ? 31 - __clz(b) : -1;  // warp-uniform
      const int sl = si[g] < 0 ? 0 : si[g];
      const unsigned a = __shfl_sync(0xffffffffu, s0, sl), e = __shfl_sync(0xffffffffu, s1, sl);
      const int fbs = __shfl_sync(0xffffffffu, fb, sl);
      const unsigned p = a + 32u * static_cast<unsigned>(f - fbs) + static_cast<unsigned>(lane);
      in[g] = si[g] >= 0 && p < e;
      off[g] = in[g] ? l.at(c.sh, p) : 0u;
    }
    float x[kListAhead];
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) x[g] = in[g] ? zat(off[g]) : -INFINITY;
    double m[kListAhead];
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) {
      m[g] = in[g] && candx(x[g]) ? massx(c.beg + off[g], x[g]) : 0.0;
      if (!(m[g] > 0)) m[g] = 0.0;
    }
#pragma unroll
    for (int g = 0; g < kListAhead; ++g) {
      if (si[g] < 0 || done) break;  // warp-uniform
      if (si[g] != cur) {            // a new segment: the previous one's sum is complete
        if (!find && cur >= 0 && lane == 0) st[kcur] = run;
        run = 0.0;
        cur = si[g];
        kcur = __shfl_sync(0xffffffffu, k, cur);
      }
      double in_incl = m[g];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, in_incl, o);
        if (lane >= o) in_incl = y + in_incl;
      }
      const unsigned pos = __ballot_sync(0xffffffffu, m[g] > 0);
      if (pos == 0) continue;
      const int lp = 31 - __clz(pos);
      const double gs = __shfl_sync(0xffffffffu, in_incl, lp);
      const double next = run + gs;
      const long long vl = static_cast<long long>(c.beg + off[g]);
      if (find && target < base + (sx + next)) {
        const unsigned hit = __ballot_sync(0xffffffffu, m[g] > 0 && target < base + (sx + (run + in_incl)));
        found = __shfl_sync(0xffffffffu, vl, hit ? __ffs(hit) - 1 : lp);
        done = true;
      }
      run = next;
      const long long lv = __shfl_sync(0xffffffffu, vl, lp);
      last_positive = lv > last_positive ? lv : last_positive;
    }
  }
  if (!find && cur >= 0 && lane == 0) st[kcur] = run;
}

// cluster_draw over a CandList (every CTA of the cluster has one): the same segments, batches and
// sums, reading the recorded candidates only. candx(x) and massx(v, x) are cand and mass given id
// v's z value x; zat(offset) reads z.
template <typename ZAt, typename CandX, typename MassX>
__device__ DrawOut cluster_draw_listed(Ctx& c, const CandList& l, ZAt zat, CandX candx, MassX massx, double u,
                                       bool scale) {
  const int64_t len = c.end - c.beg;
  const int64_t seg = c.draw_seg();
  const int nseg = static_cast<int>((len + seg - 1) / seg);
  auto sums = [&](double* st, long long& lastpos) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    static_assert(kMaxSegments / kWarps <= 32, "one lane per segment of a warp");
    const int k = wid + kWarps * lane;  // this lane's segment
    const bool has = lane < kMaxSegments / kWarps && k < nseg;
    if (has) st[k] = 0.0;  // segments without candidates
    __syncwarp();
    long long unused = -1;
    draw_listed(c, l, has, k, has ? c.sh.seg[k] : 0u, has ? c.sh.seg[k + 1] : 0u, zat, candx, massx, false, 0.0,
                0.0, 0.0, st, unused, lastpos);
  };
  auto find = [&](int first, double base, double sxk, double target) {
    const bool has = (threadIdx.x & 31) == 0;
    long long found = -1, unused = -1;
    draw_listed(c, l, has, first, has ? c.sh.seg[first] : 0u, has ? c.sh.seg[first + 1] : 0u, zat, candx, massx,
                true, base, sxk, target, nullptr, found, unused);
    return found;
  };
  return cluster_draw_core(c, nseg, sums, find, u, scale);
}

}  // namespace tandem::kernels::cuda::sample_cluster
