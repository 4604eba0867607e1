// Test helpers shared by the model tests: deterministic token lists, per-slot block tables, and a
// runner that feeds a token list through one slot in chunks and collects every position's logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/tiny_weights.h"

namespace tandem::testing {

inline std::vector<int32_t> tokens(int n, uint64_t seed) {
  TinyRng r{seed};
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(r.next() % 500);
  return t;
}

// Per-slot block tables: slot s uses blocks [s*4, s*4+4) in reverse order (paging must not matter).
inline std::vector<int32_t> table_for(int slot) { return {slot * 4 + 3, slot * 4 + 2, slot * 4 + 1, slot * 4 + 0}; }

// Runs `toks` through `slot` (reset first) in chunks (empty: one chunk; the last size repeats);
// returns logits for every position, and the DSpark taps when `taps` is given.
inline std::vector<float> run(DsV4Model& m, int slot, const std::vector<int32_t>& toks, const std::vector<int>& chunks,
                              std::vector<float>* taps = nullptr) {
  m.reset(slot);
  const int64_t V = m.vocab_size();
  std::vector<float> all;
  auto table = table_for(slot);
  size_t pos = 0, ci = 0;
  StepOutput out;
  while (pos < toks.size()) {
    size_t n = chunks.empty() ? toks.size() : static_cast<size_t>(chunks[std::min(ci, chunks.size() - 1)]);
    ++ci;
    n = std::min(n, toks.size() - pos);
    StepBatch b;
    SeqStep s;
    s.slot = slot;
    s.start_pos = static_cast<int64_t>(pos);
    s.tokens = std::span<const int32_t>(toks.data() + pos, n);
    s.block_table = table;
    s.logits = LogitsMode::kAll;
    s.collect_taps = taps != nullptr;
    b.seqs.push_back(s);
    Status st = m.forward(b, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    all.insert(all.end(), out.logits.begin(), out.logits.begin() + n * V);
    if (taps) taps->insert(taps->end(), out.taps.begin(), out.taps.begin() + n * m.tap_dim());
    pos += n;
  }
  return all;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    d = std::max(d, std::fabs(a[i] - b[i]));
  }
  return d;
}

// Rollback across ratio-4 and ratio-128 block completions: 7 speculative tokens from each cut are
// run and rejected (all but the first), then the real continuation must give the same logits,
// bit for bit, as a fresh run of the same history in slot 1.
inline void expect_rollback_then_recompute_exact(DsV4Model& m, std::initializer_list<int64_t> cuts) {
  const int64_t V = m.vocab_size();
  auto base = tokens(262, 31);
  for (int64_t cut : cuts) {
    std::vector<int32_t> hist(base.begin(), base.begin() + cut);
    run(m, 0, hist, {});
    auto spec = tokens(7, 100 + cut);  // crosses position 255: a ratio-128 and a ratio-4 completion
    auto table = table_for(0);
    StepBatch b;
    b.seqs.push_back({0, cut, spec, table, LogitsMode::kAll, false});
    StepOutput out;
    ASSERT_TRUE(m.forward(b, out).ok());
    ASSERT_TRUE(m.rollback(0, cut + 1).ok());
    std::vector<int32_t> rest(base.begin() + cut + 1, base.end());
    std::vector<int32_t> h2(base.begin(), base.begin() + cut);
    h2.push_back(spec[0]);
    h2.insert(h2.end(), rest.begin(), rest.end());
    b.seqs = {{0, cut + 1, rest, table, LogitsMode::kAll, false}};
    ASSERT_TRUE(m.forward(b, out).ok());
    auto fresh = run(m, 1, h2, {});
    for (size_t t = 0; t < rest.size(); ++t)
      for (int64_t v = 0; v < V; ++v)
        ASSERT_EQ(out.logits[t * V + v], fresh[(cut + 1 + t) * V + v]) << "cut " << cut << " t " << t;
  }
}

}  // namespace tandem::testing
