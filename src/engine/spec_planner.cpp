// SpecPlanner and CostModel: see spec_planner.h.
#include "engine/spec_planner.h"

#include <algorithm>
#include <cmath>

namespace tandem {

namespace {
constexpr double kDecay = 0.97;       // cost fits forget old samples (shapes drift with context)
constexpr double kLevelRate = 0.5;    // the common level takes half of each surprise (in log): drift goes
                                      // mostly to the level, so stale shapes follow
constexpr double kAcceptDecay = 0.98;   // global estimate: the start of every new request's
constexpr double kRequestDecay = 0.8;       // a request's recent counts follow its text (code -> prose)
constexpr double kRequestLongDecay = 0.98;  // its long-run counts (what a stretch not drafted reverts to),
constexpr double kLongRunWeight = 4.0;      // which count as 4 recent verifies of evidence
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
  // Costs drift (context grows, the machine gets busier) for every shape at once, but only the
  // shapes in use are measured again: a common level follows every sample, and the table and the
  // line hold times relative to it, so shapes not run lately move with the ones that are.
  if (expected > 0 && !outlier) level_ = std::clamp(level_ * std::pow(seconds / expected, kLevelRate), 0.05, 20.0);
  const double norm = seconds / level_;
  int shape = static_cast<int>(x);
  if (shape >= 0 && shape <= kMaxShape) {
    double alpha = outlier ? 0.02 : 0.2;
    shape_ema_[shape] = shape_n_[shape] == 0 ? norm : (1 - alpha) * shape_ema_[shape] + alpha * norm;
    ++shape_n_[shape];
  }
  ++n_;
  if (outlier) return;
  w_ = w_ * kDecay + 1;
  sx_ = sx_ * kDecay + x;
  sy_ = sy_ * kDecay + norm;
  sxx_ = sxx_ * kDecay + x * x;
  sxy_ = sxy_ * kDecay + x * norm;
  ++fit_n_;
}

bool CostModel::has_shape(double x) const {
  int shape = static_cast<int>(x);
  return shape >= 0 && shape <= kMaxShape && shape == x && shape_n_[shape] >= kMinShapeSamples;
}

bool CostModel::fitted() const {
  if (fit_n_ < 4) return false;
  double mx = sx_ / w_;
  return sxx_ / w_ - mx * mx > 1e-9 * std::max(1.0, mx * mx);
}

double CostModel::predict(double x) const {
  if (has_shape(x)) return level_ * shape_ema_[static_cast<int>(x)];
  return level_ * linear(x);
}

double CostModel::linear(double x) const {
  if (fit_n_ == 0) return prior_c0_ + prior_c1_ * x;
  double mx = sx_ / w_, my = sy_ / w_;
  double var = sxx_ / w_ - mx * mx;
  double c1, c0;
  if (fitted()) {
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
      verify_by_seqs_(kMaxSeqBucket + 1, CostModel(1e-3, 2e-5)),
      draft_cost_(2e-4, 1e-5) {
  accept_ema_.resize(k_);
  for (int j = 0; j < k_; ++j) {
    double cond = j < 7 ? kPrior[j] / (j == 0 ? 1.0 : kPrior[j - 1]) : 0.5;
    accept_ema_[j] = cond;
  }
}

void SpecPlanner::observe_forward(int seqs, int64_t tokens, double seconds) {
  verify_cost_.add(static_cast<double>(tokens), seconds);
  verify_by_seqs_[std::clamp(seqs, 0, kMaxSeqBucket)].add(static_cast<double>(tokens), seconds);
}

double SpecPlanner::predict_forward(int seqs, int64_t tokens) const {
  const CostModel& m = verify_by_seqs_[std::clamp(seqs, 0, kMaxSeqBucket)];
  const double x = static_cast<double>(tokens);
  if (m.has_shape(x) || m.fitted()) return m.predict(x);
  if (m.samples() == 0) return verify_cost_.predict(x);
  // Few shapes seen at this sequence count: its level, the all-batches curve's slope.
  return std::max(0.0, m.mean_y() + verify_cost_.predict(x) - verify_cost_.predict(m.mean_x()));
}

void SpecPlanner::start_request(SpecRequestState& st) const {
  st.hits.assign(k_, 0.0);
  st.trials.assign(k_, 0.0);
  st.long_hits.assign(k_, 0.0);
  st.long_trials.assign(k_, 0.0);
  st.steps_off = 0;
  st.probe_interval = kFirstProbe;
  st.probe = false;
}

double SpecPlanner::acceptance(const SpecRequestState& st, int j) const {
  const double g = accept_ema_[j];
  if (j >= static_cast<int>(st.trials.size())) return g;
  // The request's long-run record shrunk toward the global estimate, its recent record toward that.
  const double lg = (kPriorWeight * g + st.long_hits[j]) / (kPriorWeight + st.long_trials[j]);
  return std::clamp((kLongRunWeight * lg + st.hits[j]) / (kLongRunWeight + st.trials[j]), 0.0, 1.0);
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
      st->long_hits[j] = st->long_hits[j] * kRequestLongDecay + hit;
      st->long_trials[j] = st->long_trials[j] * kRequestLongDecay + 1.0;
    }
  }
}

void SpecPlanner::choose_drafts(std::span<SpecRequestState* const> states, std::span<const int> limits,
                                int64_t extra_tokens, std::vector<uint8_t>& draft) {
  const size_t R = states.size();
  draft.assign(R, 0);
  if (config_.verify_mode != VerifyMode::kAuto) {
    for (size_t r = 0; r < R; ++r) draft[r] = limits[r] > 0;
    return;
  }
  const double B0 = static_cast<double>(R + extra_tokens);
  const int seqs = static_cast<int>(R) + (extra_tokens > 0 ? 1 : 0);
  auto V = [&](double tokens) { return predict_forward(seqs, static_cast<int64_t>(tokens)); };
  const double base = static_cast<double>(R) / V(B0);
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
      double v = (static_cast<double>(R) + g) / (d1 + V(B0 + l));
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
                  (draft_cost_.predict(static_cast<double>(n)) + V(B0 + len));
    if (rate > best) {
      best = rate;
      best_n = n;
    }
  }
  for (size_t i = 0; i < best_n; ++i) draft[opts_[i].r] = 1;
  // A draft launch serves every request in it for little more than one: probes share launches. The
  // step launches one if someone drafts or a probe is due; then every request at least halfway to
  // its probe is probed too (a batch's probes fall together instead of each paying a launch).
  bool launch = best_n > 0;
  for (size_t r = 0; r < R; ++r) {
    SpecRequestState* st = states[r];
    if (draft[r]) {
      st->steps_off = 0;
      st->probe_interval = kFirstProbe;
      continue;
    }
    if (limits[r] <= 0) continue;
    // The request's text moves on while it does not draft: its recent record ages as its verifies'
    // would, so its estimate drifts back to its own long-run one (a bad stretch is not held against
    // the text that follows it; text that was always poor stays poor).
    for (size_t j = 0; j < st->trials.size(); ++j) {
      st->hits[j] *= kRequestDecay;
      st->trials[j] *= kRequestDecay;
    }
    if (++st->steps_off >= st->probe_interval) launch = true;
  }
  if (!launch) return;
  for (size_t r = 0; r < R; ++r) {
    SpecRequestState* st = states[r];
    if (draft[r] || limits[r] <= 0 || 2 * st->steps_off < st->probe_interval) continue;
    // Probe: the estimate only moves when drafts are verified; each probe that does not turn
    // drafting back on doubles the wait before the next one.
    draft[r] = 1;
    st->probe = true;
    st->steps_off = 0;
    st->probe_interval = std::min<int64_t>(st->probe_interval * 2, kMaxProbe);
  }
}

void SpecPlanner::plan(std::span<const std::span<const float>> confidences, std::span<const int> limits,
                       int64_t extra_tokens, std::vector<int>& lengths, std::span<SpecRequestState* const> states) {
  const size_t R = confidences.size();
  lengths.assign(R, 0);
  if (config_.verify_mode == VerifyMode::kFixed) {
    for (size_t r = 0; r < R; ++r) lengths[r] = std::min<int>(k_, limits[r]);
    return;
  }
  if (config_.verify_mode == VerifyMode::kThreshold) {
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
  const bool have_states = states.size() == R;
  const int seqs = static_cast<int>(R) + (extra_tokens > 0 ? 1 : 0);
  auto V = [&](double tokens) { return predict_forward(seqs, static_cast<int64_t>(tokens)); };
  double B = static_cast<double>(R + extra_tokens);
  double E = static_cast<double>(R);
  cands_.clear();
  for (size_t r = 0; r < R; ++r) {
    const int lim = std::min<int>({k_, limits[r], static_cast<int>(confidences[r].size())});
    const SpecRequestState* st = have_states ? states[r] : nullptr;
    double a = 1.0;
    for (int j = 0; j < lim; ++j) {
      // A probe's request has a poor record; its fresh confidences alone say whether the text
      // turned predictable (a verify then updates the record). Otherwise both count.
      double c = calibrated(confidences[r][j]);
      if (st && !st->probe) c = 0.5 * (c + acceptance(*st, j));
      a *= c;
      cands_.push_back({a, static_cast<int>(r), j});
    }
  }
  std::stable_sort(cands_.begin(), cands_.end(), [](const Cand& x, const Cand& y) {
    if (x.a != y.a) return x.a > y.a;
    return x.r != y.r ? x.r < y.r : x.j < y.j;
  });
  // Candidates come in survival order, and a request's positions in order (survival only falls
  // along a request), so every prefix of the list is a valid plan. The best prefix wins; unlike the
  // paper's stop at the first non-improvement, this does not get stuck on a jagged cost table (a
  // measured shape that happens to be slow just after a fitted one).
  // The round's time includes its draft: already spent, but what the verified tokens are weighed
  // against is the round's rate (tokens per second of draft + verify), not the verify's alone,
  // which would cut verifies short whenever the draft costs a good part of a step.
  const double D = R > 0 ? draft_cost_.predict(static_cast<double>(R)) : 0.0;
  double best = E / (D + V(B));
  size_t best_n = 0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    E += cands_[i].a;
    B += 1;
    double theta = E / (D + V(B));
    if (theta > best) {
      best = theta;
      best_n = i + 1;
    }
  }
  for (size_t i = 0; i < best_n; ++i) lengths[cands_[i].r] = std::max(lengths[cands_[i].r], cands_[i].j + 1);
}

}  // namespace tandem
