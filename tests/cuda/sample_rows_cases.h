// Random batches for the sampling op's device-vs-host tests (sample_rows_test.cpp): every row kind
// the op knows (greedy, temperature, top-k, top-p with ties at the threshold, min-p, all combined,
// penalties, grammar masks and dead ends, the noise token, drafts with one-hot and full q,
// logprobs) on random logits (never zeros). Host-only code: the arrays are uploaded by the test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/sampling.h"

namespace tandem::sample_rows_cases {

enum class Kind : int {
  kGreedy,
  kTemperature,
  kTopK,
  kTopP,
  kMinP,
  kCombined,
  kPenalties,
  kPenaltiesGreedy,
  kMask,
  kMaskGreedy,
  kDeadEnd,
  kDraftOneHot,
  kDraftFullQ,
  kDraftGreedy,
  kTiesTopP,
  kScore,  // a score row (SampleRow::score): a prompt token's logprob, rank and top n, nothing drawn
  kCount
};

inline bool is_greedy(Kind k) {
  return k == Kind::kGreedy || k == Kind::kPenaltiesGreedy || k == Kind::kMaskGreedy || k == Kind::kDraftGreedy ||
         k == Kind::kScore;
}

// The arrays a batch of rows indexes (host copies).
struct Batch {
  int64_t vocab = 0;
  int32_t eos = -1, noise = -1;
  std::vector<float> logits;   // [rows, vocab], row i = rows[i].logits_row
  std::vector<float> q;        // [q rows, vocab]
  std::vector<uint32_t> masks; // [mask rows, mask_words]
  std::vector<int32_t> prompt, counts;
  std::vector<SampleRow> rows;
  std::vector<Kind> kinds;

  int64_t mask_words() const { return (vocab + 31) / 32; }
  SampleInputs host_inputs() const {
    SampleInputs in;
    in.logits = logits.data();
    in.q = q.empty() ? nullptr : q.data();
    in.masks = masks.empty() ? nullptr : masks.data();
    in.prompt_ids = prompt.empty() ? nullptr : prompt.data();
    in.counts = counts.empty() ? nullptr : counts.data();
    in.vocab = vocab;
    in.mask_words = mask_words();
    in.eos = eos;
    in.noise = noise;
    return in;
  }
};

class Builder {
 public:
  Builder(int64_t vocab, uint64_t seed, bool with_noise) : rng_(seed) {
    b_.vocab = vocab;
    b_.eos = static_cast<int32_t>(vocab > 3 ? vocab - 3 : 0);
    b_.noise = with_noise && vocab > 2 ? static_cast<int32_t>(vocab - 1) : -1;
  }

  // Normal logits times `scale`, never 0 (so no row is flat by accident).
  std::vector<float> random_logits(float scale) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> z(static_cast<size_t>(b_.vocab));
    for (auto& x : z) {
      x = nd(rng_) * scale;
      if (x == 0.0f) x = 0.5f * scale;
    }
    return z;
  }
  // Logits from a few levels (k + 0.25 for k in [-6, 2]): many exactly equal probabilities, so top-k
  // and top-p thresholds fall inside runs of ties.
  std::vector<float> tie_logits() {
    std::uniform_int_distribution<int> lv(-6, 2);
    std::vector<float> z(static_cast<size_t>(b_.vocab));
    for (auto& x : z) x = static_cast<float>(lv(rng_)) + 0.25f;
    return z;
  }

  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  int64_t index(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng_); }

  // Adds one row of `kind`; `seed` keys its RNG.
  void add(Kind kind, uint64_t seed, int top_logprobs) {
    const int64_t V = b_.vocab;
    SampleRow r;
    r.logits_row = static_cast<int32_t>(b_.rows.size());
    r.seed = seed;
    r.position = static_cast<int64_t>(index(1 << 20));
    r.top_logprobs = top_logprobs;
    r.temperature = uniform(0.5, 1.5);
    const bool ties = kind == Kind::kTiesTopP || (kind == Kind::kScore && index(2));  // ranks shared by equal logits
    std::vector<float> z = ties ? tie_logits() : random_logits(static_cast<float>(uniform(1.0, 4.0)));
    switch (kind) {
      case Kind::kGreedy:
      case Kind::kPenaltiesGreedy:
      case Kind::kMaskGreedy:
      case Kind::kDraftGreedy:
        r.temperature = index(2) ? 0.0 : 5e-6;
        break;
      case Kind::kTemperature:
        break;
      case Kind::kTopK:
        r.top_k = static_cast<int32_t>(1 + index(std::min<int64_t>(V, 64)));
        break;
      case Kind::kTopP:
        r.top_p = uniform(0.05, 0.98);
        break;
      case Kind::kMinP:
        r.min_p = uniform(0.01, 0.3);
        break;
      case Kind::kCombined:
        r.top_k = static_cast<int32_t>(1 + index(std::min<int64_t>(V, 200)));
        r.top_p = uniform(0.3, 0.95);
        r.min_p = uniform(0.0, 0.1);
        break;
      case Kind::kTiesTopP:
        r.top_p = uniform(0.05, 0.95);
        if (index(2)) r.top_k = static_cast<int32_t>(1 + index(std::min<int64_t>(V, 300)));
        break;
      case Kind::kScore: {
        // the row's argmax, a random id or the noise token (logprob -inf, rank 0)
        r.temperature = 0.0;
        r.top_logprobs = std::max(top_logprobs, 0);
        const int64_t pick = index(4);
        if (pick == 0) r.score = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
        else if (pick == 1 && b_.noise >= 0) r.score = b_.noise;
        else r.score = static_cast<int32_t>(index(V));
        break;
      }
      default:
        break;
    }
    if (kind == Kind::kPenalties || kind == Kind::kPenaltiesGreedy) add_penalties(r, z);
    if (kind == Kind::kMask || kind == Kind::kMaskGreedy) add_mask(r, 0.5);
    if (kind == Kind::kDeadEnd) add_dead_end(r);
    if (kind == Kind::kDraftOneHot || kind == Kind::kDraftFullQ || kind == Kind::kDraftGreedy) {
      // a draft that is often accepted: one of the row's largest logits, else a random id
      if (index(3) > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(V));
        for (int64_t v = 0; v < V; ++v) idx[v] = static_cast<int32_t>(v);
        const int64_t top = std::min<int64_t>(V, 4);
        std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int32_t a, int32_t c) { return z[a] > z[c]; });
        r.draft = idx[static_cast<size_t>(index(top))];
      } else {
        r.draft = static_cast<int32_t>(index(V));
      }
      if (b_.noise >= 0 && r.draft == b_.noise) r.draft = 0;
      if (kind == Kind::kDraftFullQ) add_q(r, z);
      if (kind != Kind::kDraftGreedy && index(2)) r.top_k = static_cast<int32_t>(1 + index(std::min<int64_t>(V, 100)));
    }
    b_.logits.insert(b_.logits.end(), z.begin(), z.end());
    b_.rows.push_back(r);
    b_.kinds.push_back(kind);
  }

  const Batch& batch() const { return b_; }
  Batch take() { return std::move(b_); }

 private:
  void add_penalties(SampleRow& r, const std::vector<float>& z) {
    const int64_t V = b_.vocab;
    std::set<int32_t> prompt, out;
    const int64_t np = std::min<int64_t>(V / 2, 40), no = std::min<int64_t>(V / 2, 30);
    // bias towards large logits so the penalties change the argmax and the kept set
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) idx[v] = static_cast<int32_t>(v);
    const int64_t top = std::min<int64_t>(V, 32);
    std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int32_t a, int32_t c) { return z[a] > z[c]; });
    for (int64_t i = 0; i < np; ++i) prompt.insert(index(2) ? idx[static_cast<size_t>(index(top))] : static_cast<int32_t>(index(V)));
    for (int64_t i = 0; i < no; ++i) out.insert(index(2) ? idx[static_cast<size_t>(index(top))] : static_cast<int32_t>(index(V)));
    r.repetition_penalty = index(4) ? uniform(1.05, 1.6) : 1.0;
    r.frequency_penalty = index(4) ? uniform(-0.5, 1.0) : 0.0;
    r.presence_penalty = index(4) ? uniform(-0.5, 1.0) : 0.0;
    r.prompt_begin = static_cast<int32_t>(b_.prompt.size());
    r.prompt_count = static_cast<int32_t>(prompt.size());
    b_.prompt.insert(b_.prompt.end(), prompt.begin(), prompt.end());  // sorted, unique
    r.counts_begin = static_cast<int32_t>(b_.counts.size() / 2);
    r.counts_count = static_cast<int32_t>(out.size());
    for (int32_t t : out) {
      b_.counts.push_back(t);
      b_.counts.push_back(static_cast<int32_t>(1 + index(5)));
    }
  }
  void add_mask(SampleRow& r, double density) {
    const int64_t W = b_.mask_words();
    r.mask_row = static_cast<int32_t>(b_.masks.size() / static_cast<size_t>(W));
    std::vector<uint32_t> m(static_cast<size_t>(W), 0u);
    int64_t allowed = 0;
    for (int64_t v = 0; v < b_.vocab; ++v)
      if (uniform(0, 1) < density) {
        m[v >> 5] |= 1u << (v & 31);
        ++allowed;
      }
    if (allowed == 0) m[0] |= 1u;
    b_.masks.insert(b_.masks.end(), m.begin(), m.end());
  }
  // No allowed token with a finite logit: only the noise token (always -inf) or nothing at all.
  void add_dead_end(SampleRow& r) {
    const int64_t W = b_.mask_words();
    r.mask_row = static_cast<int32_t>(b_.masks.size() / static_cast<size_t>(W));
    std::vector<uint32_t> m(static_cast<size_t>(W), 0u);
    if (b_.noise >= 0 && index(2)) m[b_.noise >> 5] |= 1u << (b_.noise & 31);
    b_.masks.insert(b_.masks.end(), m.begin(), m.end());
    if (index(2)) r.temperature = 0.0;
  }
  // A full draft distribution: softmax of the row's logits, perturbed, normalised in float.
  void add_q(SampleRow& r, const std::vector<float>& z) {
    const int64_t V = b_.vocab;
    r.q_row = static_cast<int32_t>(b_.q.size() / static_cast<size_t>(V));
    std::vector<double> e(static_cast<size_t>(V));
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) sum += (e[v] = std::exp((z[v] - mx + uniform(-1.0, 1.0)) / 0.8));
    for (int64_t v = 0; v < V; ++v) b_.q.push_back(static_cast<float>(e[v] / sum));
  }

  std::mt19937_64 rng_;
  Batch b_;
};

// Rows of every kind, cycling; top_logprobs cycles over -1, 0, 1, 5, 20.
inline Batch mixed_batch(int64_t vocab, int rows, uint64_t seed, bool with_noise) {
  Builder bld(vocab, seed, with_noise);
  static constexpr int kTop[] = {-1, 0, 1, 5, 20};
  for (int i = 0; i < rows; ++i) {
    const Kind k = static_cast<Kind>(i % static_cast<int>(Kind::kCount));
    bld.add(k, seed * 1000003ull + static_cast<uint64_t>(i), kTop[(i / static_cast<int>(Kind::kCount) + i) % 5]);
  }
  return bld.take();
}

// Device results against host results of the same batch.
struct Comparison {
  int rows = 0;
  int sampled_rows = 0;        // non-greedy rows
  int token_mismatches = 0;    // non-greedy rows whose token differs, each on a CDF boundary (below)
  int unexplained_tokens = 0;  // sampled tokens that differ away from any boundary: must be 0
  int greedy_mismatches = 0;   // greedy rows whose token or accept flag differs: must be 0
  int accept_mismatches = 0;   // must be 0
  int top_mismatches = 0;      // rows whose num_top or top ids differ: must be 0
  int rank_mismatches = 0;     // score rows whose token_rank differs: must be 0
  double worst_logprob_err = 0; // |device - host| over token and top logprobs, relative to logprob_err's bound
  int first_bad_row = -1;
};

inline bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// The two sides compute the processed distribution in fp64 in different summation orders (and exp's
// last bits): their CDFs over the vocabulary differ by far less than kCdfSlack (V * 2^-52 ~ 3e-11 at
// V = 129280). Two different draws with the same u are explained only when u lies within kCdfSlack
// of the host CDF at the lower token and no mass beyond kCdfSlack lies strictly between the two.
inline constexpr double kCdfSlack = 1e-9;

// Whether the host draw `want` and the device draw `got` of row r differ only by u sitting on a CDF
// boundary: the row's plain draw (u_sample over p) or its residual draw (u_residual over
// norm(max(0, p - q))), recomputed with the host sampler.
inline bool draw_on_boundary(const Batch& b, const SampleRow& r, int32_t got, int32_t want) {
  if (got < 0 || want < 0 || got >= b.vocab || want >= b.vocab) return false;
  RowSampler rs(b.vocab);
  const SampleInputs in = b.host_inputs();
  rs.prepare(b.logits.data() + static_cast<int64_t>(r.logits_row) * b.vocab, r, in);
  std::vector<double> w(static_cast<size_t>(b.vocab));
  for (int64_t v = 0; v < b.vocab; ++v) w[v] = rs.prob(static_cast<int32_t>(v));
  double u = rng_uniform(r.seed, r.position, RngStream::kSample);
  if (r.draft >= 0) {  // rejected draft: the residual distribution
    const float* q = r.q_row >= 0 ? b.q.data() + static_cast<int64_t>(r.q_row) * b.vocab : nullptr;
    double sum = 0;
    for (int64_t v = 0; v < b.vocab; ++v) {
      const double qv = q ? static_cast<double>(q[v]) : (v == r.draft ? 1.0 : 0.0);
      w[v] = std::max(0.0, w[v] - qv);
      sum += w[v];
    }
    if (sum > 0)
      for (auto& x : w) x /= sum;
    else
      for (int64_t v = 0; v < b.vocab; ++v) w[v] = rs.prob(static_cast<int32_t>(v));
    u = rng_uniform(r.seed, r.position, RngStream::kResidual);
  }
  const int32_t lo = std::min(got, want), hi = std::max(got, want);
  double cum_lo = 0, between = 0;
  for (int64_t v = 0; v <= lo; ++v) cum_lo += w[v];
  for (int64_t v = lo + 1; v < hi; ++v) between += w[v];
  return std::fabs(u - cum_lo) <= kCdfSlack && between <= kCdfSlack;
}

// A log-probability is fp32(logit - lse) with lse = max + log(sum exp) in fp64 on both sides: the
// sums differ by at most V * 2^-52 relative (summation order), so lse by that much absolute, and the
// fp32 results by one fp32 ulp plus that. Returns |x - y| over that bound (inf: equal or 1e30).
inline double logprob_err(float x, float y, int64_t vocab) {
  if (std::isinf(x) || std::isinf(y) || std::isnan(x) || std::isnan(y)) return same_float(x, y) ? 0.0 : 1e30;
  const double bound = std::ldexp(1.0, std::max(std::ilogb(y), -126) - 23) + static_cast<double>(vocab) * 0x1p-52;
  return std::fabs(static_cast<double>(x) - y) / bound;
}

inline Comparison compare(const Batch& b, const std::vector<SampleRowResult>& got,
                          const std::vector<SampleRowResult>& want) {
  Comparison c;
  auto bad = [&](int i) {
    if (c.first_bad_row < 0) c.first_bad_row = i;
  };
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const SampleRow& r = b.rows[i];
    const SampleRowResult &g = got[i], &w = want[i];
    const bool greedy = r.temperature < kGreedyTemperature;
    ++c.rows;
    if (!greedy) ++c.sampled_rows;
    if (g.accepted != w.accepted) {
      ++c.accept_mismatches;
      bad(static_cast<int>(i));
    }
    if (g.token != w.token) {
      if (greedy) {
        ++c.greedy_mismatches;
        bad(static_cast<int>(i));
      } else if (draw_on_boundary(b, r, g.token, w.token)) {
        ++c.token_mismatches;
      } else {
        ++c.unexplained_tokens;
        bad(static_cast<int>(i));
      }
      continue;  // the logprobs are those of different tokens
    }
    if (g.token_rank != w.token_rank) {
      ++c.rank_mismatches;
      bad(static_cast<int>(i));
    }
    if (r.top_logprobs < 0) continue;
    c.worst_logprob_err = std::max(c.worst_logprob_err, logprob_err(g.token_logprob, w.token_logprob, b.vocab));
    bool top_same = g.num_top == w.num_top;
    for (int k = 0; top_same && k < w.num_top; ++k) {
      top_same = g.top_ids[k] == w.top_ids[k];
      c.worst_logprob_err = std::max(c.worst_logprob_err, logprob_err(g.top_logprobs[k], w.top_logprobs[k], b.vocab));
    }
    if (!top_same) {
      ++c.top_mismatches;
      bad(static_cast<int>(i));
    }
  }
  return c;
}

}  // namespace tandem::sample_rows_cases
