// PenaltyState and SampleRowsBuilder: see sampler.h.
#include "engine/sampler.h"

#include <algorithm>

namespace tandem {

void PenaltyState::init(const SamplingParams& sp, std::span<const int32_t> prompt) {
  output_counts.clear();
  prompt_unique.clear();
  if (sp.repetition_penalty != 1.0) {
    prompt_unique.assign(prompt.begin(), prompt.end());
    std::sort(prompt_unique.begin(), prompt_unique.end());
    prompt_unique.erase(std::unique(prompt_unique.begin(), prompt_unique.end()), prompt_unique.end());
  }
}

void SampleRowsBuilder::append_score(int32_t token, int top_n, int64_t position, StepSamples& out) {
  SampleRow& r = out.rows.emplace_back();
  r.score = token;
  r.top_logprobs = std::clamp(top_n, 0, kMaxTopLogprobs);
  r.temperature = 0.0;
  r.position = position;
}

void SampleRowsBuilder::append(const SamplingParams& sp, const PenaltyState& pen, TokenConstraint* constraint,
                               uint64_t seed, int64_t position, std::span<const int32_t> draft, bool draft_sampled,
                               StepSamples& out) {
  const int rows = static_cast<int>(draft.size()) + 1;
  SampleRow base;
  base.top_logprobs = sp.logprobs >= 0 ? std::min(sp.logprobs, kMaxTopLogprobs) : -1;
  base.top_k = sp.top_k;
  base.temperature = sp.temperature;
  base.top_p = sp.top_p;
  base.min_p = sp.min_p;
  base.repetition_penalty = sp.repetition_penalty;
  base.frequency_penalty = sp.frequency_penalty;
  base.presence_penalty = sp.presence_penalty;
  base.seed = seed;
  // Penalties: the prompt once per sequence, the output counts per row (drafts before the row added).
  const bool penalties = sp.repetition_penalty != 1.0 || sp.frequency_penalty != 0.0 || sp.presence_penalty != 0.0;
  if (sp.repetition_penalty != 1.0) {
    base.prompt_begin = static_cast<int32_t>(out.prompt_ids.size());
    base.prompt_count = static_cast<int32_t>(pen.prompt_unique.size());
    out.prompt_ids.insert(out.prompt_ids.end(), pen.prompt_unique.begin(), pen.prompt_unique.end());
  }
  if (penalties) {
    base_.assign(pen.output_counts.begin(), pen.output_counts.end());
    std::sort(base_.begin(), base_.end());  // a fixed order: the same rows for the same state
  }
  // Grammar: masks for every row from a copy advanced through the drafts.
  std::unique_ptr<TokenConstraint> walk;
  int mask_base = -1;
  if (constraint) {
    out.mask_words = (vocab + 31) / 32;
    mask_base = static_cast<int>(out.masks.size() / std::max<int64_t>(out.mask_words, 1));
    if (rows > 1) walk = constraint->clone();
  }
  bool forbidden = false;  // a draft the grammar forbids: later rows are never used
  for (int j = 0; j < rows; ++j) {
    SampleRow r = base;
    r.draft = j < rows - 1 ? draft[j] : -1;
    r.q_row = j < rows - 1 && draft_sampled ? j : -1;
    r.position = position + j;
    if (penalties) {
      r.counts_begin = static_cast<int32_t>(out.counts.size() / 2);
      extra_.clear();
      for (int k = 0; k < j; ++k) ++extra_[draft[k]];
      for (const auto& [t, c] : base_) {
        auto it = extra_.find(t);
        int32_t n = c;
        if (it != extra_.end()) {
          n += it->second;
          extra_.erase(it);
        }
        out.counts.push_back(t);
        out.counts.push_back(n);
      }
      for (int k = 0; k < j; ++k) {  // drafts not yet in the output, in draft order
        auto it = extra_.find(draft[k]);
        if (it == extra_.end()) continue;
        out.counts.push_back(it->first);
        out.counts.push_back(it->second);
        extra_.erase(it);
      }
      r.counts_count = static_cast<int32_t>(out.counts.size() / 2) - r.counts_begin;
    }
    if (constraint) {
      r.mask_row = mask_base + j;
      TokenConstraint& c = j == 0 || !walk ? *constraint : *walk;
      if (!forbidden) {
        allowed_.assign(static_cast<size_t>(vocab), false);
        c.allowed_tokens(allowed_);
        if (!c.is_complete() && eos >= 0 && eos < vocab) allowed_[eos] = false;
      }
      const size_t at = out.masks.size();
      out.masks.resize(at + static_cast<size_t>(out.mask_words), 0u);
      for (int64_t v = 0; v < vocab; ++v)
        if (allowed_[v]) out.masks[at + (v >> 5)] |= 1u << (v & 31);
      if (j < rows - 1 && !forbidden) {
        const int32_t d = draft[j];
        if (d < 0 || d >= vocab || !allowed_[d]) forbidden = true;
        else walk->accept_token(d);
      }
    }
    out.rows.push_back(r);
  }
}

}  // namespace tandem
