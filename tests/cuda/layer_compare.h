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
#include <map>
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
//  * records (KV records, FP4 indexer keys): a record differs where one of its values sat next to
//    an FP8/FP4/bf16 rounding boundary, a rare event independent from record to record. Over the
//    whole script, at most 1/16 of the records of each kind written on the GEMV path and in decode
//    and verify steps may differ (kRecordDifferFrac; tensor-core steps are held to their
//    tensor-core-emulated spread piece by piece, see below); one piece (a layer's records of one
//    step, often 10 to 32 of them) may reach 1/4 (kRecordPieceFrac), because rare independent flips
//    bunch: at a mean of one per 32-record piece, 8% of pieces hold 3 or more, and a script
//    compares hundreds (measured on an H200, run3: 3 and 4 of 32 compressed entries on single
//    pieces, decoded max-abs 0.0024, with the script's total of that kind at 9 of 235). A wrong
//    position, scale or layout changes every record of a piece, so both limits catch it
//    (LayerHarness.InjectedFaultsAreReportedOnTheirPiece).
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
constexpr double kRecordPieceFrac = 1.0 / 4;

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
// A step whose GEMMs take the tensor cores (prefill chunks of more than tc_min_rows rows, the
// draft's context insertion of 150 rows) sums every GEMM in another order and at another precision
// than the GEMV/decode kernels and the CPU (FP8 wgmma keeps about 14 bits while summing a 128-K
// block, bf16 mma truncates each k16 step to 24 bits: kernels/cuda/gemm_tc.h, bounds in
// tests/cuda/tc_bound.h), so far more bf16/FP8/FP4 roundings flip than the CPU's instruction-set
// switch shows. Such a step gets a third CPU run from the same inputs and state: the CPU layer with
// every GEMM the CUDA model runs on the tensor cores in that step (the FP8 linears, the bf16
// linears and wo_a's grouped einsum, the grouped MXFP4 experts) computed as the tensor cores
// accumulate (tests/cuda/tc_emulation.h, through the CPU GEMM's testing hook). Its spread against
// the CPU's own run takes the ISA spread's place in the same derivation (kSpreadFactor times the
// piece's spread, the largest of that kind of half in the step as a floor, the flip floors), and
// the piece's limit is the larger of that and the CPU-derived limit; its records are limited by
// the same run's record differences. Which rule applied is printed. The GPU's own spread between its
// tensor-core run and its GEMV run of the step (the same piece on the model pinned to the GEMV
// kernels) is printed beside it as information only: as a limit it was circular (where the GEMV
// piece equals the CPU's, twice the tensor-core piece's own distance admits any error of that
// piece). The GEMV model's pieces of the same step are compared with the CPU-derived limits: that
// is where a formula error of the prefill rows shows; the tensor-core kernels themselves are pinned
// by their op tests (exact sums bit for bit, random inputs within the stated bound). The
// emulation's own error is within the stated bounds (tests/cuda/tc_emulation_test.cpp); the
// harness's self-test shows a tensor-core piece off by more than they allow reported on its piece
// and tensor-core arithmetic within them passing (LayerHarness.InjectedFaultsAreReportedOnTheirPiece).
// Measured on the CPU before any GPU run of this rule (tiny and built-in models, 131-row prefill
// steps): the emulated run differs from the CPU's own by max rel 0.007 to 0.026 per half, in 20 to
// 37% of an attention half's elements and 7 to 13% of an FFN half's, with 6 to 31 indexer-score
// rows of 131 over the row limit (query flips); the H200 measured its tensor-core prefill halves
// against the CPU at max rel 0.020 and 8 to 26% of the elements (run3).
struct TcRows {
  Residual spread;                 // the CPU with the tensor cores' accumulation emulated vs the CPU
  RowLimit lim;                    // derived from spread as the CPU-derived limit is from the ISA spread
  const Residual* gpu = nullptr;   // the GPU's tensor-core run vs its GEMV run (information), or null
};
inline RowLimit max_limit(const RowLimit& a, const RowLimit& b) {
  return {std::max(a.max_rel, b.max_rel), std::max(a.mean_rel, b.mean_rel),
          a.differ_frac < 0 ? a.differ_frac : std::max(a.differ_frac, b.differ_frac)};
}
inline bool raises(const RowLimit& base, const RowLimit& l) {
  return l.max_rel > base.max_rel || l.mean_rel > base.mean_rel || l.differ_frac > base.differ_frac;
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
                           static_cast<int64_t>(std::ceil(kRecordPieceFrac * static_cast<double>(records))));
}
// The whole script's records: at most kRecordDifferFrac of them (and twice the CPU spread's) differ.
inline int64_t record_total_limit(int64_t records, int64_t spread_differ) {
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
  struct RecordTotal {
    int64_t records = 0, differ = 0, spread = 0;
  };
  std::map<std::string, RecordTotal> record_totals;  // per kind of record piece, over the whole script
  std::vector<std::string> lines, failures;
  std::string worst_piece;
  double worst_rel = 0;
  // The worst residual per (layer kind, piece, path), for the test's JSON record (by_kind_text).
  struct KindWorst {
    int pieces = 0;
    double max_rel = 0, mean_rel = 0, differ_frac = 0;
  };
  std::map<std::string, KindWorst> by_kind;

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
  // Key of a piece's tag "subject | step [path] | Lk KIND[/hash] | piece[ (notes)]": "KIND piece | path".
  static std::string kind_key(const std::string& tag) {
    const bool tc = tag.find("[tensor cores]") != std::string::npos;
    std::string kind = "draft";
    for (const char* k : {"CSA", "HCA", "SWA"})
      if (tag.find(std::string(" ") + k) != std::string::npos) kind = k;
    const size_t bar = tag.rfind(" | ");
    std::string piece = bar == std::string::npos ? tag : tag.substr(bar + 3);
    piece = piece.substr(0, piece.find_first_of(" (:"));
    return kind + " " + piece + (tc ? " | tensor cores" : " | GEMV path, decode and verify");
  }
  void note_kind(const std::string& tag, double max_rel, double mean_rel, double differ_frac) {
    KindWorst& w = by_kind[kind_key(tag)];
    ++w.pieces;
    w.max_rel = std::max(w.max_rel, max_rel);
    w.mean_rel = std::max(w.mean_rel, mean_rel);
    w.differ_frac = std::max(w.differ_frac, differ_frac);
  }
  std::string by_kind_text() const {
    std::string out;
    char buf[256];
    for (const auto& [k, w] : by_kind) {
      std::snprintf(buf, sizeof buf, "%s%s: pieces %d max-rel %.3g mean-rel %.3g differ %.3g", out.empty() ? "" : "; ",
                    k.c_str(), w.pieces, w.max_rel, w.mean_rel, w.differ_frac);
      out += buf;
    }
    return out;
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
// With tc (a tensor-core step): also the CPU's tensor-core-emulated spread, the limit raised to the
// one derived from it where that is more, the GPU's tc-vs-GEMV spread (information), and the rule.
inline bool check_rows(Report& rep, const std::string& tag, const Residual& got, const Residual& spread,
                       const RowLimit& cpu_lim, const TcRows* tc = nullptr) {
  const RowLimit lim = tc ? max_limit(cpu_lim, tc->lim) : cpu_lim;
  rep.note_kind(tag, got.max_rel, got.mean_rel, got.differ_frac());
  const bool ok = got.nan_mismatch == 0 && got.max_rel <= lim.max_rel && got.mean_rel <= lim.mean_rel &&
                  (lim.differ_frac < 0 || got.differ_frac() <= lim.differ_frac);
  char buf[256];
  std::snprintf(buf, sizeof buf, " | cpu-spread max-rel %.3g mean-rel %.3g differ %lld", spread.max_rel, spread.mean_rel,
                static_cast<long long>(spread.elems_differ));
  std::string text = tag + ": " + fmt_rows(got) + buf;
  if (tc) {
    std::snprintf(buf, sizeof buf, " | cpu tc-emulated spread max-rel %.3g mean-rel %.3g differ %lld",
                  tc->spread.max_rel, tc->spread.mean_rel, static_cast<long long>(tc->spread.elems_differ));
    text += buf;
    if (tc->gpu) {
      std::snprintf(buf, sizeof buf, " | gpu tc-vs-gemv spread (not a limit) max-rel %.3g mean-rel %.3g differ %lld",
                    tc->gpu->max_rel, tc->gpu->mean_rel, static_cast<long long>(tc->gpu->elems_differ));
      text += buf;
    }
  }
  std::snprintf(buf, sizeof buf, " | limit max-rel %.3g mean-rel %.3g", lim.max_rel, lim.mean_rel);
  text += buf;
  if (lim.differ_frac >= 0) {
    std::snprintf(buf, sizeof buf, " differ-frac %.3g", lim.differ_frac);
    text += buf;
  }
  if (tc) text += raises(cpu_lim, lim) ? " (rule: 2 x cpu tc-emulated spread)" : " (rule: cpu-derived)";
  rep.line(text, ok);
  rep.note_rel(tag, got.max_rel);
  return ok;
}

// The tensor-core side of a record piece: the records the CPU's tensor-core-emulated run wrote
// differently from its own run, and (information) the GPU's tensor-core vs GEMV runs.
struct TcRecords {
  RecordDiff spread;
  const RecordDiff* gpu = nullptr;
};

// Records: at most record_limit of them decode to other values; with tc (a tensor-core step) the
// limit is at least record_limit of the tensor-core-emulated spread. The script's totals hold the
// pieces of the other steps (the GEMV path's flips, whose rate kRecordDifferFrac bounds).
inline bool check_records(Report& rep, const std::string& tag, const RecordDiff& got, const RecordDiff& spread,
                          const TcRecords* tc = nullptr) {
  const int64_t cpu_lim = record_limit(got.records, spread.differ);
  const int64_t tc_lim = tc ? record_limit(got.records, tc->spread.differ) : 0;
  const int64_t lim = std::max(cpu_lim, tc_lim);
  const bool ok = got.differ <= lim;
  if (!tc) {
    const size_t bar = tag.rfind("| ");
    Report::RecordTotal& t = rep.record_totals[bar == std::string::npos ? tag : tag.substr(bar + 2)];
    t.records += got.records;
    t.differ += got.differ;
    t.spread += spread.differ;
  }
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s: records %lld differ %lld (first %lld, decoded max-abs %.3g) | cpu-spread differ %lld", tag.c_str(),
                static_cast<long long>(got.records), static_cast<long long>(got.differ),
                static_cast<long long>(got.first), got.max_abs, static_cast<long long>(spread.differ));
  std::string text = buf;
  if (tc) {
    std::snprintf(buf, sizeof buf, " | cpu tc-emulated spread differ %lld", static_cast<long long>(tc->spread.differ));
    text += buf;
    if (tc->gpu) {
      std::snprintf(buf, sizeof buf, " | gpu tc-vs-gemv spread (not a limit) differ %lld",
                    static_cast<long long>(tc->gpu->differ));
      text += buf;
    }
  }
  std::snprintf(buf, sizeof buf, " | limit %lld", static_cast<long long>(lim));
  text += buf;
  if (tc) text += tc_lim > cpu_lim ? " (rule: 2 x cpu tc-emulated spread)" : " (rule: cpu-derived)";
  rep.line(text, ok);
  return ok;
}

// The whole script's records of each kind against record_total_limit (after the last step).
inline bool check_record_totals(Report& rep, const std::string& tag) {
  bool all = true;
  const auto totals = rep.record_totals;
  for (const auto& [kind, t] : totals) {
    const int64_t lim = record_total_limit(t.records, t.spread);
    const bool ok = t.differ <= lim;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s | %s over the script: %lld of %lld differ | spreads differ %lld | limit %lld",
                  tag.c_str(), kind.c_str(), static_cast<long long>(t.differ), static_cast<long long>(t.records),
                  static_cast<long long>(t.spread), static_cast<long long>(lim));
    rep.line(buf, ok);
    all = all && ok;
  }
  return all;
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
