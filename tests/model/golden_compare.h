// The golden comparison's measures and limits, shared by the CPU golden test (golden_test.cpp) and
// the CUDA whole-model and golden tests (tests/cuda/model_test.cpp): per-row relative error, top-1
// agreement, the exact leading rows, the limits derived from a golden's record of the official
// reference's own prefill-vs-decode spread (tools/golden/README.md), and the draft comparison over
// the positions whose earlier draft tokens agree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/numeric.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace tandem::golden {

// Both we and the reference's second path differ from its first path only by fp32 summation order
// amplified through bf16/FP8 rounding flips, so our spread is held to kSpreadFactor times the
// reference's.
constexpr double kSpreadFactor = 2.0;
// A row is "exact" while it agrees to the golden file's F16 storage precision.
constexpr double kExactRel = 1e-3;

inline std::vector<float> as_float(const TensorView& t) {
  std::vector<float> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], t.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = t.dtype == DType::kF16 ? num::f16_to_f32(h) : num::bf16_to_f32(h);
    }
  }
  return out;
}

struct Stats {
  double max_abs = 0, max_rel = 0, mean_rel = 0;  // rel: per row, max|a-b| / max|b|
  double top1 = 0;
  int64_t rows = 0, disagree = 0;
  bool nan_mismatch = false;
};

inline Stats compare(const float* a, const float* b, int64_t rows, int64_t V) {
  Stats s;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = 0, mb = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double x = a[r * V + v], y = b[r * V + v];
      if (std::isnan(x) != std::isnan(y)) s.nan_mismatch = true;
      mx = std::max(mx, std::fabs(x - y));
      mb = std::max(mb, std::fabs(y));
      if (a[r * V + v] > a[r * V + ia]) ia = v;
      if (b[r * V + v] > b[r * V + ib]) ib = v;
    }
    s.max_abs = std::max(s.max_abs, mx);
    const double rel = mx / std::max(mb, 1e-6);
    s.max_rel = std::max(s.max_rel, rel);
    s.mean_rel += rel;
    agree += ia == ib;
  }
  s.rows = rows;
  s.disagree = rows - agree;
  s.mean_rel /= std::max<int64_t>(rows, 1);
  s.top1 = static_cast<double>(agree) / std::max<int64_t>(rows, 1);
  return s;
}

// Rows before the first one that differs by more than kExactRel (a formula error shows on the
// first rows, long before any aggregate limit moves).
inline int64_t exact_prefix(const float* a, const float* b, int64_t rows, int64_t V) {
  int64_t n = 0;
  while (n < rows && compare(a + n * V, b + n * V, 1, V).max_rel <= kExactRel) ++n;
  return n;
}

// Top-1 disagreements are rare events (rows where a rounding flip meets a near tie): a count over
// `rows` rows at `rate` per row is Poisson; the limit is its 99% quantile, so a handful of rows
// does not make the limit a coin toss.
inline int64_t disagree_limit(double rate, int64_t rows) {
  const double mean = rate * static_cast<double>(rows);
  double pk = std::exp(-mean), cdf = pk;
  int64_t k = 0;
  while (cdf < 0.99) {
    ++k;
    pk *= mean / static_cast<double>(k);
    cdf += pk;
  }
  return k;
}

struct Limits {
  double max_rel = 0;        // kSpreadFactor x the reference's own max rel (per row, to the row max)
  double disagree_rate = 0;  // top-1 disagreements per row: kSpreadFactor x the reference's own rate
};

// The limits of a golden from its reference_self_consistency record (fields required).
inline ::testing::AssertionResult limits_from_spread(const nlohmann::json& info, Limits* out) {
  if (!info.contains("reference_self_consistency"))
    return ::testing::AssertionFailure() << "golden lacks reference_self_consistency: regenerate it (tools/golden)";
  const auto& self = info["reference_self_consistency"];
  for (const char* f : {"max_rel_to_row_max", "top1_agreement"})
    if (!self.contains(f) || !self[f].is_number())
      return ::testing::AssertionFailure() << "reference_self_consistency lacks " << f;
  out->max_rel = kSpreadFactor * self["max_rel_to_row_max"].get<double>();
  out->disagree_rate = kSpreadFactor * (1.0 - self["top1_agreement"].get<double>());
  return ::testing::AssertionSuccess();
}

// data/golden/<name>.json of the source tree.
inline ::testing::AssertionResult load_info(const std::string& name, nlohmann::json* info) {
  const std::filesystem::path p = std::filesystem::path(TANDEM_SOURCE_DIR) / "data/golden" / (name + ".json");
  std::ifstream jf(p);
  if (!jf) return ::testing::AssertionFailure() << "missing " << p.string();
  std::stringstream ss;
  ss << jf.rdbuf();
  *info = nlohmann::json::parse(ss.str(), nullptr, false);
  if (info->is_discarded()) return ::testing::AssertionFailure() << "unparsable " << p.string();
  return ::testing::AssertionSuccess();
}

// The golden was computed on one exact checkpoint: a changed make-tiny or a retrained built-in
// model must be noticed as such, not as a numeric failure (checkpoint_sha256 is required).
inline ::testing::AssertionResult checkpoint_matches(const nlohmann::json& info, const std::filesystem::path& dir) {
  if (!info.contains("checkpoint_sha256") || info["checkpoint_sha256"].empty())
    return ::testing::AssertionFailure() << "golden lacks checkpoint_sha256";
  for (const auto& [file, want] : info["checkpoint_sha256"].items()) {
    auto got = sha256_file_hex((dir / file).string());
    if (!got.ok()) return ::testing::AssertionFailure() << got.status().to_string();
    if (*got != want.get<std::string>())
      return ::testing::AssertionFailure() << "checkpoint changed (" << file
                                           << "): regenerate data/golden as tools/golden/README.md says";
  }
  return ::testing::AssertionSuccess();
}

// Draft rows: ours [ours_steps, K, V] against ref [ref_steps, K, V], ref step st = our step st +
// shift. Position k of a step is conditioned on the draft's own greedy tokens 0..k-1; where those
// differ from the reference's, the two rows answer different questions, so a position is compared
// only while the tokens before it agree. Confidence errors are relative to the largest |reference
// confidence|.
struct DraftStats {
  Stats s;
  int64_t compared = 0, total = 0;
  double conf_rel = 0;
};
inline DraftStats compare_draft(const std::vector<float>& ours, const std::vector<int32_t>& ours_tok,
                                const std::vector<float>& ours_conf, const std::vector<float>& ref,
                                const std::vector<int32_t>& ref_tok, const std::vector<float>& ref_conf,
                                int64_t ref_steps, int64_t K, int64_t V, int64_t shift) {
  DraftStats d;
  double conf_scale = 0;
  for (int64_t i = 0; i < ref_steps * K; ++i) conf_scale = std::max(conf_scale, std::fabs(double(ref_conf[i])));
  conf_scale = std::max(conf_scale, 1e-30);
  d.total = ref_steps * K;
  for (int64_t st = 0; st < ref_steps; ++st)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t o = (st + shift) * K + k, g = st * K + k;
      if (k > 0 && ours_tok[o - 1] != ref_tok[g - 1]) break;
      const Stats r = compare(ours.data() + o * V, ref.data() + g * V, 1, V);
      d.s.max_abs = std::max(d.s.max_abs, r.max_abs);
      d.s.max_rel = std::max(d.s.max_rel, r.max_rel);
      d.s.mean_rel += r.mean_rel;
      d.s.disagree += r.disagree;
      d.s.nan_mismatch = d.s.nan_mismatch || r.nan_mismatch;
      ++d.compared;
      d.conf_rel = std::max(d.conf_rel, std::fabs(double(ours_conf[o]) - ref_conf[g]) / conf_scale);
    }
  d.s.rows = d.compared;
  d.s.mean_rel /= static_cast<double>(std::max<int64_t>(d.compared, 1));
  d.s.top1 = 1.0 - static_cast<double>(d.s.disagree) / static_cast<double>(std::max<int64_t>(d.compared, 1));
  return d;
}

}  // namespace tandem::golden
