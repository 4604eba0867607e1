// Sampling as an op of the backend: every row of a step's logits that must yield a token is
// described by a SampleRow (built by the engine, uploaded once per step on a GPU), and the op says
// whether the row's draft token is accepted and which token the row draws otherwise, with raw
// log-probabilities. Logits never leave the backend that produced them. One implementation per
// backend, both following the order of operations below and the same counter-based RNG:
//   host:   kernels/cpu/sampling.cpp (RowSampler, sample_rows_host)
//   device: kernels/cuda/sample_rows.cu (sample_rows_device)
//
// Per row: z = logits row; penalties (repetition on prompt and output tokens, then frequency and
// presence on output counts); the DSpark noise token and the grammar mask set to -inf (a grammar
// dead end, no allowed finite logit, sets EOS to 0); argmax (first maximum). Greedy when
// is_greedy(temperature) (T < 1e-5): accept = (draft == argmax), token = argmax. Otherwise
// p = softmax(z / T) over top-k, then top-p (sorted by p, ties by lower id, kept until the sum
// reaches top_p), then min-p, renormalized each time. A draft x is accepted when p(x) > 0 and
// u_accept * q(x) < p(x) (q(x) = the stored draft distribution, or 1 for a one-hot draft);
// token = a draw from norm(max(0, p - q)) with u_residual (from p when that mass is 0) for draft
// rows, a draw from p with u_sample for plain rows. Draws walk the vocabulary in id order
// (inverse CDF). A score row (SampleRow::score >= 0, a prompt token's log-probability) samples
// nothing: its token is the scored one, with its raw log-probability, its rank and the top n.
#pragma once

#include <cstdint>

#include "common/numeric_core.h"

namespace tandem {

inline constexpr int kMaxTopLogprobs = 20;        // OpenAI's top_logprobs limit
inline constexpr double kGreedyTemperature = 1e-5;  // below it a row is greedy

// The one greedy predicate, host and device: the samplers' rows, the runners' drafts and the CUDA
// draft kernel all take the argmax (and a one-hot q) exactly when this holds.
TANDEM_HD bool is_greedy(double temperature) { return temperature < kGreedyTemperature; }

// Independent random streams per (seed, position).
enum class RngStream : uint64_t { kSample = 1, kAccept = 2, kResidual = 3, kDraft = 4 };

TANDEM_HD uint64_t rng_mix64(uint64_t z) {  // splitmix64 (common/hash.h's mix64)
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) keyed by (seed, position, stream): a request's draws never depend on batching.
TANDEM_HD double rng_uniform(uint64_t seed, int64_t position, RngStream stream) {
  const uint64_t h =
      rng_mix64(rng_mix64(rng_mix64(seed) ^ static_cast<uint64_t>(position)) ^ static_cast<uint64_t>(stream));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

// One row to sample. Offsets index the arrays of SampleInputs.
struct SampleRow {
  int32_t logits_row = 0;    // row of the step's logits [rows, vocab]
  int32_t draft = -1;        // the draft token this row verifies; -1 = a plain draw
  int32_t q_row = -1;        // row of the draft distributions [*, vocab]; -1 = q one-hot at draft
  int32_t mask_row = -1;     // row of the grammar bitmasks [*, mask_words] (bit set = allowed); -1 = none
  int32_t prompt_begin = 0;  // sorted unique prompt ids (only with a repetition penalty)
  int32_t prompt_count = 0;
  int32_t counts_begin = 0;  // (token, count) pairs, unique tokens: the output so far, drafts
  int32_t counts_count = 0;  //   before this row included (only with penalties)
  int32_t top_logprobs = -1; // -1: no logprobs; n >= 0: the emitted token's logprob and the top n
  // >= 0: a score row: token = score (nothing drawn, accepted 0) with its raw log-probability and
  // rank; top_logprobs must be >= 0. -1: a sampled row.
  int32_t score = -1;
  int32_t top_k = 0;         // 0 = off
  double temperature = 0.0;
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  uint64_t seed = 0;
  int64_t position = 0;      // position of the token this row chooses (keys the RNG)
};

struct SampleRowResult {
  int32_t accepted = 0;       // 1: the draft is accepted (rows with a draft)
  int32_t token = 0;          // the token this row emits: the draft when accepted, else the draw
  float token_logprob = 0.0f; // raw log-softmax of `token` (noise token left out; top_logprobs >= 0)
  // Score rows only: 1 + the ids (noise and NaN left out) whose raw logit is greater than the
  // scored token's (ties share a rank); 0 for the noise token and on other rows.
  int32_t token_rank = 0;
  int32_t num_top = 0;        // min(top_logprobs, vocab - noise): the top ids, highest first,
  int32_t top_ids[kMaxTopLogprobs] = {};  // ties towards the lower id
  float top_logprobs[kMaxTopLogprobs] = {};
};

// The arrays a batch of SampleRows indexes (host pointers for the host op, device pointers for the
// device op). Unused arrays may be null.
struct SampleInputs {
  const float* logits = nullptr;     // [rows, vocab]
  const float* q = nullptr;          // [q rows, vocab] draft distributions
  const uint32_t* masks = nullptr;   // [mask rows, mask_words]
  const int32_t* prompt_ids = nullptr;
  const int32_t* counts = nullptr;   // pairs: token, count
  int64_t vocab = 0;
  int64_t mask_words = 0;            // (vocab + 31) / 32
  int32_t eos = -1;
  int32_t noise = -1;                // the DSpark noise token (never emitted); -1 = none
};

}  // namespace tandem
