// The host implementation of the sampling op (kernels/sampling.h): RowSampler turns one row of
// logits into its processed distribution p and draws from it; sample_rows_host runs a step's rows.
// It is the CPU backend's only sampler (target rows, speculative acceptance and the CPU draft's
// draws all go through it) and the reference the CUDA op is tested against.
#pragma once

#include <span>
#include <vector>

#include "kernels/sampling.h"

namespace tandem {

class RowSampler {
 public:
  explicit RowSampler(int64_t vocab_size);

  // Builds p for `row` over `logits` (one row of in.vocab floats); in's arrays are host pointers.
  void prepare(const float* logits, const SampleRow& row, const SampleInputs& in);
  bool greedy() const { return greedy_; }
  int32_t argmax() const { return argmax_; }
  // p(token) of the prepared distribution (one-hot at argmax when greedy).
  double prob(int32_t token) const;
  // The prepared distribution as floats (one-hot when greedy): a sampled draft's q.
  void probs(float* out) const;
  // Draws from p with a uniform u in [0,1).
  int32_t sample(double u) const;
  // Draws from norm(max(0, p - q)) where q is a full draft distribution, or one-hot at `draft` when
  // q is null; falls back to p when that mass is zero.
  int32_t sample_residual(const float* q, int32_t draft, double u);

 private:
  int64_t vocab_;
  bool greedy_ = true;
  int32_t argmax_ = 0;
  std::vector<float> z_;      // processed logits
  std::vector<double> p_;     // processed probabilities
  std::vector<int32_t> idx_;  // scratch for top-k / top-p
  std::vector<double> resid_;
};

// Raw-model log-probabilities (log_softmax of the unprocessed logits, the noise token left out) of
// `token` and the top n (n <= kMaxTopLogprobs) into r.
void row_logprobs(const float* logits, int64_t vocab, int32_t noise, int32_t token, int n,
                  std::vector<int32_t>& scratch, SampleRowResult& r);

// A score row's rank of `token` (SampleRowResult::token_rank): 1 + the ids, noise and NaN left
// out, whose raw logit is greater; 0 for the noise token, a NaN logit or an id outside the vocabulary.
int32_t score_rank(const float* logits, int64_t vocab, int32_t noise, int32_t token);

// Runs every row (the op's host implementation).
void sample_rows_host(const SampleInputs& in, std::span<const SampleRow> rows, std::span<SampleRowResult> out,
                      RowSampler& sampler, std::vector<int32_t>& scratch);

}  // namespace tandem
