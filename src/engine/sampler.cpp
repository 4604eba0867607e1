// Sampler: see sampler.h. Order of operations follows vLLM: penalties on logits, masks, greedy
// argmax (temperature ~0), else temperature, top-k and top-p on logits/probs, then min-p.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/hash.h"

namespace tandem {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kGreedyTemperature = 1e-5;
}  // namespace

double rng_uniform(uint64_t seed, int64_t position, RngStream stream) {
  uint64_t h = mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(position)) ^ static_cast<uint64_t>(stream));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

void PenaltyState::init(const SamplingParams& sp, std::span<const int32_t> prompt) {
  output_counts.clear();
  prompt_unique.clear();
  if (sp.repetition_penalty != 1.0) {
    prompt_unique.assign(prompt.begin(), prompt.end());
    std::sort(prompt_unique.begin(), prompt_unique.end());
    prompt_unique.erase(std::unique(prompt_unique.begin(), prompt_unique.end()), prompt_unique.end());
  }
}

Sampler::Sampler(int64_t vocab_size, int32_t eos_token_id, int32_t noise_token_id)
    : vocab_(vocab_size), eos_(eos_token_id), noise_(noise_token_id) {
  z_.resize(vocab_);
  p_.resize(vocab_);
  idx_.resize(vocab_);
  resid_.resize(vocab_);
}

void Sampler::prepare(const float* logits, const SamplingParams& sp, const PenaltyState& pen,
                      TokenConstraint* constraint) {
  std::copy(logits, logits + vocab_, z_.begin());
  // Penalties.
  if (sp.repetition_penalty != 1.0) {
    const float r = static_cast<float>(sp.repetition_penalty);
    auto apply = [&](int32_t t) {
      if (t < 0 || t >= vocab_) return;
      z_[t] = z_[t] > 0 ? z_[t] / r : z_[t] * r;
    };
    for (int32_t t : pen.prompt_unique) apply(t);
    for (const auto& [t, c] : pen.output_counts)
      if (!std::binary_search(pen.prompt_unique.begin(), pen.prompt_unique.end(), t)) apply(t);
  }
  if (sp.frequency_penalty != 0.0 || sp.presence_penalty != 0.0) {
    for (const auto& [t, c] : pen.output_counts) {
      if (t < 0 || t >= vocab_) continue;
      z_[t] -= static_cast<float>(sp.frequency_penalty * c + sp.presence_penalty * (c > 0 ? 1 : 0));
    }
  }
  // Masks: the DSpark noise token is never emitted; the grammar decides the rest.
  if (noise_ >= 0 && noise_ < vocab_) z_[noise_] = kNegInf;
  if (constraint) {
    allowed_.assign(vocab_, false);
    constraint->allowed_tokens(allowed_);
    if (!constraint->is_complete() && eos_ >= 0 && eos_ < vocab_) allowed_[eos_] = false;
    bool any = false;
    for (int64_t v = 0; v < vocab_; ++v) {
      if (!allowed_[v]) z_[v] = kNegInf;
      else any = any || z_[v] != kNegInf;
    }
    if (!any && eos_ >= 0 && eos_ < vocab_) z_[eos_] = 0.f;  // dead end: end the output
  }
  // Argmax (first maximum, so ties break towards the lower id).
  int32_t best = -1;
  for (int64_t v = 0; v < vocab_; ++v)
    if (z_[v] != kNegInf && (best < 0 || z_[v] > z_[best])) best = static_cast<int32_t>(v);
  if (best < 0) best = eos_ >= 0 ? eos_ : 0;
  argmax_ = best;
  greedy_ = sp.temperature < kGreedyTemperature;
  if (greedy_) return;

  const double inv_t = 1.0 / sp.temperature;
  // top-k on logits: keep values >= the k-th largest.
  float kth = kNegInf;
  if (sp.top_k > 0 && sp.top_k < vocab_) {
    int64_t n = 0;
    for (int64_t v = 0; v < vocab_; ++v)
      if (z_[v] != kNegInf) idx_[n++] = static_cast<int32_t>(v);
    if (sp.top_k < n) {
      std::nth_element(idx_.begin(), idx_.begin() + (sp.top_k - 1), idx_.begin() + n,
                       [&](int32_t a, int32_t b) { return z_[a] > z_[b]; });
      kth = z_[idx_[sp.top_k - 1]];
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
  if (sp.top_p < 1.0) {
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
      if (cum >= sp.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0;
    for (int64_t i = keep; i < n; ++i) p_[idx_[i]] = 0;
    for (int64_t i = 0; i < keep; ++i) kept += p_[idx_[i]];
    for (int64_t i = 0; i < keep; ++i) p_[idx_[i]] /= kept;
  }
  if (sp.min_p > 0.0) {
    double pmax = 0;
    for (int64_t v = 0; v < vocab_; ++v) pmax = std::max(pmax, p_[v]);
    double cut = sp.min_p * pmax, kept = 0;
    for (int64_t v = 0; v < vocab_; ++v) {
      if (p_[v] < cut) p_[v] = 0;
      kept += p_[v];
    }
    for (int64_t v = 0; v < vocab_; ++v) p_[v] /= kept;
  }
}

double Sampler::prob(int32_t token) const {
  if (token < 0 || token >= vocab_) return 0.0;
  if (greedy_) return token == argmax_ ? 1.0 : 0.0;
  return p_[token];
}

int32_t Sampler::sample(double u) const {
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

int32_t Sampler::sample_residual(std::span<const float> q, int32_t draft, double u) {
  if (greedy_) return argmax_;
  double sum = 0;
  for (int64_t v = 0; v < vocab_; ++v) {
    double qv = q.empty() ? (v == draft ? 1.0 : 0.0) : static_cast<double>(q[v]);
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

void Sampler::logprobs(const float* logits, int32_t token, int n, TokenLogprob& out) {
  // Raw model distribution, except that the noise token (never emitted) is left out.
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < vocab_; ++v)
    if (v != noise_) mx = std::max(mx, static_cast<double>(logits[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab_; ++v)
    if (v != noise_) sum += std::exp(static_cast<double>(logits[v]) - mx);
  const double lse = mx + std::log(sum);
  out.token = token;
  out.logprob = token >= 0 && token < vocab_ ? static_cast<float>(logits[token] - lse) : kNegInf;
  out.top.clear();
  if (n <= 0) return;
  int64_t m = 0;
  for (int64_t v = 0; v < vocab_; ++v)
    if (v != noise_) idx_[m++] = static_cast<int32_t>(v);
  n = static_cast<int>(std::min<int64_t>(n, m));
  std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.begin() + m, [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int i = 0; i < n; ++i) out.top.emplace_back(idx_[i], static_cast<float>(logits[idx_[i]] - lse));
}

}  // namespace tandem
