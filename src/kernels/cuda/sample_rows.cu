// sample_rows_device (sample_rows.h): one 1024-thread block per row, in the host's order of
// operations (kernels/cpu/sampling.cpp):
//   penalties -> noise/grammar masks + argmax (one pass) -> greedy: done
//   else top-k (radix select of the k-th largest logit over order-preserving keys, 8-bit digits,
//   integer counts) -> e = exp((z - zmax) / T) in double, then p = e / sum stored over e in the
//   scratch (one division per id; every later pass reads p) -> top-p (radix select over the bits of
//   p, 8-bit digits; the probability mass of each bucket is summed in 2^-60 fixed point with integer
//   atomics, so no sort and no order-dependent float atomics; ties at the threshold are kept in id
//   order by a block scan) -> min-p -> accept / draw by inverse CDF in id order (sampling_device.cuh).
// The radix selects add each warp's candidates per digit before one shared atomic per digit (a row's
// keys crowd into a few digits), and stop as soon as the selected bucket holds a single key (the
// later passes could only narrow down to it): both leave the result as the full 8-pass select.
// p after top-p/min-p is recomputed from the stored p with the host's divisions (/ kept_top_p, then
// / kept_min_p), so it has the host's rounding steps.
// Precision: e, p and all masses are double as on the host; sums run in a fixed tree (not the
// host's sequential order), so p agrees to a few ulps and a draw whose uniform sits within ~1e-15
// of a CDF boundary may land on the neighbouring id; top-p's cumulative mass agrees with the
// host's to ~1e-13, so a threshold decided by less than that may differ.
// NaN logits: the argmax follows the host (a NaN wins only as the first finite-or-NaN element);
// elsewhere NaN never crashes or hangs a row but its p is not specified (the host's is NaN too).
#include "kernels/cuda/sample_rows.h"

#include <climits>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/sampling_device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr double kFixedOne = 1152921504606846976.0;  // 2^60: top-p masses in fixed point

__device__ __forceinline__ uint64_t to_fixed(double p) { return __double2ull_rn(p * kFixedOne); }

// score_key (device.cuh) back to the float (-0 comes back as +0, which compares equal).
__device__ __forceinline__ float score_key_value(uint32_t k) {
  return num::bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---- radix select over a block ----
struct RadixShared {
  unsigned long long mass[256];
  unsigned count[256];
  unsigned long long sel_above;
  unsigned long long single_key;
  unsigned sel_count;
  int sel;
};
struct RadixResult {
  bool found = false;
  uint64_t key = 0;    // the selected key
  uint64_t above = 0;  // weight of the candidates with a larger key
  uint32_t count = 0;  // candidates with exactly this key
};

// The largest candidate key K with weight(keys >= K) >= target, where `elem(v, key, weight)` says
// whether id v is a candidate and gives its key (kKeyBits wide, unsigned order = selection order)
// and weight. Top-k: weight 1, target k (K = the k-th largest). Top-p: weight = fixed-point p.
// Not found when the candidates' whole weight is below the target.
template <int kKeyBits, typename Elem>
__device__ RadixResult radix_select_desc(int64_t n, Elem elem, uint64_t target, RadixShared& sh) {
  RadixResult r;
  uint64_t prefix = 0, above = 0;
  uint32_t count = 0;
  const int lane = threadIdx.x & 31;
  for (int shift = kKeyBits - 8; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      sh.mass[i] = 0;
      sh.count[i] = 0;
    }
    __syncthreads();
    const int hi = shift + 8;
    // Each warp adds its candidates per digit (butterfly sums over the lanes of that digit), then
    // one atomic per digit present: the loop runs warp-uniformly (the last round's lanes past n
    // hold no candidate).
    for (int64_t v0 = 0; v0 < n; v0 += blockDim.x) {
      const int64_t v = v0 + threadIdx.x;
      uint64_t key = 0, weight = 0;
      int digit = -1;
      if (v < n && elem(v, key, weight) && (hi >= 64 || (key >> hi) == (prefix >> hi)))
        digit = static_cast<int>((key >> shift) & 255u);
      unsigned todo = __ballot_sync(0xffffffffu, digit >= 0);
      while (todo) {
        const int leader = __ffs(todo) - 1;
        const int dg = __shfl_sync(0xffffffffu, digit, leader);
        const bool in = digit == dg;
        const unsigned group = __ballot_sync(0xffffffffu, in);
        unsigned long long w = in ? weight : 0ull;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
        if (lane == leader) {
          atomicAdd(&sh.count[dg], static_cast<unsigned>(__popc(group)));
          atomicAdd(&sh.mass[dg], w);
        }
        todo &= ~group;
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // lane l owns buckets [8l, 8l + 8): the highest bucket whose suffix weight reaches the target
      unsigned long long lm = 0;
      for (int j = 0; j < 8; ++j) lm += sh.mass[8 * lane + j];
      unsigned long long suf = lm;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += y;
      }
      unsigned long long run = above + (suf - lm);
      int sel = -1;
      unsigned long long sel_above = 0;
      for (int j = 7; j >= 0; --j) {
        const int b = 8 * lane + j;
        const unsigned long long before = run;
        run += sh.mass[b];
        if (sh.count[b] > 0 && run >= target) {
          sel = b;
          sel_above = before;
          break;
        }
      }
      const unsigned ball = __ballot_sync(0xffffffffu, sel >= 0);
      if (ball == 0) {
        if (lane == 0) sh.sel = -1;
      } else if (lane == 31 - __clz(ball)) {
        sh.sel = sel;
        sh.sel_above = sel_above;
        sh.sel_count = sh.count[sel];
        sh.single_key = 0;
      }
    }
    __syncthreads();
    const int sel = sh.sel;
    if (sel < 0) return r;  // the same in every thread
    prefix |= static_cast<uint64_t>(sel) << shift;
    above = sh.sel_above;
    count = sh.sel_count;
    if (count == 1 && shift > 0) {
      // One key left in the bucket: the later passes would select it digit by digit (above and
      // count unchanged); its holder reports it.
      for (int64_t v = threadIdx.x; v < n; v += blockDim.x) {
        uint64_t key, weight;
        if (elem(v, key, weight) && (key >> shift) == (prefix >> shift)) sh.single_key = key;
      }
      __syncthreads();
      prefix = sh.single_key;
      break;
    }
    // sh.sel and sh.single_key are next written after the next pass's first __syncthreads()
  }
  r.found = true;
  r.key = prefix;
  r.above = above;
  r.count = count;
  return r;
}

// p of a prepared row, from the stored p = e / sum with the host's operations (see the file comment).
struct RowDist {
  const double* e = nullptr;  // p = e / sum, stored
  double sum = 1.0;
  bool top_p = false;
  double pstar = 0.0;          // top-p: keep p > pstar, and p == pstar up to id tie_last
  int64_t tie_last = -1;
  double kept_p = 1.0;
  bool min_p = false;
  double cut = 0.0;
  double kept_m = 1.0;

  __device__ __forceinline__ double p1(int64_t v) const { return e[v]; }
  __device__ __forceinline__ bool in_top_p(double p, int64_t v) const {
    return p > pstar || (p == pstar && v <= tie_last);
  }
  __device__ __forceinline__ double p2(int64_t v) const {
    const double p = p1(v);
    if (!top_p) return p;
    return in_top_p(p, v) ? p / kept_p : 0.0;
  }
  __device__ __forceinline__ double p(int64_t v) const {
    const double q = p2(v);
    if (!min_p) return q;
    return (q < cut ? 0.0 : q) / kept_m;
  }
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

struct RowScratch {
  float* z;   // [vocab] processed logits
  double* e;  // [vocab] exp((z - zmax) / T), 0 outside top-k
};

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SampleInputs in, const SampleRow* rows, int n,
                                                                unsigned char* scratch, size_t row_bytes,
                                                                size_t z_bytes, SampleRowResult* out) {
  __shared__ BlockReduceScratch red;
  __shared__ RadixShared radix;
  const int ri = blockIdx.x;
  if (ri >= n) return;
  const SampleRow row = rows[ri];
  const int64_t V = in.vocab;
  const float kNegInf = -INFINITY;
  RowScratch rs;
  rs.z = reinterpret_cast<float*>(scratch + static_cast<size_t>(ri) * row_bytes);
  rs.e = reinterpret_cast<double*>(scratch + static_cast<size_t>(ri) * row_bytes + z_bytes);
  float* z = rs.z;
  const float* logits = in.logits + static_cast<int64_t>(row.logits_row) * V;

  // ---- penalties (each listed token is touched by one thread: the lists hold unique tokens) ----
  const int32_t* prompt = in.prompt_ids ? in.prompt_ids + row.prompt_begin : nullptr;
  const int32_t* counts = in.counts ? in.counts + 2 * static_cast<int64_t>(row.counts_begin) : nullptr;
  const int np = prompt ? row.prompt_count : 0, nc = counts ? row.counts_count : 0;
  const bool rep = row.repetition_penalty != 1.0 && (np > 0 || nc > 0);
  const bool freq = (row.frequency_penalty != 0.0 || row.presence_penalty != 0.0) && nc > 0;
  const float* src = logits;
  if (rep || freq) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) z[v] = logits[v];
    __syncthreads();
    if (rep) {
      const float r = static_cast<float>(row.repetition_penalty);
      auto apply = [&](int32_t t) {
        if (t < 0 || t >= V) return;
        const float x = z[t];
        z[t] = x > 0 ? __fdiv_rn(x, r) : __fmul_rn(x, r);
      };
      for (int i = threadIdx.x; i < np; i += blockDim.x) apply(prompt[i]);
      for (int i = threadIdx.x; i < nc; i += blockDim.x)
        if (!sorted_contains(prompt, np, counts[2 * i])) apply(counts[2 * i]);
      __syncthreads();
    }
    if (freq) {
      for (int i = threadIdx.x; i < nc; i += blockDim.x) {
        const int32_t t = counts[2 * i], c = counts[2 * i + 1];
        if (t < 0 || t >= V) continue;
        const double pen = __dadd_rn(__dmul_rn(row.frequency_penalty, static_cast<double>(c)),
                                     __dmul_rn(row.presence_penalty, c > 0 ? 1.0 : 0.0));
        z[t] = __fsub_rn(z[t], static_cast<float>(pen));
      }
      __syncthreads();
    }
    src = z;
  }

  // ---- masks and argmax in one pass ----
  // argmax = the first element != -inf when it is NaN (the host's `z[v] > z[best]` never replaces
  // it), else the first maximum among the non-NaN ones.
  const uint32_t* mask =
      row.mask_row >= 0 && in.masks ? in.masks + static_cast<int64_t>(row.mask_row) * in.mask_words : nullptr;
  unsigned long long best = 0;
  int first = INT_MAX;  // 2 * id + isnan of the first element != -inf
  long long nvalid = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float x = src[v];
    if (v == in.noise) x = kNegInf;
    if (mask && !((mask[v >> 5] >> (v & 31)) & 1u)) x = kNegInf;
    z[v] = x;
    if (x != kNegInf) {
      ++nvalid;
      const bool nan = is_nan(x);
      if (first == INT_MAX) first = 2 * static_cast<int>(v) + (nan ? 1 : 0);
      if (!nan) {
        const unsigned long long k = select_key(x, static_cast<uint32_t>(v));
        best = k > best ? k : best;
      }
    }
  }
  best = block_argmax_key(best, red);
  first = block_min_int(first, red);
  nvalid = block_sum_i64(nvalid, red);
  int64_t argmax;
  if (mask && nvalid == 0 && in.eos >= 0 && in.eos < V) {  // grammar dead end: EOS ends the output
    if (threadIdx.x == 0) z[in.eos] = 0.0f;
    __syncthreads();
    argmax = in.eos;
    nvalid = 1;
  } else if (first != INT_MAX) {
    argmax = (first & 1) ? (first >> 1) : static_cast<int64_t>(select_key_index(best));
  } else {
    argmax = in.eos >= 0 && in.eos < V ? in.eos : 0;  // no finite logit: end the output, greedily
  }

  int accepted = 0;
  int64_t token = argmax;
  const bool greedy = nvalid == 0 || is_greedy(row.temperature);
  if (greedy) {
    accepted = row.draft >= 0 && row.draft == argmax ? 1 : 0;
  } else {
    // ---- top-k: keep z >= the k-th largest finite-or-NaN logit ----
    float kth = kNegInf;
    if (row.top_k > 0 && row.top_k < V && row.top_k < nvalid) {
      auto elem = [&](int64_t v, uint64_t& key, uint64_t& weight) {
        const float x = z[v];
        if (x == kNegInf) return false;
        key = score_key(x);
        weight = 1;
        return true;
      };
      const RadixResult rr = radix_select_desc<32>(V, elem, static_cast<uint64_t>(row.top_k), radix);
      if (rr.found) kth = score_key_value(static_cast<uint32_t>(rr.key));
    }
    // ---- softmax numerators in double ----
    const double zmax = argmax < V ? static_cast<double>(z[argmax]) : -INFINITY;
    const double inv_t = 1.0 / row.temperature;
    double* e = rs.e;
    double local = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float x = z[v];
      const double ev = (x == kNegInf || x < kth) ? 0.0 : exp(__dmul_rn(static_cast<double>(x) - zmax, inv_t));
      e[v] = ev;
      local += ev;
    }
    RowDist d;
    d.e = e;
    d.sum = block_sum_f64(local, red);
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) e[v] = e[v] / d.sum;  // the host's p = e / sum
    __syncthreads();  // p is read by other threads from here on
    // ---- top-p ----
    if (row.top_p < 1.0) {
      d.top_p = true;
      const uint64_t target = row.top_p > 0.0 ? __double2ull_ru(row.top_p * kFixedOne) : 0;
      auto elem = [&](int64_t v, uint64_t& key, uint64_t& weight) {
        const double p = d.p1(v);
        if (!(p > 0)) return false;
        key = static_cast<uint64_t>(__double_as_longlong(p));
        weight = to_fixed(p);
        return true;
      };
      const RadixResult rr = radix_select_desc<64>(V, elem, target, radix);
      if (rr.found) {
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
          const double pstar = d.pstar;
          auto tie = [&](int64_t v) { return d.p1(v) == pstar ? 1.0 : 0.0; };
          const ChunkScan c = block_chunk_scan(V, tie, red);
          const int64_t id = block_chunk_find(c, tie, static_cast<double>(m) - 0.5, red);
          if (id >= 0) d.tie_last = id;
        }
      }  // else the whole mass is below top_p: every p > 0 stays (pstar 0), renormalised
      double kept = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const double p = d.p1(v);
        if (p > 0 && d.in_top_p(p, v)) kept += p;
      }
      d.kept_p = block_sum_f64(kept, red);
    }
    // ---- min-p ----
    if (row.min_p > 0.0) {
      double pmax = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) pmax = fmax(pmax, d.p2(v));
      pmax = block_max_f64(pmax, red);
      const double cut = row.min_p * pmax;
      double kept = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const double p = d.p2(v);
        kept += p < cut ? 0.0 : p;
      }
      d.kept_m = block_sum_f64(kept, red);
      d.cut = cut;
      d.min_p = true;
    }
    // ---- accept / draw ----
    auto prob = [&](int64_t v) { return d.p(v); };
    auto draw_p = [&](double u) -> int64_t {
      const ChunkScan c = block_chunk_scan(V, prob, red);
      const int64_t t = block_chunk_find(c, prob, u, red);
      return t >= 0 ? t : (c.last_positive >= 0 ? c.last_positive : argmax);
    };
    if (row.draft >= 0) {
      const float* q = row.q_row >= 0 && in.q ? in.q + static_cast<int64_t>(row.q_row) * V : nullptr;
      const bool in_vocab = row.draft < V;
      const double px = in_vocab ? d.p(row.draft) : 0.0;
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
        const ChunkScan c = block_chunk_scan(V, resid, red);
        if (c.total > 1e-12) {
          const int64_t t = block_chunk_find(c, resid, u * c.total, red);
          token = t >= 0 ? t : (c.last_positive >= 0 ? c.last_positive : argmax);
        } else {
          token = draw_p(u);
        }
      }
    } else {
      token = draw_p(rng_uniform(row.seed, row.position, RngStream::kSample));
    }
  }

  // ---- raw log-probabilities (unprocessed logits, the noise token left out) ----
  SampleRowResult* o = out + ri;
  if (threadIdx.x == 0) {
    o->accepted = accepted;
    o->token = static_cast<int32_t>(token);
    o->token_logprob = 0.0f;
    o->num_top = 0;
    for (int i = 0; i < kMaxTopLogprobs; ++i) {
      o->top_ids[i] = 0;
      o->top_logprobs[i] = 0.0f;
    }
  }
  if (row.top_logprobs >= 0) {
    double mx = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      if (v != in.noise) mx = fmax(mx, static_cast<double>(logits[v]));
    mx = block_max_f64(mx, red);
    double s = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      if (v != in.noise) s += exp(static_cast<double>(logits[v]) - mx);
    const double lse = mx + log(block_sum_f64(s, red));
    int nt = row.top_logprobs < kMaxTopLogprobs ? row.top_logprobs : kMaxTopLogprobs;
    const int64_t m = V - (in.noise >= 0 && in.noise < V ? 1 : 0);
    if (nt > m) nt = static_cast<int>(m);
    // the top nt by (value desc, id asc): repeated block argmax over the keys after the previous one
    unsigned long long prev = ~0ull;
    int got = 0;
    for (int i = 0; i < nt; ++i) {
      unsigned long long b = 0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float x = logits[v];
        if (v == in.noise || is_nan(x)) continue;
        const unsigned long long k = select_key(x, static_cast<uint32_t>(v));
        if (k < prev && k > b) b = k;
      }
      b = block_argmax_key(b, red);
      if (b == 0) break;  // only NaN left
      const uint32_t id = select_key_index(b);
      if (threadIdx.x == 0) {
        o->top_ids[i] = static_cast<int32_t>(id);
        o->top_logprobs[i] = static_cast<float>(static_cast<double>(logits[id]) - lse);
      }
      prev = b;
      ++got;
    }
    if (threadIdx.x == 0) {
      o->num_top = got;
      o->token_logprob = token >= 0 && token < V && token != in.noise
                             ? static_cast<float>(static_cast<double>(logits[token]) - lse)
                             : kNegInf;
    }
  }
}

size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

}  // namespace

size_t sample_rows_scratch_bytes(int max_rows, int64_t vocab) {
  const size_t v = static_cast<size_t>(vocab < 0 ? 0 : vocab);
  return static_cast<size_t>(max_rows < 0 ? 0 : max_rows) * (align256(v * sizeof(float)) + align256(v * sizeof(double)));
}

void sample_rows_device(const SampleRowsArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  const size_t v = static_cast<size_t>(a.in.vocab);
  const size_t z_bytes = align256(v * sizeof(float));
  const size_t row_bytes = z_bytes + align256(v * sizeof(double));
  sample_rows_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(
      a.in, a.rows, a.n, static_cast<unsigned char*>(a.scratch), row_bytes, z_bytes, a.out);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
