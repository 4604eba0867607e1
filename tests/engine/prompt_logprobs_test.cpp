// Prompt log-probabilities (SamplingParams::prompt_logprobs, the completions API's echo + logprobs):
// every prompt token after the first gets its raw log-probability, rank and top alternatives from
// the step's score rows, equal to the model's own log-softmax whatever the chunking, the step's
// sampled-row limit, the prefix cache, preemption or what else shares the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness.h"

namespace tandem::testing {
namespace {

constexpr int64_t kVocab = 64;

FakeModelConfig fake_config(int64_t max_sample_rows = 0) {
  FakeModelConfig fc;
  fc.vocab_size = kVocab;
  fc.max_sample_rows = max_sample_rows;
  return fc;
}

// The oracle: log_softmax of the fake model's raw logits after prompt[0..i] at prompt[i + 1] (the
// noise token left out, the sum in id order as the host sampler takes it), its rank (1 + the ids
// with a greater logit) and the top n by (value desc, id asc).
std::vector<TokenLogprob> expected_prompt_logprobs(const FakeModelRunner& m, const std::vector<int32_t>& prompt, int n) {
  std::vector<TokenLogprob> out;
  std::vector<float> z;
  const int32_t noise = m.noise_token_id();
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    m.reference_logits(std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(i) + 1), z);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t v = 0; v < kVocab; ++v)
      if (v != noise) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < kVocab; ++v)
      if (v != noise) sum += std::exp(static_cast<double>(z[v]) - mx);
    const double lse = mx + std::log(sum);
    TokenLogprob lp;
    lp.token = prompt[i + 1];
    lp.logprob = static_cast<float>(z[lp.token] - lse);
    lp.rank = 1;
    std::vector<int32_t> ids;
    for (int64_t v = 0; v < kVocab; ++v) {
      if (v == noise) continue;
      ids.push_back(static_cast<int32_t>(v));
      if (z[v] > z[lp.token]) ++lp.rank;
    }
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    for (int k = 0; k < n; ++k) lp.top.emplace_back(ids[k], static_cast<float>(z[ids[k]] - lse));
    out.push_back(lp);
  }
  return out;
}

void expect_equal(const std::vector<TokenLogprob>& got, const std::vector<TokenLogprob>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << what << " entry " << i;
    EXPECT_EQ(got[i].logprob, want[i].logprob) << what << " entry " << i;  // the same operations: the same bits
    EXPECT_EQ(got[i].rank, want[i].rank) << what << " entry " << i;
    EXPECT_EQ(got[i].top, want[i].top) << what << " entry " << i;
  }
}

SamplingParams scoring(int max_tokens, int n) {
  SamplingParams sp = greedy_params(max_tokens);
  sp.prompt_logprobs = n;
  return sp;
}

TEST(PromptLogprobs, EqualTheModelsLogSoftmaxOnTheFirstEventOnly) {
  Harness h(fake_config(), small_config(4));
  const auto prompt = make_prompt(7, 40, kVocab);
  ASSERT_TRUE(h.submit("a", prompt, scoring(6, 3)).ok());
  h.run();
  const Collected& c = h.results["a"];
  expect_equal(c.prompt_logprobs, expected_prompt_logprobs(*h.fake, prompt, 3), "40-token prompt");
  EXPECT_EQ(c.prompt_logprob_events, 1);
  EXPECT_EQ(c.tokens, reference_greedy(*h.fake, prompt, 6)) << "scoring the prompt changed the output";
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.usage.completion_tokens, 6);
  // Asked with no alternatives: the same entries without tops.
  ASSERT_TRUE(h.submit("b", prompt, scoring(2, 0)).ok());
  h.run();
  expect_equal(h.results["b"].prompt_logprobs, expected_prompt_logprobs(*h.fake, prompt, 0), "no alternatives");
}

// Chunks of a few tokens, a runner that samples at most 7 rows a step (the fake model refuses
// more), DSpark drafting and other requests decoding in the same steps: the same entries, and the
// other requests' outputs unchanged.
TEST(PromptLogprobs, SameUnderChunkingSampledRowLimitsAndSharedSteps) {
  const auto prompt = make_prompt(11, 100, kVocab);
  const auto want = expected_prompt_logprobs(*std::make_unique<FakeModelRunner>(fake_config()), prompt, 5);
  for (int64_t max_rows : {0, 7, 2}) {
    for (int budget : {256, 16, 5}) {
      EngineConfig ec = with_spec(small_config(4), "fixed");
      ec.max_num_batched_tokens = budget;
      Harness h(fake_config(max_rows), ec);
      for (int i = 0; i < 2; ++i)
        ASSERT_TRUE(h.submit("other" + std::to_string(i), make_prompt(30 + i, 9, kVocab), greedy_params(40)).ok());
      h.step();
      ASSERT_TRUE(h.submit("scored", prompt, scoring(12, 5)).ok());
      h.run();
      const std::string what = "max_sample_rows " + std::to_string(max_rows) + ", budget " + std::to_string(budget);
      expect_equal(h.results["scored"].prompt_logprobs, want, what);
      EXPECT_EQ(h.results["scored"].tokens, reference_greedy(*h.fake, prompt, 12)) << what;
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(h.results["other" + std::to_string(i)].tokens,
                  reference_greedy(*h.fake, make_prompt(30 + i, 9, kVocab), 40))
            << what;
    }
  }
}

// A scored prompt takes no prefix hit (cached positions have no logits) but the cache keeps serving
// everyone else, the scored request's blocks included.
TEST(PromptLogprobs, ScoredPromptsBypassThePrefixCacheWithoutDisablingIt) {
  Harness h(fake_config(), small_config(4));
  const auto prompt = make_prompt(21, 70, kVocab);
  ASSERT_TRUE(h.submit("warm", prompt, greedy_params(3)).ok());
  h.run();
  ASSERT_TRUE(h.submit("scored", prompt, scoring(3, 2)).ok());
  h.run();
  expect_equal(h.results["scored"].prompt_logprobs, expected_prompt_logprobs(*h.fake, prompt, 2), "after a warm-up");
  EXPECT_EQ(h.results["scored"].usage.cached_tokens, 0);
  ASSERT_TRUE(h.submit("again", prompt, greedy_params(3)).ok());
  h.run();
  EXPECT_GT(h.results["again"].usage.cached_tokens, 0);
  EXPECT_EQ(h.results["again"].tokens, h.results["warm"].tokens);
}

// max_tokens 0 scores the prompt and generates nothing; without prompt_logprobs it is refused, as
// is an n outside [0, 20].
TEST(PromptLogprobs, MaxTokensZeroScoresOnly) {
  Harness h(fake_config(), small_config(4));
  const auto prompt = make_prompt(5, 33, kVocab);
  ASSERT_TRUE(h.submit("zero", prompt, scoring(0, 1)).ok());
  ASSERT_TRUE(h.submit("one", {9}, scoring(0, 1)).ok());
  h.run();
  const Collected& c = h.results["zero"];
  expect_equal(c.prompt_logprobs, expected_prompt_logprobs(*h.fake, prompt, 1), "max_tokens 0");
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.usage.completion_tokens, 0);
  EXPECT_EQ(c.usage.prompt_tokens, 33);
  EXPECT_EQ(h.results["one"].finish, FinishReason::kLength);  // a one-token prompt has nothing to score
  EXPECT_TRUE(h.results["one"].prompt_logprobs.empty());
  EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
  EXPECT_FALSE(h.submit("bad0", prompt, greedy_params(0)).ok());
  EXPECT_FALSE(h.submit("bad21", prompt, scoring(1, 21)).ok());
  EXPECT_FALSE(h.submit("bad-2", prompt, scoring(1, -2)).ok());
}

// A pool too small for everyone: scored requests are preempted and resumed (some mid-prompt) and
// still report every prompt token once, with the same values.
TEST(PromptLogprobs, SurvivePreemption) {
  EngineConfig tight = with_spec(small_config(4), "fixed");
  tight.max_num_batched_tokens = 24;
  const int64_t block_bytes = FakeModelRunner(fake_config()).kv_bytes_per_block(16, "fp8") +
                              FakeModelRunner(fake_config()).slot_state_bytes();
  tight.kv_cache_memory = block_bytes * 20;
  Harness h(fake_config(), tight);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(make_prompt(60 + i, 60, kVocab));
    ASSERT_TRUE(h.submit("r" + std::to_string(i), prompts.back(), scoring(80, 2)).ok());
  }
  h.run();
  EXPECT_GT(h.core->metrics(true).num_preemptions_total, 0);
  for (int i = 0; i < 4; ++i) {
    const Collected& c = h.results["r" + std::to_string(i)];
    expect_equal(c.prompt_logprobs, expected_prompt_logprobs(*h.fake, prompts[i], 2), "request " + std::to_string(i));
    EXPECT_EQ(c.prompt_logprob_events, 1);
    EXPECT_EQ(c.tokens, reference_greedy(*h.fake, prompts[i], 80));
  }
  EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
}

}  // namespace
}  // namespace tandem::testing
