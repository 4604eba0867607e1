// Test harness: an EngineCore over the fake model, driven step by step, collecting every event.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/fake_model.h"

namespace tandem::testing {

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;
  int prompt_logprob_events = 0;  // events that carried prompt log-probabilities
  FinishReason finish = FinishReason::kNone;
  std::string error;
  Usage usage;
  int events = 0;
};

class Harness {
 public:
  Harness(FakeModelConfig fc, EngineConfig ec, bool integrity = true)
      : Harness(std::make_unique<FakeModelRunner>(fc), ec, integrity) {}
  // A subclass of the fake model (one that records what it proposes, say).
  Harness(std::unique_ptr<FakeModelRunner> runner, EngineConfig ec, bool integrity = true) {
    fake = runner.get();
    CoreOptions o;
    o.check_integrity_each_step = integrity;
    o.log_startup = false;
    o.max_waiting = 1 << 20;
    auto r = EngineCore::create(std::move(runner), ec, o);
    if (!r.ok()) ADD_FAILURE() << r.status().to_string();
    else core = std::move(r).value();
  }

  Status submit(const std::string& id, std::vector<int32_t> prompt, SamplingParams sp) {
    Request req;
    req.request_id = id;
    req.prompt_tokens = std::move(prompt);
    req.sampling = std::move(sp);
    return core->add_request(std::move(req), [this](const RequestEvent& ev) {
      Collected& c = results[ev.request_id];
      ++c.events;
      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      c.text += ev.text;
      c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (!ev.prompt_logprobs.empty()) {
        ++c.prompt_logprob_events;
        c.prompt_logprobs.insert(c.prompt_logprobs.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
      }
      if (ev.finish != FinishReason::kNone) {
        EXPECT_EQ(c.finish, FinishReason::kNone) << "two final events for " << ev.request_id;
        c.finish = ev.finish;
        c.error = ev.error;
        c.usage = ev.usage;
      }
    });
  }

  // Steps until idle; fails the test on a step error.
  void run(int max_steps = 1000000) {
    for (int i = 0; i < max_steps && core->has_work(); ++i) {
      Status st = core->step();
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    ASSERT_FALSE(core->has_work()) << "still busy after " << max_steps << " steps";
  }
  void step() {
    Status st = core->step();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }

  FakeModelRunner* fake = nullptr;
  std::unique_ptr<EngineCore> core;
  std::map<std::string, Collected> results;
};

// Greedy continuation straight from the fake model's oracle (noise never chosen, first max wins).
inline std::vector<int32_t> reference_greedy(const FakeModelRunner& m, std::vector<int32_t> tokens, int n,
                                             bool stop_at_eos = false) {
  std::vector<int32_t> out;
  std::vector<float> logits;
  const int64_t V = m.vocab_size();
  for (int i = 0; i < n; ++i) {
    m.reference_logits(tokens, logits);
    int32_t best = -1;
    for (int64_t v = 0; v < V; ++v)
      if (v != m.noise_token_id() && (best < 0 || logits[v] > logits[best])) best = static_cast<int32_t>(v);
    if (stop_at_eos && best == m.eos_token_id()) break;
    out.push_back(best);
    tokens.push_back(best);
  }
  return out;
}

inline std::vector<int32_t> make_prompt(uint64_t seed, int len, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i)
    p.push_back(static_cast<int32_t>(5 + fake_mix(seed, static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab - 6)));
  return p;
}

inline SamplingParams greedy_params(int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  return sp;
}

inline EngineConfig small_config(int max_num_seqs = 8, int block_size = 16) {
  EngineConfig ec;
  ec.max_num_seqs = max_num_seqs;
  ec.max_num_batched_tokens = 256;
  ec.block_size = block_size;
  ec.kv_cache_memory = 0;
  return ec;
}

inline EngineConfig with_spec(EngineConfig ec, const std::string& mode, int k = 5) {
  ec.speculative.method = "dspark";
  ec.speculative.num_speculative_tokens = k;
  ec.speculative.verify_mode = parse_verify_mode(mode).value();
  return ec;
}

}  // namespace tandem::testing
