// SpecPlanner: decides, each step, how many of each request's K draft tokens the target verifies
// ("fixed": all K; "threshold": up to the first position whose confidence is below the threshold;
// "auto": the paper's Algorithm 1 — admit (request, position) pairs by prefix survival prod(c),
// stopping at the first pair that does not raise expected tokens per second under the measured
// step cost), and in "auto" mode whether drafting pays at all this step (otherwise speculation is
// off until a periodic probe says it pays again). Costs are measured online: forward time as a
// function of batch tokens, draft time as a function of requests (exponentially weighted fits).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace tandem {

// Cost of one batch shape (x = tokens or requests): a per-shape table of measured times (EMA) for
// shapes seen often enough — real costs are jagged (kernel tiles, graph buckets) — and elsewhere
// seconds ~= c0 + c1 * x, fitted by exponentially weighted least squares over all samples.
class CostModel {
 public:
  static constexpr int kMaxShape = 1024;
  static constexpr int kMinShapeSamples = 3;
  CostModel(double prior_c0, double prior_c1) : prior_c0_(prior_c0), prior_c1_(prior_c1) {}
  void add(double x, double seconds);
  double predict(double x) const;
  int64_t samples() const { return n_; }

 private:
  double linear(double x) const;
  double prior_c0_, prior_c1_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  int64_t n_ = 0, fit_n_ = 0;
  std::vector<double> shape_ema_ = std::vector<double>(kMaxShape + 1, 0.0);
  std::vector<int> shape_n_ = std::vector<int>(kMaxShape + 1, 0);
};

class SpecPlanner {
 public:
  SpecPlanner(const SpeculativeConfig& config, int num_draft_tokens);

  // confidences[i]: request i's K confidences; limits[i]: the most it may verify (max_tokens,
  // max_model_len). extra_tokens: other tokens in the same forward (prefill chunks).
  void plan(std::span<const std::span<const float>> confidences, std::span<const int> limits, int64_t extra_tokens,
            std::vector<int>& lengths);
  // "auto" only: whether drafting for `num_requests` decodes is expected to pay next step.
  bool should_draft(int num_requests, int64_t extra_tokens);
  void observe_verify(int verified, int accepted);
  void observe_forward(int64_t tokens, double seconds) { verify_cost_.add(static_cast<double>(tokens), seconds); }
  void observe_draft(int requests, double seconds) { draft_cost_.add(static_cast<double>(requests), seconds); }

  const std::vector<double>& acceptance_ema() const { return accept_ema_; }
  bool drafting_enabled() const { return drafting_; }

 private:
  SpeculativeConfig config_;
  int k_;
  CostModel verify_cost_;
  CostModel draft_cost_;
  std::vector<double> accept_ema_;  // P(position j accepted | verified and prefix accepted)
  bool drafting_ = true;
  int64_t steps_since_probe_ = 0;
  int64_t probe_interval_ = 32;  // doubles after each unprofitable probe (spec_planner.cpp)
  struct Cand {
    double a;
    int r, j;
  };
  std::vector<Cand> cands_;
};

}  // namespace tandem
