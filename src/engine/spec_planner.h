// SpecPlanner: decides, each step, which requests draft and how many of each request's K draft
// tokens the target verifies.
//  * "fixed": every decoding request drafts and verifies all K.
//  * "threshold": every request drafts; it verifies up to the first position whose confidence is
//    below the threshold.
//  * "auto": drafting costs time before anything is known about this step's drafts, so it is
//    decided per request from what that request has shown so far: a per-request estimate of the
//    acceptance at each draft position (decayed counts of its recent verifies, shrunk toward its
//    long-run counts, those toward the running global estimate) gives the expected accepted
//    tokens, and the measured cost of the batch shapes (forward time per token count, draft time
//    per request count) says whether drafting for a set of requests raises tokens per second; a
//    request for which it does not stops drafting and is re-probed after 4, 8, ... 256 of its
//    steps (a step that launches a draft anyway probes every request at least halfway to its probe:
//    one launch serves them all), while its recent counts age step by step (its text moves on), so
//    that a bad stretch gives way to the request's long-run estimate. Once drafts exist, the verify
//    lengths follow the paper's Algorithm 1: (request, position) pairs are ordered by prefix survival (the product of
//    the draft's confidences, calibrated online against observed outcomes per confidence decile
//    and averaged with the request's own estimate; a probe's by its confidences alone, so a probe
//    whose drafts look hopeless costs a draft and no verify) and the prefix of that order with the
//    most expected tokens per second of the round (its draft's time included) is verified.
// Costs are measured: the engine profiles every batch shape at start-up (EngineCore) and keeps
// feeding real step times, so the tables follow context growth and machine load.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace tandem {

// Cost of one batch shape (x = tokens or requests): a per-shape table of measured times (EMA) for
// shapes seen often enough — real costs are jagged (kernel tiles, graph buckets) — and elsewhere
// seconds ~= c0 + c1 * x, fitted by exponentially weighted least squares over all samples; both
// relative to a common level that follows every sample (drift: longer context, a busier machine).
class CostModel {
 public:
  static constexpr int kMaxShape = 1024;
  static constexpr int kMinShapeSamples = 3;
  CostModel(double prior_c0, double prior_c1) : prior_c0_(prior_c0), prior_c1_(prior_c1) {}
  void add(double x, double seconds);
  double predict(double x) const;
  int64_t samples() const { return n_; }
  bool has_shape(double x) const;  // a measured time for exactly this shape
  bool fitted() const;             // enough distinct shapes for its own line
  double mean_x() const { return w_ > 0 ? sx_ / w_ : 0.0; }
  double mean_y() const { return w_ > 0 ? level_ * sy_ / w_ : 0.0; }

 private:
  double linear(double x) const;
  double prior_c0_, prior_c1_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  int64_t n_ = 0, fit_n_ = 0;
  double level_ = 1.0;  // common cost level; the table and the fit hold times divided by it
  std::vector<double> shape_ema_ = std::vector<double>(kMaxShape + 1, 0.0);
  std::vector<int> shape_n_ = std::vector<int>(kMaxShape + 1, 0);
};

// What the planner knows about one request (kept with the request by the engine).
struct SpecRequestState {
  std::vector<double> hits, trials;  // decayed per-position counts of this request's recent verifies
  std::vector<double> long_hits, long_trials;  // the same over its longer run
  int64_t steps_off = 0;             // steps since it last drafted
  int64_t probe_interval = 0;        // steps without drafting before the next probe
  bool probe = false;                // this step's draft is a probe (judged by its confidences alone)
};

class SpecPlanner {
 public:
  static constexpr int kFirstProbe = 4;
  static constexpr int kMaxProbe = 256;

  SpecPlanner(const SpeculativeConfig& config, int num_draft_tokens);

  void start_request(SpecRequestState& st) const;
  // Which of the decoding requests draft now (draft[i] = 1). limits[i]: the most request i may
  // verify (max_tokens, max_model_len). extra_tokens: other tokens in the next forward.
  void choose_drafts(std::span<SpecRequestState* const> states, std::span<const int> limits, int64_t extra_tokens,
                     std::vector<uint8_t>& draft);
  // Verify lengths for requests holding drafts. states may be empty (then confidences alone).
  void plan(std::span<const std::span<const float>> confidences, std::span<const int> limits, int64_t extra_tokens,
            std::vector<int>& lengths, std::span<SpecRequestState* const> states = {});
  // A verify of `verified` drafts of which the first `accepted` were accepted; confidences (may be
  // empty) are the draft's, which the planner calibrates against the outcomes.
  void observe_verify(SpecRequestState* st, int verified, int accepted, std::span<const float> confidences = {});
  // The draft's confidence mapped to the acceptance rate observed for such confidences.
  double calibrated(double confidence) const;
  // A forward of `seqs` sequences with `tokens` new tokens in all took `seconds`.
  void observe_forward(int seqs, int64_t tokens, double seconds);
  void observe_draft(int requests, double seconds) { draft_cost_.add(static_cast<double>(requests), seconds); }

  // Conditional acceptance at position j for a request (its counts shrunk toward the global EMA).
  double acceptance(const SpecRequestState& st, int j) const;
  const std::vector<double>& acceptance_ema() const { return accept_ema_; }
  double predict_forward(int seqs, int64_t tokens) const;
  double predict_draft(int requests) const { return draft_cost_.predict(static_cast<double>(requests)); }
  static constexpr int kMaxSeqBucket = 16;  // forward costs are kept per sequence count up to this

 private:
  SpeculativeConfig config_;
  int k_;
  // Forward cost by token count, one model per sequence count (1..kMaxSeqBucket, the last for all
  // larger batches) plus one over all batches for counts not seen yet: a batch of 8 one-token
  // decodes and one sequence verifying 8 tokens can cost very different amounts (per-sequence work:
  // attention, compressor state, indexer).
  CostModel verify_cost_;
  std::vector<CostModel> verify_by_seqs_;
  CostModel draft_cost_;
  std::vector<double> accept_ema_;  // global P(position j accepted | verified and prefix accepted)
  static constexpr int kBins = 10;  // confidence calibration: decayed outcomes per confidence decile
  double cal_hits_[kBins] = {}, cal_trials_[kBins] = {};
  struct Cand {
    double a;
    int r, j;
  };
  std::vector<Cand> cands_;
  struct Opt {
    double gain, density;
    int len, r;
  };
  std::vector<Opt> opts_;
};

}  // namespace tandem
