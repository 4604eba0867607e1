// Sampler: turns one row of raw logits into the request's processed distribution p (noise-token
// and grammar masks, repetition/frequency/presence penalties, temperature, top-k, top-p, min-p)
// and draws from it with a counter-based RNG keyed by (seed, position, stream), so a request's
// samples do not depend on batching or on what else runs. The same p feeds lossless speculative
// verification (accept x with prob min(1, p(x)/q(x)), else resample from norm(max(0, p - q))).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace tandem {

// Independent random streams per (seed, position).
enum class RngStream : uint64_t { kSample = 1, kAccept = 2, kResidual = 3 };
double rng_uniform(uint64_t seed, int64_t position, RngStream stream);  // [0,1)

// Per-request state the penalties read.
struct PenaltyState {
  std::unordered_map<int32_t, int32_t> output_counts;
  std::vector<int32_t> prompt_unique;  // sorted unique prompt ids (only with repetition_penalty)
  void init(const SamplingParams& sp, std::span<const int32_t> prompt);
  void add_output(int32_t token) { ++output_counts[token]; }
};

class Sampler {
 public:
  Sampler(int64_t vocab_size, int32_t eos_token_id, int32_t noise_token_id);

  // Builds p for one row. `constraint` may be null; `allow_eos` false masks EOS (grammar incomplete).
  void prepare(const float* logits, const SamplingParams& sp, const PenaltyState& pen,
               TokenConstraint* constraint);
  bool greedy() const { return greedy_; }
  int32_t argmax() const { return argmax_; }
  // p(token) of the prepared distribution (one-hot at argmax when greedy).
  double prob(int32_t token) const;
  // Draws from p with a uniform u in [0,1).
  int32_t sample(double u) const;
  // Draws from norm(max(0, p - q)) where q is a full draft distribution, or one-hot at `draft` when
  // q is empty; falls back to p when that mass is zero.
  int32_t sample_residual(std::span<const float> q, int32_t draft, double u);
  // Raw-model log-probabilities (log_softmax of the unprocessed logits) of `token` and the top n.
  void logprobs(const float* logits, int32_t token, int n, TokenLogprob& out);

  int64_t vocab_size() const { return vocab_; }

 private:
  int64_t vocab_;
  int32_t eos_;
  int32_t noise_;
  bool greedy_ = true;
  int32_t argmax_ = 0;
  std::vector<float> z_;      // processed logits
  std::vector<double> p_;     // processed probabilities
  std::vector<int32_t> idx_;  // scratch for top-k / top-p / logprobs
  std::vector<bool> allowed_;
  std::vector<double> resid_;
};

}  // namespace tandem
