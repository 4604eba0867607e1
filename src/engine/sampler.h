// The engine's side of sampling: it turns a request's sampling parameters, penalty state and
// grammar into the SampleRows of a step (kernels/sampling.h), which the runner's sampler (the host
// RowSampler or the CUDA op) runs next to the logits. Counter-based RNG keyed by (seed, position,
// stream): a request's samples do not depend on batching or on what else runs.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/model_runner.h"

namespace tandem {

// Per-request state the penalties read.
struct PenaltyState {
  std::unordered_map<int32_t, int32_t> output_counts;
  std::vector<int32_t> prompt_unique;  // sorted unique prompt ids (only with repetition_penalty)
  void init(const SamplingParams& sp, std::span<const int32_t> prompt);
  void add_output(int32_t token) { ++output_counts[token]; }
};

// Appends one sequence's rows to `out`: row j < draft.size() verifies draft[j], the last row draws
// the token after the drafts. Row j's token sits at position + j; its penalties count the drafts
// before it; its grammar mask comes from a copy of `constraint` advanced through those drafts (EOS
// cleared while the grammar is incomplete; rows after a draft the grammar forbids are never used).
// q_row = j when the proposal was sampled (the runner maps it to its stored q), else -1.
struct SampleRowsBuilder {
  int64_t vocab = 0;
  int32_t eos = -1;
  void append(const SamplingParams& sp, const PenaltyState& pen, TokenConstraint* constraint, uint64_t seed,
              int64_t position, std::span<const int32_t> draft, bool draft_sampled, StepSamples& out);
  // A score row (SampleRow::score): the raw log-probability and rank of `token` at `position`, with
  // the top `top_n` alternatives; greedy, unmasked, no penalties (nothing is drawn).
  static void append_score(int32_t token, int top_n, int64_t position, StepSamples& out);

 private:
  std::vector<bool> allowed_;
  std::vector<std::pair<int32_t, int32_t>> base_;
  std::unordered_map<int32_t, int32_t> extra_;
};

}  // namespace tandem
