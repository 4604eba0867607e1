// The indexer's top-k selection (indexer_topk.h): three grids of (slices, rows) blocks over bf16
// scores, or one grid of a block per row when the rows are one slice. Only integer counts are accumulated (shared and global atomics, whose order does not
// change a count), and every decision is a function of the counts, so the result is deterministic.
#include "model/cuda/indexer_topk.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPer = kTopkSlice / kThreads;  // 8 consecutive entries per thread: one 16-byte load
static_assert(kPer == 8, "one uint4 of bf16 per thread");
constexpr int kInfo = 258;                   // per slice: count above, suffix sums [0, 256]

// The per-call carve of state.work: [rows, slices, kInfo] info, [rows, slices, 2] bases, [rows, 4] thr.
struct Work {
  uint32_t* info = nullptr;
  uint32_t* bases = nullptr;
  int32_t* thr = nullptr;
  int64_t slices = 0;
};

struct Row {
  int64_t nv = 0;  // visible entries (clamped)
  int kk = 0;      // min(k, nv)
  bool all = false;
};
__device__ __forceinline__ Row row_of(const IndexerTopkArgs& a, int64_t t) {
  Row r;
  const int64_t v = a.visible[t];
  r.nv = v < 0 ? 0 : (v > a.n_cols ? a.n_cols : v);
  r.kk = static_cast<int>(r.nv < a.k ? r.nv : a.k);
  r.all = r.nv <= a.k;
  return r;
}

// This thread's 8 entries [e0, e0 + 8) of the row as keys; valid[i] = e0 + i < nv.
__device__ __forceinline__ void load_keys(const uint16_t* row, int64_t e0, int64_t nv, uint32_t (&key)[kPer],
                                          bool (&valid)[kPer]) {
  uint16_t v[kPer];
  if (e0 + kPer <= nv) {
    const uint4 w = *reinterpret_cast<const uint4*>(row + e0);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = static_cast<uint16_t>(u[i] & 0xffffu);
      v[2 * i + 1] = static_cast<uint16_t>(u[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[i] = e0 + i < nv ? row[e0 + i] : 0;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    valid[i] = e0 + i < nv;
    key[i] = topk_key16(v[i]);
  }
}

// Exclusive prefix of v over the block (thread order); total = the block's sum. Contains barriers.
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t v, uint32_t* s_warp, uint32_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();  // s_warp's previous readers are done
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  uint32_t pre = 0, tot = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t x = s_warp[w];
    pre += w < warp ? x : 0u;
    tot += x;
  }
  total = tot;
  return pre + incl - v;
}

// The bin holding the want-th largest key (1 <= want <= the histogram's total): bins from 255 down,
// `above` = the count in higher bins. Warp 0; results in *bin / *above.
__device__ __forceinline__ void find_bin(const uint32_t* hist, uint32_t want, int* bin, uint32_t* above) {
  const int lane = threadIdx.x & 31;
  uint32_t tot = 0;
  for (int q = 8 * lane; q < 8 * lane + 8; ++q) tot += hist[255 - q];
  uint32_t incl = tot;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const uint32_t excl = incl - tot;
  const unsigned hit = __ballot_sync(0xffffffffu, excl < want && want <= incl);
  if (hit && lane == __ffs(hit) - 1) {
    uint32_t run = excl;
    int b = 255 - 8 * lane;
    for (int q = 8 * lane; q < 8 * lane + 8; ++q) {
      b = 255 - q;
      if (run + hist[b] >= want) break;
      run += hist[b];
    }
    *bin = b;
    *above = run;
  }
}

// Pass 1 (when the indexer did not count it): the top-byte histogram of each row's visible keys.
__global__ void __launch_bounds__(kThreads) topk_hist_kernel(IndexerTopkArgs a) {
  __shared__ uint32_t s_h[256];
  kernels::cuda::pdl_wait();
  const int64_t t = blockIdx.y;
  if (t >= a.rows) return;
  const Row r = row_of(a, t);
  s_h[threadIdx.x] = 0;
  __syncthreads();
  uint32_t key[kPer];
  bool valid[kPer];
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kTopkSlice + threadIdx.x * kPer;
  load_keys(a.scores + t * a.lds, e0, r.nv, key, valid);
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (valid[i]) atomicAdd(&s_h[key[i] >> 8], 1u);
  __syncthreads();
  kernels::cuda::pdl_trigger();
  if (s_h[threadIdx.x]) atomicAdd(&a.state.hist1[t * 256 + threadIdx.x], s_h[threadIdx.x]);
}

// Pass 2: per slice, the count above the threshold byte T1 and the next byte's histogram of the
// entries in T1; the row's last block turns the counts into T, R and the slices' offsets.
__global__ void __launch_bounds__(kThreads) topk_select_kernel(IndexerTopkArgs a, Work w) {
  __shared__ uint32_t s_h1[256], s_h2[256], s_warp[kWarps];
  __shared__ int s_T1, s_T2, s_last;
  __shared__ uint32_t s_A1, s_A2, s_carry_eq, s_carry_out;
  kernels::cuda::pdl_wait();
  const int64_t t = blockIdx.y;
  const int tid = threadIdx.x;
  if (t >= a.rows) return;
  const TopkState& st = a.state;
  const Row r = row_of(a, t);
  s_h1[tid] = st.hist1[t * 256 + tid];
  s_h2[tid] = 0;
  if (tid == 0) {
    s_T1 = -1;
    s_A1 = 0;
  }
  __syncthreads();
  if (!r.all && tid < 32) find_bin(s_h1, static_cast<uint32_t>(r.kk), &s_T1, &s_A1);
  __syncthreads();
  const int T1 = s_T1;  // -1: every visible entry is selected
  uint32_t key[kPer];
  bool valid[kPer];
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kTopkSlice + tid * kPer;
  load_keys(a.scores + t * a.lds, e0, r.nv, key, valid);
  uint32_t gt = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (!valid[i]) continue;
    const int b1 = static_cast<int>(key[i] >> 8);
    if (b1 > T1)
      ++gt;
    else if (b1 == T1)
      atomicAdd(&s_h2[key[i] & 255u], 1u);
  }
  uint32_t gt_total;
  block_excl_scan(gt, s_warp, gt_total);  // (also orders s_h2's atomics before the reads below)
  // suffix sums of s_h2: thread i holds bin 255 - i
  uint32_t h2_total;
  const uint32_t hv = s_h2[255 - tid];
  const uint32_t suf = block_excl_scan(hv, s_warp, h2_total) + hv;  // sum of bins >= 255 - tid
  uint32_t* info = w.info + (t * w.slices + blockIdx.x) * kInfo;
  if (tid == 0) {
    info[0] = gt_total;
    info[1 + 256] = 0;
  }
  info[1 + 255 - tid] = suf;
  if (hv) atomicAdd(&st.hist2[t * 256 + 255 - tid], hv);
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&st.ticket[t], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) {
    kernels::cuda::pdl_trigger();
    return;
  }
  __threadfence();

  // ---- the row's last block ----
  int T = -1, T2 = 0;
  uint32_t R = 0;
  if (!r.all) {
    s_h2[tid] = __ldcg(&st.hist2[t * 256 + tid]);
    __syncthreads();
    const uint32_t R1 = static_cast<uint32_t>(r.kk) - s_A1;  // >= 1
    if (tid < 32) find_bin(s_h2, R1, &s_T2, &s_A2);
    __syncthreads();
    T2 = s_T2;
    T = (T1 << 8) | T2;
    R = R1 - s_A2;
  }
  if (tid == 0) {
    s_carry_eq = 0;
    s_carry_out = 0;
  }
  const int nsl = static_cast<int>(gridDim.x);
  for (int s0 = 0; s0 < nsl; s0 += kThreads) {
    const int sl = s0 + tid;
    uint32_t gt_s = 0, eq_s = 0;
    if (sl < nsl) {
      const uint32_t* in = w.info + (t * w.slices + sl) * kInfo;
      gt_s = __ldcg(in);
      if (!r.all) {
        const uint32_t at = __ldcg(in + 1 + T2), after = __ldcg(in + 2 + T2);
        gt_s += after;
        eq_s = at - after;
      }
    }
    __syncthreads();  // s_carry_* of the previous group are read
    const uint32_t carry_eq = s_carry_eq, carry_out = s_carry_out;
    uint32_t eq_tot, out_tot;
    const uint32_t eq_pre = carry_eq + block_excl_scan(eq_s, s_warp, eq_tot);
    const uint32_t want = R > eq_pre ? R - eq_pre : 0u;
    const uint32_t sel = eq_s < want ? eq_s : want;
    const uint32_t out_pre = carry_out + block_excl_scan(gt_s + sel, s_warp, out_tot);
    if (sl < nsl) {
      uint32_t* b = w.bases + (t * w.slices + sl) * 2;
      b[0] = out_pre;
      b[1] = eq_pre;
    }
    if (tid == 0) {
      s_carry_eq = carry_eq + eq_tot;
      s_carry_out = carry_out + out_tot;
    }
  }
  if (tid == 0) {
    int32_t* th = w.thr + t * 4;
    th[0] = T;
    th[1] = static_cast<int32_t>(R);
    th[2] = r.kk;
    th[3] = 0;
    st.ticket[t] = 0;
  }
  st.hist1[t * 256 + tid] = 0;
  st.hist2[t * 256 + tid] = 0;
  kernels::cuda::pdl_trigger();
}

// Pass 3: the slice's selected ids in id order at its offset (-1 past min(k, visible): slice 0).
__global__ void __launch_bounds__(kThreads) topk_write_kernel(IndexerTopkArgs a, Work w) {
  __shared__ uint32_t s_warp[kWarps];
  kernels::cuda::pdl_wait();
  const int64_t t = blockIdx.y;
  const int tid = threadIdx.x;
  if (t >= a.rows) return;
  const Row r = row_of(a, t);
  const int32_t T = w.thr[t * 4], R = w.thr[t * 4 + 1], kk = w.thr[t * 4 + 2];
  const uint32_t* b = w.bases + (t * w.slices + blockIdx.x) * 2;
  const uint32_t out_base = b[0], eq_base = b[1];
  int32_t* out = a.out + t * a.ldo;
  if (blockIdx.x == 0)
    for (int i = kk + tid; i < a.k; i += kThreads) out[i] = -1;
  uint32_t key[kPer];
  bool valid[kPer];
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kTopkSlice + tid * kPer;
  load_keys(a.scores + t * a.lds, e0, r.nv, key, valid);
  uint32_t n_eq = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) n_eq += valid[i] && static_cast<int32_t>(key[i]) == T ? 1u : 0u;
  uint32_t tot;
  uint32_t eq_rank = eq_base + block_excl_scan(n_eq, s_warp, tot);
  bool sel[kPer];
  uint32_t n_sel = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int32_t k = static_cast<int32_t>(key[i]);
    sel[i] = valid[i] && k > T;
    if (valid[i] && k == T) sel[i] = eq_rank++ < static_cast<uint32_t>(R);
    n_sel += sel[i] ? 1u : 0u;
  }
  uint32_t pos = out_base + block_excl_scan(n_sel, s_warp, tot);
  kernels::cuda::pdl_trigger();
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (sel[i]) {
      if (pos < static_cast<uint32_t>(kk)) out[pos] = static_cast<int32_t>(e0 + i);  // (always, with consistent counts)
      ++pos;
    }
}

// Rows of one slice (n_cols <= kTopkSlice): passes 1-3 in one block per row, the same decisions on
// the same counts (the row's histograms are the block's own; its slice's bases are 0), so the same ids.
// Pass 1 is the indexer's (hist_ready: read, then left zero) or counted here; hist2 and the ticket
// are not used.
__global__ void __launch_bounds__(kThreads) topk_one_slice_kernel(IndexerTopkArgs a) {
  __shared__ uint32_t s_h1[256], s_h2[256], s_warp[kWarps];
  __shared__ int s_T1, s_T2;
  __shared__ uint32_t s_A1, s_A2;
  kernels::cuda::pdl_wait();
  const int64_t t = blockIdx.y;
  const int tid = threadIdx.x;
  if (t >= a.rows) return;
  const Row r = row_of(a, t);
  uint32_t key[kPer];
  bool valid[kPer];
  const int64_t e0 = static_cast<int64_t>(tid) * kPer;
  load_keys(a.scores + t * a.lds, e0, r.nv, key, valid);
  // pass 1
  if (a.hist_ready) {
    s_h1[tid] = a.state.hist1[t * 256 + tid];
    a.state.hist1[t * 256 + tid] = 0;
  } else {
    s_h1[tid] = 0;
  }
  s_h2[tid] = 0;
  if (tid == 0) {
    s_T1 = -1;
    s_A1 = 0;
  }
  __syncthreads();
  if (!a.hist_ready) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (valid[i]) atomicAdd(&s_h1[key[i] >> 8], 1u);
    __syncthreads();
  }
  // pass 2: the threshold byte T1, the next byte's histogram of the entries in it, T and R
  if (!r.all && tid < 32) find_bin(s_h1, static_cast<uint32_t>(r.kk), &s_T1, &s_A1);
  __syncthreads();
  const int T1 = s_T1;  // -1: every visible entry is selected
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (valid[i] && static_cast<int>(key[i] >> 8) == T1) atomicAdd(&s_h2[key[i] & 255u], 1u);
  __syncthreads();
  int32_t T = -1;
  uint32_t R = 0;
  if (!r.all) {  // (uniform over the block)
    const uint32_t R1 = static_cast<uint32_t>(r.kk) - s_A1;  // >= 1
    if (tid < 32) find_bin(s_h2, R1, &s_T2, &s_A2);
    __syncthreads();
    T = (T1 << 8) | s_T2;
    R = R1 - s_A2;
  }
  // pass 3: topk_write_kernel's selection with out_base = eq_base = 0
  const int kk = r.kk;
  int32_t* out = a.out + t * a.ldo;
  for (int i = kk + tid; i < a.k; i += kThreads) out[i] = -1;
  uint32_t n_eq = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) n_eq += valid[i] && static_cast<int32_t>(key[i]) == T ? 1u : 0u;
  uint32_t tot;
  uint32_t eq_rank = block_excl_scan(n_eq, s_warp, tot);
  bool sel[kPer];
  uint32_t n_sel = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int32_t k = static_cast<int32_t>(key[i]);
    sel[i] = valid[i] && k > T;
    if (valid[i] && k == T) sel[i] = eq_rank++ < R;
    n_sel += sel[i] ? 1u : 0u;
  }
  uint32_t pos = block_excl_scan(n_sel, s_warp, tot);
  kernels::cuda::pdl_trigger();
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (sel[i]) {
      if (pos < static_cast<uint32_t>(kk)) out[pos] = static_cast<int32_t>(e0 + i);
      ++pos;
    }
}

size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

}  // namespace

size_t topk_counters_bytes(int64_t max_rows) {
  const size_t R = static_cast<size_t>(std::max<int64_t>(max_rows, 1));
  return align256(R * 256 * 4) * 2 + align256(R * 4);
}

TopkState topk_state(void* counters, int64_t max_rows, void* work, size_t work_bytes) {
  TopkState st;
  st.max_rows = std::max<int64_t>(max_rows, 1);
  const size_t R = static_cast<size_t>(st.max_rows);
  uint8_t* p = static_cast<uint8_t*>(counters);
  st.hist1 = reinterpret_cast<uint32_t*>(p);
  st.hist2 = reinterpret_cast<uint32_t*>(p + align256(R * 256 * 4));
  st.ticket = reinterpret_cast<uint32_t*>(p + 2 * align256(R * 256 * 4));
  st.work = static_cast<uint8_t*>(work);
  st.work_bytes = work_bytes;
  return st;
}

size_t topk_work_bytes(int64_t rows, int64_t n_cols) {
  const size_t R = static_cast<size_t>(std::max<int64_t>(rows, 1));
  const size_t S = static_cast<size_t>(std::max<int64_t>(1, (n_cols + kTopkSlice - 1) / kTopkSlice));
  return align256(R * S * kInfo * 4) + align256(R * S * 2 * 4) + align256(R * 4 * 4);
}

void indexer_topk(const IndexerTopkArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  TANDEM_CHECK_MSG(a.k >= 1 && a.ldo >= a.k, "indexer_topk: k and the output stride");
  TANDEM_CHECK_MSG(a.lds >= a.n_cols && a.lds % 8 == 0, "indexer_topk: score row stride");
  TANDEM_CHECK_MSG(a.rows <= a.state.max_rows && a.rows <= 65535 &&
                       topk_work_bytes(a.rows, a.n_cols) <= a.state.work_bytes,
                   "indexer_topk: more rows or columns than the state holds");
  const int64_t nsl = std::max<int64_t>(1, (a.n_cols + kTopkSlice - 1) / kTopkSlice);
  Work w;
  w.slices = nsl;
  const size_t R = static_cast<size_t>(a.rows), S = static_cast<size_t>(nsl);
  w.info = reinterpret_cast<uint32_t*>(a.state.work);
  w.bases = reinterpret_cast<uint32_t*>(a.state.work + align256(R * S * kInfo * 4));
  w.thr = reinterpret_cast<int32_t*>(a.state.work + align256(R * S * kInfo * 4) + align256(R * S * 2 * 4));
  const dim3 grid(static_cast<unsigned>(nsl), static_cast<unsigned>(a.rows));
  if (nsl == 1 && a.one_launch) {
    kernels::cuda::launch_pdl(topk_one_slice_kernel, grid, dim3(kThreads), 0, s, a);
    return;
  }
  if (!a.hist_ready) kernels::cuda::launch_pdl(topk_hist_kernel, grid, dim3(kThreads), 0, s, a);
  kernels::cuda::launch_pdl(topk_select_kernel, grid, dim3(kThreads), 0, s, a, w);
  kernels::cuda::launch_pdl(topk_write_kernel, grid, dim3(kThreads), 0, s, a, w);
}

}  // namespace tandem::cuda_model
