// One check for both model runners (tests/engine runs it on the CPU model, tests/cuda on the CUDA
// model): a draft at a temperature below kGreedyTemperature (1e-6) is greedy on either backend
// (is_greedy, kernels/sampling.h): the temperature-0 tokens and confidences, and not a sampled
// proposal (no q kept for verification); at temperature 1 the same draft is a sampled one, so the
// check tells the two apart.
#pragma once

#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "engine/model_runner.h"

namespace tandem::testing {

inline void expect_tiny_temperature_drafts_greedily(ModelRunner& r, std::span<const int32_t> prompt) {
  ASSERT_TRUE(r.has_draft());
  RunnerAllocation a;
  a.num_blocks = 4;
  a.block_size = 128;
  a.max_slots = 1;
  a.max_tokens_per_step = static_cast<int>(prompt.size());
  a.num_draft_tokens = r.num_draft_tokens();
  a.max_verify_tokens = a.num_draft_tokens + 1;
  a.kv_cache_dtype = "bf16";
  ASSERT_TRUE(r.allocate(a).ok());
  const std::vector<int32_t> table = {0, 1};
  RunnerSeq s;
  s.slot = 0;
  s.tokens = prompt.first(prompt.size() - 1);
  s.block_table = table;
  s.collect_taps = true;
  s.reset = true;
  RunnerOutput out;
  ASSERT_TRUE(r.forward(std::span<const RunnerSeq>(&s, 1), nullptr, out).ok());
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  ASSERT_TRUE(r.commit(std::vector<SlotCommit>{{0, 0, n, n, -1}}).ok());
  auto propose = [&](double temperature) {
    std::vector<DraftQuery> q = {{0, prompt.back(), n, temperature, 11}};
    std::vector<DraftProposal> p;
    Status st = r.draft_propose(q, p);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return p.empty() ? DraftProposal() : p[0];
  };
  const DraftProposal greedy = propose(0.0), tiny = propose(1e-6), warm = propose(1.0);
  ASSERT_EQ(greedy.tokens.size(), static_cast<size_t>(a.num_draft_tokens));
  EXPECT_FALSE(greedy.sampled);
  EXPECT_FALSE(tiny.sampled) << "a draft at temperature 1e-6 must be greedy (is_greedy), not sampled";
  EXPECT_EQ(tiny.tokens, greedy.tokens);
  EXPECT_EQ(tiny.confidence, greedy.confidence);
  EXPECT_TRUE(warm.sampled) << "temperature 1 must sample";
}

}  // namespace tandem::testing
