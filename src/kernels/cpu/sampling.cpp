// RowSampler: see sampling.h. Order of operations follows vLLM: penalties on logits, masks, greedy
// argmax (temperature ~0), else temperature, top-k and top-p on logits/probs, then min-p.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>

namespace tandem {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

RowSampler::RowSampler(int64_t vocab_size) : vocab_(vocab_size) {
  z_.resize(vocab_);
  p_.resize(vocab_);
  idx_.resize(vocab_);
  resid_.resize(vocab_);
}

void RowSampler::prepare(const float* logits, const SampleRow& row, const SampleInputs& in) {
  std::copy(logits, logits + vocab_, z_.begin());
  const int32_t* prompt = in.prompt_ids ? in.prompt_ids + row.prompt_begin : nullptr;
  const int32_t* counts = in.counts ? in.counts + 2 * static_cast<int64_t>(row.counts_begin) : nullptr;
  const int np = prompt ? row.prompt_count : 0, nc = counts ? row.counts_count : 0;
  // Penalties: repetition once per token seen in the prompt or the output, then frequency/presence.
  if (row.repetition_penalty != 1.0) {
    const float r = static_cast<float>(row.repetition_penalty);
    auto apply = [&](int32_t t) {
      if (t < 0 || t >= vocab_) return;
      z_[t] = z_[t] > 0 ? z_[t] / r : z_[t] * r;
    };
    for (int i = 0; i < np; ++i) apply(prompt[i]);
    for (int i = 0; i < nc; ++i)
      if (!std::binary_search(prompt, prompt + np, counts[2 * i])) apply(counts[2 * i]);
  }
  if (row.frequency_penalty != 0.0 || row.presence_penalty != 0.0) {
    for (int i = 0; i < nc; ++i) {
      const int32_t t = counts[2 * i], c = counts[2 * i + 1];
      if (t < 0 || t >= vocab_) continue;
      z_[t] -= static_cast<float>(row.frequency_penalty * c + row.presence_penalty * (c > 0 ? 1 : 0));
    }
  }
  // Masks: the DSpark noise token is never emitted; the grammar decides the rest.
  if (in.noise >= 0 && in.noise < vocab_) z_[in.noise] = kNegInf;
  if (row.mask_row >= 0 && in.masks) {
    const uint32_t* m = in.masks + static_cast<int64_t>(row.mask_row) * in.mask_words;
    bool any = false;
    for (int64_t v = 0; v < vocab_; ++v) {
      if (!((m[v >> 5] >> (v & 31)) & 1u)) z_[v] = kNegInf;
      else any = any || z_[v] != kNegInf;
    }
    if (!any && in.eos >= 0 && in.eos < vocab_) z_[in.eos] = 0.f;  // dead end: end the output
  }
  // Argmax (first maximum, so ties break towards the lower id).
  int32_t best = -1;
  for (int64_t v = 0; v < vocab_; ++v)
    if (z_[v] != kNegInf && (best < 0 || z_[v] > z_[best])) best = static_cast<int32_t>(v);
  // No finite logit at all (no grammar dead-end rule applied): end the output, greedily.
  const bool none = best < 0;
  if (none) best = in.eos >= 0 && in.eos < vocab_ ? in.eos : 0;
  argmax_ = best;
  greedy_ = none || is_greedy(row.temperature);
  if (greedy_) return;

  const double inv_t = 1.0 / row.temperature;
  // top-k on logits: keep values >= the k-th largest.
  float kth = kNegInf;
  if (row.top_k > 0 && row.top_k < vocab_) {
    int64_t n = 0;
    for (int64_t v = 0; v < vocab_; ++v)
      if (z_[v] != kNegInf) idx_[n++] = static_cast<int32_t>(v);
    if (row.top_k < n) {
      std::nth_element(idx_.begin(), idx_.begin() + (row.top_k - 1), idx_.begin() + n,
                       [&](int32_t a, int32_t b) { return z_[a] > z_[b]; });
      kth = z_[idx_[row.top_k - 1]];
    }
  }
  const double zmax = z_[argmax_];
  double sum = 0;
  for (int64_t v = 0; v < vocab_; ++v) {
    double e = (z_[v] == kNegInf || z_[v] < kth) ? 0.0 : std::exp((z_[v] - zmax) * inv_t);
    p_[v] = e;
    sum += e;
  }
  for (int64_t v = 0; v < vocab_; ++v) p_[v] /= sum;
  if (row.top_p < 1.0) {
    int64_t n = 0;
    for (int64_t v = 0; v < vocab_; ++v)
      if (p_[v] > 0) idx_[n++] = static_cast<int32_t>(v);
    std::sort(idx_.begin(), idx_.begin() + n, [&](int32_t a, int32_t b) {
      return p_[a] > p_[b] || (p_[a] == p_[b] && a < b);
    });
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      cum += p_[idx_[i]];
      if (cum >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0;
    for (int64_t i = keep; i < n; ++i) p_[idx_[i]] = 0;
    for (int64_t i = 0; i < keep; ++i) kept += p_[idx_[i]];
    for (int64_t i = 0; i < keep; ++i) p_[idx_[i]] /= kept;
  }
  if (row.min_p > 0.0) {
    double pmax = 0;
    for (int64_t v = 0; v < vocab_; ++v) pmax = std::max(pmax, p_[v]);
    double cut = row.min_p * pmax, kept = 0;
    for (int64_t v = 0; v < vocab_; ++v) {
      if (p_[v] < cut) p_[v] = 0;
      kept += p_[v];
    }
    for (int64_t v = 0; v < vocab_; ++v) p_[v] /= kept;
  }
}

double RowSampler::prob(int32_t token) const {
  if (token < 0 || token >= vocab_) return 0.0;
  if (greedy_) return token == argmax_ ? 1.0 : 0.0;
  return p_[token];
}

void RowSampler::probs(float* out) const {
  for (int64_t v = 0; v < vocab_; ++v) out[v] = static_cast<float>(prob(static_cast<int32_t>(v)));
}

int32_t RowSampler::sample(double u) const {
  if (greedy_) return argmax_;
  double cum = 0;
  int32_t last = argmax_;
  for (int64_t v = 0; v < vocab_; ++v) {
    if (p_[v] <= 0) continue;
    cum += p_[v];
    last = static_cast<int32_t>(v);
    if (u < cum) return last;
  }
  return last;
}

int32_t RowSampler::sample_residual(const float* q, int32_t draft, double u) {
  if (greedy_) return argmax_;
  double sum = 0;
  for (int64_t v = 0; v < vocab_; ++v) {
    double qv = q ? static_cast<double>(q[v]) : (v == draft ? 1.0 : 0.0);
    double r = p_[v] - qv;
    resid_[v] = r > 0 ? r : 0;
    sum += resid_[v];
  }
  if (!(sum > 1e-12)) return sample(u);
  double target = u * sum, cum = 0;
  int32_t last = argmax_;
  for (int64_t v = 0; v < vocab_; ++v) {
    if (resid_[v] <= 0) continue;
    cum += resid_[v];
    last = static_cast<int32_t>(v);
    if (target < cum) return last;
  }
  return last;
}

void row_logprobs(const float* logits, int64_t vocab, int32_t noise, int32_t token, int n,
                  std::vector<int32_t>& idx, SampleRowResult& r) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < vocab; ++v)
    if (v != noise) mx = std::max(mx, static_cast<double>(logits[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (v != noise) sum += std::exp(static_cast<double>(logits[v]) - mx);
  const double lse = mx + std::log(sum);
  auto lp = [&](int32_t t) {
    return t >= 0 && t < vocab && t != noise ? static_cast<float>(logits[t] - lse) : kNegInf;
  };
  r.token_logprob = lp(token);
  r.num_top = 0;
  n = std::min(n, kMaxTopLogprobs);
  if (n <= 0) return;
  idx.resize(static_cast<size_t>(vocab));
  int64_t m = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (v != noise) idx[m++] = static_cast<int32_t>(v);
  n = static_cast<int>(std::min<int64_t>(n, m));
  // NaN logits order last (a strict weak order even then).
  std::partial_sort(idx.begin(), idx.begin() + n, idx.begin() + m, [&](int32_t x, int32_t y) {
    const bool nx = std::isnan(logits[x]), ny = std::isnan(logits[y]);
    if (nx != ny) return ny;
    if (!nx && logits[x] != logits[y]) return logits[x] > logits[y];
    return x < y;
  });
  r.num_top = n;
  for (int i = 0; i < n; ++i) {
    r.top_ids[i] = idx[i];
    r.top_logprobs[i] = static_cast<float>(logits[idx[i]] - lse);
  }
}

int32_t score_rank(const float* logits, int64_t vocab, int32_t noise, int32_t token) {
  if (token < 0 || token >= vocab || token == noise || std::isnan(logits[token])) return 0;
  const float x = logits[token];
  int64_t above = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (v != noise && logits[v] > x) ++above;  // NaN compares false
  return static_cast<int32_t>(std::min<int64_t>(above + 1, INT32_MAX));
}

void sample_rows_host(const SampleInputs& in, std::span<const SampleRow> rows, std::span<SampleRowResult> out,
                      RowSampler& s, std::vector<int32_t>& scratch) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& row = rows[i];
    SampleRowResult& r = out[i];
    r = SampleRowResult{};
    const float* z = in.logits + static_cast<int64_t>(row.logits_row) * in.vocab;
    if (row.score >= 0) {  // a score row: nothing is drawn
      r.token = row.score;
      row_logprobs(z, in.vocab, in.noise, r.token, std::max(row.top_logprobs, 0), scratch, r);
      r.token_rank = score_rank(z, in.vocab, in.noise, row.score);
      continue;
    }
    s.prepare(z, row, in);
    if (row.draft >= 0) {
      const float* q = row.q_row >= 0 && in.q ? in.q + static_cast<int64_t>(row.q_row) * in.vocab : nullptr;
      bool acc;
      if (s.greedy()) {
        acc = row.draft == s.argmax();
      } else {
        const double px = s.prob(row.draft);  // 0 outside the vocabulary: never accepted
        const double qx = q && row.draft < in.vocab ? static_cast<double>(q[row.draft]) : 1.0;
        acc = px > 0 && rng_uniform(row.seed, row.position, RngStream::kAccept) * qx < px;  // u < min(1, p/q)
      }
      r.accepted = acc ? 1 : 0;
      r.token = acc ? row.draft
                    : s.sample_residual(q, row.draft, rng_uniform(row.seed, row.position, RngStream::kResidual));
    } else {
      r.token = s.sample(rng_uniform(row.seed, row.position, RngStream::kSample));
    }
    if (row.top_logprobs >= 0) row_logprobs(z, in.vocab, in.noise, r.token, row.top_logprobs, scratch, r);
  }
}

}  // namespace tandem
