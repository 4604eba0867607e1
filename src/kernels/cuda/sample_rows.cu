// sample_rows_device (sample_rows.h): one thread-block cluster of kCtas CTAs per row, each CTA
// holding a contiguous slice of the row's processed logits z in shared memory (when more than 32
// rows run, about 30% of a 129,280 vocabulary's slice in the global scratch, so that 4 CTAs fit on
// an SM and 48 rows in one wave: ZSlice; sample_rows_cluster.cuh has the exchanges between the
// CTAs), in the host's order of operations (kernels/cpu/sampling.cpp):
//   load + penalties -> noise/grammar masks + argmax -> greedy: done
//   else top-k (radix select of the k-th largest logit over order-preserving keys, integer counts)
//   -> softmax sum: e = exp((z - zmax) / T) in double for every kept id, p = e / sum (every later
//   step recomputes e and p with the same operations, so they are the same bits; nothing stores
//   them) -> top-p -> min-p -> accept / draw by inverse CDF in id order.
// Top-p: the exact rule is the host's (sort by p descending, ties by lower id, keep until the sum
// reaches top_p) with masses in 2^-60 fixed point: the kept set is {p > p*} plus the ties at p* in
// id order, where p* is the largest p whose mass at or above it reaches top_p. The exp pass also
// fills a coarse histogram of d = (z - zmax) / T (kBins buckets of width 1/8, masses of e in fixed
// point), which brackets p* in a band of buckets: one bucket of d on each side of the buckets where
// the coarse cumulative mass crosses top_p (+- a margin far above the histogram's rounding). A gap
// of 1/8 in d is a factor e^(1/8) in p, so every id above the band has p > p* and every id below it
// p < p*; the radix select over the bits of p then runs on the band's ids only (with the exact mass
// above the band), and its result is the one a select over the whole row gives. In a row of
// distinct logits the band holds a few hundred ids: the pass that finds the band records each
// warp's band ids in a short list (kBandCap), and the select's passes and the kept mass run over
// the lists instead of the slice (a warp whose band overflows its list scans its range).
// Cost: a top-p row reads its slice in three passes (load + argmax; exp sum + histogram; the ids at
// or above the band, compacted 32 at a time), each a few dozen instructions per id; everything
// else runs over lists: the band pass also records every id at or above the band (exactly the
// ids with p > 0 after top-p) in the global scratch (CandList, sample_rows_listed.cuh), and
// min-p's kept mass and the draws (plain and residual) read those instead of scanning the slice,
// in the same batches of 32 (the same sums, bit for bit); the threshold's ties are kept in id
// order too (the m-th tie is counted over the band lists; only a row whose band overflowed a
// list, e.g. a flat one, scans its slice for it). A top-k row's softmax pass also records which
// ids of each chunk of 32 are live, so its band pass visits only the chunks with live ids. The
// scans are latency-bound (4 warps per scheduler, part of z in the L2), so each keeps several
// round trips' worth of loads in flight: the softmax pass loads the next 4 ids per thread while it
// computes the current 4 exps, the band's pass loads the next 8 groups of 32 before handling the
// current ones, the compaction evaluates 8 groups of 32 ids before compacting them, top-k's dense
// select passes load 4 ids per thread ahead, and the listed passes fetch 4 batches of 32 at once.
// p after top-p/min-p is recomputed from p with the host's divisions (/ kept_top_p, then
// / kept_min_p), so it has the host's rounding steps.
// Precision: e, p and all masses are double as on the host; sums run in fixed trees (not the host's
// sequential order), so p agrees to a few ulps and a draw whose uniform sits within ~1e-15 of a CDF
// boundary may land on the neighbouring id; top-p's cumulative mass agrees with the host's to
// ~1e-13, so a threshold decided by less than that may differ.
// NaN logits: the argmax follows the host (a NaN wins only as the first finite-or-NaN element);
// elsewhere NaN never crashes or hangs a row but its p is not specified (the host's is NaN too).
#include "kernels/cuda/sample_rows.h"

#include <climits>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sample_rows_cluster.cuh"
#include "kernels/cuda/sample_rows_listed.cuh"
#include "kernels/cuda/sampling_device.cuh"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {
namespace {

using sample_cluster::Ctx;
using sample_cluster::DrawOut;
using sample_cluster::kBins;
using sample_cluster::kCtas;
using sample_cluster::kThreads;
using sample_cluster::kWarps;
using sample_cluster::RadixOut;
using sample_cluster::Shared;
using sample_cluster::Slot;

// Four CTAs per SM on an H100/H200, so that 48 rows (384 CTAs in clusters of 8) run in one wave:
// with three, the clusters fit in the GPCs 45 at a time (sample_rows_active_clusters) and 48 rows
// took two waves. Registers: 4 CTAs x 4 warps x 32 x 128 = the SM's 64K.
constexpr int kMaxRegisters = 128;
// Shared memory: 4 x (static part + 1 KB of the system's + the slice's shared part) within the
// 228 KB of an H100/H200 SM, so a CTA keeps at most kQuadSliceFloats of its slice in shared memory
// when many rows run; the rest lives in the global scratch (ZSlice). Fewer rows keep a slice of up
// to kSmemSliceFloats in shared memory (3 CTAs per SM; 80 KB: with the static part within the 99 KB
// per block of sm_120).
constexpr int64_t kQuadSliceFloats = 11264;
static_assert(4 * (sizeof(Shared) + 1024 + kQuadSliceFloats * sizeof(float)) <= 228 * 1024, "4 CTAs per SM");
constexpr int64_t kSmemSliceFloats = 20480;
// Rows up to which a launch keeps whole slices in shared memory (3 CTAs per SM): one wave of 3
// CTAs per SM holds 45 clusters on an H200.
constexpr int kWholeSliceRows = 32;
constexpr double kBucketsPerUnit = 8.0;              // coarse buckets per unit of d
constexpr double kFixedOne = 1152921504606846976.0;  // 2^60: top-p masses in fixed point

__device__ __forceinline__ uint64_t to_fixed(double p) { return __double2ull_rn(p * kFixedOne); }
__device__ __forceinline__ uint64_t pkey(double p) { return static_cast<uint64_t>(__double_as_longlong(p)); }

// score_key (device.cuh) back to the float (-0 comes back as +0, which compares equal).
__device__ __forceinline__ float score_key_value(uint32_t k) {
  return num::bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Coarse bucket of d <= 0: floor(-d * 8), the last bucket holding everything from d <= -31.875
// (and NaN). Non-increasing in z, as d is non-decreasing (correctly rounded ops are monotone).
__device__ __forceinline__ int coarse_bucket(double d) {
  const double t = -d * kBucketsPerUnit;
  if (!(t < static_cast<double>(kBins - 1))) return kBins - 1;
  return t > 0.0 ? static_cast<int>(t) : 0;
}

// {x : f(x)} for a predicate f on floats that is monotone (false below some x0, true from it on),
// as one comparison: x >= x0, or every x, or none. NaN passes only `all`.
struct ZThreshold {
  float x0 = INFINITY;
  bool all = false, none = false;
  __device__ __forceinline__ bool pass(float x) const { return all || (!none && x >= x0); }
};
template <typename F>
__device__ ZThreshold z_threshold(F f) {
  ZThreshold t;
  if (f(-INFINITY)) {
    t.all = true;
  } else if (!f(INFINITY)) {
    t.none = true;
  } else {
    // f(value(lo)) false, f(value(hi)) true over score_key order (-inf .. +inf, no NaN in between)
    uint32_t lo = score_key(-INFINITY), hi = score_key(INFINITY);
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (f(score_key_value(mid))) hi = mid;
      else lo = mid;
    }
    t.x0 = score_key_value(hi);
  }
  return t;
}

template <typename T, typename Op>
__device__ __forceinline__ T warp_fold(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A CTA's slice of z: ids in chunks of 32; of each group of 16 chunks, the first `nsh` live in
// shared memory and the others in the CTA's region of the global scratch. Every warp's range and
// every stretch of a few hundred ids see the same mix, so no warp waits on global memory alone.
// nsh 16: all in shared memory; 0: all in the scratch.
constexpr int kChunk = 32, kGroupChunks = 16;
struct ZSlice {
  float* s = nullptr;  // shared part
  float* g = nullptr;  // global part
  int nsh = kGroupChunks;
  // id offset i's value (a value, not a reference: each part is read with its own address space)
  __device__ __forceinline__ float operator[](int64_t i) const {
    const int k = static_cast<int>(i >> 5), grp = k >> 4, r = k & (kGroupChunks - 1), l = static_cast<int>(i) & 31;
    return r < nsh ? s[(grp * nsh + r) * kChunk + l] : g[(grp * (kGroupChunks - nsh) + r - nsh) * kChunk + l];
  }
  __device__ __forceinline__ float* ptr(int64_t i) const {
    const int k = static_cast<int>(i >> 5), grp = k >> 4, r = k & (kGroupChunks - 1), l = static_cast<int>(i) & 31;
    return r < nsh ? s + (grp * nsh + r) * kChunk + l : g + (grp * (kGroupChunks - nsh) + r - nsh) * kChunk + l;
  }
};
// Floats of a slice of `n` ids in shared memory / in the global scratch, with nsh of 16 chunks shared.
__host__ __device__ inline int64_t zslice_shared_floats(int64_t n, int nsh) {
  const int64_t k = (n + kChunk - 1) / kChunk, rem = k % kGroupChunks;
  return kChunk * (nsh * (k / kGroupChunks) + (rem < nsh ? rem : nsh));
}
__host__ __device__ inline int64_t zslice_global_floats(int64_t n, int nsh) {
  const int64_t k = (n + kChunk - 1) / kChunk, rem = k % kGroupChunks;
  return kChunk * ((kGroupChunks - nsh) * (k / kGroupChunks) + (rem > nsh ? rem - nsh : 0));
}

// A CTA's region of the list scratch (16-bit entries): the candidate list (CandList: each warp's at
// most a quarter of its range, cand_cap; a row with more candidates scans instead), then the live
// mask of a top-k row (one 32-bit word per 32 ids), each part 256-byte aligned.
__host__ __device__ inline int64_t cand_cap(int64_t warp_len) { return ((warp_len + 3) / 4 + 31) / 32 * 32; }
__host__ __device__ inline int64_t cand_list_entries(int64_t slice) {
  const int64_t wl = ((slice + sample_cluster::kWarps - 1) / sample_cluster::kWarps + 31) / 32 * 32;  // >= warp_len()
  return (sample_cluster::kWarps * cand_cap(wl) + 127) / 128 * 128;
}
__host__ __device__ inline int64_t live_mask_entries(int64_t slice) { return (2 * ((slice + 31) / 32) + 127) / 128 * 128; }

// p of a prepared row, recomputed from z with the same operations wherever it is needed.
struct RowDist {
  ZSlice z;  // this CTA's slice: z[v - beg]
  int64_t beg = 0;
  double zmax = 0.0, inv_t = 1.0, sum = 1.0;
  float kth = -INFINITY;  // top-k: keep z >= kth
  bool top_p = false;
  float za = INFINITY, zb = INFINITY;  // top-p: above the band z >= za, in the band zb <= z < za
  double pstar = 0.0;                  // top-p: keep p > pstar, and p == pstar up to id tie_last
  int64_t tie_last = -1;
  double kept_p = 1.0;
  bool min_p = false;
  double cut = 0.0;
  double kept_m = 1.0;

  __device__ __forceinline__ bool live(float x) const { return !(x == -INFINITY || x < kth); }
  __device__ __forceinline__ double dval(float x) const {
    return __dmul_rn(__dsub_rn(static_cast<double>(x), zmax), inv_t);
  }
  __device__ __forceinline__ double p1x(float x) const { return live(x) ? exp(dval(x)) / sum : 0.0; }
  __device__ __forceinline__ bool above(float x) const { return live(x) && x >= za; }
  __device__ __forceinline__ bool band(float x) const { return live(x) && x >= zb && !(x >= za); }
  // may have p > 0 after top-p
  __device__ __forceinline__ bool cand(float x) const { return live(x) && (!top_p || x >= zb); }
  __device__ __forceinline__ bool in_top_p(double p, int64_t v) const {
    return p > pstar || (p == pstar && v <= tie_last);
  }
  __device__ __forceinline__ double p2x(float x, int64_t v) const {
    const double p = p1x(x);
    if (!top_p) return p;
    if (above(x)) return p / kept_p;
    return band(x) && in_top_p(p, v) ? p / kept_p : 0.0;
  }
  __device__ __forceinline__ double px(float x, int64_t v) const {
    const double q = p2x(x, v);
    if (!min_p) return q;
    return (q < cut ? 0.0 : q) / kept_m;
  }
  __device__ __forceinline__ double p(int64_t v) const { return px(z[v - beg], v); }
};

__device__ __forceinline__ bool sorted_contains(const int32_t* a, int n, int32_t t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (a[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && a[lo] == t;
}

// One cluster per row (blockIdx.x / kCtas), CTA rank r holding ids [r slice, (r + 1) slice). z (the
// processed logits) lives in shared memory and in zscratch [rows, kCtas, zstride] as ZSlice lays it
// out with nsh of 16 chunks shared.
__global__ void __cluster_dims__(kCtas, 1, 1) __maxnreg__(kMaxRegisters)
    sample_rows_kernel(SampleInputs in, const SampleRow* rows, float* zscratch, int64_t zstride,
                       unsigned short* lscratch, int64_t lstride, int64_t slice, int nsh, SampleRowResult* out) {
  extern __shared__ float4 zdyn[];  // zslice_shared_floats(slice, nsh) floats
  __shared__ Shared sh;
  pdl_wait();
  const int ri = static_cast<int>(blockIdx.x / kCtas);
  const SampleRow row = rows[ri];
  const int64_t V = in.vocab;
  Ctx c{sh, sample_cluster::cg::this_cluster(), 0, 0, 0};
  c.rank = static_cast<int>(c.cl.block_rank());
  c.beg = static_cast<int64_t>(c.rank) * slice < V ? static_cast<int64_t>(c.rank) * slice : V;
  c.end = c.beg + slice < V ? c.beg + slice : V;
  const int64_t beg = c.beg, end = c.end, len = end - beg;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const float kNegInf = -INFINITY;
  auto zpeer = [&](int q) {  // CTA q's slice
    ZSlice t;
    t.s = c.cl.map_shared_rank(reinterpret_cast<float*>(zdyn), q);
    t.g = nsh < kGroupChunks ? zscratch + (static_cast<int64_t>(ri) * kCtas + q) * zstride : nullptr;
    t.nsh = nsh;
    return t;
  };
  ZSlice z;
  z.s = reinterpret_cast<float*>(zdyn);
  z.g = nsh < kGroupChunks ? zscratch + (static_cast<int64_t>(ri) * kCtas + c.rank) * zstride : nullptr;
  z.nsh = nsh;
  const float* const lg = in.logits + static_cast<int64_t>(row.logits_row) * V;

  // ---- load the slice; penalties; noise/grammar masks and argmax ----
  // argmax = the first element != -inf when it is NaN (the host's `z[v] > z[best]` never replaces
  // it), else the first maximum among the non-NaN ones. mxf: the raw maximum without the noise
  // token (for the log-probabilities).
  const int32_t* prompt = in.prompt_ids ? in.prompt_ids + row.prompt_begin : nullptr;
  const int32_t* counts = in.counts ? in.counts + 2 * static_cast<int64_t>(row.counts_begin) : nullptr;
  const int np = prompt ? row.prompt_count : 0, nc = counts ? row.counts_count : 0;
  const bool rep = row.repetition_penalty != 1.0 && (np > 0 || nc > 0);
  const bool freq = (row.frequency_penalty != 0.0 || row.presence_penalty != 0.0) && nc > 0;
  const bool penalties = rep || freq;
  const uint32_t* mask =
      row.mask_row >= 0 && in.masks ? in.masks + static_cast<int64_t>(row.mask_row) * in.mask_words : nullptr;
  // Per thread: ids visited in increasing order (the loops below), so the first element != -inf
  // and the first maximum are the first ones met; ids fit int (V < 2^30). The noise token as an id
  // of this slice, or -1.
  const int noise = in.noise >= beg && in.noise < end ? static_cast<int>(in.noise) : -1;
  float mxf = kNegInf;
  float bv = kNegInf;  // the thread's maximum (NaN left out) and its first id
  int bi = -1;
  int first = INT_MAX;  // 2 * id + isnan of the first element != -inf
  int nv = 0;           // elements != -inf
  auto mask_argmax = [&](int v, float x) {
    if (v == noise) x = kNegInf;
    if (mask && !((mask[v >> 5] >> (v & 31)) & 1u)) x = kNegInf;
    if (x != kNegInf) {
      ++nv;
      if (first == INT_MAX) first = 2 * v + (is_nan(x) ? 1 : 0);
      if (x > bv) {  // false for NaN; -0 and +0 tie (the lower id stays), as in select_key
        bv = x;
        bi = v;
      }
    }
    return x;
  };
  // The load: load_slice(f) stores z[v] = f(v, logit v); each thread meets its ids in increasing
  // order. Without penalties the masks and the argmax run in it (the penalties come first); the
  // common row (no mask, no penalty) gets its own copy without the mask's branches.
  auto load_slice = [&](auto&& f) {
    const int n = static_cast<int>(len);
    int done = 0;
    // z's parts are 16-byte aligned and a float4 of ids never straddles a chunk
    if ((reinterpret_cast<uintptr_t>(lg + beg) & 15u) == 0) {
      const int n4 = n / 4;
      const float4* s4 = reinterpret_cast<const float4*>(lg + beg);
      const int v0 = static_cast<int>(beg);
      constexpr int kUnroll = 8;  // loads in flight per thread (16 KB per CTA)
      for (int i0 = tid; i0 < n4; i0 += kUnroll * kThreads) {
        float4 t[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (i0 + u * kThreads < n4) t[u] = __ldg(s4 + i0 + u * kThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = i0 + u * kThreads;
          if (i >= n4) continue;
          const int v = v0 + 4 * i;
          float4 x = t[u];
          x.x = f(v, x.x);
          x.y = f(v + 1, x.y);
          x.z = f(v + 2, x.z);
          x.w = f(v + 3, x.w);
          *reinterpret_cast<float4*>(z.ptr(4 * static_cast<int64_t>(i))) = x;
        }
      }
      done = 4 * n4;
    }
    for (int i = done + tid; i < n; i += kThreads) *z.ptr(i) = f(static_cast<int>(beg) + i, lg[beg + i]);
    __syncthreads();
  };
  if (penalties) {
    load_slice([&](int v, float x) {
      if (v != noise) mxf = fmaxf(mxf, x);
      return x;
    });
  } else if (mask) {
    load_slice([&](int v, float x) {
      if (v != noise) mxf = fmaxf(mxf, x);
      return mask_argmax(v, x);
    });
  } else {
    load_slice([&](int v, float x) {
      const float y = v == noise ? kNegInf : x;
      mxf = fmaxf(mxf, y);  // -inf changes no maximum: the noise token stays out
      if (y != kNegInf) {
        ++nv;
        if (first == INT_MAX) first = 2 * v + (is_nan(y) ? 1 : 0);
        if (y > bv) {
          bv = y;
          bi = v;
        }
      }
      return y;
    });
  }
  if (penalties) {  // each listed token is touched by one thread: the lists hold unique tokens
    if (rep) {
      const float r = static_cast<float>(row.repetition_penalty);
      auto apply = [&](int32_t t) {
        if (t < beg || t >= end) return;  // another CTA's (or outside the vocabulary)
        const float x = z[t - beg];
        *z.ptr(t - beg) = x > 0 ? __fdiv_rn(x, r) : __fmul_rn(x, r);
      };
      for (int i = tid; i < np; i += kThreads) apply(prompt[i]);
      for (int i = tid; i < nc; i += kThreads)
        if (!sorted_contains(prompt, np, counts[2 * i])) apply(counts[2 * i]);
      __syncthreads();
    }
    if (freq) {
      for (int i = tid; i < nc; i += kThreads) {
        const int32_t t = counts[2 * i], k = counts[2 * i + 1];
        if (t < beg || t >= end) continue;
        const double pen = __dadd_rn(__dmul_rn(row.frequency_penalty, static_cast<double>(k)),
                                     __dmul_rn(row.presence_penalty, k > 0 ? 1.0 : 0.0));
        *z.ptr(t - beg) = __fsub_rn(z[t - beg], static_cast<float>(pen));
      }
      __syncthreads();
    }
    for (int64_t i = tid; i < len; i += kThreads) *z.ptr(i) = mask_argmax(static_cast<int>(beg + i), z[i]);
  }
  unsigned long long best = block_argmax_key(bi >= 0 ? select_key(bv, static_cast<uint32_t>(bi)) : 0ull, sh.red);
  first = block_min_int(first, sh.red);
  long long nvalid = block_sum_i64(nv, sh.red);
  mxf = block_reduce(mxf, MaxOp{}, kNegInf, sh.red);
  {
    Slot& s = c.open();
    if (tid == 0) {
      s.u[0] = best;
      s.i[0] = first;
      s.i[1] = nvalid;
      s.x[0] = mxf;
    }
    c.publish();
    best = 0;
    first = INT_MAX;
    nvalid = 0;
    mxf = kNegInf;
    for (int q = 0; q < kCtas; ++q) {
      const Slot* p = c.peer(q);
      best = p->u[0] > best ? p->u[0] : best;
      first = p->i[0] < first ? static_cast<int>(p->i[0]) : first;
      nvalid += p->i[1];
      mxf = fmaxf(mxf, p->x[0]);
    }
  }
  int64_t argmax;
  double zmax = 0.0;  // z[argmax] (read from the keys: the argmax may be another CTA's)
  if (mask && nvalid == 0 && in.eos >= 0 && in.eos < V) {  // grammar dead end: EOS ends the output
    if (in.eos >= beg && in.eos < end && tid == 0) *z.ptr(in.eos - beg) = 0.0f;
    __syncthreads();
    argmax = in.eos;
    nvalid = 1;
  } else if (first != INT_MAX) {
    argmax = (first & 1) ? (first >> 1) : static_cast<int64_t>(select_key_index(best));
    zmax = (first & 1) ? static_cast<double>(NAN) : static_cast<double>(score_key_value(static_cast<uint32_t>(best >> 32)));
  } else {
    argmax = in.eos >= 0 && in.eos < V ? in.eos : 0;  // no finite logit: end the output, greedily
  }

  int accepted = 0;
  int64_t token = argmax;
  const bool greedy = nvalid == 0 || is_greedy(row.temperature);
  if (greedy) {
    accepted = row.draft >= 0 && row.draft == argmax ? 1 : 0;
  } else {
    RowDist d;
    d.z = z;
    d.beg = beg;
    d.zmax = zmax;
    d.inv_t = 1.0 / row.temperature;
    int64_t wb, we;
    c.warp_range(wb, we);
    unsigned* const queue = sh.warp[wid].queue;
    // top-p: the candidates recorded by the band's pass (CandList), read by min-p and the draws
    sample_cluster::CandList clist;
    // ---- top-k: keep z >= the k-th largest finite-or-NaN logit ----
    if (row.top_k > 0 && row.top_k < V && row.top_k < nvalid) {
      auto elem = [&](float x, uint64_t& key, uint64_t& weight) {
        if (x == kNegInf) return false;
        key = score_key(x);
        weight = 1;
        return true;
      };
      const RadixOut rr = sample_cluster::cluster_radix_select<true>(
          c, 32, 0, 0, static_cast<uint64_t>(row.top_k), sample_cluster::WarpList{},
          [&](int64_t v) { return z[v - beg]; }, elem);
      if (rr.found) d.kth = score_key_value(static_cast<uint32_t>(rr.key));
    }
    // ---- softmax sum in double; top-p: the coarse histogram of d ----
    const bool top_p = row.top_p < 1.0;
    // a top-k row's live ids per chunk of 32 (the softmax pass writes them; the band's pass reads
    // them), in the list scratch after the candidate list; the same choice in every CTA
    unsigned* const live_words =
        lscratch != nullptr && top_p && d.kth != kNegInf
            ? reinterpret_cast<unsigned*>(lscratch + (static_cast<int64_t>(ri) * kCtas + c.rank) * lstride +
                                          cand_list_entries(slice))
            : nullptr;
    const int vbits = 64 - __clzll(static_cast<unsigned long long>(V));
    const double wscale = ldexp(1.0, 63 - vbits);  // e <= 1: a row's coarse mass stays below 2^63
    // The coarse masses in 16-bit limbs (Slot) while a CTA's bucket sums of each limb fit 32 bits:
    // at most `slice` ids of w <= 2^(63 - vbits) (the top limb's sum is below 2^31 for any slice,
    // as a CTA has fewer than 2^vbits ids). Decided by the slice, so every CTA reads the same way.
    const bool limbs = slice <= 65536;
    double p1max = 0.0;                              // the largest p among the ids top-p keeps
    {
      Slot& s = c.open();
      if (top_p)
        for (int i = tid; i < kBins; i += kThreads) {
          if (limbs) {
            s.limb[0][i] = 0;
            s.limb[1][i] = 0;
            s.count[i] = 0;
          } else {
            s.mass[i] = 0;
          }
        }
      __syncthreads();
      double local = 0.0, emax = 0.0;
      // Every id in turn (no compaction: a warp's exps run together whether few ids or all are live,
      // and the queue would cost more than the dead ids' compare). A thread takes kExpIlp of its ids
      // at once: their loads (part of the slice is in global memory) and their exps (a chain of
      // dependent FP64 operations each) overlap, and they are added in id order as one at a time
      // would add them (the same bits).
      // The next step's z are loaded before this step's exps (software pipelining): the loads of
      // the part of the slice in the L2 are then in flight during the FP64 work instead of
      // stalling every step (the order of the additions is unchanged).
      constexpr int kExpIlp = 4;
      constexpr int64_t kExpStep = kExpIlp * kThreads;
      float xn[kExpIlp];
#pragma unroll
      for (int u = 0; u < kExpIlp; ++u) {
        const int64_t i = tid + static_cast<int64_t>(u) * kThreads;
        xn[u] = i < len ? z[i] : kNegInf;
      }
      // The loop's bounds are the warp's (a lane past the slice sees -inf: nothing to add), so a
      // top-k row can record which ids of each chunk of 32 are live (the band's pass then visits
      // only those chunks: warp_batches_masked).
      for (int64_t w0 = tid - lane; w0 < len; w0 += kExpStep) {
        const int64_t i0 = w0 + lane;
        float x[kExpIlp];
        double dv[kExpIlp], e[kExpIlp];
        unsigned live = 0;
#pragma unroll
        for (int u = 0; u < kExpIlp; ++u) {
          x[u] = xn[u];
          live |= d.live(x[u]) ? 1u << u : 0u;
          dv[u] = d.live(x[u]) ? d.dval(x[u]) : 0.0;
          const int64_t i = i0 + kExpStep + static_cast<int64_t>(u) * kThreads;
          xn[u] = i < len ? z[i] : kNegInf;
          if (live_words) {  // block-uniform
            const unsigned lb = __ballot_sync(0xffffffffu, (live >> u) & 1u);
            const int64_t chunk = (w0 + static_cast<int64_t>(u) * kThreads) / 32;
            if (lane == 0 && 32 * chunk < len) live_words[chunk] = lb;
          }
        }
#pragma unroll
        for (int u = 0; u < kExpIlp; ++u) e[u] = (live >> u) & 1u ? exp(dv[u]) : 0.0;
#pragma unroll
        for (int u = 0; u < kExpIlp; ++u) {
          if (!((live >> u) & 1u)) continue;
          local += e[u];
          emax = fmax(emax, e[u]);
          if (top_p) {
            const uint64_t w = e[u] > 0 ? __double2ull_rz(e[u] * wscale) : 0;
            if (w) {
              const int b = coarse_bucket(dv[u]);
              if (limbs) {
                atomicAdd(&s.limb[0][b], static_cast<unsigned>(w & 0xffffu));
                atomicAdd(&s.limb[1][b], static_cast<unsigned>((w >> 16) & 0xffffu));
                if (w >> 32) atomicAdd(&s.count[b], static_cast<unsigned>(w >> 32));  // the larger e only
              } else {
                atomicAdd(&s.mass[b], static_cast<unsigned long long>(w));
              }
            }
          }
        }
      }
      local = block_sum_f64(local, sh.red);
      emax = block_max_f64(emax, sh.red);
      if (tid == 0) {
        s.f[0] = local;
        s.f[1] = emax;
      }
      c.publish();
      double sum = 0.0;
      emax = 0.0;
      for (int q = 0; q < kCtas; ++q) {
        sum = sum + c.peer(q)->f[0];
        emax = fmax(emax, c.peer(q)->f[1]);
      }
      d.sum = sum;
      p1max = emax / sum;
    }
    // ---- top-p ----
    if (top_p) {
      d.top_p = true;
      // The band of coarse buckets (every CTA computes the same from the summed histogram).
      {
        Slot& s = c.open();
        constexpr int kPer = kBins / kCtas;  // CTA r sums buckets [kPer r, kPer (r + 1))
        for (int i = tid; i < kPer; i += kThreads) {
          const int b = kPer * c.rank + i;
          unsigned long long m = 0;
          for (int q = 0; q < kCtas; ++q) {
            const Slot* p = c.peer_prev(q);
            m += limbs ? p->limb[0][b] + (static_cast<unsigned long long>(p->limb[1][b]) << 16) +
                             (static_cast<unsigned long long>(p->count[b]) << 32)
                       : p->mass[b];
          }
          s.mass[b] = m;
        }
        c.publish();
        if (wid == 0) {
          unsigned long long m[8], lm = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int b = 8 * lane + j;
            m[j] = c.peer(b / kPer)->mass[b];
            lm += m[j];
          }
          unsigned long long incl = lm;
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
          }
          const unsigned long long W = __shfl_sync(0xffffffffu, incl, 31);
          const double tc = row.top_p * static_cast<double>(W);
          const uint64_t Tc = tc > 0.0 ? __double2ull_ru(tc) : 0;
          // The histogram's masses are within V * 2^(vbits - 63) of W of the exact fixed-point
          // ones (truncation of each e); the margin is 2^6 times that.
          const int shift = 57 - 2 * vbits;
          const uint64_t delta = shift <= 0 ? W : (W >> shift);
          const uint64_t lo_t = Tc > delta ? Tc - delta : 0, hi_t = Tc + delta;
          unsigned long long run = incl - lm;
          int jlo = -1, jhi = -1;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            run += m[j];
            if (jlo < 0 && run >= lo_t) jlo = 8 * lane + j;
            if (jhi < 0 && run >= hi_t) jhi = 8 * lane + j;
          }
          const unsigned blo = __ballot_sync(0xffffffffu, jlo >= 0), bhi = __ballot_sync(0xffffffffu, jhi >= 0);
          const int glo = blo ? __shfl_sync(0xffffffffu, jlo, __ffs(blo) - 1) : kBins - 1;
          const int ghi = bhi ? __shfl_sync(0xffffffffu, jhi, __ffs(bhi) - 1) : kBins - 1;
          if (lane == 0) {
            sh.bc.band_top = glo > 0 ? glo - 1 : 0;
            sh.bc.band_bot = ghi + 1 < kBins ? ghi + 1 : kBins - 1;
          }
        }
        __syncthreads();
      }
      const int band_top = sh.bc.band_top, band_bot = sh.bc.band_bot;
      // Above the band: exact fixed-point mass and kept mass. In the band: the keys' range, its
      // mass and count. The smallest z above / in the band give the thresholds za / zb (z's order
      // is the buckets' order, so z >= za is exactly "above the band").
      uint64_t afix = 0, kmin = ~0ull, kmax = 0, wband = 0, cband = 0;
      double akept = 0.0, amax = 0.0;
      float amin = INFINITY, bmin = INFINITY;
      // The warp's band ids with p > 0 (every id the select and the kept mass below need: an id
      // of the band (d.band) lies in the band's buckets, see za/zb), in id order, while they fit.
      unsigned short* const blist = sh.band[wid];
      int band_n = len <= 65536 ? 0 : -1;  // offsets fit 16 bits
      // The ids at or above the band, coarse_bucket(d.dval(x)) <= band_bot, are the x >= x0 (the
      // bucket is non-increasing in x): x0 found once by bisection over the floats' order, so the
      // pass below compares floats instead of computing every id's bucket. NaN (bucket 255)
      // passes exactly when every x does (band_bot 255), as the bucket test lets it. Monotone
      // (down to x = +-inf) needs a finite zmax and a finite positive 1 / T; any other row keeps
      // the bucket test.
      const bool monotone = isfinite(d.zmax) && d.inv_t > 0.0 && isfinite(d.inv_t);
      auto at_or_above = [&](float x) { return coarse_bucket(d.dval(x)) <= band_bot; };
      ZThreshold zt;
      if (monotone) zt = z_threshold(at_or_above);
      // The pass below also records its ids (every id with p > 0 after top-p: cand) in the scratch
      // when it passes exactly the candidates (monotone: the ids x >= x0 are those x >= zb, zb
      // being the smallest of them; only NaN, which passes when every x does, is not a candidate)
      // and their offsets fit 16 bits. The same in every CTA (slice, zmax, T).
      // A warp with more than cand_cap candidates (over a quarter of its range: a flat row) stops
      // recording, and the cluster's later passes scan (decided in the exchange below).
      const bool listing = lscratch != nullptr && monotone && slice <= 65536;
      const int64_t dseg = c.draw_seg();
      const int ccap = static_cast<int>(cand_cap(c.warp_len()));
      unsigned short* const cw = listing ? lscratch + (static_cast<int64_t>(ri) * kCtas + c.rank) * lstride +
                                               static_cast<int64_t>(wid) * ccap
                                         : nullptr;
      int cn = 0;  // this warp's recorded candidates; -1: more than ccap
      if (listing) {
        for (int k = tid; k <= sample_cluster::kMaxSegments; k += kThreads) sh.seg[k] = 0;
        __syncthreads();
      }
      {
        Slot& s = c.open();
        auto band_pass = [&](auto&& fn) {
          auto load = [&](int64_t v) { return z[v - beg]; };
          auto test = [&](float x) { return d.live(x) && (monotone ? zt.pass(x) : at_or_above(x)); };
          if (live_words) {  // the chunks with live ids only (test checks liveness again)
            sample_cluster::warp_batches_masked(wb, we, live_words + (wb - beg) / 32, queue, load, test, fn);
          } else {
            sample_cluster::warp_batches_pipelined(wb, we, queue, load, test, fn);
          }
        };
        band_pass(
            [&](int64_t v, bool ok) {
              bool rec = false;
              if (ok) {
                const float x = z[v - beg];
                const double dv = d.dval(x);
                const double p = exp(dv) / d.sum;  // = d.p1x(x)
                if (coarse_bucket(dv) < band_top) {
                  if (p > 0) {
                    afix += to_fixed(p);
                    akept += p;
                    amax = fmax(amax, p);
                  }
                  amin = fminf(amin, x);
                } else {
                  if (p > 0) {
                    const uint64_t k = pkey(p);
                    kmin = k < kmin ? k : kmin;
                    kmax = k > kmax ? k : kmax;
                    wband += to_fixed(p);
                    ++cband;
                    rec = true;
                  }
                  bmin = fminf(bmin, x);
                }
              }
              if (listing && cn >= 0) {  // warp-uniform
                // the batch's ids in the warp's list; their draw segments' counts (ids increase
                // with the lane: one atomic per run of lanes in the same segment)
                const unsigned okb = __ballot_sync(0xffffffffu, ok);
                if (cn + __popc(okb) > ccap) cn = -1;  // the list is abandoned (the last batch's ids are not counted)
              }
              if (listing && cn >= 0) {  // warp-uniform
                const unsigned okb = __ballot_sync(0xffffffffu, ok);
                if (ok) cw[cn + __popc(okb & ((1u << lane) - 1u))] = static_cast<unsigned short>(v - beg);
                const int sk = ok ? static_cast<int>((v - beg) / dseg) : -1;
                const int sprev = __shfl_up_sync(0xffffffffu, sk, 1);
                const bool start = ok && (lane == 0 || sk != sprev);
                const unsigned starts = __ballot_sync(0xffffffffu, start);
                if (start) {
                  const unsigned later = starts & ~((2u << lane) - 1u);  // run starts after this lane
                  const unsigned upto = later ? (1u << (__ffs(later) - 1)) - 1u : 0xffffffffu;
                  atomicAdd(&sh.seg[sk], static_cast<unsigned>(__popc(okb & upto & ~((1u << lane) - 1u))));
                }
                cn += __popc(okb);
              }
              const unsigned ball = __ballot_sync(0xffffffffu, rec);
              if (band_n >= 0) {  // warp-uniform
                const int total = band_n + __popc(ball);
                if (total > sample_cluster::kBandCap) {
                  band_n = -1;  // too many: the passes below scan the warp's range
                } else {
                  if (rec) blist[band_n + __popc(ball & ((1u << lane) - 1u))] = static_cast<unsigned short>(v - beg);
                  band_n = total;
                }
              }
            });
        auto sum_u = [](unsigned long long a, unsigned long long b) { return a + b; };
        auto min_u = [](unsigned long long a, unsigned long long b) { return b < a ? b : a; };
        auto max_u = [](unsigned long long a, unsigned long long b) { return a < b ? b : a; };
        auto sum_d = [](double a, double b) { return a + b; };
        auto max_d = [](double a, double b) { return fmax(a, b); };
        auto min_f = [](float a, float b) { return fminf(a, b); };
        afix = warp_fold<unsigned long long>(afix, sum_u);
        kmin = warp_fold<unsigned long long>(kmin, min_u);
        kmax = warp_fold<unsigned long long>(kmax, max_u);
        wband = warp_fold<unsigned long long>(wband, sum_u);
        cband = warp_fold<unsigned long long>(cband, sum_u);
        akept = warp_fold(akept, sum_d);
        amax = warp_fold(amax, max_d);
        amin = warp_fold(amin, min_f);
        bmin = warp_fold(bmin, min_f);
        auto& part = sh.warp[wid].part;
        if (lane == 0) sh.cand_n[wid] = cn;
        if (lane == 0) {
          part.u[0] = afix;
          part.u[1] = kmin;
          part.u[2] = kmax;
          part.u[3] = wband;
          part.u[4] = cband;
          part.f[0] = akept;
          part.f[1] = amax;
          part.x[0] = amin;
          part.x[1] = bmin;
        }
        __syncthreads();
        if (tid == 0 && listing) {  // segment counts -> starts (read after the exchanges below)
          unsigned a = 0;
          for (int k = 0; k <= sample_cluster::kMaxSegments; ++k) {
            const unsigned n = k < sample_cluster::kMaxSegments ? sh.seg[k] : 0u;
            sh.seg[k] = a;
            a += n;
          }
        }
        if (tid == 0) {
          for (int w = 1; w < kWarps; ++w) {
            const auto& o = sh.warp[w].part;
            afix += o.u[0];
            kmin = min_u(kmin, o.u[1]);
            kmax = max_u(kmax, o.u[2]);
            wband += o.u[3];
            cband += o.u[4];
            akept = akept + o.f[0];
            amax = fmax(amax, o.f[1]);
            amin = fminf(amin, o.x[0]);
            bmin = fminf(bmin, o.x[1]);
          }
          s.u[0] = afix;
          s.u[1] = kmin;
          s.u[2] = kmax;
          s.u[3] = wband;
          s.i[0] = static_cast<long long>(cband);
          s.f[0] = akept;
          s.f[1] = amax;
          s.x[0] = amin;
          s.x[1] = bmin;
          long long over = 0;  // a warp's candidates did not fit its list
          for (int w = 0; w < kWarps; ++w) over |= sh.cand_n[w] < 0 ? 1 : 0;
          s.i[1] = over;
        }
        c.publish();
        afix = 0, kmin = ~0ull, kmax = 0, wband = 0, cband = 0, akept = 0.0, amax = 0.0;
        amin = INFINITY, bmin = INFINITY;
        for (int q = 0; q < kCtas; ++q) {
          const Slot* p = c.peer(q);
          afix += p->u[0];
          kmin = min_u(kmin, p->u[1]);
          kmax = max_u(kmax, p->u[2]);
          wband += p->u[3];
          cband += static_cast<uint64_t>(p->i[0]);
          akept = akept + p->f[0];
          amax = fmax(amax, p->f[1]);
          amin = fminf(amin, p->x[0]);
          bmin = fminf(bmin, p->x[1]);
        }
        d.za = amin;
        d.zb = fminf(amin, bmin);
        bool fits = listing;  // every warp of every CTA holds its candidates
        for (int q = 0; q < kCtas; ++q) fits = fits && c.peer(q)->i[1] == 0;
        if (fits) {
          clist.off = lscratch + (static_cast<int64_t>(ri) * kCtas + c.rank) * lstride;
          clist.stride = ccap;
        }
      }
      // ---- the exact select over the band's p ----
      const uint64_t target = row.top_p > 0.0 ? __double2ull_ru(row.top_p * kFixedOne) : 0;
      bool found = cband > 0 && afix + wband >= target;
      RadixOut rr;
      if (found) {
        if (kmin == kmax) {  // one value of p in the band: nothing to select
          rr.found = true;
          rr.key = kmax;
          rr.above = afix;
          rr.count = static_cast<uint32_t>(cband);
        } else {
          const int bits = 64 - __clzll(kmin ^ kmax);
          const uint64_t prefix = bits < 64 ? (kmax >> bits) << bits : 0;
          auto elem = [&](int64_t v, uint64_t& key, uint64_t& weight) {
            const double p = d.p1x(z[v - beg]);
            if (!(p > 0)) return false;
            key = pkey(p);
            weight = to_fixed(p);
            return true;
          };
          rr = sample_cluster::cluster_radix_select<false>(
              c, bits, prefix, afix, target, sample_cluster::WarpList{blist, band_n},
              [&](int64_t v) { return d.band(z[v - beg]); }, elem);
        }
        found = rr.found;
      }
      if (found) {
        d.pstar = __longlong_as_double(static_cast<long long>(rr.key));
        d.tie_last = LLONG_MAX;
        // ties at pstar are kept in id order until the cumulative mass reaches top_p
        const uint64_t f = to_fixed(d.pstar);
        uint64_t m = rr.count;
        if (f > 0) {
          const uint64_t need = target > rr.above ? target - rr.above : 0;
          m = (need + f - 1) / f;
          m = m < 1 ? 1 : (m > rr.count ? rr.count : m);
        }
        if (m < rr.count) {
          // the m-th tie in id order: over the band's lists when every warp has one (every tie is
          // a band id with p > 0, which the lists hold), else by a draw of weight 1 per tie
          const double pstar = d.pstar;
          bool listed = false;
          const int64_t t = sample_cluster::cluster_nth_listed(
              c, sample_cluster::WarpList{blist, band_n}, static_cast<long long>(m), [&](int64_t v) {
                const float x = z[v - beg];
                return d.band(x) && d.p1x(x) == pstar;
              },
              listed);
          if (listed) {
            if (t >= 0) d.tie_last = t;
          } else {
            const DrawOut o = sample_cluster::cluster_draw(
                c, [&](int64_t v) { return d.band(z[v - beg]); },
                [&](int64_t v) { return d.p1x(z[v - beg]) == pstar ? 1.0 : 0.0; }, static_cast<double>(m) - 0.5,
                false);
            if (o.token >= 0) d.tie_last = o.token;
          }
        }
      }  // else the whole mass is below top_p: every p > 0 stays (pstar 0), renormalised; nothing
         // lies below the band then (its lower margin would have reached top_p)
      // kept mass: above the band (summed above) + the band's kept ids
      {
        Slot& s = c.open();
        double kb = 0.0, bmax = 0.0;
        sample_cluster::warp_cands(sample_cluster::WarpList{blist, band_n}, beg, wb, we, queue,
                                   [&](int64_t v) { return d.band(z[v - beg]); }, [&](int64_t v, bool ok) {
                                       if (!ok) return;
                                       const double p = d.p1x(z[v - beg]);
                                       if (p > 0 && d.in_top_p(p, v)) {
                                         kb += p;
                                         bmax = fmax(bmax, p);
                                       }
                                     });
        kb = block_sum_f64(kb, sh.red);
        bmax = block_max_f64(bmax, sh.red);
        if (tid == 0) {
          s.f[0] = kb;
          s.f[1] = bmax;
        }
        c.publish();
        double kept_band = 0.0;
        for (int q = 0; q < kCtas; ++q) {
          kept_band = kept_band + c.peer(q)->f[0];
          amax = fmax(amax, c.peer(q)->f[1]);
        }
        d.kept_p = akept + kept_band;
        p1max = amax;
      }
    }
    // ---- min-p ----
    if (row.min_p > 0.0) {
      const double pmax = top_p ? p1max / d.kept_p : p1max;  // the largest p after top-p
      const double cut = row.min_p * pmax;
      Slot& s = c.open();
      double kept = 0.0;
      if (clist.off) {  // the same batches over the recorded candidates
        sample_cluster::warp_listed(c, clist, [&](unsigned o) { return z[o]; }, [&](int64_t v, float x, bool ok) {
          if (!ok || !d.cand(x)) return;
          const double p = d.p2x(x, v);
          kept += p < cut ? 0.0 : p;
        });
      } else {
        sample_cluster::warp_batches(wb, we, queue, [&](int64_t v) { return d.cand(z[v - beg]); },
                                     [&](int64_t v, bool ok) {
                                       if (!ok) return;
                                       const double p = d.p2x(z[v - beg], v);
                                       kept += p < cut ? 0.0 : p;
                                     });
      }
      kept = block_sum_f64(kept, sh.red);
      if (tid == 0) s.f[0] = kept;
      c.publish();
      double km = 0.0;
      for (int q = 0; q < kCtas; ++q) km = km + c.peer(q)->f[0];
      d.kept_m = km;
      d.cut = cut;
      d.min_p = true;
    }
    // ---- accept / draw ----
    auto cand = [&](int64_t v) { return d.cand(z[v - beg]); };
    auto prob = [&](int64_t v) { return d.p(v); };
    auto zat = [&](unsigned o) { return z[o]; };
    auto candx = [&](float x) { return d.cand(x); };
    // over the recorded candidates when the band's pass recorded them (the same in every CTA)
    auto draw = [&](auto mass, auto massx, double u, bool scale) {
      return clist.off ? sample_cluster::cluster_draw_listed(c, clist, zat, candx, massx, u, scale)
                       : sample_cluster::cluster_draw(c, cand, mass, u, scale);
    };
    auto draw_p = [&](double u) -> int64_t {
      const DrawOut o = draw(prob, [&](int64_t v, float x) { return d.px(x, v); }, u, false);
      return o.token >= 0 ? o.token : (o.last_positive >= 0 ? o.last_positive : argmax);
    };
    if (row.draft >= 0) {
      const float* q = row.q_row >= 0 && in.q ? in.q + static_cast<int64_t>(row.q_row) * V : nullptr;
      const bool in_vocab = row.draft < V;
      double px = 0.0;
      if (in_vocab) {  // z of the draft from the CTA that holds it (written before several barriers)
        const int owner = static_cast<int>(row.draft / slice);
        px = d.px(zpeer(owner)[row.draft - static_cast<int64_t>(owner) * slice], row.draft);
      }
      const double qx = q ? (in_vocab ? static_cast<double>(q[row.draft]) : 0.0) : 1.0;
      accepted = px > 0 && rng_uniform(row.seed, row.position, RngStream::kAccept) * qx < px ? 1 : 0;
      if (accepted) {
        token = row.draft;
      } else {
        const double u = rng_uniform(row.seed, row.position, RngStream::kResidual);
        const int32_t draft = row.draft;
        auto resid = [&](int64_t v) {
          const double qv = q ? static_cast<double>(q[v]) : (v == draft ? 1.0 : 0.0);
          const double r = d.p(v) - qv;
          return r > 0 ? r : 0.0;
        };
        auto residx = [&](int64_t v, float x) {
          const double qv = q ? static_cast<double>(q[v]) : (v == draft ? 1.0 : 0.0);
          const double r = d.px(x, v) - qv;
          return r > 0 ? r : 0.0;
        };
        const DrawOut o = draw(resid, residx, u, true);
        if (o.total > 1e-12) {
          token = o.token >= 0 ? o.token : (o.last_positive >= 0 ? o.last_positive : argmax);
        } else {
          token = draw_p(u);
        }
      }
    } else {
      token = draw_p(rng_uniform(row.seed, row.position, RngStream::kSample));
    }
  }

  // A score row reports the scored token (it is greedy and unmasked as the engine builds it, so
  // the draw above was the argmax's few instructions).
  if (row.score >= 0) {
    token = row.score;
    accepted = 0;
  }

  // ---- raw log-probabilities (unprocessed logits, the noise token left out) ----
  double lse = 0.0;
  int nt = 0;
  long long rank = 0;  // a score row's rank (SampleRowResult::token_rank)
  if (row.top_logprobs >= 0) {
    // z is the raw slice unless a mask or a penalty changed it (the noise token is left out anyway)
    const bool raw_z = !mask && !penalties;
    auto raw = [&](int64_t i) { return raw_z ? z[i] : lg[beg + i]; };
    const double mx = static_cast<double>(mxf);
    Slot& s = c.open();
    double sum = 0.0;
    // A score row also counts the ids above the scored token's raw logit (NaN compares false).
    const bool scored = row.score >= 0 && row.score < V && row.score != in.noise && !is_nan(lg[row.score]);
    const float sx = scored ? lg[row.score] : 0.0f;
    long long above = 0;
    for (int64_t i = tid; i < len; i += kThreads)
      if (beg + i != in.noise) {
        const float x = raw(i);
        sum += exp(static_cast<double>(x) - mx);
        above += scored && x > sx ? 1 : 0;
      }
    sum = block_sum_f64(sum, sh.red);
    if (scored) above = block_sum_i64(above, sh.red);  // `scored` is the row's: every thread or none
    nt = row.top_logprobs < kMaxTopLogprobs ? row.top_logprobs : kMaxTopLogprobs;
    const int64_t m = V - (in.noise >= 0 && in.noise < V ? 1 : 0);
    if (nt > m) nt = static_cast<int>(m);
    if (tid == 0) {
      s.f[0] = sum;
      s.i[0] = above;
      for (int i = 0; i < kMaxTopLogprobs; ++i) s.top[i] = 0;
    }
    // this slice's top nt by (value desc, id asc): repeated block argmax below the previous one
    unsigned long long prev = ~0ull;
    for (int k = 0; k < nt; ++k) {
      unsigned long long b = 0;
      for (int64_t i = tid; i < len; i += kThreads) {
        const float x = raw(i);
        if (beg + i == in.noise || is_nan(x)) continue;
        const unsigned long long key = select_key(x, static_cast<uint32_t>(beg + i));
        if (key < prev && key > b) b = key;
      }
      b = block_argmax_key(b, sh.red);
      if (b == 0) break;  // only NaN left
      if (tid == 0) s.top[k] = b;
      prev = b;
    }
    c.publish();
    if (c.rank == 0 && tid == 0) {
      double total = 0.0;
      for (int q = 0; q < kCtas; ++q) total = total + c.peer(q)->f[0];
      lse = mx + log(total);
      if (scored) {
        for (int q = 0; q < kCtas; ++q) rank += c.peer(q)->i[0];
        rank = rank + 1 < INT_MAX ? rank + 1 : INT_MAX;
      }
    }
  }

  if (c.rank == 0 && tid == 0) {
    SampleRowResult* o = out + ri;
    o->accepted = accepted;
    o->token = static_cast<int32_t>(token);
    o->token_logprob = 0.0f;
    o->token_rank = static_cast<int32_t>(rank);
    o->num_top = 0;
    for (int i = 0; i < kMaxTopLogprobs; ++i) {
      o->top_ids[i] = 0;
      o->top_logprobs[i] = 0.0f;
    }
    if (row.top_logprobs >= 0) {
      // merge the CTAs' lists (each sorted, 0-padded; keys are distinct: they hold the id)
      int head[kCtas] = {};
      int got = 0;
      for (int k = 0; k < nt; ++k) {
        unsigned long long b = 0;
        int from = -1;
#pragma unroll
        for (int q = 0; q < kCtas; ++q) {  // unrolled: head stays in registers
          if (head[q] >= kMaxTopLogprobs) continue;
          const unsigned long long key = c.peer(q)->top[head[q]];
          if (key > b) {
            b = key;
            from = q;
          }
        }
        if (b == 0) break;  // only NaN left
#pragma unroll
        for (int q = 0; q < kCtas; ++q) head[q] += q == from ? 1 : 0;
        const uint32_t id = select_key_index(b);
        o->top_ids[k] = static_cast<int32_t>(id);
        o->top_logprobs[k] = static_cast<float>(static_cast<double>(lg[id]) - lse);
        ++got;
      }
      o->num_top = got;
      o->token_logprob = token >= 0 && token < V && token != in.noise
                             ? static_cast<float>(static_cast<double>(lg[token]) - lse)
                             : kNegInf;
    }
  }
  c.publish();  // no CTA leaves while another may read its shared memory
}

// Ids per CTA: a multiple of 4 (16-byte aligned slices of a vocabulary that is a multiple of 4).
int64_t slice_of(int64_t vocab) { return ((vocab + kCtas - 1) / kCtas + 3) / 4 * 4; }

// ZSlice's nsh for a launch of `rows` rows: few rows keep whole slices of up to kSmemSliceFloats in
// shared memory (3 CTAs per SM: they run in one wave anyway); more rows keep the most chunks that
// allow 4 CTAs per SM (kQuadSliceFloats), the rest in the global scratch.
int nsh_of(int64_t vocab, int rows) {
  const int64_t slice = slice_of(vocab);
  if (rows <= kWholeSliceRows && zslice_shared_floats(slice, kGroupChunks) <= kSmemSliceFloats) return kGroupChunks;
  for (int k = kGroupChunks; k > 0; --k)
    if (zslice_shared_floats(slice, k) <= kQuadSliceFloats) return k;
  return 0;
}

// Floats of a CTA's region of the scratch: the global part of the fewest chunks any launch keeps
// shared (nsh only falls as rows grow), a multiple of 64 (256-byte aligned regions).
int64_t zstride_of(int64_t vocab) {
  const int64_t g = zslice_global_floats(slice_of(vocab), nsh_of(vocab, INT_MAX));
  return (g + 63) / 64 * 64;
}

// Entries (16 bits) of a CTA's region of the list scratch: its candidate list and live mask, a
// multiple of 128 (256-byte aligned regions).
int64_t lstride_of(int64_t vocab) {
  return cand_list_entries(slice_of(vocab)) + live_mask_entries(slice_of(vocab));
}

// Dynamic shared memory of a launch; the kernel's limit is raised once to the largest any launch
// asks (kSmemSliceFloats floats: the attribute only bounds, occupancy follows each launch's size).
size_t dyn_bytes(int64_t vocab, int rows) {
  return static_cast<size_t>(zslice_shared_floats(slice_of(vocab), nsh_of(vocab, rows))) * sizeof(float);
}
void prepare_kernel(const void* k) {
  static_assert(kQuadSliceFloats <= kSmemSliceFloats, "the limit covers every launch");
  allow_dynamic_smem(k, static_cast<size_t>(kSmemSliceFloats) * sizeof(float));
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

}  // namespace

// The scratch of a launch of n rows: z's global parts [n, kCtas, zstride] floats, then the candidate
// lists [n, kCtas, lstride] 16-bit offsets.
size_t sample_rows_scratch_bytes(int max_rows, int64_t vocab) {
  if (vocab <= 0 || max_rows <= 0) return 0;
  return static_cast<size_t>(max_rows) * kCtas *
         (static_cast<size_t>(zstride_of(vocab)) * sizeof(float) +
          static_cast<size_t>(lstride_of(vocab)) * sizeof(unsigned short));
}

void sample_rows_device(const SampleRowsArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  const int64_t V = a.in.vocab;
  TANDEM_CHECK_MSG(V > 0 && V < (int64_t{1} << 30), "sample_rows: vocabulary out of range");
  const int64_t slice = slice_of(V);
  const int nsh = nsh_of(V, a.n);
  const int64_t zstride = zstride_of(V);
  TANDEM_CHECK_MSG(nsh == kGroupChunks || a.scratch, "sample_rows: the scratch is missing (sample_rows_scratch_bytes)");
  TANDEM_CHECK(zslice_global_floats(slice, nsh) <= zstride);
  float* const zs = static_cast<float*>(a.scratch);
  // without a scratch (allowed when the slices fit in shared memory) the passes scan their slices
  unsigned short* const ls =
      zs ? reinterpret_cast<unsigned short*>(zs + static_cast<int64_t>(a.n) * kCtas * zstride) : nullptr;
  const void* k = reinterpret_cast<const void*>(sample_rows_kernel);
  prepare_kernel(k);
  sample_rows_kernel<<<static_cast<unsigned>(a.n) * kCtas, kThreads, dyn_bytes(V, a.n), stream>>>(
      a.in, a.rows, zs, zstride, ls, lstride_of(V), slice, nsh, a.out);
  TANDEM_CUDA_LAUNCH_CHECK();
}

int sample_rows_active_clusters(int64_t vocab, int rows) {
  if (vocab <= 0 || vocab >= (int64_t{1} << 30) || rows <= 0) return -1;
  const void* k = reinterpret_cast<const void*>(sample_rows_kernel);
  prepare_kernel(k);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kCtas * 64);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = dyn_bytes(vocab, rows);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return clusters;
}

SmemBound sample_rows_smem_bound() {
  return {"sample_rows_kernel", kSmemSliceFloats * static_cast<int64_t>(sizeof(float)),
          "a whole slice of 20480 ids (up to 32 rows of a vocabulary up to 163840)",
          "more rows or a larger vocabulary keep part of each slice in the global scratch (at most 44 KB shared)",
          0, {}};
}

}  // namespace tandem::kernels::cuda
