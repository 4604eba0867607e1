// The built-in model (data/builtin) in the C++ CPU forward (DsV4Model) against the trainer's own
// PyTorch QAT forward (data/builtin/golden.json, tools/train/make_golden.py): greedy continuations
// through the decode path, top-5 logits and logsumexp at every position (teacher-forced prefill of
// prompt + continuation), and the DSpark draft's greedy block + confidence at every anchor.
// The golden is the training numerics (fake-quant in fp32, another summation order), so logits
// are compared with a tolerance and tokens exactly except where the reference itself was a near tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace tandem {
namespace {

// Tolerances. The golden is CPU PyTorch in fp32 (docs/TRAINING.md), with weights and activations
// fake-quantized to the same FP8/FP4 codes the C++ model uses for real, so the two differ only in
// fp32 summation order (the trainer's matmuls vs kernels::Ops::gemm, whose order also changes with
// the GEMM ISA) plus the golden's 4-decimal rounding. An order change can move an activation across
// an FP8/FP4 rounding boundary, and that flip propagates through the later layers; this is what the
// tolerances absorb. Measured at 2e34fc1 (AVX-512 FMA GEMM, printed by the test):
//   top-5 logits, |C++ - PyTorch| / max|row|: worst row 0.039 (days_of_week, pos 5), mean 0.003-0.007
//   logsumexp / max|row|: worst 0.023;  greedy 16/16 and teacher-forced top-1 28/28 in all cases
//   draft greedy tokens 144/144 comparable positions; confidence logits max abs 0.29
// Limits are ~3x the measured worst (golden_test.cpp saw ISA-only changes move the official
// reference comparison by 2x on this model), and tokens must be equal except at a near tie of the
// reference, where one rounding flip can legitimately swap them; after such a divergence the
// continuations are different texts and are not compared further. A near tie is not a fixed logit
// gap: it is a reference top-1/top-2 gap smaller than kTieErrFactor (1) times the largest error of that
// gap (our logit[top-1] - logit[top-2] vs the reference's) at the *other* positions of the same case
// (teacher-forced), i.e. a gap our own measured noise has been seen to close (0.29 logit on add_12_7,
// whose one divergence is at a reference gap of 0.008). It was a fixed 0.5 logit.
constexpr double kLogitRelTol = 0.12;
constexpr double kMeanLogitRelTol = 0.02;
constexpr double kLseRelTol = 0.07;
constexpr double kTieErrFactor = 1.0;
constexpr double kConfAbsTol = 0.9;
constexpr double kMinDraftAgree = 0.95;

nlohmann::json load_golden() {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/data/builtin/golden.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

struct Env {
  std::unique_ptr<DsV4Model> model;
  nlohmann::json golden;
};

Env& env() {
  static Env e = [] {
    Env x;
    x.golden = load_golden();
    ModelOptions o;
    o.max_slots = 2;
    o.num_blocks = 4;
    o.block_size = 256;
    o.max_tokens_per_step = 256;
    o.num_threads = 1;
    auto m = DsV4Model::load(std::string(TANDEM_SOURCE_DIR) + "/data/builtin", o);
    if (m.ok()) x.model = std::move(m).value();
    else std::fprintf(stderr, "load failed: %s\n", m.status().to_string().c_str());
    return x;
  }();
  return e;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

class BuiltinPytorch : public ::testing::TestWithParam<int> {};

TEST_P(BuiltinPytorch, GreedyLogitsAndDraftMatchTrainer) {
  Env& e = env();
  ASSERT_TRUE(e.model) << "data/builtin did not load";
  ASSERT_FALSE(e.golden.is_discarded()) << "data/builtin/golden.json is not JSON";
  const nlohmann::json& c = e.golden["cases"][GetParam()];
  const std::string name = c["name"];
  DsV4Model& m = *e.model;
  const int64_t V = m.vocab_size();
  const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = c["greedy_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), greedy.begin(), greedy.end());
  const int64_t n = static_cast<int64_t>(seq.size());
  const std::vector<int32_t> table0 = {0}, table1 = {1};
  ASSERT_LE(n, 256);

  // 1. Greedy continuation through prefill + one-token decode steps (slot 1).
  m.reset(1);
  StepOutput out;
  std::vector<int32_t> mine;
  {
    StepBatch b;
    b.seqs.push_back({1, 0, prompt, table1, LogitsMode::kLast, false});
    ASSERT_TRUE(m.forward(b, out).ok());
    mine.push_back(argmax(out.logits_for(0, V)));
  }
  while (mine.size() < greedy.size()) {
    StepBatch b;
    const int32_t tok = mine.back();
    b.seqs.push_back({1, static_cast<int64_t>(prompt.size() + mine.size() - 1), std::span<const int32_t>(&tok, 1),
                      table1, LogitsMode::kLast, false});
    ASSERT_TRUE(m.forward(b, out).ok());
    mine.push_back(argmax(out.logits_for(0, V)));
  }
  size_t same = 0;
  while (same < greedy.size() && mine[same] == greedy[same]) ++same;
  std::printf("[builtin-pytorch %s] greedy: %zu/%zu tokens equal before the first divergence\n", name.c_str(), same,
              greedy.size());

  // 2. Teacher-forced logits of prompt + reference continuation at every position (slot 0), taps.
  m.reset(0);
  {
    StepBatch b;
    b.seqs.push_back({0, 0, seq, table0, LogitsMode::kAll, true});
    ASSERT_TRUE(m.forward(b, out).ok());
  }
  const auto& top5_ids = c["top5_ids_per_position"];
  const auto& top5_logits = c["top5_logits_per_position"];
  const auto& lse = c["logsumexp_per_position"];
  ASSERT_EQ(static_cast<int64_t>(top5_ids.size()), n);
  double worst = 0.0, mean = 0.0, worst_lse = 0.0;
  int64_t top1_agree = 0, worst_pos = 0;
  std::vector<double> abs_err(n, 0.0);  // per position: error of our top-1 - top-2 logit gap
  for (int64_t p = 0; p < n; ++p) {
    std::span<const float> row = out.logits_for(0, V, p);
    double rmax = 0.0, mx = -1e30, s = 0.0;
    for (float v : row) rmax = std::max(rmax, std::fabs(static_cast<double>(v))), mx = std::max(mx, double(v));
    for (float v : row) s += std::exp(double(v) - mx);
    const double my_lse = mx + std::log(s);
    double row_err = 0.0;
    for (int k = 0; k < 5; ++k) {
      const int32_t id = top5_ids[p][k];
      ASSERT_TRUE(id >= 0 && id < V);
      row_err = std::max(row_err, std::fabs(row[id] - top5_logits[p][k].get<double>()));
    }
    // Error of the reference's top-1 minus top-2 logit (what decides a swap; a common shift of the
    // row cancels).
    abs_err[p] = std::fabs((row[top5_ids[p][0].get<int32_t>()] - row[top5_ids[p][1].get<int32_t>()]) -
                           (top5_logits[p][0].get<double>() - top5_logits[p][1].get<double>()));
    row_err /= std::max(rmax, 1e-6);
    if (row_err > worst) worst = row_err, worst_pos = p;
    mean += row_err;
    worst_lse = std::max(worst_lse, std::fabs(my_lse - lse[p].get<double>()) / std::max(rmax, 1e-6));
    top1_agree += argmax(row) == top5_ids[p][0].get<int32_t>();
  }
  mean /= n;
  std::printf("[builtin-pytorch %s] top-5 logits over %lld positions: max rel %.4f (position %lld), mean rel %.4f, "
              "logsumexp max rel %.4f, top-1 agreement %lld/%lld\n",
              name.c_str(), static_cast<long long>(n), worst, static_cast<long long>(worst_pos), mean, worst_lse,
              static_cast<long long>(top1_agree), static_cast<long long>(n));
  EXPECT_LE(worst, kLogitRelTol) << name;
  EXPECT_LE(mean, kMeanLogitRelTol) << name;
  EXPECT_LE(worst_lse, kLseRelTol) << name;
  // A near tie at position p: the reference's top-1/top-2 gap there is within kTieErrFactor x our
  // largest error of that gap at the other positions.
  auto tie_limit = [&](int64_t p) {
    double e = 0.0;
    for (int64_t q = 0; q < n; ++q)
      if (q != p) e = std::max(e, abs_err[q]);
    return kTieErrFactor * e;
  };
  auto ref_gap = [&](int64_t p) { return top5_logits[p][0].get<double>() - top5_logits[p][1].get<double>(); };
  if (same < greedy.size()) {
    // Justified only at a near tie of the reference (position prompt + same - 1 predicts greedy[same]).
    const int64_t p = static_cast<int64_t>(prompt.size() + same) - 1;
    std::printf("[builtin-pytorch %s] divergence at %zu: reference %d, C++ %d, reference top-1/top-2 gap %.4f, "
                "near-tie limit %.4f\n",
                name.c_str(), same, greedy[same], mine[same], ref_gap(p), tie_limit(p));
    EXPECT_LT(ref_gap(p), tie_limit(p)) << name << ": greedy diverges at token " << same << " without a near tie";
  }
  // Teacher-forced top-1 may only differ where the reference had a near tie.
  for (int64_t p = 0; p < n; ++p) {
    const int32_t mine_top = argmax(out.logits_for(0, V, p));
    if (mine_top == top5_ids[p][0].get<int32_t>()) continue;
    EXPECT_LT(ref_gap(p), tie_limit(p)) << name << ": top-1 differs at position " << p << " (gap " << ref_gap(p) << ")";
  }

  // 3. DSpark: greedy draft block and confidence for every golden anchor. The golden is
  // teacher-forced (draft position i sees the true token at P+i); our greedy chain sees its own
  // previous draft, so position i is compared only while our chain equals the true tokens.
  ASSERT_TRUE(m.has_draft());
  const int K = m.draft_block_size();
  const int64_t td = m.tap_dim();
  ASSERT_GE(out.taps_row[0], 0);
  std::vector<float> taps(out.taps.begin() + out.taps_row[0] * td, out.taps.begin() + (out.taps_row[0] + n) * td);
  m.draft_reset(0);
  int64_t context = 0, compared = 0, agree = 0;
  double conf_worst = 0.0;
  DraftSampling greedy_draft;
  for (const auto& d : c["dspark"]) {
    const int64_t p = d["anchor_position"];
    ASSERT_TRUE(p > 0 && p + K < n);
    ASSERT_TRUE(m.draft_insert_context(0, context, std::span<const float>(taps.data() + context * td, (p - context) * td))
                    .ok());
    context = p;
    DraftRequest r{0, seq[p], p};
    std::vector<DraftResult> res;
    ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&r, 1), greedy_draft, res).ok());
    ASSERT_EQ(res.size(), 1u);
    ASSERT_EQ(static_cast<int>(res[0].tokens.size()), K);
    const auto want = d["draft_argmax_ids"].get<std::vector<int32_t>>();
    const auto conf = d["confidence_logits"].get<std::vector<double>>();
    for (int i = 0; i < K; ++i) {
      ++compared;
      agree += res[0].tokens[i] == want[i];
      conf_worst = std::max(conf_worst, std::fabs(res[0].confidence[i] - conf[i]));
      if (res[0].tokens[i] != seq[p + 1 + i]) break;  // the chains' inputs differ from here on
    }
  }
  const double draft_agree = compared ? double(agree) / compared : 0.0;
  std::printf("[builtin-pytorch %s] draft: %lld/%lld comparable positions agree (%.3f) over %zu anchors; confidence "
              "max abs %.4f\n",
              name.c_str(), static_cast<long long>(agree), static_cast<long long>(compared), draft_agree,
              c["dspark"].size(), conf_worst);
  EXPECT_GE(draft_agree, kMinDraftAgree) << name;
  EXPECT_LE(conf_worst, kConfAbsTol) << name;
}

std::string case_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"count_1_151", "days_of_week", "add_12_7"};
  return kNames[info.param];
}

INSTANTIATE_TEST_SUITE_P(Cases, BuiltinPytorch, ::testing::Values(0, 1, 2), case_name);

}  // namespace
}  // namespace tandem
