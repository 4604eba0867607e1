// Cluster-level building blocks of the sampling op (sample_rows.cu): a row is split over the kCtas
// CTAs of one thread-block cluster, each holding a contiguous slice of the row's ids, and the CTAs
// combine partial results through distributed shared memory in "exchanges" (write the own slot,
// cluster barrier, read every CTA's slot). Partials are combined in rank order and warp/block
// reductions run fixed trees, so every result is the same bits on every run.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/sampling_device.cuh"
#include "kernels/sampling.h"

namespace tandem::kernels::cuda::sample_cluster {

namespace cg = cooperative_groups;

constexpr int kCtas = 8;     // CTAs per row: one cluster (8 is the portable cluster size)
// 4 warps: 3 CTAs per SM (one wave of 48 rows on 132 SMs) at 128 registers (sample_rows.cu); with
// 6 warps, 3 CTAs put 5 warps on some scheduler, whose 16K registers then allow only 96 each
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kQueue = 64;   // per-warp queue of candidate offsets (warp_batches)
constexpr int kBins = 256;   // radix digits (8 bits) and coarse buckets
constexpr int kMaxSegments = 64;  // the draw's segments per CTA
// A warp's list of top-p band ids (WarpList): a row of distinct logits has a few hundred band ids
// per CTA; a warp with more scans its range instead. Sized to keep 3 CTAs per SM (sample_rows.cu).
constexpr int kBandCap = 448;

// One CTA's side of an exchange. `mass`/`count` hold a histogram (radix digits, coarse buckets);
// the softmax pass keeps its coarse masses as three 16-bit limbs in `limb` and `count`, summed with
// native 32-bit shared atomics (a 64-bit shared atomicAdd is a compare-and-swap loop, and the lanes
// of a warp often hit the same bucket); the draw keeps its segment sums in `dv` (read only by its
// own CTA). kmin/kmax: each warp's smallest / largest key of the radix select's current bucket.
// 16-byte aligned: the select reads two buckets' masses with one load.
struct alignas(16) Slot {
  union {
    unsigned long long mass[kBins];
    double dv[kBins];
    unsigned limb[2][kBins];
  };
  unsigned count[kBins];
  double f[4];
  unsigned long long u[4];
  long long i[4];
  unsigned long long kmin[kWarps], kmax[kWarps], klor[kWarps], kland[kWarps];
  float x[2];
  unsigned long long top[kMaxTopLogprobs];
};

// A warp's private shared memory: its candidate queue, or its partial results before a CTA
// combines them.
union WarpArea {
  unsigned queue[kQueue];
  struct {
    unsigned long long u[8];
    double f[8];
    float x[8];
  } part;
};

// Results one thread computes and the whole CTA reads after a __syncthreads().
struct Broadcast {
  unsigned long long sel_above;
  long long id;
  unsigned sel_count;
  int sel;
  int band_top, band_bot;
};

struct Shared {
  Slot slot[2];
  WarpArea warp[kWarps];
  unsigned short band[kWarps][kBandCap];  // each warp's WarpList of band ids (offsets from beg)
  BlockReduceScratch red;
  Broadcast bc;
  long long list_n[kWarps];  // cluster_nth_listed: each warp's listed ids that pass, -1: no list
  // CandList: each warp's count of recorded candidates, and the draw segments' candidate counts
  // (filled by the band pass), then their starts in the CTA's candidates (seg[k] .. seg[k + 1])
  int cand_n[kWarps];
  unsigned seg[kMaxSegments + 1];
};

// A CTA's view of its row. Exchange protocol: open() returns this exchange's slot (the two slots
// alternate), the CTA writes it, publish() is the cluster barrier (release/acquire: every CTA's
// writes before it are visible to every CTA after it), then peer(q) reads CTA q's slot. A slot is
// written again two exchanges later, after the barrier of the exchange in between, which every CTA
// reaches only after its reads of this one: no CTA overwrites a slot another may still read. A
// CTA may also read the previous exchange's slots (peer_prev) until it opens the next exchange's
// successor, for the same reason. Every CTA runs the same exchanges (their number and order depend
// only on values all CTAs share), and the kernel ends with a barrier so no CTA exits while another
// may read its shared memory.
struct Ctx {
  Shared& sh;
  cg::cluster_group cl;
  int rank;
  int64_t beg, end;  // this CTA's ids [beg, end) (empty for CTAs past a small vocabulary)
  int ex = 0;

  __device__ Slot& open() {
    ++ex;
    return sh.slot[ex & 1];
  }
  __device__ void publish() { cl.sync(); }
  __device__ Slot* peer(int q) { return cl.map_shared_rank(&sh.slot[ex & 1], q); }
  __device__ Slot* peer_prev(int q) { return cl.map_shared_rank(&sh.slot[(ex - 1) & 1], q); }

  // Ids of each warp's contiguous part of the slice (a multiple of 32).
  __device__ int64_t warp_len() const {
    const int64_t len = end - beg;
    return ((len + kWarps - 1) / kWarps + 31) / 32 * 32;
  }
  // This warp's contiguous part of the slice (a multiple of 32 ids long).
  __device__ void warp_range(int64_t& b, int64_t& e) const {
    const int64_t wl = warp_len();
    const int64_t wb = beg + static_cast<int64_t>(threadIdx.x >> 5) * wl;
    b = wb < end ? wb : end;
    e = b + wl < end ? b + wl : end;
  }
  // The draw's segments (cluster_draw): consecutive ranges of draw_seg() ids (a multiple of 32, so
  // a group of 32 ids of a warp's range lies in one segment), at most kMaxSegments of them.
  __device__ int64_t draw_seg() const {
    const int64_t len = end - beg;
    const int64_t seg = ((len + kMaxSegments - 1) / kMaxSegments + 31) / 32 * 32;
    return seg < 32 ? 32 : seg;
  }
};

// ---- warp-level compaction ----
// Calls fn(v, ok) with the ids v in [b, e) for which pred(v) holds, 32 at a time, in increasing
// id order: lane l gets the l-th id of the batch (ok false on the lanes past the last batch's end).
// Sparse candidates (the kept set of a top-p row) thus cost one exp per 32 of them, not one per
// 32 ids. Every lane of the warp calls it (fn may use warp shuffles); pred(v) is called only for
// v < e. The batches depend only on pred, so a second pass sees the same batches.
// The predicate of kAhead groups of 32 ids is evaluated before any of them is compacted: pred
// loads z, part of which lives in the global scratch (L2), so the loads of kAhead groups are in
// flight together instead of one round trip per group of 32 ids (the scans over a whole slice were
// latency-bound at 4 warps per scheduler; 8 groups of 32 span 8 chunks of ZSlice, so each round
// trip to the L2 serves 256 ids). pred must be pure (it is evaluated ahead of fn).
constexpr int kAhead = 8;

// The compaction's queue (q: a warp's shared offsets from b; n queued, < 32 between calls): lane
// l's id v joins when ok, in lane order, and each full batch of 32 goes to fn. Every lane calls it.
template <typename Fn>
__device__ __forceinline__ void queue_group(int64_t b, int64_t v, bool ok, unsigned* q, int& n, Fn& fn) {
  const int lane = threadIdx.x & 31;
  const unsigned ball = __ballot_sync(0xffffffffu, ok);
  if (ok) q[n + __popc(ball & ((1u << lane) - 1u))] = static_cast<unsigned>(v - b);
  n += __popc(ball);
  __syncwarp();
  if (n >= 32) {
    const int64_t w = b + q[lane];
    if (lane < n - 32) q[lane] = q[lane + 32];  // lane l alone reads q[l] and writes it
    __syncwarp();
    n -= 32;
    fn(w, true);
  }
}
// The last, partial batch (ok false past its end), then the queue is free for the next use.
template <typename Fn>
__device__ __forceinline__ void flush_queue(int64_t b, const unsigned* q, int n, Fn& fn) {
  const int lane = threadIdx.x & 31;
  if (n > 0) {
    const bool ok = lane < n;
    fn(ok ? b + q[lane] : b, ok);
  }
  __syncwarp();
}
template <typename Pred, typename Fn>
__device__ __forceinline__ void warp_batches(int64_t b, int64_t e, unsigned* q, Pred pred, Fn fn) {
  const int lane = threadIdx.x & 31;
  int n = 0;  // queued offsets (< 32 between rounds)
  for (int64_t g0 = b; g0 < e; g0 += 32 * kAhead) {
    unsigned oks = 0;  // bit u: id g0 + 32 u + lane passes
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t v = g0 + 32 * u + lane;
      if (v < e && pred(v)) oks |= 1u << u;
    }
#pragma unroll 1
    for (int u = 0; u < kAhead && g0 + 32 * u < e; ++u) {  // warp-uniform bounds
      const int64_t v = g0 + 32 * u + lane;
      const bool ok = (oks >> u) & 1u;
      queue_group(b, v, ok, q, n, fn);
    }
  }
  flush_queue(b, q, n, fn);
}

// warp_batches with pred(v) = test(load(v)), pipelined: the next kAhead groups' values are loaded
// before this block's groups are compacted and handed to fn, so their round trip (part of z is in
// the L2) overlaps fn's work (the exps of the band's pass) instead of following it. The same
// batches as warp_batches. load must be pure.
template <typename Load, typename Test, typename Fn>
__device__ __forceinline__ void warp_batches_pipelined(int64_t b, int64_t e, unsigned* q, Load load, Test test, Fn fn) {
  const int lane = threadIdx.x & 31;
  using X = decltype(load(b));
  X xs[kAhead];
#pragma unroll
  for (int u = 0; u < kAhead; ++u) {
    const int64_t v = b + 32 * u + lane;
    xs[u] = v < e ? load(v) : X{};
  }
  int n = 0;  // queued offsets (< 32 between rounds)
  for (int64_t g0 = b; g0 < e; g0 += 32 * kAhead) {
    unsigned oks = 0;  // bit u: id g0 + 32 u + lane passes
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t v = g0 + 32 * u + lane;
      if (v < e && test(xs[u])) oks |= 1u << u;
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {  // the next block's values, in flight during this block's fn
      const int64_t v = g0 + 32 * (kAhead + u) + lane;
      if (v < e) xs[u] = load(v);
    }
#pragma unroll 1
    for (int u = 0; u < kAhead && g0 + 32 * u < e; ++u) {  // warp-uniform bounds
      const int64_t v = g0 + 32 * u + lane;
      const bool ok = (oks >> u) & 1u;
      queue_group(b, v, ok, q, n, fn);
    }
  }
  flush_queue(b, q, n, fn);
}

// warp_batches over [b, e) (b - the CTA's first id a multiple of 32) where pred(v) = bit v - b of
// `words` (word k: ids b + 32 k .. b + 32 k + 31) && test(load(v)): only the words' nonzero chunks
// are loaded and tested, 32 words per step. The same batches as warp_batches with that pred (a
// chunk without bits has no candidate). For a top-k row's few live ids.
template <typename Load, typename Test, typename Fn>
__device__ __forceinline__ void warp_batches_masked(int64_t b, int64_t e, const unsigned* words, unsigned* q, Load load,
                                                    Test test, Fn fn) {
  const int lane = threadIdx.x & 31;
  const int nchunks = static_cast<int>((e - b + 31) / 32);
  int n = 0;  // queued offsets (< 32 between chunks)
  for (int k0 = 0; k0 < nchunks; k0 += 32) {
    const unsigned word = k0 + lane < nchunks ? words[k0 + lane] : 0u;
    unsigned nz = __ballot_sync(0xffffffffu, word != 0);
    while (nz) {  // warp-uniform
      const int cl = __ffs(nz) - 1;
      nz &= nz - 1;
      const unsigned bits = __shfl_sync(0xffffffffu, word, cl);
      const int64_t v = b + 32 * static_cast<int64_t>(k0 + cl) + lane;
      const bool ok = ((bits >> lane) & 1u) && v < e && test(load(v));
      queue_group(b, v, ok, q, n, fn);
    }
  }
  flush_queue(b, q, n, fn);
}

// A warp's candidates recorded by an earlier pass: offsets from the CTA's first id, in increasing
// order, or n < 0 when they did not fit (the warp then scans its range with the predicate).
struct WarpList {
  const unsigned short* off = nullptr;
  int n = -1;  // the same in every lane
};

// warp_batches over a recorded list: calls fn(v, ok) for the listed ids, 32 at a time in list order,
// ok = pred(v) (false on the lanes past the end, whose v is not an id to read). Without a list,
// warp_batches over [b, e). The list must hold every id of [b, e) with pred true that fn needs.
template <typename Pred, typename Fn>
__device__ __forceinline__ void warp_cands(const WarpList& l, int64_t beg, int64_t b, int64_t e, unsigned* q,
                                           Pred pred, Fn fn) {
  if (l.n < 0) {
    warp_batches(b, e, q, pred, fn);
    return;
  }
  __syncwarp();  // the list's writes by every lane are visible
  const int lane = threadIdx.x & 31;
  for (int i0 = 0; i0 < l.n; i0 += 32) {
    const int i = i0 + lane;
    const bool in = i < l.n;
    const int64_t v = in ? beg + l.off[i] : b;
    fn(v, in && pred(v));
  }
}

// The lanes whose digit (0..255) equals this lane's, for lanes with digit >= 0 (8 ballots: cheaper
// than match_any on the dense first pass of a top-k select).
__device__ __forceinline__ unsigned same_digit_lanes(int dg) {
  unsigned peers = __ballot_sync(0xffffffffu, dg >= 0);
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const bool bit = (dg >> b) & 1;
    const unsigned set = __ballot_sync(0xffffffffu, bit);
    peers &= bit ? set : ~set;
  }
  return peers;
}

// ---- radix select over the cluster ----
struct RadixOut {
  bool found = false;
  uint64_t key = 0;    // the selected key
  uint64_t above = 0;  // weight of the candidates with a larger key (the initial `above` included)
  uint32_t count = 0;  // candidates with exactly this key
};

// The largest candidate key K with above + weight(keys >= K) >= target, over the keys' low `bits`
// bits (every candidate's higher bits equal `prefix`'s), 8-bit digits from the top. `above` is the
// weight of the elements that rank above every candidate. elem(v, key, weight) says whether id v
// is a candidate and gives its key (unsigned order = selection order) and weight.
// kDense: every id of the slice is offered, weight 1 (top-k: counts), warps aggregate equal digits
// (same_digit_lanes); cand(v) then loads id v's value x (one iteration ahead: part of a slice may
// be in global memory) and elem(x, key, weight) takes it. Else the candidates are the ids with
// cand(v) (warp_batches), weighted.
// Each pass also finds the smallest and largest key of the bucket the previous pass selected (the
// candidates with the current prefix): when they are equal, that bucket holds one key, which is
// the answer (its `above` and count are the previous pass's), so a bucket of ties (logits of a
// few levels: hundreds of ids per key) ends the select one pass after it is selected instead of
// after every digit. Likewise, when every key with the current prefix has the same bits below the
// pass's digit (their OR equals their AND, exchanged with the range), the bucket the pass selects
// holds one key and the select ends there (bf16-valued logits: top-k's select takes 2 passes).
// One exchange per pass. Not found when the weight never reaches the target.
// list: the warp's candidates when not kDense (WarpList; n < 0: scan with cand).
template <bool kDense, typename Cand, typename Elem>
__device__ RadixOut cluster_radix_select(Ctx& c, int bits, uint64_t prefix, uint64_t above, uint64_t target,
                                         const WarpList& list, Cand cand, Elem elem) {
  static_assert(kBins == 2 * kThreads, "thread t combines buckets 2t and 2t + 1");
  static_assert(kCtas * kWarps == 32, "one lane per (CTA, warp) for the bucket's key range");
  RadixOut r;
  uint32_t count = 0;
  bool selected = false;  // a previous pass selected the current prefix's bucket
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  for (int hi = bits; hi > 0;) {
    const int lo = hi > 8 ? hi - 8 : 0;
    const uint64_t dmask = (uint64_t{1} << (hi - lo)) - 1;
    auto digit_of = [&](uint64_t key) {
      return (hi >= 64 || (key >> hi) == (prefix >> hi)) ? static_cast<int>((key >> lo) & dmask) : -1;
    };
    Slot& s = c.open();
    for (int i = tid; i < kBins; i += kThreads) {
      if constexpr (!kDense) s.mass[i] = 0;
      s.count[i] = 0;
    }
    __syncthreads();
    unsigned long long kmn = ~0ull, kmx = 0;  // keys with the current prefix, this thread's
    const uint64_t lowmask = (uint64_t{1} << lo) - 1;  // the bits below this pass's digit (lo < 64)
    unsigned long long klw = 0, kla = lowmask;         // their OR and AND over the keys with the prefix
    if constexpr (kDense) {
      // kDenseAhead ids per thread per step, the next step's loaded before this step's ids are
      // counted (part of the slice is in the L2: a round trip per kDenseAhead * kThreads ids, in
      // flight during the counting). Counts, minima and maxima: the order does not matter.
      constexpr int kDenseAhead = 4;
      constexpr int64_t kStep = kDenseAhead * kThreads;
      using X = decltype(cand(c.beg));
      const int64_t len = c.end - c.beg;
      X xn[kDenseAhead];
#pragma unroll
      for (int u = 0; u < kDenseAhead; ++u) {
        const int64_t i = tid + static_cast<int64_t>(u) * kThreads;
        xn[u] = i < len ? cand(c.beg + i) : X{};
      }
      for (int64_t i0 = 0; i0 < len; i0 += kStep) {  // the same trip count in every thread
        X x[kDenseAhead];
#pragma unroll
        for (int u = 0; u < kDenseAhead; ++u) {
          x[u] = xn[u];
          const int64_t i = i0 + kStep + static_cast<int64_t>(u) * kThreads + tid;
          if (i < len) xn[u] = cand(c.beg + i);
        }
#pragma unroll
        for (int u = 0; u < kDenseAhead; ++u) {
          const int64_t i = i0 + static_cast<int64_t>(u) * kThreads + tid;
          uint64_t key = 0, w = 0;
          int dg = -1;
          if (i < len && elem(x[u], key, w)) dg = digit_of(key);
          if (__ballot_sync(0xffffffffu, dg >= 0) == 0) continue;  // the later passes' common case
          if (dg >= 0) {
            kmn = key < kmn ? key : kmn;
            kmx = key > kmx ? key : kmx;
            klw |= key & lowmask;
            kla &= key;
          }
          const unsigned peers = same_digit_lanes(dg);
          // weight 1: a bucket's mass is its count (the combine reads it from there), so no 64-bit
          // shared atomic (a compare-and-swap loop) per digit and iteration
          if (dg >= 0 && lane == __ffs(peers) - 1) atomicAdd(&s.count[dg], static_cast<unsigned>(__popc(peers)));
        }
      }
    } else {
      int64_t wb, we;
      c.warp_range(wb, we);
      warp_cands(list, c.beg, wb, we, c.sh.warp[wid].queue, cand, [&](int64_t v, bool ok) {
        uint64_t key = 0, w = 0;
        int dg = -1;
        if (ok && elem(v, key, w)) dg = digit_of(key);
        if (dg >= 0) {
          kmn = key < kmn ? key : kmn;
          kmx = key > kmx ? key : kmx;
          klw |= key & lowmask;
          kla &= key;
        }
        // one atomic per distinct digit of the batch (a band's keys crowd into few digits)
        unsigned todo = __ballot_sync(0xffffffffu, dg >= 0);
        while (todo) {
          const int leader = __ffs(todo) - 1;
          const int d = __shfl_sync(0xffffffffu, dg, leader);
          const bool in = dg == d;
          const unsigned group = __ballot_sync(0xffffffffu, in);
          unsigned long long sw = in ? w : 0ull;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sw += __shfl_xor_sync(0xffffffffu, sw, o);
          if (lane == leader) {
            atomicAdd(&s.count[d], static_cast<unsigned>(__popc(group)));
            atomicAdd(&s.mass[d], sw);
          }
          todo &= ~group;
        }
      });
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long a = __shfl_xor_sync(0xffffffffu, kmn, o), b = __shfl_xor_sync(0xffffffffu, kmx, o);
      kmn = a < kmn ? a : kmn;
      kmx = b > kmx ? b : kmx;
      klw |= __shfl_xor_sync(0xffffffffu, klw, o);
      kla &= __shfl_xor_sync(0xffffffffu, kla, o);
    }
    if (lane == 0) {
      s.kmin[wid] = kmn;
      s.kmax[wid] = kmx;
      s.klor[wid] = klw;
      s.kland[wid] = kla;
    }
    c.publish();
    // Every CTA's bucket range (each warp reads it: one load per lane, no broadcast needed).
    kmn = c.peer(lane / kWarps)->kmin[lane % kWarps];
    kmx = c.peer(lane / kWarps)->kmax[lane % kWarps];
    klw = c.peer(lane / kWarps)->klor[lane % kWarps];
    kla = c.peer(lane / kWarps)->kland[lane % kWarps];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long a = __shfl_xor_sync(0xffffffffu, kmn, o), b = __shfl_xor_sync(0xffffffffu, kmx, o);
      kmn = a < kmn ? a : kmn;
      kmx = b > kmx ? b : kmx;
      klw |= __shfl_xor_sync(0xffffffffu, klw, o);
      kla &= __shfl_xor_sync(0xffffffffu, kla, o);
    }
    if (selected && kmn == kmx) {  // the same in every thread of every CTA
      prefix = kmn;
      break;
    }
    // thread t's two buckets summed over the CTAs (unrolled: the loads are independent, so they
    // are in flight together rather than one round trip per CTA)
    unsigned long long m0 = 0, m1 = 0;  // buckets 2t, 2t + 1
    unsigned n0 = 0, n1 = 0;
#pragma unroll
    for (int q = 0; q < kCtas; ++q) {
      const Slot* p = c.peer(q);
      const uint2 pc = *reinterpret_cast<const uint2*>(&p->count[2 * tid]);
      if constexpr (!kDense) {
        const ulonglong2 pm = *reinterpret_cast<const ulonglong2*>(&p->mass[2 * tid]);
        m0 += pm.x;
        m1 += pm.y;
      }
      n0 += pc.x;
      n1 += pc.y;
    }
    if constexpr (kDense) {  // weight 1: the mass is the count
      m0 = n0;
      m1 = n1;
    }
    // the mass of the buckets above 2t + 1: a suffix scan over the lanes, then over the warps
    const unsigned long long lm = m0 + m1;
    unsigned long long suf = lm;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_down_sync(0xffffffffu, suf, o);
      if (lane + o < 32) suf += y;
    }
    unsigned long long* wsum = reinterpret_cast<unsigned long long*>(c.sh.red.bytes);
    if (lane == 0) wsum[wid] = suf;  // the cluster barrier above ended every earlier read of red
    __syncthreads();
    unsigned long long run = above + (suf - lm);
    for (int w = wid + 1; w < kWarps; ++w) run += wsum[w];
    // the highest bucket with candidates whose suffix weight (with `above`) reaches the target
    int sel = -1;
    unsigned long long sel_above = 0;
    unsigned sel_count = 0;
    if (n1 > 0 && run + m1 >= target) {
      sel = 2 * tid + 1;
      sel_above = run;
      sel_count = n1;
    } else if (n0 > 0 && run + m1 + m0 >= target) {
      sel = 2 * tid;
      sel_above = run + m1;
      sel_count = n0;
    }
    const int best = block_max_int(sel, c.sh.red);  // begins with a __syncthreads(): wsum is read
    if (best < 0) return r;                         // the same in every thread of every CTA
    if (sel == best) {
      c.sh.bc.sel_above = sel_above;
      c.sh.bc.sel_count = sel_count;
    }
    __syncthreads();
    prefix |= static_cast<uint64_t>(best) << lo;
    above = c.sh.bc.sel_above;
    count = c.sh.bc.sel_count;
    // Every key with the previous prefix has the same bits below this digit (bf16-valued logits of
    // one sign: the low 16 bits of their score keys): the selected bucket holds one key, prefix
    // with those bits, and its count and the weight above it are this pass's, so the passes below
    // would change nothing. (No candidate with the prefix: best < 0 returned above.)
    if (klw == kla) {
      prefix |= klw;
      hi = 0;
    } else {
      hi = lo;
    }
    selected = true;
  }
  r.found = true;
  r.key = prefix;
  r.above = above;
  r.count = count;
  return r;
}

// ---- the m-th listed id over the cluster ----
// The m-th id (from 1, in id order over the row) among the ids of the warps' lists with pred(v),
// where every warp of every CTA has its list (WarpList n >= 0; warps hold consecutive ranges of
// their CTA's slice and a list is in id order, so lists in (CTA, warp) order are in id order):
// counts per warp, one exchange for the CTAs' counts, the owning warp walks its list, a second
// exchange hands its id to every CTA. No scan of the slice. -1 when fewer than m ids pass.
// `listed` false (and -1, after one exchange) when some warp of the cluster has no list: the
// caller then scans (cluster_draw); the same in every CTA. pred must be pure.
template <typename Pred>
__device__ int64_t cluster_nth_listed(Ctx& c, const WarpList& list, long long m, Pred pred, bool& listed) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  long long cnt = 0;
  if (list.n >= 0) {  // warp-uniform
    __syncwarp();     // the list's writes by every lane are visible
    for (int i0 = 0; i0 < list.n; i0 += 32) {
      const int i = i0 + lane;
      const bool t = i < list.n && pred(c.beg + list.off[i]);
      cnt += __popc(__ballot_sync(0xffffffffu, t));
    }
  }
  if (lane == 0) c.sh.list_n[wid] = list.n >= 0 ? cnt : -1;
  Slot& s = c.open();
  __syncthreads();  // list_n
  if (tid == 0) {
    long long tot = 0, over = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (c.sh.list_n[w] < 0) over = 1;
      else tot += c.sh.list_n[w];
    }
    s.i[0] = tot;
    s.i[1] = over;
  }
  c.publish();
  listed = true;
  int owner = -1;  // the CTA holding the m-th id
  long long before = 0, owner_before = 0;
  for (int q = 0; q < kCtas; ++q) {
    const Slot* p = c.peer(q);
    if (p->i[1]) listed = false;
    if (owner < 0 && before + p->i[0] >= m) {
      owner = q;
      owner_before = before;
    }
    before += p->i[0];
  }
  if (!listed) return -1;  // the same in every thread of every CTA
  Slot& s2 = c.open();
  if (c.rank == owner) {  // block-uniform; so are ow and rem (from list_n)
    long long rem = m - owner_before;  // >= 1: the rem-th passing id of this CTA
    int ow = -1;
    for (int w = 0; w < kWarps; ++w) {
      if (ow >= 0) continue;
      if (rem <= c.sh.list_n[w]) ow = w;
      else rem -= c.sh.list_n[w];
    }
    if (ow < 0 && tid == 0) s2.i[0] = -1;  // not reached: the warps' counts add up to the CTA's
    if (wid == ow) {
      long long found = -1, seen = 0;
      for (int i0 = 0; i0 < list.n; i0 += 32) {
        const int i = i0 + lane;
        const int64_t v = i < list.n ? c.beg + list.off[i] : c.beg;
        const bool t = i < list.n && pred(v);
        const unsigned ball = __ballot_sync(0xffffffffu, t);
        const int k = __popc(ball);
        if (seen + k >= rem) {  // warp-uniform: the (rem - seen)-th passing lane of this batch
          const int want = static_cast<int>(rem - seen) - 1;
          const unsigned hit = __ballot_sync(0xffffffffu, t && __popc(ball & ((1u << lane) - 1u)) == want);
          found = __shfl_sync(0xffffffffu, static_cast<long long>(v), __ffs(hit) - 1);
          break;
        }
        seen += k;
      }
      if (lane == 0) s2.i[0] = found;
    }
  }
  c.publish();
  return owner >= 0 ? static_cast<int64_t>(c.peer(owner)->i[0]) : -1;
}

// ---- inverse-CDF draw in id order over the cluster ----
// The row's ids form a tree of contiguous ranges: CTAs (rank order), segments of a CTA's slice
// (<= kMaxSegments, each run by one warp), batches of 32 consecutive candidates of a segment
// (warp_batches), lanes. A node's mass is a fixed combination of its children's: lanes by a
// shuffle scan (incl), a batch = incl at its last positive lane, a segment = the running sum of its
// batches, a CTA = the running sum of its segments, the row = the running sum of the CTAs. The draw
// descends: the first CTA with positive mass whose running sum exceeds the target, in it the first
// such segment, batch and lane, every test of the form target < base + (prefix + partial) with the
// same operands at each level as the one above, so the last positive child always passes its
// parent's test (a level never comes up empty). It is the first id whose cumulative mass exceeds
// the target, up to the rounding of the sums: a target within a few ulps of a boundary may land on
// the neighbouring id. Masses <= 0 (and NaN) are skipped, as the host skips p <= 0.
struct DrawOut {
  int64_t token = -1;          // -1: the target is not below the row's mass (rounding, NaN)
  double total = 0.0;          // the row's mass
  int64_t last_positive = -1;  // the row's last id with positive mass, or -1
};

// One segment's batches; returns its mass. With `find`, stops at the first batch and lane where
// target < base + (sx + (R + incl)) and stores the id in `found`.
template <typename Cand, typename Mass>
__device__ double draw_segment(Ctx& c, int64_t sb, int64_t se, Cand cand, Mass mass, bool find, double base,
                               double sx, double target, long long& found, long long& last_positive) {
  const int lane = threadIdx.x & 31;
  double run = 0.0;
  bool done = false;
  warp_batches(sb, se, c.sh.warp[threadIdx.x >> 5].queue, cand, [&](int64_t v, bool ok) {
    if (done) return;  // warp-uniform
    double m = ok ? mass(v) : 0.0;
    if (!(m > 0)) m = 0.0;
    double incl = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl = y + incl;
    }
    const unsigned pos = __ballot_sync(0xffffffffu, m > 0);
    if (pos == 0) return;
    const int lp = 31 - __clz(pos);
    const double g = __shfl_sync(0xffffffffu, incl, lp);
    const double next = run + g;
    const long long vl = static_cast<long long>(v);
    if (find && target < base + (sx + next)) {
      // lane lp passes: run + incl[lp] is `next`
      const unsigned hit = __ballot_sync(0xffffffffu, m > 0 && target < base + (sx + (run + incl)));
      found = __shfl_sync(0xffffffffu, vl, hit ? __ffs(hit) - 1 : lp);
      done = true;
    }
    run = next;
    const long long lv = __shfl_sync(0xffffffffu, vl, lp);
    last_positive = lv > last_positive ? lv : last_positive;
  });
  return run;
}

// The draw's exchanges (see above). seg_sums(st, lastpos): every warp stores st[k] (the mass of
// segment k, for the warp's segments k = wid, wid + kWarps, ...) and folds its last positive id into
// lastpos. seg_find(first, base, sx, target): warp 0 of the owning CTA, the id in segment `first`.
template <typename SegSums, typename SegFind>
__device__ DrawOut cluster_draw_core(Ctx& c, int nseg, SegSums seg_sums, SegFind seg_find, double u, bool scale) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  Slot& s = c.open();
  double* st = s.dv;                 // [nseg] segment masses
  double* sx = s.dv + kMaxSegments;  // [nseg + 1] running sums before each segment
  long long lastpos = -1;
  seg_sums(st, lastpos);
  lastpos = block_reduce(lastpos, MaxOp{}, -1ll, c.sh.red);  // contains the __syncthreads() st needs
  if (threadIdx.x == 0) {
    double a = 0.0;
    sx[0] = a;
    for (int k = 0; k < nseg; ++k) {
      a = a + st[k];
      sx[k + 1] = a;
    }
    s.f[0] = a;
    s.i[0] = lastpos;
  }
  c.publish();
  double pre[kCtas], ms[kCtas];  // registers: every index below is a constant after unrolling
  double acc = 0.0;
  long long lp_row = -1;
#pragma unroll
  for (int q = 0; q < kCtas; ++q) {
    const Slot* p = c.peer(q);
    ms[q] = p->f[0];
    acc = acc + ms[q];
    pre[q] = acc;
    lp_row = p->i[0] > lp_row ? p->i[0] : lp_row;
  }
  DrawOut out;
  out.total = acc;
  out.last_positive = lp_row;
  const double target = scale ? u * acc : u;
  int owner = -1;  // the first CTA with positive mass whose running sum exceeds the target
  double base = 0.0;  // the running sum before it
#pragma unroll
  for (int q = kCtas - 1; q >= 0; --q)
    if (ms[q] > 0 && target < pre[q]) {
      owner = q;
      base = q > 0 ? pre[q - 1] : 0.0;
    }
  long long found = -1;
  if (c.rank == owner) {  // block-uniform
    int first = INT_MAX;
    for (int k = threadIdx.x; k < nseg; k += kThreads)
      if (st[k] > 0 && target < base + sx[k + 1] && k < first) first = k;
    first = block_min_int(first, c.sh.red);
    if (threadIdx.x == 0) c.sh.bc.id = -1;
    __syncthreads();
    if (wid == 0 && first != INT_MAX) {
      found = seg_find(first, base, sx[first], target);
      if (lane == 0) c.sh.bc.id = found;
    }
    __syncthreads();
    found = c.sh.bc.id;
  }
  Slot& s2 = c.open();
  if (threadIdx.x == 0) s2.i[0] = found;
  c.publish();
  out.token = owner >= 0 ? c.peer(owner)->i[0] : -1;
  return out;
}

// The first id (of the candidates cand(v)) whose cumulative mass(v) in id order exceeds the
// target: u, or u times the row's mass when `scale`. mass(v) must be a pure function of v (it is
// evaluated again for the segment that holds the draw). Two exchanges.
template <typename Cand, typename Mass>
__device__ DrawOut cluster_draw(Ctx& c, Cand cand, Mass mass, double u, bool scale) {
  const int64_t len = c.end - c.beg;
  const int64_t seg = c.draw_seg();
  const int nseg = static_cast<int>((len + seg - 1) / seg);
  auto sums = [&](double* st, long long& lastpos) {
    const int lane = threadIdx.x & 31;
    for (int k = threadIdx.x >> 5; k < nseg; k += kWarps) {
      const int64_t sb = c.beg + k * seg, se = sb + seg < c.end ? sb + seg : c.end;
      long long unused = -1;
      const double m = draw_segment(c, sb, se, cand, mass, false, 0.0, 0.0, 0.0, unused, lastpos);
      if (lane == 0) st[k] = m;
    }
  };
  auto find = [&](int first, double base, double sxk, double target) {
    const int64_t sb = c.beg + first * seg, se = sb + seg < c.end ? sb + seg : c.end;
    long long found = -1, unused = -1;
    draw_segment(c, sb, se, cand, mass, true, base, sxk, target, found, unused);
    return found;
  };
  return cluster_draw_core(c, nseg, sums, find, u, scale);
}

}  // namespace tandem::kernels::cuda::sample_cluster
