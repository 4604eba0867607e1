// The sampling op on the device (kernels/cuda/sample_rows.cu) against the host op
// (kernels/cpu/sampling.cpp) on random batches at vocabulary size (129280) and small vocabularies:
// greedy tokens, accept flags and top-logprob ids must be identical; logprobs (fp32 of an fp64
// log-softmax on each side) within one fp32 ulp plus V * 2^-52 (the fp64 sums' order); a sampled token may differ only when its
// uniform lies within 1e-9 of the host's CDF at the boundary between the two tokens (recomputed per
// mismatch; the sides' fp64 CDFs differ by ~V * 2^-52), counted and reported; any other difference
// fails.
// Also: bit-identical reruns, draw frequencies against p, CUDA graph capture and replay; the full
// vocabulary with 48 rows of each kind, the sampler benchmark's rows (also with its bf16-valued
// logits: bands of ties) and more rows than run at once; top-p at its extremes; a vocabulary too
// large for the device's shared-memory slices.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "cuda/cuda_test_util.h"
#include "common/numeric_core.h"
#include "cuda/sample_rows_cases.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sample_rows.h"

namespace tandem::kernels::cuda_testing {
namespace {

using sample_rows_cases::Batch;
using sample_rows_cases::Builder;
using sample_rows_cases::Comparison;
using sample_rows_cases::Kind;
using sample_rows_cases::mixed_batch;

constexpr int64_t kVocab = 129280;

// A batch's arrays, scratch and outputs on the device.
struct DeviceBatch {
  DeviceBuffer<float> logits, q;
  DeviceBuffer<uint32_t> masks;
  DeviceBuffer<int32_t> prompt, counts;
  DeviceBuffer<SampleRow> rows;
  DeviceBuffer<SampleRowResult> out;
  DeviceBuffer<unsigned char> scratch;
  SampleInputs in;
  int n = 0;

  explicit DeviceBatch(const Batch& b)
      : logits(to_dev(b.logits)),
        q(to_dev(b.q)),
        masks(to_dev(b.masks)),
        prompt(to_dev(b.prompt)),
        counts(to_dev(b.counts)),
        rows(to_dev(b.rows)),
        out(b.rows.size()),
        scratch(cuda::sample_rows_scratch_bytes(static_cast<int>(b.rows.size()), b.vocab)),
        n(static_cast<int>(b.rows.size())) {
    in = b.host_inputs();
    in.logits = logits.get();
    in.q = b.q.empty() ? nullptr : q.get();
    in.masks = b.masks.empty() ? nullptr : masks.get();
    in.prompt_ids = b.prompt.empty() ? nullptr : prompt.get();
    in.counts = b.counts.empty() ? nullptr : counts.get();
  }
  void launch(cudaStream_t s) { cuda::sample_rows_device({in, rows.get(), n, scratch.get(), out.get()}, s); }
  // Poisons the outputs and the scratch (an unwritten field or a scratch value read before it is
  // written shows up), runs, returns the results.
  std::vector<SampleRowResult> run() {
    poison(out);
    poison(scratch);
    launch(kStream);
    return to_host(out);
  }
};

std::vector<SampleRowResult> run_host(const Batch& b) {
  RowSampler s(b.vocab);
  std::vector<int32_t> scratch;
  std::vector<SampleRowResult> out(b.rows.size());
  sample_rows_host(b.host_inputs(), b.rows, out, s, scratch);
  return out;
}

bool same_bytes(const std::vector<SampleRowResult>& a, const std::vector<SampleRowResult>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(SampleRowResult)) == 0;
}

// A mismatching row in words: its parameters, both results, the host's p of both tokens, the
// uniform that drew it and the host's CDF around the lower token, the first differing top id.
std::string describe_row(const Batch& b, int i, const SampleRowResult& g, const SampleRowResult& w) {
  const SampleRow& r = b.rows[static_cast<size_t>(i)];
  RowSampler s(b.vocab);
  s.prepare(b.logits.data() + static_cast<int64_t>(r.logits_row) * b.vocab, r, b.host_inputs());
  auto p = [&](int32_t t) { return t >= 0 && t < b.vocab ? s.prob(t) : -1.0; };
  std::ostringstream o;
  o.precision(17);
  o << "vocab " << b.vocab << " row " << i << " kind " << static_cast<int>(b.kinds[static_cast<size_t>(i)])
    << " (temperature " << r.temperature << ", top_k " << r.top_k << ", top_p " << r.top_p << ", min_p " << r.min_p
    << ", draft " << r.draft << ", q_row " << r.q_row << ", mask_row " << r.mask_row << ", top_logprobs "
    << r.top_logprobs << ", host argmax " << s.argmax() << "): got token " << g.token << " (host p " << p(g.token)
    << ") accepted " << g.accepted << " num_top " << g.num_top << "; want token " << w.token << " (host p "
    << p(w.token) << ") accepted " << w.accepted << " num_top " << w.num_top;
  if (!s.greedy() && g.token != w.token && g.token >= 0 && g.token < b.vocab) {
    const int32_t lo = std::min(g.token, w.token);
    double before = 0;
    for (int64_t v = 0; v < lo; ++v) before += s.prob(static_cast<int32_t>(v));
    o << "; u_sample " << rng_uniform(r.seed, r.position, RngStream::kSample) << ", u_residual "
      << rng_uniform(r.seed, r.position, RngStream::kResidual) << ", host p-CDF before/after token " << lo << ": "
      << before << " / " << before + s.prob(lo);
  }
  for (int k = 0; k < std::min(g.num_top, w.num_top); ++k)
    if (g.top_ids[k] != w.top_ids[k]) {
      o << "; first differing top id at " << k << ": got " << g.top_ids[k] << " want " << w.top_ids[k];
      break;
    }
  return o.str();
}

// Runs `b` on both sides and accumulates the comparison into `total`.
void check_batch(const Batch& b, Comparison& total) {
  DeviceBatch d(b);
  const std::vector<SampleRowResult> got = d.run(), want = run_host(b);
  const Comparison c = sample_rows_cases::compare(b, got, want);
  if (c.first_bad_row >= 0) {
    const int i = c.first_bad_row;
    ADD_FAILURE() << describe_row(b, i, got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]);
  }
  total.rows += c.rows;
  total.sampled_rows += c.sampled_rows;
  total.token_mismatches += c.token_mismatches;
  total.unexplained_tokens += c.unexplained_tokens;
  total.greedy_mismatches += c.greedy_mismatches;
  total.accept_mismatches += c.accept_mismatches;
  total.top_mismatches += c.top_mismatches;
  total.rank_mismatches += c.rank_mismatches;
  total.worst_logprob_err = std::max(total.worst_logprob_err, c.worst_logprob_err);
}

void expect_matches(const Comparison& t, const char* what) {
  std::printf("[sample_rows] %s: %d rows (%d sampled): %d sampled tokens differ from the host on a CDF boundary, "
              "worst logprob difference %.3g of its bound\n",
              what, t.rows, t.sampled_rows, t.token_mismatches, t.worst_logprob_err);
  EXPECT_EQ(t.greedy_mismatches, 0);
  EXPECT_EQ(t.accept_mismatches, 0);
  EXPECT_EQ(t.top_mismatches, 0);
  EXPECT_EQ(t.rank_mismatches, 0);
  EXPECT_EQ(t.unexplained_tokens, 0) << "sampled tokens that differ away from a CDF boundary";
  EXPECT_LE(t.worst_logprob_err, 1.0);
}

TEST(CudaSampleRows, MatchesHostSmallVocabs) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  uint64_t seed = 11;
  for (int64_t vocab : {8, 1000, 4096}) {
    for (bool noise : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << (noise ? " noise" : ""));
      check_batch(mixed_batch(vocab, 600, seed++, noise), total);
    }
  }
  expect_matches(total, "vocab 8/1000/4096");
}

TEST(CudaSampleRows, MatchesHostFullVocab) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  uint64_t seed = 101;
  // 64 rows keep part of each slice in the global scratch (4 CTAs per SM), 24 the whole slice in
  // shared memory (sample_rows.cu: ZSlice)
  for (int rows : {64, 24}) {
    for (bool noise : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows" << (noise ? " noise" : ""));
      check_batch(mixed_batch(kVocab, rows, seed++, noise), total);
    }
  }
  expect_matches(total, "vocab 129280");
}

// 48 rows of each kind at the full vocabulary (the rows of a decode step), the noise token in
// every other batch.
TEST(CudaSampleRows, MatchesHostFullVocabPerKind) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  for (int k = 0; k < static_cast<int>(Kind::kCount); ++k) {
    SCOPED_TRACE(::testing::Message() << "kind " << k);
    Builder bld(kVocab, 900 + k, k % 2 == 0);
    for (int i = 0; i < 48; ++i) bld.add(static_cast<Kind>(k), 50000 + 100 * k + i, i % 4 == 0 ? 5 : -1);
    check_batch(bld.take(), total);
  }
  expect_matches(total, "48 rows per kind, vocab 129280");
}

// A batch of `n` rows with logits uniform in [-8, 8) (never 0), each row made by `set(i, row)`;
// `bf16`: rounded to bf16 values, as bench-kernels fills them (RandomFill::kF32Bf16): 32 levels
// per unit near the top, so every key of top-p's band is shared by a few hundred ids.
template <typename Set>
Batch uniform_batch(int64_t vocab, int n, uint64_t seed, Kind kind, Set set, bool bf16 = false) {
  Batch b;
  b.vocab = vocab;
  b.eos = 1;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
  b.logits.resize(static_cast<size_t>(vocab * n));
  for (float& x : b.logits) {
    x = ud(rng);
    if (bf16) x = num::round_bf16(x);
    if (x == 0.0f) x = 0.5f;
  }
  for (int i = 0; i < n; ++i) {
    SampleRow r;
    r.logits_row = i;
    r.seed = 1000 + static_cast<uint64_t>(i);
    r.position = 77 + i;
    set(i, r);
    b.rows.push_back(r);
    b.kinds.push_back(kind);
  }
  return b;
}

// The rows bench-kernels' `sampler` section times (48 rows, logits uniform in [-8, 8),
// temperature 1): greedy, top-p 0.9, top-k 50 + top-p 0.9.
TEST(CudaSampleRows, MatchesHostBenchmarkRows) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  struct Cfg {
    const char* name;
    double temperature, top_p;
    int top_k;
    Kind kind;
  };
  uint64_t seed = 31;
  for (const Cfg& c : {Cfg{"greedy", 0.0, 1.0, 0, Kind::kGreedy}, Cfg{"top-p 0.9", 1.0, 0.9, 0, Kind::kTopP},
                       Cfg{"top-k 50 + top-p 0.9", 1.0, 0.9, 50, Kind::kCombined}}) {
    SCOPED_TRACE(c.name);
    check_batch(uniform_batch(kVocab, 48, seed++, c.kind,
                              [&](int i, SampleRow& r) {
                                r.temperature = c.temperature;
                                r.top_p = c.top_p;
                                r.top_k = c.top_k;
                                r.top_logprobs = i % 8 == 0 ? 3 : -1;
                              }),
                total);
  }
  expect_matches(total, "the sampler benchmark's rows, vocab 129280");
}

// The benchmark's rows with its bf16-valued logits: top-p's band is a few keys of a few hundred
// ids each, so its radix select ends on a bucket of one key (the pass after it is selected sees
// its smallest and largest key equal) and its tie rule keeps part of the threshold's run; top-p
// values and temperatures around the benchmark's move the threshold across the levels.
TEST(CudaSampleRows, MatchesHostBenchmarkRowsBf16Logits) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  const double top_ps[] = {0.5, 0.9, 0.95, 0.999};
  const double temps[] = {0.3, 1.0, 2.0};
  uint64_t seed = 8100;
  for (int top_k : {0, 50, 1000}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << top_k);
    check_batch(uniform_batch(
                    kVocab, 48, seed++, top_k > 0 ? Kind::kCombined : Kind::kTopP,
                    [&](int i, SampleRow& r) {
                      r.temperature = temps[i % 3];
                      r.top_p = top_ps[(i / 3) % 4];
                      r.top_k = top_k;
                      r.seed = 1000 + static_cast<uint64_t>(i) + 100 * static_cast<uint64_t>(top_k);
                      r.top_logprobs = i % 8 == 0 ? 3 : -1;
                    },
                    true),
                total);
  }
  expect_matches(total, "bf16-valued uniform logits, vocab 129280");
}

// More rows than the device holds at once (sample_rows_active_clusters: the later rows wait for a
// cluster to leave), every kind but greedy mixed, at the full vocabulary: each row's result is its
// own, whichever wave runs it.
TEST(CudaSampleRows, MatchesHostBeyondOneWave) {
  TANDEM_REQUIRE_GPU();
  const int resident = cuda::sample_rows_active_clusters(kVocab, 1024);  // many rows: split slices
  ASSERT_GT(resident, 0) << "the cluster occupancy query failed";
  const int n = 2 * resident + 5;
  ASSERT_EQ(cuda::sample_rows_active_clusters(kVocab, n), resident);
  std::printf("[sample_rows] %d rows resident at once; running %d\n", resident, n);
  Comparison total;
  check_batch(uniform_batch(kVocab, n, 57, Kind::kCombined,
                            [&](int i, SampleRow& r) {
                              r.temperature = i % 3 == 0 ? 0.7 : 1.0;
                              r.top_p = i % 4 == 3 ? 1.0 : 0.9;
                              r.top_k = i % 5 == 1 ? 50 : 0;
                              r.min_p = i % 7 == 2 ? 0.01 : 0.0;
                              r.top_logprobs = i % 16 == 0 ? 2 : -1;
                            }),
              total);
  expect_matches(total, "more rows than one wave, vocab 129280");
}

// Top-p at its extremes (0, tiny, close to 1), at low and high temperatures, on distinct logits,
// logits from a few levels (ties at the threshold) and uniform ones, with and without top-k: the
// device selects top-p's threshold inside a band of coarse buckets of (z - zmax) / T, and these
// rows put the threshold at the band's edges and fill it with ties.
TEST(CudaSampleRows, TopPExtremes) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  const double top_ps[] = {0.0, 1e-12, 1e-3, 0.3, 0.9, 0.999, 0.999999999, 1.0 - 0x1p-40};
  const double temps[] = {0.05, 1.0, 4.0};
  uint64_t seed = 4000;
  for (int64_t vocab : {int64_t{1000}, kVocab}) {
    for (int shape = 0; shape < 3; ++shape) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " shape " << shape);
      Builder bld(vocab, seed++, shape == 1);
      Batch b = bld.batch();  // vocab, eos, noise
      int i = 0;
      for (double tp : top_ps)
        for (double t : temps) {
          std::vector<float> z = shape == 0 ? bld.random_logits(3.0f) : shape == 1 ? bld.tie_logits() : std::vector<float>{};
          if (shape == 2) {
            std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
            std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(i));
            z.resize(static_cast<size_t>(vocab));
            for (float& x : z) {
              x = ud(rng);
              if (x == 0.0f) x = 0.5f;
            }
          }
          SampleRow r;
          r.logits_row = i;
          r.temperature = t;
          r.top_p = tp;
          r.top_k = i % 3 == 2 ? 100 : 0;
          r.seed = 777 + static_cast<uint64_t>(i);
          r.position = 5 * i;
          b.logits.insert(b.logits.end(), z.begin(), z.end());
          b.rows.push_back(r);
          b.kinds.push_back(Kind::kTopP);
          ++i;
        }
      check_batch(b, total);
    }
  }
  expect_matches(total, "top-p extremes, vocab 1000/129280");
}

// Top-p's paths at the full vocabulary, in launches of 1, 48 and 64 rows (whole slices in shared
// memory, and part of each slice in the global scratch): flat rows (every logit equal: top-p keeps
// a prefix of the vocabulary in id order and its band holds every id, more than the warps' band
// lists: the tie is found by a scan), rows of 4 levels (tens of thousands of ties on each key),
// logits on a grid of 1/64 (a few ties on each key of the band, the band lists hold them: the tie
// is found over the lists), bf16 values (a few hundred ties per key), peaked rows (one logit far
// above uniform ones) and distinct logits; top_p 1, 0.99, 0.93, 0.37, tiny; top_k 0, 20 and 5000;
// temperatures 0.5, 1 and 3. Rows are filled so that each shape meets each top_p and top_k.
TEST(CudaSampleRows, TopPPathsAtFullVocab) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  // top_p x 129280 is not an integer: a flat row's kept count is not decided by the sums' rounding
  const double top_ps[] = {1.0, 0.99, 0.93, 0.37, 1e-9};
  const int top_ks[] = {0, 20, 5000};
  const double temps[] = {0.5, 1.0, 3.0};
  constexpr int kShapes = 6;
  for (int n : {1, 48, 64}) {
    SCOPED_TRACE(::testing::Message() << n << " rows");
    Batch b;
    b.vocab = kVocab;
    b.eos = 1;
    std::mt19937_64 rng(9000 + static_cast<uint64_t>(n));
    std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
    for (int i = 0; i < n; ++i) {
      // n = 1 takes the flat shape with ties kept in part (top_p 0.93)
      const int shape = n == 1 ? 0 : i % kShapes;
      for (int64_t v = 0; v < kVocab; ++v) {
        float x = ud(rng);
        switch (shape) {
          case 0: x = 1.5f; break;                                                  // flat
          case 1: x = 0.5f * static_cast<float>(static_cast<int>(rng() % 4)); break;  // 4 levels
          case 2: x = std::round(x * 64.0f) / 64.0f; break;                         // grid of 1/64
          case 3: x = num::round_bf16(x); break;                                    // bf16 values
          case 4: x = v == 4242 + i ? 24.0f : x - 8.0f; break;                      // peaked
          default: break;                                                           // distinct
        }
        if (x == 0.0f) x = 0.25f;
        b.logits.push_back(x);
      }
      SampleRow r;
      r.logits_row = i;
      r.temperature = temps[(i / kShapes) % 3];
      r.top_p = n == 1 ? 0.93 : top_ps[(i / kShapes + i) % 5];
      r.top_k = n == 1 ? 0 : top_ks[(i / (kShapes * 3)) % 3];
      r.seed = 31337 + static_cast<uint64_t>(i) + 1000 * static_cast<uint64_t>(n);
      r.position = 3 * i + 1;
      r.top_logprobs = i % 16 == 5 ? 4 : -1;
      b.rows.push_back(r);
      b.kinds.push_back(r.top_k > 0 ? Kind::kCombined : Kind::kTopP);
    }
    check_batch(b, total);
  }
  expect_matches(total, "top-p paths (flat, levels, grid, bf16, peaked, distinct), 1/48/64 rows, vocab 129280");
}

// Top-p rows whose later passes read the candidates recorded by the band's pass (CandList) in every
// way they are used: the plain draw, the residual draw of a rejected draft (one-hot and full q),
// min-p after top-p, with and without top-k, and rows whose candidates overflow some CTAs' lists
// (the cluster scans); 16 rows (whole slices in shared memory) and 48 (part of each slice in the
// scratch), at the full vocabulary.
TEST(CudaSampleRows, TopPListedPassesAtFullVocab) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  static constexpr Kind kKinds[] = {Kind::kDraftOneHot, Kind::kDraftFullQ, Kind::kTopP, Kind::kMinP, Kind::kCombined};
  for (int n : {16, 48}) {
    SCOPED_TRACE(::testing::Message() << n << " rows");
    Builder bld(kVocab, 4242 + static_cast<uint64_t>(n), n == 48);
    for (int i = 0; i < n; ++i) bld.add(kKinds[i % 5], 77000 + 100 * static_cast<uint64_t>(n) + i, i % 8 == 3 ? 5 : -1);
    Batch b = bld.take();
    for (int i = 0; i < n; ++i) {
      SampleRow& r = b.rows[static_cast<size_t>(i)];
      r.top_p = 0.3 + 0.65 * static_cast<double>((i * 7) % 13) / 12.0;
      if (i % 5 == 3 || i % 4 == 1) r.min_p = 0.02 + 0.01 * static_cast<double>(i % 5);
      // every 7th row: the first 19,997 ids share the largest logit (40), so the first two CTAs have
      // more candidates than their lists hold and the whole cluster scans instead (top_p x 19,997
      // is at least 0.09 from an integer: the kept count of the ties is not a rounding question)
      if (i % 7 == 6)
        for (int64_t v = 0; v < 19997; ++v) b.logits[static_cast<size_t>(i * kVocab + v)] = 40.0f;
    }
    check_batch(b, total);
  }
  expect_matches(total, "top-p with drafts, min-p and top-k (listed candidates), 16/48 rows, vocab 129280");
}

// Top-k over bf16-valued logits, whose score keys share their low 16 bits (0 for positive values,
// all ones for negative ones), so the radix select ends as soon as a pass leaves one key in its
// bucket: negative rows, positive rows, rows whose k-th value is near 0 (keys of both signs in
// play), k from 1 to most of the vocabulary, with and without top-p.
TEST(CudaSampleRows, TopKOnBf16LogitsAtFullVocab) {
  TANDEM_REQUIRE_GPU();
  const int top_ks[] = {1, 50, 5000, 64640, 100000};  // 64640: the k-th of a mixed row near 0
  constexpr int n = 24;
  Batch b = uniform_batch(
      kVocab, n, 6060, Kind::kCombined,
      [&](int i, SampleRow& r) {
        r.temperature = 1.0;
        r.top_k = top_ks[i % 5];
        r.top_p = (i / 2) % 2 ? 0.9 : 1.0;
      },
      true);
  for (int i = 0; i < n; ++i) {
    const int shape = i / 8;  // 0: negative, 1: positive, 2: mixed sign (as drawn)
    for (int64_t v = 0; v < kVocab; ++v) {
      float& x = b.logits[static_cast<size_t>(i * kVocab + v)];
      if (shape == 0) x = -std::fabs(x) - 1.0f;
      if (shape == 1) x = std::fabs(x) + 1.0f;
      x = num::round_bf16(x);
      if (x == 0.0f) x = 0.5f;
    }
  }
  Comparison total;
  check_batch(b, total);
  expect_matches(total, "top-k on bf16-valued logits (negative, positive, mixed), vocab 129280");
}

// A vocabulary whose slices do not fit in shared memory (z stays in the global scratch), odd, so
// rows are not 16-byte aligned.
TEST(CudaSampleRows, MatchesHostLargeVocab) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  check_batch(mixed_batch(200003, 30, 606, true), total);
  expect_matches(total, "vocab 200003");
}

// Many rows of one kind: each kind on its own (thousands of (row, seed) cases in all).
TEST(CudaSampleRows, MatchesHostPerKind) {
  TANDEM_REQUIRE_GPU();
  Comparison total;
  for (int k = 0; k < static_cast<int>(Kind::kCount); ++k) {
    SCOPED_TRACE(::testing::Message() << "kind " << k);
    Builder bld(1000, 500 + k, k % 2 == 1);
    for (int i = 0; i < 200; ++i) bld.add(static_cast<Kind>(k), 7000 + 1000 * k + i, i % 3 == 0 ? 5 : -1);
    check_batch(bld.take(), total);
  }
  expect_matches(total, "per kind, vocab 1000");
}

TEST(CudaSampleRows, Deterministic) {
  TANDEM_REQUIRE_GPU();
  const Batch b = mixed_batch(kVocab, 64, 77, true);
  DeviceBatch d(b);
  const std::vector<SampleRowResult> first = d.run();
  for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(same_bytes(d.run(), first)) << "run " << rep + 1 << " differs";
  const Batch s = mixed_batch(1000, 600, 78, false);
  DeviceBatch ds(s);
  const std::vector<SampleRowResult> sfirst = ds.run();
  EXPECT_TRUE(same_bytes(ds.run(), sfirst));
}

// Exact tie semantics at the top-p threshold: four equal maxima, top_p keeps two of them, which
// must be the two lowest ids; and top-k keeps every logit equal to the k-th largest.
TEST(CudaSampleRows, TiesAtThresholdsByLowerId) {
  TANDEM_REQUIRE_GPU();
  Batch b;
  b.vocab = 8;
  const std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f, 2.0f, -0.5f};
  const int kRows = 400;
  for (int i = 0; i < kRows; ++i) {
    b.logits.insert(b.logits.end(), z.begin(), z.end());
    SampleRow r;
    r.logits_row = i;
    r.temperature = 1.0;
    r.seed = 1234 + i;
    r.position = i;
    if (i % 2 == 0) {
      r.top_p = 0.3;  // each maximum has p ~0.2: two of them reach 0.3
    } else {
      r.top_k = 2;  // the 2nd largest is 2.0: all four maxima stay
    }
    b.rows.push_back(r);
    b.kinds.push_back(Kind::kTopP);
  }
  DeviceBatch d(b);
  const std::vector<SampleRowResult> got = d.run(), want = run_host(b);
  std::map<int, int> topp_tokens, topk_tokens;
  for (int i = 0; i < kRows; ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << "row " << i;
    (i % 2 == 0 ? topp_tokens : topk_tokens)[got[i].token]++;
  }
  EXPECT_EQ(topp_tokens.size(), 2u);
  EXPECT_TRUE(topp_tokens.count(1) && topp_tokens.count(3));
  EXPECT_EQ(topk_tokens.size(), 4u);
  for (int t : {1, 3, 4, 6}) EXPECT_TRUE(topk_tokens.count(t)) << t;
}

// Draws over many seeds follow the host's p: each token's frequency within 5 sigma (+ 3/N) of
// p, and a token with p == 0 is never drawn. Plain rows and residual draws (the draft rejected).
TEST(CudaSampleRows, DrawFrequenciesFollowP) {
  TANDEM_REQUIRE_GPU();
  const int64_t V = 1000;
  const int N = 16384;
  Builder bld(V, 4242, false);
  const std::vector<float> z = bld.random_logits(2.0f);
  struct Cfg {
    const char* name;
    double temperature, top_p, min_p;
    int top_k;
    bool draft;
  };
  for (const Cfg& c : {Cfg{"temperature", 0.9, 1.0, 0.0, 0, false}, Cfg{"combined", 1.1, 0.9, 0.02, 100, false},
                       Cfg{"residual after a one-hot draft", 1.0, 0.95, 0.0, 50, true}}) {
    SCOPED_TRACE(c.name);
    Batch b;
    b.vocab = V;
    b.eos = 2;
    b.logits = z;
    SampleRow r;
    r.temperature = c.temperature;
    r.top_p = c.top_p;
    r.min_p = c.min_p;
    r.top_k = c.top_k;
    RowSampler host(V);
    host.prepare(z.data(), r, b.host_inputs());
    std::vector<double> p(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) p[v] = host.prob(static_cast<int32_t>(v));
    if (c.draft) {
      r.draft = host.argmax();  // rejected draws come from norm(max(0, p - onehot(draft)))
      double s = 0;
      p[r.draft] = 0;
      for (double x : p) s += x;
      for (double& x : p) x /= s;
    }
    for (int i = 0; i < N; ++i) {
      r.seed = 99991ull * i + 17;
      r.position = 1000 + i;
      b.rows.push_back(r);
      b.kinds.push_back(Kind::kCombined);
    }
    DeviceBatch d(b);
    const std::vector<SampleRowResult> got = d.run();
    std::vector<int> count(static_cast<size_t>(V), 0);
    int n = 0;
    for (const SampleRowResult& g : got) {
      ASSERT_GE(g.token, 0);
      ASSERT_LT(g.token, V);
      if (c.draft && g.accepted) continue;
      ++count[g.token];
      ++n;
    }
    ASSERT_GT(n, N / 10);
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (p[v] == 0) {
        EXPECT_EQ(count[v], 0) << "token " << v << " has p = 0";
        continue;
      }
      const double f = static_cast<double>(count[v]) / n;
      const double sigma = std::sqrt(p[v] * (1 - p[v]) / n);
      if (p[v] * n >= 5) worst = std::max(worst, std::fabs(f - p[v]) / sigma);
      EXPECT_LE(std::fabs(f - p[v]), 5 * sigma + 3.0 / n) << "token " << v << " p " << p[v] << " freq " << f;
    }
    std::printf("[sample_rows] %s: %d draws, worst |freq - p| = %.2f sigma (tokens with p * draws >= 5)\n", c.name, n,
                worst);
  }
}

// A grammar dead end emits EOS (greedy and sampled), whose logprob is the raw one; NaN logits
// leave the argmax rule of the host (a NaN first element wins, a later NaN never does) and do not
// crash a sampled row.
TEST(CudaSampleRows, DeadEndAndNaN) {
  TANDEM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Builder bld(64, 9, true);
  for (int i = 0; i < 4; ++i) bld.add(Kind::kDeadEnd, 50 + i, 3);
  Batch b = bld.take();
  std::vector<float> zn = Builder(64, 10, false).random_logits(1.0f);
  auto add_row = [&](std::vector<float> z, double temperature) {
    SampleRow r;
    r.logits_row = static_cast<int32_t>(b.rows.size());
    r.temperature = temperature;
    r.seed = 5;
    b.logits.insert(b.logits.end(), z.begin(), z.end());
    b.rows.push_back(r);
    b.kinds.push_back(Kind::kGreedy);
  };
  std::vector<float> first_nan = zn, later_nan = zn;
  first_nan[0] = nan;
  later_nan[40] = nan;
  add_row(first_nan, 0.0);
  add_row(later_nan, 0.0);
  DeviceBatch d(b);
  const std::vector<SampleRowResult> got = d.run(), want = run_host(b);
  for (size_t i = 0; i < b.rows.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << "row " << i;
    if (i < 4) {
      EXPECT_EQ(got[i].token, b.eos);
      EXPECT_LE(sample_rows_cases::logprob_err(got[i].token_logprob, want[i].token_logprob, b.vocab), 1.0)
          << "row " << i << ": got " << got[i].token_logprob << " want " << want[i].token_logprob;
    }
  }
  EXPECT_EQ(got[4].token, 0);
  // sampled rows with NaN logits: no crash, a token in range
  Batch s;
  s.vocab = 64;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> z = zn;
    z[static_cast<size_t>(7 * i + 3)] = nan;
    s.logits.insert(s.logits.end(), z.begin(), z.end());
    SampleRow r;
    r.logits_row = i;
    r.temperature = 1.0;
    r.top_p = i == 1 ? 0.8 : 1.0;
    r.top_k = i == 2 ? 10 : 0;
    r.top_logprobs = 5;
    r.seed = 3;
    s.rows.push_back(r);
    s.kinds.push_back(Kind::kCombined);
  }
  DeviceBatch ds(s);
  for (const SampleRowResult& g : ds.run()) {
    EXPECT_GE(g.token, 0);
    EXPECT_LT(g.token, 64);
  }
}

// The op is captured in a CUDA graph and replayed with the same results as an eager launch.
TEST(CudaSampleRows, GraphReplayMatchesEager) {
  TANDEM_REQUIRE_GPU();
  for (int64_t vocab : {int64_t{4096}, kVocab}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const Batch b = mixed_batch(vocab, 64, 314, true);
    DeviceBatch d(b);
    const std::vector<SampleRowResult> eager = d.run();
    cudaStream_t s;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    d.launch(s);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) {
      poison(d.out);
      poison(d.scratch);
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
      EXPECT_TRUE(same_bytes(to_host(d.out), eager)) << "replay " << rep;
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
    TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
