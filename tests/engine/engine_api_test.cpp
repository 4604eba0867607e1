// The threaded Engine (engine.h) over the fake model, and the distribution test: speculative
// sampling (rejection sampling with residual resampling and bonus tokens) must reproduce the
// target's own sampling distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "harness.h"

namespace tandem::testing {
namespace {

// ---------------- distribution (chi-square) ----------------

// Exact marginal distributions of the 2nd and 3rd generated token under plain sampling at T=1.
void exact_marginals(const FakeModelRunner& m, const std::vector<int32_t>& prompt, std::vector<double>& p2,
                     std::vector<double>& p3) {
  const int64_t V = m.vocab_size();
  auto dist = [&](const std::vector<int32_t>& hist) {
    std::vector<float> z;
    m.reference_logits(hist, z);
    std::vector<double> p(V, 0.0);
    double mx = -1e30, sum = 0;
    for (int64_t v = 0; v < V; ++v)
      if (v != m.noise_token_id()) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < V; ++v)
      if (v != m.noise_token_id()) sum += p[v] = std::exp(z[v] - mx);
    for (auto& x : p) x /= sum;
    return p;
  };
  p2.assign(V, 0.0);
  p3.assign(V, 0.0);
  auto p1 = dist(prompt);
  for (int64_t a = 0; a < V; ++a) {
    if (p1[a] == 0) continue;
    auto h = prompt;
    h.push_back(static_cast<int32_t>(a));
    auto pb = dist(h);
    for (int64_t b = 0; b < V; ++b) {
      if (pb[b] == 0) continue;
      p2[b] += p1[a] * pb[b];
      auto h2 = h;
      h2.push_back(static_cast<int32_t>(b));
      auto pc = dist(h2);
      for (int64_t c = 0; c < V; ++c) p3[c] += p1[a] * pb[b] * pc[c];
    }
  }
}

// Pearson chi-square of counts against probabilities; cells with expectation < 5 are pooled.
// Returns statistic / critical value at p = 0.001 (Wilson-Hilferty), so < 1 passes.
double chi_square_ratio(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    double e = p[v] * n;
    if (e < 5) {
      pooled_e += e;
      pooled_o += counts[v];
      continue;
    }
    stat += (counts[v] - e) * (counts[v] - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++cells;
  }
  double df = cells - 1;
  const double z = 3.09;
  double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  return stat / crit;
}

struct DistResult {
  double r2, r3;
  int64_t accepted, drafted;
};

DistResult run_distribution(const EngineConfig& ec, double agree, int n) {
  FakeModelConfig fc;
  fc.vocab_size = 12;
  fc.draft_agree = agree;
  Harness h(fc, ec, /*integrity=*/false);
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  for (int i = 0; i < n; ++i) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = 3;
    sp.ignore_eos = true;
    sp.seed = 1000 + i;
    EXPECT_TRUE(h.submit("r" + std::to_string(i), prompt, sp).ok());
  }
  h.run();
  std::vector<double> p2, p3;
  exact_marginals(*h.fake, prompt, p2, p3);
  std::vector<int> c2(12, 0), c3(12, 0);
  for (int i = 0; i < n; ++i) {
    const auto& t = h.results["r" + std::to_string(i)].tokens;
    EXPECT_EQ(t.size(), 3u);
    if (t.size() < 3) continue;
    ++c2[t[1]];
    ++c3[t[2]];
  }
  EXPECT_EQ(c2[11], 0);  // noise never emitted
  auto m = h.core->metrics(true);
  return {chi_square_ratio(c2, p2, n), chi_square_ratio(c3, p3, n), m.spec_decode_num_accepted_tokens_total,
          m.spec_decode_num_draft_tokens_total};
}

TEST(SpeculativeSampling, ReproducesTargetDistribution) {
  const int kN = 6000;
  EngineConfig base;
  base.max_num_seqs = 64;
  base.max_num_batched_tokens = 512;
  base.block_size = 16;
  base.enable_prefix_caching = false;
  auto plain = run_distribution(base, 0.5, kN);
  EXPECT_LT(plain.r2, 1.0);
  EXPECT_LT(plain.r3, 1.0);
  for (DraftSampleMethod m : {DraftSampleMethod::kSample, DraftSampleMethod::kGreedy}) {
    const char* method = draft_sample_method_name(m);
    for (const char* mode : {"fixed", "threshold"}) {
      EngineConfig ec = with_spec(base, mode);
      ec.speculative.draft_sample_method = m;
      auto r = run_distribution(ec, 0.5, kN);
      EXPECT_LT(r.r2, 1.0) << method << " " << mode;
      EXPECT_LT(r.r3, 1.0) << method << " " << mode;
      EXPECT_GT(r.accepted, 0) << method << " " << mode;
      EXPECT_LT(r.accepted, r.drafted);
    }
  }
}

// A broken verifier (accepting every draft) must fail the same test: the test has teeth.
TEST(SpeculativeSampling, ChiSquareDetectsABiasedSampler) {
  std::vector<double> p = {0.25, 0.25, 0.25, 0.25};
  std::vector<int> fair = {1510, 1490, 1495, 1505}, biased = {1700, 1300, 1500, 1500};
  EXPECT_LT(chi_square_ratio(fair, p, 6000), 1.0);
  EXPECT_GT(chi_square_ratio(biased, p, 6000), 1.0);
}

// The fake draft, recording the first proposal made for each (request seed, anchor position): the
// draft token for the next position and its distribution q.
class RecordingRunner : public FakeModelRunner {
 public:
  using FakeModelRunner::FakeModelRunner;
  struct Proposal {
    int32_t token;
    std::vector<float> q;
  };
  std::map<std::pair<uint64_t, int64_t>, Proposal> first;

  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override {
    Status st = FakeModelRunner::draft_propose(reqs, out);
    const size_t V = static_cast<size_t>(vocab_size());
    for (size_t i = 0; st.ok() && i < reqs.size(); ++i)
      if (const float* q = out[i].sampled ? stored_q(reqs[i].slot) : nullptr)
        first.try_emplace({reqs[i].seed, reqs[i].anchor_pos}, Proposal{out[i].tokens[0], std::vector<float>(q, q + V)});
    return st;
  }
};

// The engine's sampled verification, observed through the engine: each request samples t1, the draft
// proposes x ~ q for the next position (q = target logits + uniform noise of width 6: unlike the
// target), and the engine accepts x with probability min(1, p(x)/q(x)). Because the residual
// max(0, p - q) is zero at x whenever q(x) >= p(x), "x accepted" is exactly "t2 == x". The sum of
// these indicators is compared with its exact expectation sum min(1, p/q) (a z-test); the test also
// computes its power against a verifier that over-accepts by 5% (accepts with min(1, 1.05 p/q)) and
// requires it to be at least 99%.
TEST(SpeculativeSampling, EngineVerifierAcceptsWithExactlyMinOfOneAndPOverQ) {
  const int kN = 60000;  // ~6.8 sd of shift for 5% over-acceptance (3.9 sd at 20000)
  const int64_t V = 12;
  FakeModelConfig fc;
  fc.vocab_size = V;
  fc.draft_agree = 0.0;  // noise width (1 - agree) * 6 = 6 logits
  EngineConfig ec;
  ec.max_num_seqs = 64;
  ec.max_num_batched_tokens = 512;
  ec.block_size = 16;
  ec.enable_prefix_caching = false;
  ec = with_spec(ec, "fixed");
  ec.speculative.draft_sample_method = DraftSampleMethod::kSample;
  auto runner = std::make_unique<RecordingRunner>(fc);
  RecordingRunner* rec = runner.get();
  Harness h(std::move(runner), ec, /*integrity=*/false);
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  for (int i = 0; i < kN; ++i) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = 3;  // t1 from the prefill, then one verify of one draft token (and a last token)
    sp.ignore_eos = true;
    sp.seed = 5000 + i;
    ASSERT_TRUE(h.submit("r" + std::to_string(i), prompt, sp).ok());
  }
  h.run();
  double observed = 0, expected = 0, variance = 0, shift5 = 0;
  int contested = 0;  // trials with q(x) > p(x), the only ones where the rule matters
  std::vector<float> z;
  for (int i = 0; i < kN; ++i) {
    const auto& t = h.results["r" + std::to_string(i)].tokens;
    ASSERT_EQ(t.size(), 3u);
    auto it = rec->first.find({static_cast<uint64_t>(5000 + i), static_cast<int64_t>(prompt.size())});
    ASSERT_NE(it, rec->first.end()) << "no draft after t1 for request " << i;
    auto hist = prompt;
    hist.push_back(t[0]);
    h.fake->reference_logits(hist, z);
    double mx = -1e30, sum = 0;
    for (int64_t v = 0; v < V - 1; ++v) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < V - 1; ++v) sum += std::exp(z[v] - mx);
    const int32_t x = it->second.token;
    const double p = std::exp(z[x] - mx) / sum, q = it->second.q[x];
    const double pi = std::min(1.0, p / q);
    observed += t[1] == x;
    expected += pi;
    variance += pi * (1 - pi);
    shift5 += std::min(1.0, 1.05 * p / q) - pi;
    contested += q > p;
  }
  const double sd = std::sqrt(variance), zscore = (observed - expected) / sd;
  // Power against 5% over-acceptance of a two-sided test at |z| < 4 (false alarm 6e-5): the mean
  // moves by shift5 / sd standard deviations, so power = Phi(shift5 / sd - 4).
  const double power = 0.5 * std::erfc(-(shift5 / sd - 4.0) / std::sqrt(2.0));
  std::printf("[verify] %d requests, %d contested drafts; accepted %.0f, expected %.1f +- %.1f (z %.2f); "
              "5%% over-acceptance would add %.1f (%.1f sd), power %.4f\n",
              kN, contested, observed, expected, sd, zscore, shift5, shift5 / sd, power);
  EXPECT_GT(power, 0.99) << "the test cannot see a 5% over-acceptance: more requests or a sharper draft";
  EXPECT_LT(std::fabs(zscore), 4.0) << "acceptance differs from min(1, p/q)";
}

// ---------------- threaded Engine ----------------

class Collector {
 public:
  EventCallback callback() {
    return [this](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu_);
      Collected& c = results_[ev.request_id];
      ++c.events;
      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      c.text += ev.text;
      if (ev.finish != FinishReason::kNone) {
        c.finish = ev.finish;
        c.usage = ev.usage;
        c.error = ev.error;
        ++finished_;
        cv_.notify_all();
      }
    };
  }
  bool wait_finished(int n, double seconds = 30) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return finished_ >= n; });
  }
  Collected get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Collected> results_;
  int finished_ = 0;
};

Request make_request(const std::string& id, std::vector<int32_t> prompt, SamplingParams sp) {
  Request r;
  r.request_id = id;
  r.prompt_tokens = std::move(prompt);
  r.sampling = std::move(sp);
  return r;
}

TEST(Engine, ServesCancelsAndShutsDown) {
  FakeModelConfig fc;
  fc.vocab_size = 64;
  fc.forward_fixed_us = 200;  // slow enough that unbounded requests are still running at shutdown
  FakeModelRunner oracle(fc);
  EngineConfig ec = with_spec(small_config(4, 16), "auto");
  auto er = create_engine_with_runner(std::make_unique<FakeModelRunner>(fc), ec);
  ASSERT_TRUE(er.ok()) << er.status().to_string();
  auto engine = std::move(er).value();
  EXPECT_TRUE(engine->healthy());
  EXPECT_EQ(engine->model_info().vocab_size, 64);
  EXPECT_TRUE(engine->model_info().has_draft);
  Collector col;
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(engine->submit(make_request("r" + std::to_string(i), make_prompt(i, 20 + i, 64), greedy_params(80)),
                               col.callback())
                    .ok());
  ASSERT_TRUE(engine->submit(make_request("long", make_prompt(50, 10, 64), greedy_params(100000)), col.callback()).ok());
  // Errors come back from submit, not as events.
  EXPECT_EQ(engine->submit(make_request("r0", {5}, greedy_params(1)), col.callback()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->submit(make_request("big", make_prompt(1, 9000, 64), greedy_params(1)), col.callback()).code(),
            StatusCode::kOutOfRange);
  ASSERT_TRUE(col.wait_finished(6));
  for (int i = 0; i < 6; ++i) {
    Collected c = col.get("r" + std::to_string(i));
    EXPECT_EQ(c.finish, FinishReason::kLength);
    EXPECT_EQ(c.tokens, reference_greedy(oracle, make_prompt(i, 20 + i, 64), 80)) << i;
    EXPECT_EQ(c.usage.completion_tokens, 80);
    EXPECT_EQ(c.usage.prompt_tokens, 20 + i);
  }
  engine->cancel("long");
  engine->cancel("nobody");
  ASSERT_TRUE(col.wait_finished(7));
  EXPECT_EQ(col.get("long").finish, FinishReason::kCancelled);
  // Metrics are published by the loop after the events: poll until the cancel shows.
  EngineMetrics m;
  std::vector<double> ttft;
  for (int i = 0; i < 200; ++i) {
    m = engine->metrics();
    ttft.insert(ttft.end(), m.ttft_s.begin(), m.ttft_s.end());
    if (m.num_requests_running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(m.request_success_total, 6);
  EXPECT_EQ(m.generation_tokens_total >= 480, true);
  EXPECT_GT(m.spec_decode_num_drafts_total, 0);
  EXPECT_EQ(m.kv_blocks_leaked, 0);
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_GE(ttft.size(), 7u);
  EXPECT_TRUE(engine->metrics().ttft_s.empty());  // drained
  // Shutdown: in-flight requests are cancelled after the deadline.
  ASSERT_TRUE(engine->submit(make_request("late", make_prompt(60, 10, 64), greedy_params(100000)), col.callback()).ok());
  engine->shutdown(0.05);
  ASSERT_TRUE(col.wait_finished(8));
  EXPECT_EQ(col.get("late").finish, FinishReason::kCancelled);
  EXPECT_EQ(engine->submit(make_request("after", {5}, greedy_params(1)), col.callback()).code(),
            StatusCode::kUnavailable);
  EXPECT_FALSE(engine->healthy());
}

TEST(Engine, CreateUsesFakeModelWithoutCheckpointAndRejectsBadFlags) {
  EngineConfig ec;
  ec.block_size = 16;
  auto e = Engine::create(ec);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_FALSE((*e)->tokenizer().token_bytes(5).empty());
  (*e)->shutdown(1);
  ec.kv_cache_dtype = "nvfp4";
  auto bad = Engine::create(ec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--kv-cache-dtype"), std::string::npos) << bad.status().message();
  ec.kv_cache_dtype = "auto";
  ec.tensor_parallel_size = 2;
  auto tp = Engine::create(ec);
  ASSERT_FALSE(tp.ok());
  EXPECT_NE(tp.status().message().find("--tensor-parallel-size"), std::string::npos);
  ec.tensor_parallel_size = 1;
  ec.model_dir = "/nonexistent/checkpoint";
  EXPECT_FALSE(Engine::create(ec).ok());
}

}  // namespace
}  // namespace tandem::testing
