// Comparators of the teacher-forced layer-by-layer test (layer_test.cpp): per-row residuals of
// residual streams and fp32 rows, the limits each piece gets from the CPU's own spread, discrete
// selections (indexer top-k, MoE routing) judged against the CPU's selection margin, and the
// report that prints every piece as one greppable `[cuda-layer]` line and collects the failures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace tandem::layer_compare {

// ---- limits ----
// Each piece is compared twice: the CUDA layer against the CPU layer, and the CPU layer against
// itself with only its GEMM instruction set changed (baseline SSE instead of AVX-512/AVX2: 4
// instead of 16 lanes, no FMA), both from the same teacher-forced inputs. The CUDA limit is
// kSpreadFactor times that spread (the golden tests' factor), but never below a floor, because
// the ISA switch varies only the GEMMs while the CUDA layer also sums the non-GEMM reductions in
// another fp32 order (mHC mixes, attention scores and softmax denominators, compressor pooling,
// the confidence head; the runner's kernels in src/model/cuda use FMA where the CPU rounds the
// product), computes expf with CUDA's libm, and runs its GEMMs and the attention's dots on the
// tensor cores (the decode GEMV, the prefill GEMMs and the flash-decode attention truncate each
// k16 step to 24 bits: at most k/16 * 2^-19 of sum |x w|, docs/PERFORMANCE.md). Those
// differences are a few fp32 ulps of the terms' magnitude; they reach a layer's output only where
// a value sits next to a bf16 (or FP8/FP4) rounding boundary and rounds the other way. The floors
// are that mechanism's size, fixed before any GPU result:
//  * residual streams (bf16 values, hc_post rounds every element): a flipped bf16 rounding moves
//    an element by one bf16 ulp, at most 2^-7 of the row's largest |value|; two such ulps per row
//    (kFlipMaxRel = 2^-6), a quarter of one on average over rows (kFlipMeanRel = 2^-9: flips are
//    rare, a systematic error touches every row), and at most 1/64 of the elements not bit-identical
//    (a dropped or extra rounding changes far more of them).
//  * fp32 rows (compressor rows, gate logits, logits: GEMM outputs without rounding): the inputs
//    are the same bf16 values except where an upstream rounding flipped, which moves an output by
//    a fraction of one input ulp: 2^-8 of the row's largest |value| at most, 2^-12 on average.
//  * records (KV records, FP4 indexer keys): at most 1/16 of the records a step writes may differ
//    (a wrong position, scale or layout changes all of them).
// The residual streams' floors are raised to the largest spread the CPU shows on any layer of the
// same kind of half in the same step (Spread below: a flip's measured reach in this model).
// Discrete selections are judged row by row instead (see Selection below).
constexpr double kSpreadFactor = 2.0;
constexpr double kFlipMaxRel = 1.0 / 64;
constexpr double kFlipMeanRel = 1.0 / 512;
constexpr double kFlipDifferFrac = 1.0 / 64;
constexpr double kFp32MaxRel = 1.0 / 256;
constexpr double kFp32MeanRel = 1.0 / 4096;
constexpr double kRecordDifferFrac = 1.0 / 16;

inline bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// ---- per-row residuals ----
// rel of a row = max |got - want| / max |want| over the row (the golden tests' measure).
struct Residual {
  int64_t rows = 0, skipped = 0, elems = 0, elems_differ = 0, nan_mismatch = 0, worst_row = -1, first_row = -1;
  double max_rel = 0, mean_rel = 0, max_abs = 0;
  double differ_frac() const { return elems ? static_cast<double>(elems_differ) / static_cast<double>(elems) : 0.0; }
};

// Rows with skip[r] != 0 are left out (rows whose discrete selection differs, judged apart).
inline Residual residual(const float* got, const float* want, int64_t rows, int64_t cols,
                         const std::vector<uint8_t>* skip = nullptr) {
  Residual s;
  for (int64_t r = 0; r < rows; ++r) {
    if (skip && (*skip)[static_cast<size_t>(r)]) {
      ++s.skipped;
      continue;
    }
    double mx = 0, mb = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float a = got[r * cols + c], b = want[r * cols + c];
      if (!same_value(a, b)) {
        ++s.elems_differ;
        if (s.first_row < 0) s.first_row = r;
      }
      if (std::isnan(a) != std::isnan(b) || (std::isinf(a) != std::isinf(b))) {
        ++s.nan_mismatch;
        continue;
      }
      if (std::isnan(b) || std::isinf(b)) continue;
      mx = std::max(mx, std::fabs(static_cast<double>(a) - b));
      mb = std::max(mb, std::fabs(static_cast<double>(b)));
    }
    s.elems += cols;
    const double rel = mx / std::max(mb, 1e-30);
    if (s.worst_row < 0 || rel > s.max_rel) {
      s.worst_row = r;
      s.max_rel = rel;
    }
    s.max_abs = std::max(s.max_abs, mx);
    s.mean_rel += rel;
    ++s.rows;
  }
  s.mean_rel /= static_cast<double>(std::max<int64_t>(s.rows, 1));
  return s;
}

struct RowLimit {
  double max_rel = 0, mean_rel = 0, differ_frac = -1;  // differ_frac < 0: not limited
};
// The largest CPU spread over one kind of half (attention or FFN) of every layer of a step: how far
// one rounding flip travels through a half of this model, measured. It is also a floor for each
// half of that kind, at factor 1: a half whose own GEMMs happen not to flip on the CPU still has
// non-GEMM reductions that may flip on the device, with the same reach.
struct Spread {
  double max_rel = 0, mean_rel = 0, differ_frac = 0;
};
inline Spread worst_spread(const std::vector<Residual>& v) {
  Spread w;
  for (const Residual& r : v) {
    w.max_rel = std::max(w.max_rel, r.max_rel);
    w.mean_rel = std::max(w.mean_rel, r.mean_rel);
    w.differ_frac = std::max(w.differ_frac, r.differ_frac());
  }
  return w;
}
// In a step of few rows the floors admit one flipped row: a flip upstream of a row-wide
// projection (wo_b after the attention output, w2 and the combine after the experts) moves every
// output of its row and reaches a sizeable part of the row's elements (a single attention-output
// flip reached 136 of a 1024-element row in a 6-row verify step on the GPU: run2/5), so the
// element and mean floors are at least one row's worth: 1/rows of the elements, kFlipMaxRel/rows.
inline RowLimit bf16_row_limit(const Residual& spread, const Spread& model = {}) {
  const double rows = static_cast<double>(std::max<int64_t>(spread.rows, 1));
  return {std::max({kSpreadFactor * spread.max_rel, model.max_rel, kFlipMaxRel}),
          std::max({kSpreadFactor * spread.mean_rel, model.mean_rel, kFlipMeanRel, kFlipMaxRel / rows}),
          std::max({kSpreadFactor * spread.differ_frac(), model.differ_frac, kFlipDifferFrac, 1.0 / rows})};
}
inline RowLimit fp32_row_limit(const Residual& spread) {
  return {std::max(kSpreadFactor * spread.max_rel, kFp32MaxRel), std::max(kSpreadFactor * spread.mean_rel, kFp32MeanRel),
          -1};
}
// A step whose GEMMs take the tensor cores (prefill chunks of more than tc_min_rows rows) sums
// every GEMM in another order than the GEMV/decode kernels and the CPU (FP8 wgmma keeps about 14
// bits while summing a 128-K block: kernels/cuda/gemm_tc.h), so far more bf16/FP8 roundings flip
// than the CPU's GEMM instruction-set switch shows. Such a piece is held to kSpreadFactor times the
// GPU's own spread between its two accumulation paths on the same teacher-forced inputs (the same
// piece on the model pinned to the GEMV/decode kernels), where that is more than the CPU-derived
// limit; which rule applied is printed. (The GEMV model's own pieces of the same step are compared
// with the CPU-derived limits: that is where a formula error of the prefill rows shows. The
// tensor-core kernels themselves are pinned by their op tests: exact sums bit for bit, random
// inputs within the stated bound.)
inline RowLimit gpu_spread_limit(const RowLimit& cpu, const Residual& gpu) {
  RowLimit l = cpu;
  l.max_rel = std::max(l.max_rel, kSpreadFactor * gpu.max_rel);
  l.mean_rel = std::max(l.mean_rel, kSpreadFactor * gpu.mean_rel);
  if (l.differ_frac >= 0) l.differ_frac = std::max(l.differ_frac, kSpreadFactor * gpu.differ_frac());
  return l;
}
inline bool gpu_rule_applies(const RowLimit& cpu, const RowLimit& gpu) {
  return gpu.max_rel > cpu.max_rel || gpu.mean_rel > cpu.mean_rel || gpu.differ_frac > cpu.differ_frac;
}

// ---- records ----
// A record differs when the values it decodes to differ (NaN equal to NaN): the values are what
// attention and the indexer read. Bytes are not compared here: the encoding of a value set is not
// unique (a group whose amax rounds down to a power-of-two boundary, 224 * 2^e in e4m3 or 3 * 2^e
// in e2m1, re-encodes with the scale one binade lower and every code doubled: the same values), so
// the CPU's state re-encoded from its decoded floats need not repeat the device's bytes. The
// encoders are pinned byte for byte against the CPU's encoders by tests/cuda/kv_record_test.cpp.
struct RecordDiff {
  int64_t records = 0, differ = 0, first = -1;
  double max_abs = 0;  // decoded values against the reference
};
inline int64_t record_limit(int64_t records, int64_t spread_differ) {
  return std::max<int64_t>(static_cast<int64_t>(kSpreadFactor * static_cast<double>(spread_differ)),
                           static_cast<int64_t>(std::ceil(kRecordDifferFrac * static_cast<double>(records))));
}

// ---- discrete selections ----
// A selection (the indexer's top-k entries of a row, the experts a token is routed to) may differ
// only where the CPU's own choice was a near tie: the gap between the last selected and the first
// rejected candidate (the CPU's margin, in its score units) is at most the change of two scores,
// 2 * max |device score - CPU score| over the row. Such a row is "explained" and left out of the
// row residuals of that half-layer (its output legitimately differs by a different key or expert);
// any other differing row is a real error (tie order, a wrong score, a wrong candidate set).
struct Selection {
  int64_t rows = 0, differ = 0, explained = 0, unexplained = 0;
  std::vector<uint8_t> row_differs;
  std::string first_unexplained;
};

// Gap between the k-th and (k+1)-th best of v[0..n) (larger first, lower index first on ties); +inf
// when every candidate is selected.
inline double selection_margin(const std::vector<double>& v, int64_t k) {
  const int64_t n = static_cast<int64_t>(v.size());
  if (k >= n || k <= 0) return std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, int64_t>> c(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) c[i] = {v[i], i};
  auto before = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  std::nth_element(c.begin(), c.begin() + k, c.end(), before);
  const double kth = std::min_element(c.begin(), c.begin() + k, [&](const auto& a, const auto& b) { return before(b, a); })->first;
  return kth - c[static_cast<size_t>(k)].first;
}

// got/want: [rows, ld] id lists; the first count(r) entries of a row form its selection (order
// ignored). scores(r, cpu, dev) fills the row's candidate scores of both sides (empty dev: not
// available, the row counts as unexplained).
inline Selection compare_selection(const int32_t* got, const int32_t* want, int64_t rows, int64_t ld,
                                   const std::function<int64_t(int64_t)>& count,
                                   const std::function<void(int64_t, std::vector<double>&, std::vector<double>&)>& scores) {
  Selection s;
  s.rows = rows;
  s.row_differs.assign(static_cast<size_t>(rows), 0);
  std::vector<int32_t> a, b;
  std::vector<double> cs, ds;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = count(r);
    a.assign(got + r * ld, got + r * ld + k);
    b.assign(want + r * ld, want + r * ld + k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) continue;
    ++s.differ;
    s.row_differs[static_cast<size_t>(r)] = 1;
    scores(r, cs, ds);
    double delta = 0;
    const bool have = !ds.empty() && ds.size() == cs.size();
    if (have) {
      for (size_t i = 0; i < cs.size(); ++i) {
        if (std::isfinite(cs[i]) && std::isfinite(ds[i])) {
          delta = std::max(delta, std::fabs(ds[i] - cs[i]));
        } else if (std::isfinite(cs[i]) != std::isfinite(ds[i])) {
          delta = std::numeric_limits<double>::infinity();
        }
      }
    }
    const double margin = selection_margin(cs, k);
    if (have && delta > 0 && margin <= 2 * delta) {
      ++s.explained;
      continue;
    }
    ++s.unexplained;
    if (s.first_unexplained.empty()) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "row %lld: cpu margin %.4g, score change %s%.4g", static_cast<long long>(r), margin,
                    have ? "" : "(device scores unavailable) ", delta);
      s.first_unexplained = buf;
    }
  }
  return s;
}

// ---- report ----
struct Report {
  int pieces = 0, failed = 0;
  std::vector<std::string> lines, failures;
  std::string worst_piece;
  double worst_rel = 0;

  // Prints `line` with OK/FAIL and records a failure.
  void line(const std::string& text, bool ok) {
    ++pieces;
    lines.push_back(text);
    std::printf("[cuda-layer] %s %s\n", text.c_str(), ok ? "OK" : "FAIL");
    std::fflush(stdout);
    if (!ok) {
      ++failed;
      if (failures.size() < 40) failures.push_back(text);
    }
  }
  void note_rel(const std::string& piece, double rel) {
    if (rel > worst_rel) {
      worst_rel = rel;
      worst_piece = piece;
    }
  }
};

inline std::string fmt_rows(const Residual& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "rows %lld max-rel %.3g mean-rel %.3g max-abs %.3g differ %lld/%lld (first row %lld, worst row %lld)%s",
                static_cast<long long>(r.rows), r.max_rel, r.mean_rel, r.max_abs, static_cast<long long>(r.elems_differ),
                static_cast<long long>(r.elems), static_cast<long long>(r.first_row), static_cast<long long>(r.worst_row),
                r.nan_mismatch ? " NaN/inf MISMATCH" : "");
  std::string s = buf;
  if (r.skipped) s += " [" + std::to_string(r.skipped) + " rows with a different selection left out]";
  return s;
}

// One continuous piece: prints device-vs-CPU, the CPU spread and the limit; false over the limit.
// With gpu (a tensor-core step): also the GPU's tc-vs-GEMV spread, the limit raised to
// gpu_spread_limit, and which rule applied.
inline bool check_rows(Report& rep, const std::string& tag, const Residual& got, const Residual& spread,
                       const RowLimit& cpu_lim, const Residual* gpu = nullptr) {
  const RowLimit lim = gpu ? gpu_spread_limit(cpu_lim, *gpu) : cpu_lim;
  const bool ok = got.nan_mismatch == 0 && got.max_rel <= lim.max_rel && got.mean_rel <= lim.mean_rel &&
                  (lim.differ_frac < 0 || got.differ_frac() <= lim.differ_frac);
  char buf[256];
  std::snprintf(buf, sizeof buf, " | cpu-spread max-rel %.3g mean-rel %.3g differ %lld", spread.max_rel, spread.mean_rel,
                static_cast<long long>(spread.elems_differ));
  std::string text = tag + ": " + fmt_rows(got) + buf;
  if (gpu) {
    std::snprintf(buf, sizeof buf, " | gpu tc-vs-gemv spread max-rel %.3g mean-rel %.3g differ %lld", gpu->max_rel,
                  gpu->mean_rel, static_cast<long long>(gpu->elems_differ));
    text += buf;
  }
  std::snprintf(buf, sizeof buf, " | limit max-rel %.3g mean-rel %.3g", lim.max_rel, lim.mean_rel);
  text += buf;
  if (lim.differ_frac >= 0) {
    std::snprintf(buf, sizeof buf, " differ-frac %.3g", lim.differ_frac);
    text += buf;
  }
  if (gpu) text += gpu_rule_applies(cpu_lim, lim) ? " (rule: 2 x gpu tc-vs-gemv spread)" : " (rule: cpu-derived)";
  rep.line(text, ok);
  rep.note_rel(tag, got.max_rel);
  return ok;
}

// Records: at most record_limit of them decode to other values; with gpu (a tensor-core step) the
// limit is at least kSpreadFactor times the records the GPU's two paths disagree on.
inline bool check_records(Report& rep, const std::string& tag, const RecordDiff& got, const RecordDiff& spread,
                          const RecordDiff* gpu = nullptr) {
  const int64_t cpu_lim = record_limit(got.records, spread.differ);
  const int64_t gpu_lim = gpu ? static_cast<int64_t>(kSpreadFactor * static_cast<double>(gpu->differ)) : 0;
  const int64_t lim = std::max(cpu_lim, gpu_lim);
  const bool ok = got.differ <= lim;
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s: records %lld differ %lld (first %lld, decoded max-abs %.3g) | cpu-spread differ %lld", tag.c_str(),
                static_cast<long long>(got.records), static_cast<long long>(got.differ),
                static_cast<long long>(got.first), got.max_abs, static_cast<long long>(spread.differ));
  std::string text = buf;
  if (gpu) {
    std::snprintf(buf, sizeof buf, " | gpu tc-vs-gemv spread differ %lld", static_cast<long long>(gpu->differ));
    text += buf;
  }
  std::snprintf(buf, sizeof buf, " | limit %lld", static_cast<long long>(lim));
  text += buf;
  if (gpu) text += gpu_lim > cpu_lim ? " (rule: 2 x gpu tc-vs-gemv spread)" : " (rule: cpu-derived)";
  rep.line(text, ok);
  return ok;
}

inline bool check_selection(Report& rep, const std::string& tag, const Selection& got, const Selection& spread) {
  const bool ok = got.unexplained == 0;
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s: rows %lld differ %lld (near-tie explained %lld, unexplained %lld) | cpu-spread differ %lld",
                tag.c_str(), static_cast<long long>(got.rows), static_cast<long long>(got.differ),
                static_cast<long long>(got.explained), static_cast<long long>(got.unexplained),
                static_cast<long long>(spread.differ));
  std::string text = buf;
  if (!got.first_unexplained.empty()) text += " first unexplained " + got.first_unexplained;
  rep.line(text, ok);
  return ok;
}

}  // namespace tandem::layer_compare
