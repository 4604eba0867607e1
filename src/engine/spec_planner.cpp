// SpecPlanner and CostModel: see spec_planner.h.
#include "engine/spec_planner.h"

#include <algorithm>
#include <cmath>

namespace tandem {

namespace {
constexpr double kDecay = 0.97;       // cost fits forget old samples (shapes drift with context)
constexpr double kAcceptDecay = 0.98;
constexpr int kProbeEvery = 32;       // steps before the first probe once drafting is off
// Each probe that still finds drafting unprofitable doubles the wait before the next one: a probe
// costs a draft plus a longer verify (~20% of the steps between probes at 32 on a CPU), which
// otherwise turns "off" into a steady loss on workloads where speculation never pays.
constexpr int kMaxProbeEvery = 1024;
// Per-position acceptance prior (vLLM's DSpark-V4-Flash measurements), used until measured.
constexpr double kPrior[] = {0.78, 0.55, 0.37, 0.24, 0.16, 0.11, 0.08};
}  // namespace

void CostModel::add(double x, double seconds) {
  // Steps slowed by something else (the thread descheduled, a page fault storm) would teach the
  // planner that a shape is expensive: such outliers (> 2x the current estimate) barely count.
  const double expected = n_ >= 8 ? predict(x) : 0.0;
  const bool outlier = expected > 0 && seconds > 2.0 * expected;
  int shape = static_cast<int>(x);
  if (shape >= 0 && shape <= kMaxShape) {
    double alpha = outlier ? 0.02 : 0.2;
    shape_ema_[shape] = shape_n_[shape] == 0 ? seconds : (1 - alpha) * shape_ema_[shape] + alpha * seconds;
    ++shape_n_[shape];
  }
  ++n_;
  if (outlier) return;
  w_ = w_ * kDecay + 1;
  sx_ = sx_ * kDecay + x;
  sy_ = sy_ * kDecay + seconds;
  sxx_ = sxx_ * kDecay + x * x;
  sxy_ = sxy_ * kDecay + x * seconds;
  ++fit_n_;
}

double CostModel::predict(double x) const {
  int shape = static_cast<int>(x);
  if (shape >= 0 && shape <= kMaxShape && shape == x && shape_n_[shape] >= kMinShapeSamples)
    return shape_ema_[shape];
  return linear(x);
}

double CostModel::linear(double x) const {
  if (fit_n_ == 0) return prior_c0_ + prior_c1_ * x;
  double mx = sx_ / w_, my = sy_ / w_;
  double var = sxx_ / w_ - mx * mx;
  double c1, c0;
  if (var > 1e-9 * std::max(1.0, mx * mx) && fit_n_ >= 4) {
    c1 = std::max(0.0, (sxy_ / w_ - mx * my) / var);
    c0 = std::max(0.0, my - c1 * mx);
  } else {
    // One shape seen so far: assume the prior's split between fixed and per-item cost.
    double prior = prior_c0_ + prior_c1_ * mx;
    double scale = prior > 0 ? my / prior : 1.0;
    c0 = prior_c0_ * scale;
    c1 = prior_c1_ * scale;
  }
  return c0 + c1 * x;
}

SpecPlanner::SpecPlanner(const SpeculativeConfig& config, int num_draft_tokens)
    : config_(config),
      k_(num_draft_tokens),
      verify_cost_(1e-3, 2e-5),
      draft_cost_(2e-4, 1e-5) {
  accept_ema_.resize(k_);
  for (int j = 0; j < k_; ++j) {
    double cond = j < 7 ? kPrior[j] / (j == 0 ? 1.0 : kPrior[j - 1]) : 0.5;
    accept_ema_[j] = cond;
  }
}

void SpecPlanner::observe_verify(int verified, int accepted) {
  for (int j = 0; j < verified && j <= accepted && j < k_; ++j)
    accept_ema_[j] = accept_ema_[j] * kAcceptDecay + (1 - kAcceptDecay) * (j < accepted ? 1.0 : 0.0);
}

void SpecPlanner::plan(std::span<const std::span<const float>> confidences, std::span<const int> limits,
                       int64_t extra_tokens, std::vector<int>& lengths) {
  const size_t R = confidences.size();
  lengths.assign(R, 0);
  if (config_.verify_mode == "fixed") {
    for (size_t r = 0; r < R; ++r) lengths[r] = std::min<int>(k_, limits[r]);
    return;
  }
  if (config_.verify_mode == "threshold") {
    for (size_t r = 0; r < R; ++r) {
      int l = 0;
      while (l < k_ && l < limits[r] && l < static_cast<int>(confidences[r].size()) &&
             confidences[r][l] >= config_.confidence_threshold)
        ++l;
      lengths[r] = l;
    }
    return;
  }
  // auto: Algorithm 1 (greedy admission by survival, break at the first non-improvement).
  cands_.clear();
  for (size_t r = 0; r < R; ++r) {
    double a = 1.0;
    int lim = std::min<int>({k_, limits[r], static_cast<int>(confidences[r].size())});
    for (int j = 0; j < lim; ++j) {
      a *= std::clamp(static_cast<double>(confidences[r][j]), 0.0, 1.0);
      cands_.push_back({a, static_cast<int>(r), j});
    }
  }
  std::sort(cands_.begin(), cands_.end(), [](const Cand& x, const Cand& y) {
    if (x.a != y.a) return x.a > y.a;
    return x.r != y.r ? x.r < y.r : x.j < y.j;
  });
  double B = static_cast<double>(R + extra_tokens);
  double E = static_cast<double>(R);
  double best = E / verify_cost_.predict(B);
  for (const Cand& c : cands_) {
    if (lengths[c.r] != c.j) continue;  // keeps each request's verified drafts a prefix
    double theta = (E + c.a) / verify_cost_.predict(B + 1);
    if (!(theta > best)) break;
    best = theta;
    E += c.a;
    B += 1;
    lengths[c.r] = c.j + 1;
  }
}

bool SpecPlanner::should_draft(int num_requests, int64_t extra_tokens) {
  if (config_.verify_mode != "auto" || num_requests == 0) return true;
  const double R = num_requests;
  const double base = R / verify_cost_.predict(R + extra_tokens);
  double best = 0, surv = 1, gain = 0;
  for (int L = 1; L <= k_; ++L) {
    surv *= accept_ema_[L - 1];
    gain += surv;
    double t = draft_cost_.predict(R) + verify_cost_.predict(R * (1 + L) + extra_tokens);
    best = std::max(best, R * (1 + gain) / t);
  }
  const bool pays = best > base * 1.02;
  if (pays) {
    steps_since_probe_ = 0;
    probe_interval_ = kProbeEvery;
    drafting_ = true;
    return true;
  }
  if (++steps_since_probe_ >= probe_interval_) {
    steps_since_probe_ = 0;
    probe_interval_ = std::min<int64_t>(probe_interval_ * 2, kMaxProbeEvery);
    drafting_ = true;  // probe: refresh the acceptance estimate
    return true;
  }
  drafting_ = false;
  return false;
}

}  // namespace tandem
