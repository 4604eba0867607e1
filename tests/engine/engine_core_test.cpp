// EngineCore on the fake model: speculative == plain greedy, batching invariance, preemption,
// cancellation, prefix hits with exact block ids, randomized arrivals with integrity every step.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <random>

#include "harness.h"

namespace tandem::testing {
namespace {

constexpr int64_t kVocab = 64;

FakeModelConfig fake_config(double agree = 0.7) {
  FakeModelConfig fc;
  fc.vocab_size = kVocab;
  fc.draft_agree = agree;
  return fc;
}

// 20 prompts x 200 tokens through the engine with the given config and concurrency; returns
// outputs in prompt order.
std::vector<std::vector<int32_t>> run_prompts(const EngineConfig& ec, int concurrency, int n_prompts, int n_tokens,
                                              EngineMetrics* metrics = nullptr, double agree = 0.7) {
  FakeModelConfig fc = fake_config(agree);
  if (ec.speculative.verify_mode == VerifyMode::kAuto) {
    // auto decides from measured costs: give the fake a bandwidth-bound step (a forward costs
    // about the same for 1 or 48 tokens, a draft a tenth of it) so speculation pays and is used.
    fc.forward_fixed_us = 300;
    fc.forward_per_token_us = 3;
    fc.draft_fixed_us = 30;
    fc.draft_per_seq_us = 5;
  }
  Harness h(fc, ec);
  std::vector<std::vector<int32_t>> out(n_prompts);
  int next = 0, done = 0;
  auto top_up = [&] {
    while (next < n_prompts && h.core->num_running() + h.core->num_waiting() < concurrency) {
      auto p = make_prompt(100 + next, 5 + (next * 37) % 60, kVocab);
      EXPECT_TRUE(h.submit("r" + std::to_string(next), p, greedy_params(n_tokens)).ok());
      ++next;
    }
  };
  top_up();
  while (h.core->has_work()) {
    h.step();
    if (::testing::Test::HasFatalFailure()) return out;
    top_up();
  }
  for (int i = 0; i < n_prompts; ++i) {
    const Collected& c = h.results["r" + std::to_string(i)];
    EXPECT_EQ(c.finish, FinishReason::kLength) << i;
    out[i] = c.tokens;
    ++done;
  }
  EXPECT_EQ(h.fake->draft_context_errors(), 0);
  if (metrics) *metrics = h.core->metrics(true);
  EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
  return out;
}

TEST(EngineCoreSpec, SpeculativeGreedyEqualsPlainGreedy) {
  const int kPrompts = 20, kTokens = 200;
  FakeModelRunner oracle(fake_config());
  std::vector<std::vector<int32_t>> expected(kPrompts);
  for (int i = 0; i < kPrompts; ++i)
    expected[i] = reference_greedy(oracle, make_prompt(100 + i, 5 + (i * 37) % 60, kVocab), kTokens);
  for (int conc : {1, 8}) {
    auto plain = run_prompts(small_config(), conc, kPrompts, kTokens);
    for (int i = 0; i < kPrompts; ++i) ASSERT_EQ(plain[i], expected[i]) << "plain, prompt " << i << " conc " << conc;
    for (const char* mode : {"fixed", "threshold", "auto"}) {
      EngineMetrics m;
      auto spec = run_prompts(with_spec(small_config(), mode), conc, kPrompts, kTokens, &m);
      for (int i = 0; i < kPrompts; ++i)
        ASSERT_EQ(spec[i], expected[i]) << mode << ", prompt " << i << " conc " << conc;
      EXPECT_GT(m.spec_decode_num_accepted_tokens_total, 0) << mode;
      EXPECT_LE(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total);
      // Per-position counters: non-increasing, the first equals drafts with >= 1 accepted.
      for (size_t k = 1; k < m.spec_decode_num_accepted_tokens_per_pos_total.size(); ++k)
        EXPECT_LE(m.spec_decode_num_accepted_tokens_per_pos_total[k],
                  m.spec_decode_num_accepted_tokens_per_pos_total[k - 1]);
      int64_t sum = 0;
      for (int64_t v : m.spec_decode_num_accepted_tokens_per_pos_total) sum += v;
      EXPECT_EQ(sum, m.spec_decode_num_accepted_tokens_total);
    }
  }
}

TEST(EngineCoreSpec, FixedKAcceptanceTracksDraftAgreement) {
  EngineMetrics lo, hi;
  run_prompts(with_spec(small_config(), "fixed"), 8, 8, 100, &lo, 0.3);
  run_prompts(with_spec(small_config(), "fixed"), 8, 8, 100, &hi, 0.95);
  double rlo = double(lo.spec_decode_num_accepted_tokens_total) / lo.spec_decode_num_draft_tokens_total;
  double rhi = double(hi.spec_decode_num_accepted_tokens_total) / hi.spec_decode_num_draft_tokens_total;
  EXPECT_LT(rlo, 0.3);
  EXPECT_GT(rhi, 0.6);
}

TEST(EngineCoreSpec, ThresholdVerifiesFewerTokensWithHigherAcceptance) {
  EngineMetrics fixed, thr;
  run_prompts(with_spec(small_config(), "fixed"), 8, 8, 100, &fixed, 0.6);
  EngineConfig ec = with_spec(small_config(), "threshold");
  ec.speculative.confidence_threshold = 0.5;
  run_prompts(ec, 8, 8, 100, &thr, 0.6);
  EXPECT_LT(thr.spec_decode_num_draft_tokens_total, fixed.spec_decode_num_draft_tokens_total);
  double rf = double(fixed.spec_decode_num_accepted_tokens_total) / fixed.spec_decode_num_draft_tokens_total;
  double rt = double(thr.spec_decode_num_accepted_tokens_total) / thr.spec_decode_num_draft_tokens_total;
  EXPECT_GT(rt, rf);
}

// The engine thread's phase counters: every step that ran a batch is counted, and the phases the
// fake model spins in hold at least that spin (a lower bound, so no timing can make it fail).
TEST(EngineCoreSpec, PhaseSecondsCoverTheRunnersWork) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineMetrics m;
  run_prompts(with_spec(small_config(), "auto"), 4, 6, 40, &m);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_GT(m.engine_steps_total, 0);
  ASSERT_GT(m.spec_decode_num_drafts_total, 0);
  EXPECT_GE(m.engine_forward_s, m.engine_steps_total * 300e-6);  // forward_fixed_us
  EXPECT_GE(m.engine_draft_s, 30e-6);                            // at least one draft call
  for (double v : {m.engine_schedule_s, m.engine_outputs_s, m.engine_commit_s, m.engine_between_steps_s}) EXPECT_GE(v, 0);
  EXPECT_LE(m.engine_schedule_s + m.engine_forward_s + m.engine_outputs_s + m.engine_commit_s + m.engine_draft_s +
                m.engine_between_steps_s,
            wall);
  EXPECT_EQ(m.device_wait_s, -1);  // the fake runner does not measure it
  EXPECT_EQ(m.device_submit_s, -1);
}

// A request's output does not depend on what runs around it (greedy and seeded sampling).
TEST(EngineCore, OutputIndependentOfNeighbours) {
  for (bool spec : {false, true}) {
    // fixed K: verify lengths do not depend on the batch, so seeded sampling is batch-invariant too.
    EngineConfig ec = spec ? with_spec(small_config(4), "fixed") : small_config(4);
    auto target_prompt = make_prompt(7, 50, kVocab);
    SamplingParams greedy = greedy_params(120);
    SamplingParams sampled = greedy_params(120);
    sampled.temperature = 0.9;
    sampled.top_p = 0.9;
    sampled.seed = 1234;

    Harness alone(fake_config(), ec);
    ASSERT_TRUE(alone.submit("g", target_prompt, greedy).ok());
    ASSERT_TRUE(alone.submit("s", target_prompt, sampled).ok());
    alone.run();

    Harness busy(fake_config(), ec);
    std::mt19937_64 rng(99);
    int n = 0;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(busy.submit("pre" + std::to_string(i), make_prompt(200 + i, 30 + 20 * i, kVocab), greedy_params(40 + 10 * i)).ok());
    busy.step();
    ASSERT_TRUE(busy.submit("g", target_prompt, greedy).ok());
    busy.step();
    ASSERT_TRUE(busy.submit("s", target_prompt, sampled).ok());
    while (busy.core->has_work()) {
      busy.step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      if (rng() % 3 == 0 && n < 30) {
        std::string id = "x" + std::to_string(n++);
        SamplingParams sp = greedy_params(1 + rng() % 30);
        if (rng() % 2) sp.temperature = 1.0;
        ASSERT_TRUE(busy.submit(id, make_prompt(300 + n, 1 + rng() % 90, kVocab), sp).ok());
        if (rng() % 4 == 0) busy.core->abort(id);
      }
      if (rng() % 7 == 0 && n > 0) busy.core->abort("x" + std::to_string(rng() % n));
    }
    EXPECT_EQ(busy.results["g"].tokens, alone.results["g"].tokens) << "spec " << spec;
    EXPECT_EQ(busy.results["s"].tokens, alone.results["s"].tokens) << "spec " << spec;
    EXPECT_EQ(busy.results["g"].tokens.size(), 120u);
  }
}

// Same seed, same output, even with a different batch and a different arrival order.
TEST(EngineCore, SeededSamplingIsReproducible) {
  SamplingParams sp = greedy_params(60);
  sp.temperature = 1.0;
  sp.seed = 42;
  Harness a(fake_config(), small_config());
  ASSERT_TRUE(a.submit("a", make_prompt(1, 20, kVocab), sp).ok());
  a.run();
  Harness b(fake_config(), small_config());
  ASSERT_TRUE(b.submit("z", make_prompt(2, 40, kVocab), greedy_params(30)).ok());
  b.step();
  ASSERT_TRUE(b.submit("a", make_prompt(1, 20, kVocab), sp).ok());
  b.run();
  EXPECT_EQ(a.results["a"].tokens, b.results["a"].tokens);
  sp.seed = 43;
  Harness c(fake_config(), small_config());
  ASSERT_TRUE(c.submit("a", make_prompt(1, 20, kVocab), sp).ok());
  c.run();
  EXPECT_NE(a.results["a"].tokens, c.results["a"].tokens);
}

// A pool too small for everyone: requests get preempted, resumed, and still produce the output
// they produce with plenty of memory.
TEST(EngineCore, PreemptAndResumeGiveIdenticalResults) {
  for (bool spec : {false, true}) {
    EngineConfig roomy = spec ? with_spec(small_config(4), "fixed") : small_config(4);
    EngineConfig tight = roomy;
    // 16-token blocks: 4 requests of 40-token prompts + 100 outputs need 4 x 9 = 36 blocks.
    int64_t block_bytes = FakeModelRunner(fake_config()).kv_bytes_per_block(16, "fp8") +
                          FakeModelRunner(fake_config()).slot_state_bytes();
    tight.kv_cache_memory = block_bytes * 20;
    std::vector<std::vector<int32_t>> want, got;
    EngineMetrics m;
    for (int pass = 0; pass < 2; ++pass) {
      Harness h(fake_config(), pass == 0 ? roomy : tight);
      if (pass == 1) {
        ASSERT_EQ(h.core->num_kv_blocks(), 20);
      }
      for (int i = 0; i < 4; ++i) {
        SamplingParams sp = greedy_params(100);
        if (i % 2) {
          sp.temperature = 0.8;
          sp.seed = 10 + i;
        }
        ASSERT_TRUE(h.submit("r" + std::to_string(i), make_prompt(50 + i, 40, kVocab), sp).ok());
      }
      h.run();
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(h.results["r" + std::to_string(i)].finish, FinishReason::kLength);
        (pass == 0 ? want : got).push_back(h.results["r" + std::to_string(i)].tokens);
      }
      if (pass == 1) m = h.core->metrics(true);
      EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
    }
    EXPECT_GT(m.num_preemptions_total, 0) << "spec " << spec;
    for (int i = 0; i < 4; ++i) {
      if (i % 2 == 0 || !spec) EXPECT_EQ(got[i], want[i]) << "request " << i << " spec " << spec;
      else EXPECT_EQ(got[i].size(), want[i].size());  // sampled + spec: same law, other draws
    }
  }
}

TEST(EngineCore, CancellationFreesEverythingAtOnce) {
  Harness h(fake_config(), with_spec(small_config(4), "fixed"));
  ASSERT_TRUE(h.submit("a", make_prompt(1, 200, kVocab), greedy_params(50)).ok());
  ASSERT_TRUE(h.submit("b", make_prompt(2, 20, kVocab), greedy_params(50)).ok());
  ASSERT_TRUE(h.submit("c", make_prompt(3, 20, kVocab), greedy_params(50)).ok());
  h.step();  // a is mid-prefill (chunk cut at a block boundary), b and c too
  EXPECT_GT(h.core->block_table("a").size(), 0u);
  EXPECT_LT(h.core->num_computed("a"), 200);
  h.core->abort("a");
  EXPECT_EQ(h.results["a"].finish, FinishReason::kCancelled);
  EXPECT_TRUE(h.core->block_table("a").empty());
  ASSERT_TRUE(h.core->check_integrity().ok());
  for (int i = 0; i < 5; ++i) h.step();
  EXPECT_GT(h.results["b"].tokens.size(), 0u);
  h.core->abort("b");  // mid-decode, drafts pending
  EXPECT_EQ(h.results["b"].finish, FinishReason::kCancelled);
  h.core->abort("unknown");  // ignored
  h.run();
  EXPECT_EQ(h.results["c"].finish, FinishReason::kLength);
  EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
  EXPECT_EQ(h.core->num_running(), 0);
}

TEST(EngineCore, PrefixHitReusesExactBlocks) {
  EngineConfig ec = small_config(4, 16);
  ec.max_num_batched_tokens = 64;
  Harness h(fake_config(), ec);
  auto prompt = make_prompt(5, 40, kVocab);
  ASSERT_TRUE(h.submit("a", prompt, greedy_params(4)).ok());
  h.step();  // chunk [0, 32): ends on a block boundary -> snapshot at 32
  EXPECT_EQ(h.core->num_computed("a"), 32);
  EXPECT_EQ(h.core->block_table("a"), (std::vector<int32_t>{0, 1}));
  h.run();
  EXPECT_EQ(h.results["a"].usage.cached_tokens, 0);
  // a's table was [0, 1, 2]: 2 (partial, uncached) goes to the head of the free list, the cached
  // blocks to the tail, last block first, so eviction takes a's tail before its head.
  auto free_list = h.core->kv().free_list_order();
  ASSERT_GE(free_list.size(), 3u);
  EXPECT_EQ(free_list.front(), 2);
  EXPECT_EQ(free_list[free_list.size() - 2], 1);
  EXPECT_EQ(free_list.back(), 0);

  ASSERT_TRUE(h.submit("b", prompt, greedy_params(4)).ok());
  h.step();
  EXPECT_EQ(h.core->block_table("b"), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(h.core->num_computed("b"), 40);
  h.run();
  EXPECT_EQ(h.results["b"].usage.cached_tokens, 32);
  EXPECT_EQ(h.results["b"].tokens, h.results["a"].tokens);
  auto m = h.core->metrics(true);
  EXPECT_EQ(m.prefix_cache_hits_total, 32);
  EXPECT_EQ(m.prefix_cache_queries_total, 80);

  // A prompt sharing only the first block hits one block.
  auto p2 = prompt;
  p2[20] = (p2[20] + 1 - 5) % (kVocab - 6) + 5;
  ASSERT_TRUE(h.submit("c", p2, greedy_params(4)).ok());
  h.run();
  EXPECT_EQ(h.results["c"].usage.cached_tokens, 0);  // block 0 has no snapshot at 16: chunk ended at 32
  FakeModelRunner oracle(fake_config());
  EXPECT_EQ(h.results["c"].tokens, reference_greedy(oracle, p2, 4));
}

TEST(EngineCore, PrefixCacheEvictsLeastRecentlyFreedFirst) {
  EngineConfig ec = small_config(2, 16);
  int64_t block_bytes = FakeModelRunner(fake_config()).kv_bytes_per_block(16, "fp8") +
                        FakeModelRunner(fake_config()).slot_state_bytes();
  ec.kv_cache_memory = block_bytes * 8;
  Harness h(fake_config(), ec);
  auto pa = make_prompt(1, 33, kVocab), pb = make_prompt(2, 33, kVocab);
  ASSERT_TRUE(h.submit("a", pa, greedy_params(1)).ok());
  h.run();
  ASSERT_TRUE(h.submit("b", pb, greedy_params(1)).ok());
  h.run();
  // Free list now: [4 (b's partial block), 5, 6, 7, 1, 0 (a's cached blocks, tail first), 3, 2 (b's)].
  // A 5-block prompt takes 4..7 and then evicts the least recently freed cached block: a's tail.
  auto pc = make_prompt(3, 80, kVocab);
  ASSERT_TRUE(h.submit("c", pc, greedy_params(2)).ok());
  h.step();
  EXPECT_EQ(h.core->block_table("c"), (std::vector<int32_t>{4, 5, 6, 7, 1}));
  h.run();
  // b's prefix is still cached; a's lost its snapshotted block 1, so a second a misses.
  ASSERT_TRUE(h.submit("b2", pb, greedy_params(1)).ok());
  h.run();
  EXPECT_EQ(h.results["b2"].usage.cached_tokens, 32);
  EXPECT_EQ(h.results["b2"].tokens, h.results["b"].tokens);
  ASSERT_TRUE(h.submit("a2", pa, greedy_params(1)).ok());
  h.run();
  EXPECT_EQ(h.results["a2"].usage.cached_tokens, 0);
  EXPECT_EQ(h.results["a2"].tokens, h.results["a"].tokens);
}

TEST(EngineCore, SecondLongPromptReportsCachedTokensAndSameOutput) {
  for (bool spec : {false, true}) {
    EngineConfig ec = spec ? with_spec(small_config(4, 64), "auto") : small_config(4, 64);
    ec.max_num_batched_tokens = 512;
    Harness h(fake_config(), ec);
    auto prompt = make_prompt(77, 1000, kVocab);
    ASSERT_TRUE(h.submit("first", prompt, greedy_params(50)).ok());
    h.run();
    ASSERT_TRUE(h.submit("second", prompt, greedy_params(50)).ok());
    h.run();
    EXPECT_EQ(h.results["first"].usage.cached_tokens, 0);
    EXPECT_GT(h.results["second"].usage.cached_tokens, 900);
    EXPECT_EQ(h.results["second"].tokens, h.results["first"].tokens);
    FakeModelRunner oracle(fake_config());
    EXPECT_EQ(h.results["first"].tokens, reference_greedy(oracle, prompt, 50));
    EXPECT_EQ(h.fake->draft_context_errors(), 0);
  }
}

TEST(EngineCore, ChunkedPrefillRespectsTokenBudgetAndDecodesFirst) {
  EngineConfig ec = small_config(4, 16);
  ec.max_num_batched_tokens = 40;
  ec.long_prefill_token_threshold = 40;  // no cap here (LongPrefillDoesNotStarveShortRequests has it)
  ec.enable_prefix_caching = false;
  Harness h(fake_config(), ec);
  ASSERT_TRUE(h.submit("short", make_prompt(1, 10, kVocab), greedy_params(30)).ok());
  h.step();
  EXPECT_EQ(h.core->num_computed("short"), 10);
  ASSERT_TRUE(h.submit("long", make_prompt(2, 300, kVocab), greedy_params(5)).ok());
  int64_t before = h.fake->forward_tokens();
  h.step();  // short decodes (1 token), long gets the other 39
  EXPECT_EQ(h.fake->forward_tokens() - before, 40);
  EXPECT_EQ(h.core->num_computed("long"), 39);
  h.run();
  FakeModelRunner oracle(fake_config());
  EXPECT_EQ(h.results["long"].tokens, reference_greedy(oracle, make_prompt(2, 300, kVocab), 5));
}

TEST(EngineCore, RandomizedArrivalsAndCancellationsLeakNothing) {
  for (bool spec : {false, true}) {
    EngineConfig ec = spec ? with_spec(small_config(6, 16), "auto") : small_config(6, 16);
    ec.max_num_batched_tokens = 96;
    int64_t block_bytes = FakeModelRunner(fake_config()).kv_bytes_per_block(16, "fp8") +
                          FakeModelRunner(fake_config()).slot_state_bytes();
    ec.kv_cache_memory = block_bytes * 40;  // tight: preemptions happen
    Harness h(fake_config(), ec, /*integrity=*/true);
    std::mt19937_64 rng(spec ? 7 : 8);
    std::vector<std::string> live;
    int n = 0;
    std::vector<std::vector<int32_t>> shared = {make_prompt(900, 70, kVocab), make_prompt(901, 40, kVocab)};
    for (int step = 0; step < 3000; ++step) {
      if (rng() % 3 == 0) {
        std::string id = "q" + std::to_string(n++);
        std::vector<int32_t> p = rng() % 3 == 0 ? shared[rng() % 2] : make_prompt(rng(), 1 + rng() % 150, kVocab);
        SamplingParams sp = greedy_params(1 + rng() % 60);
        if (rng() % 2) sp.temperature = 0.7;
        if (rng() % 5 == 0) sp.ignore_eos = false;
        Status st = h.submit(id, p, sp);
        if (st.ok()) live.push_back(id);
      }
      if (!live.empty() && rng() % 11 == 0) h.core->abort(live[rng() % live.size()]);
      if (h.core->has_work()) h.step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "step " << step;
    }
    h.run();
    for (const auto& id : live) EXPECT_NE(h.results[id].finish, FinishReason::kNone) << id;
    for (const auto& [id, c] : h.results) EXPECT_NE(c.finish, FinishReason::kError) << id << ": " << c.error;
    EngineMetrics m = h.core->metrics(true);
    EXPECT_EQ(m.kv_blocks_leaked, 0);
    EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
    EXPECT_GT(m.prefix_cache_hits_total, 0);
    EXPECT_EQ(h.fake->draft_context_errors(), 0);
    if (spec) {
      EXPECT_GT(m.spec_decode_num_drafts_total, 0);
    }
  }
}

// Many distinct prompts through a pool with only 64 snapshot buffers: snapshots get recycled while
// blocks stay cached; every hit must still reproduce the oracle's output.
TEST(EngineCore, PrefixHitsWithRecycledSnapshotsStayExact) {
  EngineConfig ec = small_config(2, 16);
  ec.max_num_batched_tokens = 40;  // chunks end on many block boundaries -> many snapshots
  Harness h(fake_config(), ec);
  ASSERT_EQ(h.core->kv().num_snapshots(), 64);
  FakeModelRunner oracle(fake_config());
  std::mt19937_64 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(make_prompt(700 + i, 100 + (i * 31) % 100, kVocab));
  int n = 0;
  int64_t cached = 0;
  for (int round = 0; round < 4; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::string id = "q" + std::to_string(n++);
      ASSERT_TRUE(h.submit(id, prompts[(i * 5 + round) % prompts.size()], greedy_params(8)).ok());
    }
    h.run();
  }
  for (int k = 0; k < n; ++k) {
    const Collected& c = h.results["q" + std::to_string(k)];
    int round = k / static_cast<int>(prompts.size()), i = k % static_cast<int>(prompts.size());
    EXPECT_EQ(c.tokens, reference_greedy(oracle, prompts[(i * 5 + round) % prompts.size()], 8)) << k;
    cached += c.usage.cached_tokens;
  }
  EXPECT_GT(cached, 0);
  // The runner holds the 64 buffers (RunnerAllocation::num_snapshots) and the engine recycled them.
  EXPECT_EQ(h.fake->num_snapshots(), 64);
  EXPECT_GT(h.fake->snapshots_saved(), 64);
}

TEST(EngineCore, StopConditions) {
  FakeModelRunner oracle(fake_config());
  // A prompt whose first 40 greedy tokens are plain word pieces (no specials, no split UTF-8).
  std::vector<int32_t> prompt, ref;
  for (uint64_t seed = 3;; ++seed) {
    prompt = make_prompt(seed, 12, kVocab);
    ref = reference_greedy(oracle, prompt, 40);
    if (std::all_of(ref.begin(), ref.end(), [](int32_t t) { return t >= 5; })) break;
  }
  Harness h(fake_config(), with_spec(small_config(), "fixed"));
  // stop token: the 5th generated token's id.
  SamplingParams sp = greedy_params(40);
  sp.stop_token_ids = {ref[4]};
  ASSERT_TRUE(h.submit("tok", prompt, sp).ok());
  // stop string: text of generated tokens 6..7.
  const Tokenizer& tk = h.core->tokenizer();
  std::string full;
  for (int32_t t : ref) full += tk.token_bytes(t);
  SamplingParams ss = greedy_params(40);
  std::string prefix;
  for (int i = 0; i < 6; ++i) prefix += tk.token_bytes(ref[i]);
  std::string stop = tk.token_bytes(ref[6]) + tk.token_bytes(ref[7]);
  ss.stop = {stop};
  ASSERT_TRUE(h.submit("str", prompt, ss).ok());
  SamplingParams sl = greedy_params(7);
  sl.logprobs = 3;
  ASSERT_TRUE(h.submit("len", prompt, sl).ok());
  h.run();
  auto first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(h.results["tok"].finish, FinishReason::kStop);
  EXPECT_EQ(h.results["tok"].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first));
  EXPECT_EQ(h.results["str"].finish, FinishReason::kStop);
  EXPECT_EQ(h.results["str"].text, full.substr(0, full.find(stop)));
  EXPECT_EQ(h.results["len"].finish, FinishReason::kLength);
  EXPECT_EQ(h.results["len"].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + 7));
  EXPECT_EQ(h.results["len"].usage.completion_tokens, 7);
  ASSERT_EQ(h.results["len"].logprobs.size(), 7u);
  for (const auto& lp : h.results["len"].logprobs) {
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy: the chosen token is the most likely
    EXPECT_LE(lp.logprob, 0.f);
    for (const auto& [t, l] : lp.top) EXPECT_NE(t, oracle.noise_token_id());
  }
}

TEST(EngineCore, NoiseTokenIsNeverEmitted) {
  // The fake model gives the noise id the highest raw logit at every position.
  Harness h(fake_config(), with_spec(small_config(), "fixed"));
  SamplingParams sp = greedy_params(100);
  sp.temperature = 2.0;
  sp.seed = 5;
  ASSERT_TRUE(h.submit("a", make_prompt(1, 10, kVocab), sp).ok());
  ASSERT_TRUE(h.submit("b", make_prompt(2, 10, kVocab), greedy_params(100)).ok());
  h.run();
  for (const char* id : {"a", "b"})
    for (int32_t t : h.results[id].tokens) EXPECT_NE(t, h.fake->noise_token_id());
}

TEST(EngineCore, RejectsBadRequests) {
  EngineConfig ec = small_config();
  ec.max_model_len = 100;
  Harness h(fake_config(), ec);
  EXPECT_EQ(h.submit("a", make_prompt(1, 100, kVocab), greedy_params(5)).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(h.submit("a", {}, greedy_params(5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.submit("a", {1, 2, 999}, greedy_params(5)).code(), StatusCode::kInvalidArgument);
  SamplingParams bad = greedy_params(5);
  bad.top_p = 0;
  EXPECT_EQ(h.submit("a", {5, 6}, bad).code(), StatusCode::kInvalidArgument);
  bad = greedy_params(0);
  EXPECT_EQ(h.submit("a", {5, 6}, bad).code(), StatusCode::kInvalidArgument);
  bad = greedy_params(5);
  bad.logprobs = 21;
  EXPECT_EQ(h.submit("a", {5, 6}, bad).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(h.submit("a", {5, 6}, greedy_params(5)).ok());
  EXPECT_EQ(h.submit("a", {5, 6}, greedy_params(5)).code(), StatusCode::kInvalidArgument);  // duplicate id
  h.run();
  // Generation stops at max_model_len.
  ASSERT_TRUE(h.submit("long", make_prompt(2, 95, kVocab), greedy_params(50)).ok());
  h.run();
  EXPECT_EQ(h.results["long"].finish, FinishReason::kLength);
  EXPECT_EQ(h.results["long"].tokens.size(), 5u);
}

TEST(EngineCore, StartupErrorsAndCapacity) {
  auto make = [](EngineConfig ec) {
    CoreOptions o;
    o.log_startup = false;
    return EngineCore::create(std::make_unique<FakeModelRunner>(fake_config()), ec, o);
  };
  EngineConfig ec = small_config();
  ec.kv_cache_dtype = "nvfp4";
  auto r = make(ec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nvfp4"), std::string::npos) << r.status().message();
  ec.kv_cache_dtype = "nvfp4_ds_mla";
  EXPECT_FALSE(make(ec).ok());
  ec.kv_cache_dtype = "int4";
  EXPECT_FALSE(make(ec).ok());
  for (const char* ok : {"auto", "bf16", "fp8", "fp8_ds_mla"}) {
    ec.kv_cache_dtype = ok;
    auto c = make(ec);
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status().to_string();
  }
  ec.kv_cache_dtype = "auto";
  EXPECT_EQ((*make(ec))->kv_cache_dtype(), "fp8");
  ec.kv_cache_memory = 10;
  auto tiny = make(ec);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), StatusCode::kResourceExhausted);
  // Capacity from the budget; max_model_len capped by it.
  int64_t block_bytes = FakeModelRunner(fake_config()).kv_bytes_per_block(16, "fp8") +
                        FakeModelRunner(fake_config()).slot_state_bytes();
  ec.kv_cache_memory = block_bytes * 10 + 5;
  auto c = make(ec);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->num_kv_blocks(), 10);
  EXPECT_EQ((*c)->model_info().kv_capacity_tokens, 160);
  EXPECT_EQ((*c)->model_info().max_model_len, 160);
  ec = small_config();
  ec.speculative.method = "dspark";
  ec.speculative.num_speculative_tokens = 6;  // > the draft block (5)
  EXPECT_FALSE(make(ec).ok());
  ec.speculative.num_speculative_tokens = 3;
  ec.speculative.confidence_threshold = 1.5;  // (verify_mode is an enum: a bad name fails in the parser)
  EXPECT_FALSE(make(ec).ok());
}

}  // namespace
// A long prompt does not starve a short one: while it prefills, the short request's first token
// comes within a few steps (not after the whole prefill), and both outputs equal greedy alone.
TEST(EngineCore, LongPrefillDoesNotStarveShortRequests) {
  FakeModelRunner oracle(fake_config());
  const std::vector<int32_t> long_prompt = make_prompt(71, 4000, kVocab), short_prompt = make_prompt(72, 8, kVocab);
  EngineConfig ec = small_config(8, 16);  // 256 tokens per step; threshold 0 = 256 / 4
  Harness h(fake_config(), ec);
  ASSERT_TRUE(h.submit("long", long_prompt, greedy_params(4)).ok());
  h.step();
  h.step();
  ASSERT_TRUE(h.submit("short", short_prompt, greedy_params(2)).ok());
  int steps = 0;
  while (h.results["short"].tokens.empty() && steps < 100) {
    h.step();
    ++steps;
  }
  EXPECT_LE(steps, 3) << "the short request waited for the long prefill";
  EXPECT_LT(h.core->num_computed("long"), 3000) << "the long prefill was not still running";
  h.run();
  EXPECT_EQ(h.results["long"].tokens, reference_greedy(oracle, long_prompt, 4));
  EXPECT_EQ(h.results["short"].tokens, reference_greedy(oracle, short_prompt, 2));

  // max_num_partial_prefills 1: a second long prompt waits while the first prefills; a short one
  // behind it goes ahead. With 2 both long prompts prefill together.
  for (int partial : {1, 2}) {
    EngineConfig pc = ec;
    pc.max_num_partial_prefills = partial;
    pc.long_prefill_token_threshold = 32;
    Harness p(fake_config(), pc);
    ASSERT_TRUE(p.submit("a", make_prompt(73, 1000, kVocab), greedy_params(2)).ok());
    ASSERT_TRUE(p.submit("b", make_prompt(74, 1000, kVocab), greedy_params(2)).ok());
    ASSERT_TRUE(p.submit("c", make_prompt(75, 8, kVocab), greedy_params(2)).ok());
    p.step();
    EXPECT_EQ(p.core->num_computed("a"), 32);
    EXPECT_EQ(p.core->num_computed("b"), partial == 1 ? 0 : 32) << partial;
    EXPECT_EQ(p.core->num_computed("c"), 8);
    p.run();
    for (const char* id : {"a", "b", "c"}) EXPECT_EQ(p.results[id].tokens.size(), 2u) << id;
  }
}

// Request::timeout_s: past it the request ends with kTimeout and frees its blocks and slot; others
// go on. (The step boundary is the granularity; the test sleeps past the deadline.)
TEST(EngineCore, DeadlineEndsRequestWithTimeout) {
  Harness h(fake_config(), small_config(4, 16));
  auto submit = [&](const std::string& id, double timeout_s) {
    Request r;
    r.request_id = id;
    r.prompt_tokens = make_prompt(80, 40, kVocab);
    r.sampling = greedy_params(500);
    r.timeout_s = timeout_s;
    return h.core->add_request(std::move(r), [&h](const RequestEvent& ev) {
      Collected& c = h.results[ev.request_id];
      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finish != FinishReason::kNone) c.finish = ev.finish;
    });
  };
  ASSERT_TRUE(submit("late", 0.2).ok());
  ASSERT_TRUE(submit("free", 0).ok());
  for (int i = 0; i < 5; ++i) h.step();
  EXPECT_EQ(h.results["late"].finish, FinishReason::kNone);
  EXPECT_FALSE(h.results["late"].tokens.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  h.step();
  EXPECT_EQ(h.results["late"].finish, FinishReason::kTimeout);
  EXPECT_EQ(h.core->num_running(), 1);
  EXPECT_EQ(std::string(finish_reason_name(FinishReason::kTimeout)), "timeout");
  h.run();
  EXPECT_EQ(h.results["free"].finish, FinishReason::kLength);
  EXPECT_EQ(h.results["free"].tokens.size(), 500u);
  EXPECT_EQ(h.core->kv().num_free(), h.core->kv().num_blocks());
  Request bad;
  bad.request_id = "bad";
  bad.prompt_tokens = {5, 6};
  bad.timeout_s = -1;
  EXPECT_FALSE(h.core->validate(bad).ok());
}

// The speculative planner's start-up profile stops at its wall-time budget: with budget 0 it runs
// only the context prefills and the warm-up, far fewer forwards than the full profile.
TEST(EngineCore, PlannerProfileIsBounded) {
  auto forwards = [](double budget_s) -> int64_t {
    auto runner = std::make_unique<FakeModelRunner>(fake_config());
    FakeModelRunner* fake = runner.get();
    CoreOptions o;
    o.log_startup = false;
    o.profile_budget_s = budget_s;
    auto core = EngineCore::create(std::move(runner), with_spec(small_config(8, 16), "auto"), o);
    EXPECT_TRUE(core.ok()) << core.status().to_string();
    return core.ok() ? fake->forward_calls() : -1;
  };
  const int64_t full = forwards(1e9), cut = forwards(0.0);
  EXPECT_LE(cut, 8 + 1);  // one prefill per profiled slot (<= 8) + the warm-up
  EXPECT_GT(full, cut + 20);
}

// The planner's start-up profile commits its timed steps without snapshots: with the prefix cache
// off (no snapshots at all) "auto" starts, and with it on the profile saves none (it once asked for
// snapshot 0 on every timed shape: `tandem serve --no-enable-prefix-caching` with DSpark failed).
TEST(EngineCore, PlannerProfileTakesNoSnapshots) {
  for (bool prefix : {false, true}) {
    auto runner = std::make_unique<FakeModelRunner>(fake_config());
    FakeModelRunner* fake = runner.get();
    CoreOptions o;
    o.log_startup = false;
    EngineConfig ec = with_spec(small_config(8, 16), "auto");
    ec.enable_prefix_caching = prefix;
    auto core = EngineCore::create(std::move(runner), ec, o);
    ASSERT_TRUE(core.ok()) << "prefix caching " << prefix << ": " << core.status().to_string();
    EXPECT_GT(fake->forward_calls(), 8) << "the profile ran";
    EXPECT_EQ(fake->snapshots_saved(), 0) << "prefix caching " << prefix;
    EXPECT_EQ(fake->num_snapshots() > 0, prefix);
  }
}

}  // namespace tandem::testing
