// SpecPlanner and CostModel: see spec_planner.h.
#include "engine/spec_planner.h"

#include <algorithm>
#include <cmath>

namespace tandem {

namespace {
constexpr double kDecay = 0.97;       // cost fits forget old samples (shapes drift with context)
constexpr double kAcceptDecay = 0.98;   // global estimate: the start of every new request's
constexpr double kRequestDecay = 0.9;   // a request's own counts follow its text (code -> prose)
constexpr double kPriorWeight = 1.0;    // the global estimate counts as one verify of evidence
constexpr double kMargin = 0.02;        // drafting must beat not drafting by 2%
constexpr double kCalDecay = 0.998;     // confidence calibration remembers ~500 outcomes per decile
constexpr double kCalPriorWeight = 4;   // until then, a confidence means what it says
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

void SpecPlanner::start_request(SpecRequestState& st) const {
  st.hits.assign(k_, 0.0);
  st.trials.assign(k_, 0.0);
  st.steps_off = 0;
  st.probe_interval = kFirstProbe;
  st.probe = false;
}

double SpecPlanner::acceptance(const SpecRequestState& st, int j) const {
  const double g = accept_ema_[j];
  if (j >= static_cast<int>(st.trials.size())) return g;
  return std::clamp((kPriorWeight * g + st.hits[j]) / (kPriorWeight + st.trials[j]), 0.0, 1.0);
}

double SpecPlanner::calibrated(double confidence) const {
  const double c = std::clamp(confidence, 0.0, 1.0);
  const int b = std::min(kBins - 1, static_cast<int>(c * kBins));
  return (kCalPriorWeight * c + cal_hits_[b]) / (kCalPriorWeight + cal_trials_[b]);
}

void SpecPlanner::observe_verify(SpecRequestState* st, int verified, int accepted, std::span<const float> confidences) {
  for (int j = 0; j < verified && j <= accepted && j < k_; ++j) {
    const double hit = j < accepted ? 1.0 : 0.0;
    if (j < static_cast<int>(confidences.size())) {
      const double c = std::clamp(static_cast<double>(confidences[j]), 0.0, 1.0);
      const int b = std::min(kBins - 1, static_cast<int>(c * kBins));
      cal_hits_[b] = cal_hits_[b] * kCalDecay + hit;
      cal_trials_[b] = cal_trials_[b] * kCalDecay + 1.0;
    }
    accept_ema_[j] = accept_ema_[j] * kAcceptDecay + (1 - kAcceptDecay) * hit;
    if (st && j < static_cast<int>(st->trials.size())) {
      st->hits[j] = st->hits[j] * kRequestDecay + hit;
      st->trials[j] = st->trials[j] * kRequestDecay + 1.0;
    }
  }
}

void SpecPlanner::choose_drafts(std::span<SpecRequestState* const> states, std::span<const int> limits,
                                int64_t extra_tokens, std::vector<uint8_t>& draft) {
  const size_t R = states.size();
  draft.assign(R, 0);
  if (config_.verify_mode != "auto") {
    for (size_t r = 0; r < R; ++r) draft[r] = limits[r] > 0;
    return;
  }
  const double B0 = static_cast<double>(R + extra_tokens);
  const double base = static_cast<double>(R) / verify_cost_.predict(B0);
  const double d1 = draft_cost_.predict(1);
  // Each request's best verify length on its own, then requests by expected tokens per verified
  // token; the best prefix of that order (the draft's fixed cost is shared) wins if it beats not
  // drafting at all.
  opts_.clear();
  for (size_t r = 0; r < R; ++r) {
    SpecRequestState* st = states[r];
    st->probe = false;
    const int lim = std::min(k_, limits[r]);
    if (lim <= 0) continue;
    double surv = 1, g = 0, best_v = -1, best_g = 0;
    int best_l = 0;
    for (int l = 1; l <= lim; ++l) {
      surv *= acceptance(*st, l - 1);
      g += surv;
      double v = (static_cast<double>(R) + g) / (d1 + verify_cost_.predict(B0 + l));
      if (v > best_v) {
        best_v = v;
        best_l = l;
        best_g = g;
      }
    }
    opts_.push_back({best_g, best_g / best_l, best_l, static_cast<int>(r)});
  }
  std::sort(opts_.begin(), opts_.end(), [](const Opt& x, const Opt& y) {
    return x.density != y.density ? x.density > y.density : x.r < y.r;
  });
  double best = base * (1 + kMargin), gain = 0, len = 0;
  size_t best_n = 0;
  for (size_t n = 1; n <= opts_.size(); ++n) {
    gain += opts_[n - 1].gain;
    len += opts_[n - 1].len;
    double rate = (static_cast<double>(R) + gain) /
                  (draft_cost_.predict(static_cast<double>(n)) + verify_cost_.predict(B0 + len));
    if (rate > best) {
      best = rate;
      best_n = n;
    }
  }
  for (size_t i = 0; i < best_n; ++i) draft[opts_[i].r] = 1;
  for (size_t r = 0; r < R; ++r) {
    SpecRequestState* st = states[r];
    if (draft[r]) {
      st->steps_off = 0;
      st->probe_interval = kFirstProbe;
      continue;
    }
    if (limits[r] <= 0) continue;
    if (++st->steps_off >= st->probe_interval) {
      // Probe: the estimate only moves when drafts are verified; each probe that does not turn
      // drafting back on doubles the wait before the next one.
      draft[r] = 1;
      st->probe = true;
      st->steps_off = 0;
      st->probe_interval = std::min<int64_t>(st->probe_interval * 2, kMaxProbe);
    }
  }
}

void SpecPlanner::plan(std::span<const std::span<const float>> confidences, std::span<const int> limits,
                       int64_t extra_tokens, std::vector<int>& lengths, std::span<SpecRequestState* const> states) {
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
  // auto: Algorithm 1 (greedy admission by survival, break at the first non-improvement). Probes
  // verify everything they drafted: they exist to measure.
  const bool have_states = states.size() == R;
  double B = static_cast<double>(R + extra_tokens);
  double E = static_cast<double>(R);
  cands_.clear();
  for (size_t r = 0; r < R; ++r) {
    const int lim = std::min<int>({k_, limits[r], static_cast<int>(confidences[r].size())});
    const SpecRequestState* st = have_states ? states[r] : nullptr;
    double a = 1.0;
    if (st && st->probe) {
      lengths[r] = std::max(lim, 0);
      for (int j = 0; j < lim; ++j) E += (a *= acceptance(*st, j));
      B += std::max(lim, 0);
      continue;
    }
    for (int j = 0; j < lim; ++j) {
      double c = calibrated(confidences[r][j]);
      if (st) c = 0.5 * (c + acceptance(*st, j));
      a *= c;
      cands_.push_back({a, static_cast<int>(r), j});
    }
  }
  std::sort(cands_.begin(), cands_.end(), [](const Cand& x, const Cand& y) {
    if (x.a != y.a) return x.a > y.a;
    return x.r != y.r ? x.r < y.r : x.j < y.j;
  });
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

}  // namespace tandem
