// Unit tests: KV block manager (exact block ids, LRU, snapshots, integrity), sampler, text stream,
// speculative-config parsing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/fake_model.h"
#include "engine/kv_cache_manager.h"
#include "engine/sampler.h"
#include "engine/spec_planner.h"
#include "engine/text_stream.h"
#include "kernels/cpu/sampling.h"

namespace tandem {
namespace {

// ---------------- KvBlockManager ----------------
std::vector<int32_t> seq_tokens(int n, int base) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

TEST(KvBlockManager, AllocatesInOrderAndFreesTailFirst) {
  KvBlockManager kv(6, 4, true);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(kv.allocate(3, a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(kv.allocate(2, b));
  EXPECT_EQ(b, (std::vector<int32_t>{3, 4}));
  std::vector<int32_t> c;
  EXPECT_FALSE(kv.allocate(2, c));  // only 1 free: nothing allocated
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(kv.num_free(), 1);
  auto toks = seq_tokens(12, 100);
  std::vector<uint64_t> hashes;
  kv.register_full_blocks(toks, a, hashes, 2);  // blocks 0 and 1 full, 2 partial
  EXPECT_EQ(hashes.size(), 2u);
  kv.release(a);
  // Uncached 2 goes to the head; cached ones to the tail, last block first.
  EXPECT_EQ(kv.free_list_order(), (std::vector<int32_t>{2, 5, 1, 0}));
  std::vector<int> refs(6, 0);
  refs[3] = refs[4] = 1;
  int64_t leaked = -1;
  EXPECT_TRUE(kv.check(refs, &leaked).ok());
  EXPECT_EQ(leaked, 0);
  // Allocating 3 evicts cached block 1 (least recently freed) but keeps 0.
  std::vector<int32_t> d;
  ASSERT_TRUE(kv.allocate(3, d));
  EXPECT_EQ(d, (std::vector<int32_t>{2, 5, 1}));
  EXPECT_EQ(kv.num_cached_blocks(), 1);
}

TEST(KvBlockManager, PrefixHitNeedsSnapshotAtItsEnd) {
  KvBlockManager kv(8, 4, true);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.allocate(3, a));
  auto toks = seq_tokens(12, 7);
  std::vector<uint64_t> hashes;
  kv.register_full_blocks(toks, a, hashes, 3);
  std::vector<int32_t> hit;
  std::vector<uint64_t> hh;
  kv.find_cached_prefix(toks, 3, hit, hh);
  EXPECT_TRUE(hit.empty());  // no snapshots yet
  kv.take_snapshot(a[1]);
  kv.find_cached_prefix(toks, 3, hit, hh);
  EXPECT_EQ(hit, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(hh, (std::vector<uint64_t>{hashes[0], hashes[1]}));
  kv.take_snapshot(a[2]);
  kv.find_cached_prefix(toks, 2, hit, hh);  // capped by max_blocks
  EXPECT_EQ(hit.size(), 2u);
  // A different second block breaks the chain after block 0.
  auto other = toks;
  other[5] = 999;
  kv.find_cached_prefix(other, 3, hit, hh);
  EXPECT_TRUE(hit.empty());
  // Sharing: acquire the hit, release both owners, refcounts return to zero.
  kv.find_cached_prefix(toks, 3, hit, hh);
  kv.acquire(hit);
  EXPECT_EQ(kv.ref_count(0), 2);
  kv.release(hit);
  kv.release(a);
  EXPECT_EQ(kv.num_free(), 8);
  std::vector<int> refs(8, 0);
  EXPECT_TRUE(kv.check(refs, nullptr).ok());
}

TEST(KvBlockManager, SnapshotsAreRecycledLeastRecentlyUsedFirst) {
  KvBlockManager kv(6, 4, true, /*num_snapshots=*/2);
  EXPECT_EQ(kv.num_snapshots(), 2);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.allocate(3, a));
  auto toks = seq_tokens(12, 40);
  std::vector<uint64_t> hashes;
  kv.register_full_blocks(toks, a, hashes, 3);
  // The numbers name the runner's buffers: two distinct ones in [0, 2).
  const int s0 = kv.take_snapshot(a[0]);
  const int s1 = kv.take_snapshot(a[1]);
  EXPECT_NE(s0, s1);
  EXPECT_TRUE(s0 >= 0 && s0 < 2 && s1 >= 0 && s1 < 2) << s0 << " " << s1;
  EXPECT_EQ(kv.take_snapshot(a[0]), s0);  // taking it again keeps its buffer (and makes it recent)
  kv.touch_snapshot(a[0]);                // a[1] is now the least recently used
  const int s2 = kv.take_snapshot(a[2]);  // recycles a[1]'s buffer
  EXPECT_EQ(s2, s1);
  EXPECT_TRUE(kv.has_snapshot(a[0]));
  EXPECT_FALSE(kv.has_snapshot(a[1]));
  EXPECT_TRUE(kv.has_snapshot(a[2]));
  EXPECT_EQ(kv.snapshot(a[0]), s0);
  EXPECT_EQ(kv.snapshot(a[2]), s1);
  // A hit touches a[2]: a[0] is now the least recently used, so a[1] gets its buffer.
  kv.touch_snapshot(a[2]);
  EXPECT_EQ(kv.take_snapshot(a[1]), s0);
  EXPECT_FALSE(kv.has_snapshot(a[0]));
  EXPECT_EQ(kv.snapshot(a[1]), s0);
  EXPECT_EQ(kv.snapshot(a[2]), s1);
  std::vector<int32_t> hit;
  std::vector<uint64_t> hh;
  kv.find_cached_prefix(toks, 3, hit, hh);
  EXPECT_EQ(hit.size(), 3u);  // the chain ends at a[2], which has a snapshot
  std::vector<int> refs(6, 0);
  for (int32_t b : a) refs[b] = 1;
  EXPECT_TRUE(kv.check(refs, nullptr).ok());
  // Evicting a block frees its snapshot buffer.
  kv.release(a);
  std::vector<int32_t> b;
  ASSERT_TRUE(kv.allocate(6, b));
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  std::fill(refs.begin(), refs.end(), 1);
  EXPECT_TRUE(kv.check(refs, nullptr).ok());
}

TEST(KvBlockManager, IntegrityCheckFindsLeaks) {
  KvBlockManager kv(4, 4, true);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.allocate(2, a));
  std::vector<int> refs(4, 0);
  refs[a[0]] = 1;  // the owner forgot a[1]
  int64_t leaked = 0;
  Status st = kv.check(refs, &leaked);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(leaked, 1);
  EXPECT_NE(st.message().find("block 1"), std::string::npos) << st.message();
}

TEST(KvBlockManager, NoCachingWhenDisabled) {
  KvBlockManager kv(4, 4, false);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.allocate(2, a));
  auto toks = seq_tokens(8, 1);
  std::vector<uint64_t> hashes;
  kv.register_full_blocks(toks, a, hashes, 2);
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  EXPECT_EQ(kv.num_snapshots(), 0);
}

// ---------------- Sampler ----------------
// One row at a time, as the engine hands it to a runner: the engine's row builder (request
// parameters, penalty state, grammar) feeding the host sampler.
class Sampler {
 public:
  Sampler(int64_t vocab_size, int32_t eos_token_id, int32_t noise_token_id)
      : vocab_(vocab_size), noise_(noise_token_id), rs_(vocab_size) {
    builder_.vocab = vocab_size;
    builder_.eos = eos_token_id;
  }
  void prepare(const float* logits, const SamplingParams& sp, const PenaltyState& pen, TokenConstraint* constraint) {
    rows_.clear();
    builder_.append(sp, pen, constraint, 0, 0, {}, false, rows_);
    SampleInputs in;
    in.logits = logits;
    in.masks = rows_.masks.data();
    in.prompt_ids = rows_.prompt_ids.data();
    in.counts = rows_.counts.data();
    in.vocab = vocab_;
    in.mask_words = rows_.mask_words;
    in.eos = builder_.eos;
    in.noise = noise_;
    rs_.prepare(logits, rows_.rows[0], in);
  }
  bool greedy() const { return rs_.greedy(); }
  int32_t argmax() const { return rs_.argmax(); }
  double prob(int32_t token) const { return rs_.prob(token); }
  int32_t sample(double u) const { return rs_.sample(u); }
  int32_t sample_residual(std::span<const float> q, int32_t draft, double u) {
    return rs_.sample_residual(q.empty() ? nullptr : q.data(), draft, u);
  }
  void logprobs(const float* logits, int32_t token, int n, TokenLogprob& out) {
    SampleRowResult r;
    row_logprobs(logits, vocab_, noise_, token, n, scratch_, r);
    out.token = token;
    out.logprob = r.token_logprob;
    out.top.clear();
    for (int i = 0; i < r.num_top; ++i) out.top.emplace_back(r.top_ids[i], r.top_logprobs[i]);
  }

 private:
  int64_t vocab_;
  int32_t noise_;
  SampleRowsBuilder builder_;
  StepSamples rows_;
  RowSampler rs_;
  std::vector<int32_t> scratch_;
};

TEST(Sampler, RngIsKeyedBySeedPositionStream) {
  double a = rng_uniform(1, 10, RngStream::kSample);
  EXPECT_EQ(a, rng_uniform(1, 10, RngStream::kSample));
  EXPECT_NE(a, rng_uniform(2, 10, RngStream::kSample));
  EXPECT_NE(a, rng_uniform(1, 11, RngStream::kSample));
  EXPECT_NE(a, rng_uniform(1, 10, RngStream::kAccept));
  EXPECT_GE(a, 0.0);
  EXPECT_LT(a, 1.0);
}

TEST(Sampler, MasksNoiseAndAppliesFilters) {
  const int V = 8;
  Sampler s(V, 1, 7);
  std::vector<float> z = {0.f, 0.f, 1.f, 3.f, 2.f, 2.5f, 0.5f, 10.f};  // 7 = noise
  PenaltyState pen;
  SamplingParams sp;
  sp.temperature = 0;
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.argmax(), 3);
  sp.temperature = 1.0;
  sp.top_k = 2;
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_EQ(s.prob(7), 0.0);
  EXPECT_GT(s.prob(3), 0.0);
  EXPECT_GT(s.prob(5), 0.0);
  EXPECT_EQ(s.prob(4), 0.0);
  EXPECT_NEAR(s.prob(3) + s.prob(5), 1.0, 1e-9);
  EXPECT_NEAR(s.prob(3) / s.prob(5), std::exp(0.5), 1e-6);
  sp.top_k = 0;
  sp.top_p = 0.3;  // the top token alone has more than 0.3
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_NEAR(s.prob(3), 1.0, 1e-9);
  sp.top_p = 1.0;
  sp.min_p = 0.5;  // keeps tokens with p >= 0.5 * p(3): 3 (1.0), 5 (e^-0.5 = 0.61)
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_GT(s.prob(5), 0.0);
  EXPECT_EQ(s.prob(4), 0.0);  // e^-1 = 0.37 < 0.5
  // Empirical frequencies follow p.
  sp.min_p = 0;
  s.prepare(z.data(), sp, pen, nullptr);
  std::vector<int> count(V, 0);
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++count[s.sample(rng_uniform(9, i, RngStream::kSample))];
  for (int v = 0; v < V; ++v) EXPECT_NEAR(count[v] / double(N), s.prob(v), 0.015) << v;
}

TEST(Sampler, Penalties) {
  const int V = 6;
  Sampler s(V, 1, -1);
  std::vector<float> z = {0.f, 0.f, 2.f, 1.9f, 1.f, -1.f};
  SamplingParams sp;
  sp.temperature = 0;
  PenaltyState pen;
  sp.repetition_penalty = 2.0;
  std::vector<int32_t> prompt = {2};
  pen.init(sp, prompt);
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_EQ(s.argmax(), 3);  // 2.0 / 2 = 1.0 < 1.9
  sp.repetition_penalty = 1.0;
  pen.init(sp, prompt);
  pen.add_output(2);
  sp.frequency_penalty = 0.05;
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_EQ(s.argmax(), 2);  // 1.95 > 1.9
  pen.add_output(2);
  pen.add_output(2);
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_EQ(s.argmax(), 3);  // 2.0 - 3 * 0.05 = 1.85 < 1.9
  sp.frequency_penalty = 0;
  sp.presence_penalty = 0.5;
  s.prepare(z.data(), sp, pen, nullptr);
  EXPECT_EQ(s.argmax(), 3);
}

TEST(Sampler, ResidualExcludesTheRejectedDraft) {
  const int V = 4;
  Sampler s(V, 1, -1);
  std::vector<float> z = {0.f, 0.f, 0.f, -100.f};  // p = 1/3 on 0..2
  SamplingParams sp;
  PenaltyState pen;
  s.prepare(z.data(), sp, pen, nullptr);
  for (int i = 0; i < 100; ++i) EXPECT_NE(s.sample_residual({}, 1, rng_uniform(1, i, RngStream::kResidual)), 1);
  std::vector<float> q = {0.6f, 0.4f, 0.f, 0.f};  // residual = max(0, p - q) = {0, 0, 1/3}
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample_residual(q, 0, rng_uniform(1, i, RngStream::kResidual)), 2);
}

class OnlyToken : public TokenConstraint {
 public:
  explicit OnlyToken(int32_t t, bool complete) : t_(t), complete_(complete) {}
  void allowed_tokens(std::vector<bool>& allowed) override {
    std::fill(allowed.begin(), allowed.end(), false);
    allowed[t_] = true;
    allowed[1] = true;  // EOS, only honoured when complete
  }
  void accept_token(int32_t) override {}
  bool is_complete() const override { return complete_; }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<OnlyToken>(*this); }

 private:
  int32_t t_;
  bool complete_;
};

TEST(Sampler, ConstraintMasks) {
  const int V = 6;
  Sampler s(V, 1, -1);
  std::vector<float> z = {0.f, 5.f, 2.f, 1.f, 0.f, 0.f};
  SamplingParams sp;
  sp.temperature = 0;
  PenaltyState pen;
  OnlyToken incomplete(4, false), complete(4, true);
  s.prepare(z.data(), sp, pen, &incomplete);
  EXPECT_EQ(s.argmax(), 4);  // EOS masked while incomplete
  s.prepare(z.data(), sp, pen, &complete);
  EXPECT_EQ(s.argmax(), 1);
}

TEST(Sampler, LogprobsAreRawAndSorted) {
  const int V = 5;
  Sampler s(V, 1, 4);
  std::vector<float> z = {1.f, 2.f, 3.f, 0.f, 50.f};
  TokenLogprob lp;
  s.logprobs(z.data(), 1, 2, lp);
  double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.0));
  EXPECT_NEAR(lp.logprob, 2.0 - lse, 1e-5);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_EQ(lp.top[1].first, 1);
}

// A score row (a prompt token's log-probability) draws nothing: its token is the scored one with the
// raw log-softmax, the rank among equal and greater logits (the noise token left out) and the top n.
TEST(Sampler, ScoreRowsReportTheScoredToken) {
  const int V = 6;
  const int32_t noise = 5;
  std::vector<float> z = {1.f, 3.f, 2.f, 3.f, -1.f, 90.f};  // ids 1 and 3 tie; the noise token is the largest
  SampleInputs in;
  in.logits = z.data();
  in.vocab = V;
  in.noise = noise;
  in.eos = 0;
  StepSamples ss;
  for (int32_t t : {0, 1, 2, 3, 4, 5}) SampleRowsBuilder::append_score(t, 2, 7, ss);
  for (SampleRow& r : ss.rows) r.logits_row = 0;
  std::vector<SampleRowResult> res(ss.rows.size());
  RowSampler rs(V);
  std::vector<int32_t> scratch;
  sample_rows_host(in, ss.rows, res, rs, scratch);
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0) + std::exp(-1.0));
  const int32_t want_rank[] = {4, 1, 3, 1, 5, 0};
  for (int t = 0; t < V; ++t) {
    EXPECT_EQ(res[t].token, t);
    EXPECT_EQ(res[t].accepted, 0);
    EXPECT_EQ(res[t].token_rank, want_rank[t]) << "token " << t;
    if (t == noise) {
      EXPECT_EQ(res[t].token_logprob, -std::numeric_limits<float>::infinity());
    } else {
      EXPECT_NEAR(res[t].token_logprob, z[t] - lse, 1e-6) << "token " << t;
    }
    ASSERT_EQ(res[t].num_top, 2);
    EXPECT_EQ(res[t].top_ids[0], 1);  // the tie goes to the lower id
    EXPECT_EQ(res[t].top_ids[1], 3);
  }
}

// ---------------- SampleRowsBuilder (the rows a verify step hands the runner's sampler) ----------------

// A grammar that allows exactly the sequence `seq`, then only EOS (complete at its end).
class Sequence : public TokenConstraint {
 public:
  explicit Sequence(std::vector<int32_t> seq) : seq_(std::move(seq)) {}
  void allowed_tokens(std::vector<bool>& allowed) override {
    std::fill(allowed.begin(), allowed.end(), false);
    if (at_ < seq_.size()) allowed[seq_[at_]] = true;
    allowed[1] = true;  // EOS: the builder clears it while incomplete
  }
  void accept_token(int32_t) override { ++at_; }
  bool is_complete() const override { return at_ >= seq_.size(); }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<Sequence>(*this); }

 private:
  std::vector<int32_t> seq_;
  size_t at_ = 0;
};

bool mask_bit(const StepSamples& s, int row, int32_t v) {
  return (s.masks[static_cast<size_t>(row) * s.mask_words + (v >> 5)] >> (v & 31)) & 1u;
}

TEST(SampleRowsBuilder, VerifyRowsCountDraftsBeforeThemAndKeyByPosition) {
  SampleRowsBuilder b;
  b.vocab = 40;
  b.eos = 1;
  SamplingParams sp;
  sp.temperature = 0.7;
  sp.frequency_penalty = 0.5;
  sp.repetition_penalty = 1.3;
  sp.logprobs = 3;
  PenaltyState pen;
  const std::vector<int32_t> prompt = {9, 3, 9};
  pen.init(sp, prompt);
  pen.add_output(7);
  pen.add_output(7);
  pen.add_output(5);
  const std::vector<int32_t> draft = {7, 33};
  StepSamples out;
  b.append(sp, pen, nullptr, 42, 100, draft, /*draft_sampled=*/true, out);
  ASSERT_EQ(out.rows.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    const SampleRow& r = out.rows[j];
    EXPECT_EQ(r.position, 100 + j);
    EXPECT_EQ(r.seed, 42u);
    EXPECT_EQ(r.draft, j < 2 ? draft[j] : -1);
    EXPECT_EQ(r.q_row, j < 2 ? j : -1);
    EXPECT_EQ(r.top_logprobs, 3);
    EXPECT_EQ(r.mask_row, -1);
    ASSERT_EQ(r.prompt_count, 2);  // unique prompt ids
    EXPECT_EQ(out.prompt_ids[r.prompt_begin], 3);
    EXPECT_EQ(out.prompt_ids[r.prompt_begin + 1], 9);
    std::map<int32_t, int32_t> counts;
    for (int k = 0; k < r.counts_count; ++k) {
      const int32_t t = out.counts[2 * (r.counts_begin + k)], c = out.counts[2 * (r.counts_begin + k) + 1];
      EXPECT_TRUE(counts.emplace(t, c).second) << "token " << t << " listed twice in row " << j;
    }
    // Row j counts the output so far plus the drafts before it.
    std::map<int32_t, int32_t> want = {{7, 2}, {5, 1}};
    for (int k = 0; k < j; ++k) ++want[draft[k]];
    EXPECT_EQ(counts, want) << "row " << j;
  }
  // Greedy requests without penalties carry no arrays; greedy drafts have no q rows.
  StepSamples plain;
  SamplingParams g;
  g.temperature = 0;
  b.append(g, PenaltyState(), nullptr, 1, 5, draft, false, plain);
  ASSERT_EQ(plain.rows.size(), 3u);
  EXPECT_TRUE(plain.counts.empty());
  EXPECT_TRUE(plain.prompt_ids.empty());
  for (const SampleRow& r : plain.rows) EXPECT_EQ(r.q_row, -1);
  EXPECT_EQ(plain.rows[0].top_logprobs, -1);
}

TEST(SampleRowsBuilder, GrammarMasksFollowTheDraftsAndStopAtAForbiddenOne) {
  SampleRowsBuilder b;
  b.vocab = 70;  // three mask words
  b.eos = 1;
  SamplingParams sp;
  sp.temperature = 0;
  Sequence grammar({40, 66, 12});
  StepSamples out;
  b.append(sp, PenaltyState(), &grammar, 0, 0, std::vector<int32_t>{40, 66}, false, out);
  ASSERT_EQ(out.rows.size(), 3u);
  EXPECT_EQ(out.mask_words, 3);
  EXPECT_TRUE(mask_bit(out, 0, 40));
  EXPECT_FALSE(mask_bit(out, 0, 66));
  EXPECT_FALSE(mask_bit(out, 0, 1));  // EOS cleared while incomplete
  EXPECT_TRUE(mask_bit(out, 1, 66));
  EXPECT_FALSE(mask_bit(out, 1, 40));
  EXPECT_TRUE(mask_bit(out, 2, 12));
  // The request's own constraint is untouched (the builder advanced a copy).
  std::vector<bool> allowed(70);
  grammar.allowed_tokens(allowed);
  EXPECT_TRUE(allowed[40]);

  // A draft the grammar forbids: its row rejects it (greedy over the mask), later rows are unused.
  StepSamples bad;
  b.append(sp, PenaltyState(), &grammar, 0, 0, std::vector<int32_t>{41, 66}, false, bad);
  ASSERT_EQ(bad.rows.size(), 3u);
  std::vector<float> logits(3 * 70, 0.f);
  for (int r = 0; r < 3; ++r) logits[r * 70 + 41] = 9.f;  // the model wants the forbidden token
  SampleInputs in;
  in.logits = logits.data();
  in.masks = bad.masks.data();
  in.vocab = 70;
  in.mask_words = bad.mask_words;
  in.eos = 1;
  std::vector<SampleRow> rows = bad.rows;
  for (int r = 0; r < 3; ++r) rows[r].logits_row = r;
  std::vector<SampleRowResult> res(3);
  RowSampler rs(70);
  std::vector<int32_t> scratch;
  sample_rows_host(in, rows, res, rs, scratch);
  EXPECT_EQ(res[0].accepted, 0);
  EXPECT_EQ(res[0].token, 40);  // the only allowed token
}

// ---------------- TextStream ----------------
TEST(TextStream, JoinsSplitUtf8AndHoldsStopPrefixes) {
  FakeTokenizer tk(64);
  TextStream plain(tk, {});
  std::string out;
  EXPECT_FALSE(plain.push(2, out));  // first byte of é
  EXPECT_EQ(out, "");
  plain.push(3, out);
  EXPECT_EQ(out, "\xC3\xA9");
  plain.push(1, out);  // special: no text
  EXPECT_EQ(out, "\xC3\xA9");

  int32_t th = *tk.token_to_id("th"), er = *tk.token_to_id("er"), a = *tk.token_to_id("a");
  TextStream st(tk, {"ther"});
  out.clear();
  EXPECT_FALSE(st.push(a, out));
  EXPECT_EQ(out, "a");
  EXPECT_FALSE(st.push(th, out));
  EXPECT_EQ(out, "a");  // "th" may start "ther": held
  EXPECT_TRUE(st.push(er, out));
  EXPECT_EQ(out, "a");
  EXPECT_EQ(st.matched_stop(), "ther");

  TextStream st2(tk, {"ther"});
  out.clear();
  st2.push(th, out);
  st2.push(a, out);  // "tha": no longer a prefix
  EXPECT_EQ(out, "tha");
  st2.push(th, out);
  st2.finish(out);  // held "th" released at the end
  EXPECT_EQ(out, "thath");
}

TEST(TextStream, IncompleteUtf8AtEndBecomesReplacement) {
  FakeTokenizer tk(64);
  TextStream s(tk, {});
  std::string out;
  s.push(2, out);
  s.finish(out);
  EXPECT_EQ(out, "\xEF\xBF\xBD");
  // A lone continuation byte is invalid at once.
  TextStream t(tk, {});
  out.clear();
  t.push(3, out);
  EXPECT_EQ(out, "\xEF\xBF\xBD");
}

// ---------------- --speculative-config ----------------
TEST(SpeculativeConfig, ParsesVllmJson) {
  auto c = parse_speculative_config(R"({"method":"dspark","num_speculative_tokens":5})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->method, "dspark");
  EXPECT_EQ(c->num_speculative_tokens, 5);
  EXPECT_EQ(c->verify_mode, VerifyMode::kAuto);
  c = parse_speculative_config(R"({"method":"dspark","num_speculative_tokens":3,"dspark_confidence_threshold":0.7})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verify_mode, VerifyMode::kThreshold);
  EXPECT_DOUBLE_EQ(c->confidence_threshold, 0.7);
  c = parse_speculative_config(R"({"method":"dspark","verify_mode":"fixed","draft_sample_method":"probabilistic"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verify_mode, VerifyMode::kFixed);
  EXPECT_EQ(c->draft_sample_method, DraftSampleMethod::kSample);
  EXPECT_TRUE(parse_speculative_config("").ok());
  c = parse_speculative_config(R"({"method":"mtp","num_speculative_tokens":2})");  // vLLM's name for it
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, "dspark");
  for (const char* bad : {"{", "[]", R"({"method":"eagle"})", R"({"method":"dspark","num_speculative_tokens":0})",
                          R"({"method":"dspark","num_speculative_tokens":"5"})", R"({"method":"dspark","bogus":1})",
                          R"({"method":"dspark","verify_mode":"maybe"})", R"({"num_speculative_tokens":5})",
                          R"({"method":"dspark","confidence_threshold":2})", R"({"method":"mtp","frobnicate":true})"}) {
    auto r = parse_speculative_config(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--speculative-config"), std::string::npos);
    }
  }
}

// ---------------- SpecPlanner ----------------
TEST(SpecPlanner, AutoFollowsMeasuredCosts) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = VerifyMode::kAuto;
  std::vector<float> hi = {0.95f, 0.95f, 0.9f, 0.9f, 0.9f}, lo = {0.3f, 0.2f, 0.2f, 0.1f, 0.1f};
  std::vector<std::span<const float>> conf = {hi, lo};
  std::vector<int> limits = {5, 5}, lengths;
  std::vector<uint8_t> pick;
  // Bandwidth-bound: a step costs ~the same for any token count -> draft and verify nearly everything.
  SpecPlanner bw(sc, 5);
  for (int t = 1; t <= 64; ++t) bw.observe_forward(2, t, 0.010 + 1e-6 * t);
  for (int r = 1; r <= 8; ++r) bw.observe_draft(r, 0.001);
  bw.plan(conf, limits, 0, lengths);
  EXPECT_EQ(lengths[0], 5);
  EXPECT_GE(lengths[1], 1);
  SpecRequestState a, b;
  bw.start_request(a);
  bw.start_request(b);
  std::vector<SpecRequestState*> both = {&a, &b};
  bw.choose_drafts(both, limits, 0, pick);
  EXPECT_EQ(pick, (std::vector<uint8_t>{1, 1}));
  // Compute-bound: every token costs the same as the fixed part -> only near-certain drafts, and
  // with poor measured acceptance drafting is switched off (except periodic probes).
  SpecPlanner cb(sc, 5);
  for (int t = 1; t <= 64; ++t) cb.observe_forward(2, t, 0.001 * t);
  for (int r = 1; r <= 8; ++r) cb.observe_draft(r, 0.0005 * r);
  cb.plan(conf, limits, 0, lengths);
  EXPECT_EQ(lengths[1], 0);
  EXPECT_LE(lengths[0], 5);
  cb.start_request(a);
  cb.start_request(b);
  for (int i = 0; i < 200; ++i) cb.observe_verify(nullptr, 3, 0);  // the global estimate falls
  int drafted = 0;
  for (int i = 0; i < 64; ++i) {
    cb.choose_drafts(both, limits, 0, pick);
    drafted += pick[0] + pick[1];
  }
  EXPECT_GE(drafted, 4);   // probes: 4, 8, 16, 32 steps apart, for each request
  EXPECT_LE(drafted, 10);
  // Probes back off exponentially while drafting keeps not paying: 4,000 steps hold only a few.
  int probes = 0;
  for (int i = 0; i < 4000; ++i) {
    cb.choose_drafts(both, limits, 0, pick);
    probes += pick[0] + pick[1];
  }
  EXPECT_GE(probes, 2 * 14);
  EXPECT_LE(probes, 2 * 17);
  // Fixed and threshold modes ignore costs.
  sc.verify_mode = VerifyMode::kFixed;
  SpecPlanner fixed(sc, 5);
  std::vector<int> lim2 = {5, 2};
  fixed.plan(conf, lim2, 0, lengths);
  EXPECT_EQ(lengths, (std::vector<int>{5, 2}));
  fixed.choose_drafts(both, std::vector<int>{5, 0}, 0, pick);
  EXPECT_EQ(pick, (std::vector<uint8_t>{1, 0}));
  sc.verify_mode = VerifyMode::kThreshold;
  sc.confidence_threshold = 0.5;
  SpecPlanner thr(sc, 5);
  thr.plan(conf, limits, 0, lengths);
  EXPECT_EQ(lengths, (std::vector<int>{5, 0}));
}

// Per-request decisions: on a compute-bound machine (every verified token costs 1.5 ms on top of a
// 4 ms step, a draft 2 ms + 1 ms per request), a request whose drafts are always accepted keeps
// drafting while one whose drafts are always rejected, in the same batch, stops after its first
// verifies and is only probed now and then.
TEST(SpecPlanner, AutoDecidesPerRequest) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = VerifyMode::kAuto;
  SpecPlanner p(sc, 5);
  for (int rep = 0; rep < 3; ++rep)
    for (int t = 1; t <= 64; ++t) p.observe_forward(2, t, 0.004 + 0.0015 * t);
  for (int rep = 0; rep < 3; ++rep)
    for (int r = 1; r <= 8; ++r) p.observe_draft(r, 0.002 + 0.001 * r);
  SpecRequestState good, bad;
  p.start_request(good);
  p.start_request(bad);
  std::vector<SpecRequestState*> both = {&good, &bad};
  std::vector<int> limits = {5, 5};
  std::vector<uint8_t> pick;
  int good_drafts = 0, bad_drafts = 0;
  for (int step = 0; step < 200; ++step) {
    p.choose_drafts(both, limits, 0, pick);
    good_drafts += pick[0];
    bad_drafts += pick[1];
    if (pick[0]) p.observe_verify(&good, 5, 5);
    if (pick[1]) p.observe_verify(&bad, 5, 0);
  }
  EXPECT_GE(good_drafts, 180);
  EXPECT_LE(bad_drafts, 10);
  EXPECT_GT(p.acceptance(good, 4), 0.8);
  EXPECT_LT(p.acceptance(bad, 0), 0.2);
  // The per-request estimate starts at the global one.
  SpecRequestState fresh;
  p.start_request(fresh);
  EXPECT_DOUBLE_EQ(p.acceptance(fresh, 0), p.acceptance_ema()[0]);
  // A probe is judged by its own confidences: hopeless drafts are not verified, confident ones are,
  // even for a request whose record is poor.
  bad.probe = true;
  std::vector<float> low = {0.01f, 0.01f, 0.01f, 0.01f, 0.01f}, high = {1.f, 1.f, 1.f, 1.f, 1.f};
  std::vector<std::span<const float>> conf = {low};
  std::vector<SpecRequestState*> one = {&bad};
  std::vector<int> lengths;
  p.plan(conf, std::vector<int>{5}, 0, lengths, one);
  EXPECT_EQ(lengths[0], 0);
  conf = {high};
  p.plan(conf, std::vector<int>{5}, 0, lengths, one);
  EXPECT_EQ(lengths[0], 5);
}

// Confidences are calibrated against outcomes: a draft that says 0.15 but is right 90% of the time
// is treated as 0.9 after enough verifies, and one that says 0.95 but is wrong as ~0.
// Forward costs are kept per sequence count: 8 sequences x 1 token can cost far more than one
// sequence verifying 8 tokens (per-sequence work), and the planner must not mix the two up.
TEST(SpecPlanner, ForwardCostsPerSequenceCount) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = VerifyMode::kAuto;
  SpecPlanner p(sc, 5);
  for (int rep = 0; rep < 3; ++rep)
    for (int b : {1, 2, 4, 8})
      for (int L = 0; L <= 5; ++L) p.observe_forward(b, b * (1 + L), 0.004 * b + 0.002 * b * L);
  EXPECT_NEAR(p.predict_forward(8, 8), 0.032, 1e-9);   // measured shape
  EXPECT_NEAR(p.predict_forward(1, 8), 0.018, 1e-3);   // one sequence, 8 tokens: its own line
  EXPECT_NEAR(p.predict_forward(8, 12), 0.040, 1e-3);  // between measured shapes of 8 sequences
  // A count never profiled: after one shape, its level and the all-batches slope.
  p.observe_forward(3, 3, 0.012);
  EXPECT_NEAR(p.predict_forward(3, 3), 0.012, 1e-9);
  EXPECT_GT(p.predict_forward(3, 9), 0.012);
}

// Costs drift for all shapes at once (context grows): when the shapes in use get 30% slower, a
// shape measured only at start-up is predicted slower too.
TEST(CostModel, StaleShapesFollowTheCommonLevel) {
  CostModel m(1e-3, 1e-5);
  for (int rep = 0; rep < 3; ++rep)
    for (int x : {1, 2, 4, 8, 16, 48}) m.add(x, 0.005 + 0.001 * x);
  EXPECT_NEAR(m.predict(48), 0.053, 1e-9);
  for (int i = 0; i < 200; ++i) m.add(8, 1.3 * 0.013);
  EXPECT_NEAR(m.predict(8), 1.3 * 0.013, 0.001);
  EXPECT_NEAR(m.predict(48), 1.3 * 0.053, 0.005);
  EXPECT_NEAR(m.predict(30), 1.3 * 0.035, 0.005);  // fitted line, same level
}

TEST(SpecPlanner, CalibratesConfidences) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = VerifyMode::kAuto;
  SpecPlanner p(sc, 5);
  EXPECT_NEAR(p.calibrated(0.15), 0.15, 1e-9);  // nothing observed yet
  std::vector<float> conf = {0.95f, 0.15f, 0.5f, 0.5f, 0.5f};
  for (int i = 0; i < 500; ++i) p.observe_verify(nullptr, 2, i % 10 == 0 ? 0 : 2, conf);
  EXPECT_GT(p.calibrated(0.15), 0.8);
  EXPECT_GT(p.calibrated(0.95), 0.8);
  std::vector<float> wrong = {0.95f, 0.95f, 0.95f, 0.95f, 0.95f};
  SpecPlanner q(sc, 5);
  for (int i = 0; i < 500; ++i) q.observe_verify(nullptr, 5, 0, wrong);
  EXPECT_LT(q.calibrated(0.95), 0.05);
  EXPECT_NEAR(q.calibrated(0.55), 0.55, 1e-9);  // other deciles untouched
}

// `requests` requests decoding together for `steps` rounds through the planner, each on its own text
// whose drafts are accepted with probability p_good or p_bad per position, switching between the two
// kinds of stretch with probability `flip` a round; the draft's confidences say the stretch's p.
// Costs: a forward of the batch with t tokens in all step + (t - requests) * token; a draft of n
// requests draft + (n - 1) * draft_extra. Returns tokens per second.
struct BurstyText {
  double p_good, p_bad, flip;
};
struct StepCosts {
  const char* name;
  int requests;
  double step, token, draft, draft_extra;
};
double simulate_planner(VerifyMode mode, const BurstyText& text, const StepCosts& cost, int steps, uint64_t seed) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = mode;
  SpecPlanner p(sc, 5);
  const int R = cost.requests;
  auto forward = [&](int tokens) { return cost.step + cost.token * (tokens - R); };
  auto draft = [&](int n) { return cost.draft + cost.draft_extra * (n - 1); };
  for (int rep = 0; rep < 3; ++rep) {  // the engine's start-up profile
    for (int t = R; t <= 6 * R; ++t) p.observe_forward(R, t, forward(t));
    for (int n = 1; n <= R; ++n) p.observe_draft(n, draft(n));
  }
  std::vector<SpecRequestState> st(R);
  std::vector<SpecRequestState*> states;
  for (auto& x : st) {
    p.start_request(x);
    states.push_back(&x);
  }
  const std::vector<int> limits(R, 5);
  std::vector<int> lengths;
  std::vector<uint8_t> pick;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint8_t> good(R, 1);
  std::vector<float> conf(5 * R);
  double seconds = 0, tokens = 0;
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < R; ++r)
      if (u(rng) < text.flip) good[r] = !good[r];
    auto pa = [&](int r) { return good[r] ? text.p_good : text.p_bad; };
    p.choose_drafts(states, limits, 0, pick);
    std::vector<int> drafted;
    std::vector<std::span<const float>> c;
    std::vector<SpecRequestState*> ds;
    for (int r = 0; r < R; ++r) {
      std::fill(conf.begin() + 5 * r, conf.begin() + 5 * r + 5, static_cast<float>(pa(r)));
      if (!pick[r]) continue;
      drafted.push_back(r);
      c.emplace_back(conf.data() + 5 * r, 5);
      ds.push_back(states[r]);
    }
    int verified = 0;
    if (!drafted.empty()) {
      p.plan(c, std::vector<int>(drafted.size(), 5), 0, lengths, ds);
      seconds += draft(static_cast<int>(drafted.size()));
      p.observe_draft(static_cast<int>(drafted.size()), draft(static_cast<int>(drafted.size())));
      for (size_t i = 0; i < drafted.size(); ++i) {
        const int r = drafted[i];
        int accepted = 0;
        while (accepted < lengths[i] && u(rng) < pa(r)) ++accepted;
        p.observe_verify(states[r], lengths[i], accepted, std::span<const float>(conf.data() + 5 * r, lengths[i]));
        verified += lengths[i];
        tokens += accepted;
      }
    }
    seconds += forward(R + verified);
    p.observe_forward(R, R + verified, forward(R + verified));
    tokens += R;
  }
  return tokens / seconds;
}

// Against always drafting and verifying every draft token ("fixed") and never drafting, "auto"
// must come within 3% of the better of the two where one is best throughout (its probes cost a
// draft now and then) and beat both where the text alternates between stretches that favour each.
// Costs: the built-in model's on an H200 (a 1-token step 714 us, +26 us a verified token, a draft
// 350 us; 8 requests: 814 us, +21.5 us, 365 us + 50.6 a request: docs/PERFORMANCE.md) and on one
// CPU thread (16.4 ms, +6.3 ms, 16.8 ms: README).
TEST(SpecPlanner, AutoAgainstFixedOnBurstyText) {
  for (const StepCosts cost : {StepCosts{"gpu", 1, 714e-6, 26e-6, 350e-6, 0}, StepCosts{"cpu", 1, 16.4e-3, 6.3e-3, 16.8e-3, 0},
                               StepCosts{"gpu x8", 8, 814e-6, 21.5e-6, 365e-6, 50.6e-6}}) {
    const double plain = cost.requests / cost.step;
    for (const BurstyText text : {BurstyText{0.85, 0.85, 0.0}, BurstyText{0.1, 0.1, 0.0}, BurstyText{0.75, 0.2, 0.1},
                                  BurstyText{0.6, 0.3, 0.05}, BurstyText{0.9, 0.05, 0.02}, BurstyText{0.5, 0.5, 0.0}}) {
      double a = 0, f = 0;
      for (uint64_t seed = 1; seed <= 8; ++seed) {
        a += simulate_planner(VerifyMode::kAuto, text, cost, 400, seed) / 8;
        f += simulate_planner(VerifyMode::kFixed, text, cost, 400, seed) / 8;
      }
      std::printf("[planner] %s, p %.2f / %.2f, flip %.2f: auto %.1f tok/s, fixed %.1f, plain %.1f\n", cost.name,
                  text.p_good, text.p_bad, text.flip, a, f, plain);
      // Tokens per second of drafting and verifying all 5 in a stretch of acceptance p.
      auto drafting = [&](double pa) {
        double g = 1, surv = 1;
        for (int j = 0; j < 5; ++j) g += (surv *= pa);
        return cost.requests * g / (cost.draft + (cost.requests - 1) * cost.draft_extra + cost.step +
                                    5 * cost.requests * cost.token);
      };
      if (cost.requests == 1 && text.flip > 0 && drafting(text.p_good) > plain && drafting(text.p_bad) < plain)
        EXPECT_GE(a, std::max(f, plain)) << cost.name << ": stretches that favour each: auto drafts in the good ones";
      else  // one policy is best throughout: auto pays for its probes only
        EXPECT_GE(a, 0.97 * std::max(f, plain)) << cost.name << ": auto finds the better policy";
    }
  }
}

// Probes share draft launches: eight requests that joined at different steps, on a machine where
// drafting never pays and every draft is rejected, probe now and then; a step that launches a draft
// for one probe takes every request at least halfway to its own probe along, so the batch pays far
// fewer launches than it makes probes.
TEST(SpecPlanner, ProbesShareDraftLaunches) {
  SpeculativeConfig sc;
  sc.method = "dspark";
  sc.verify_mode = VerifyMode::kAuto;
  SpecPlanner p(sc, 5);
  for (int rep = 0; rep < 3; ++rep) {
    for (int t = 1; t <= 48; ++t) p.observe_forward(8, t, 0.001 * t);
    for (int n = 1; n <= 8; ++n) p.observe_draft(n, 0.004 + 0.0005 * n);
  }
  for (int i = 0; i < 200; ++i) p.observe_verify(nullptr, 5, 0);  // the global estimate: nothing accepted
  std::vector<SpecRequestState> st(8);
  std::vector<SpecRequestState*> states;
  std::vector<uint8_t> pick;
  int launches = 0, probes = 0;
  for (int step = 0; step < 2000; ++step) {
    if (step % 5 == 0 && step / 5 < 8) {  // a request joins every 5 steps
      p.start_request(st[step / 5]);
      states.push_back(&st[step / 5]);
    }
    p.choose_drafts(states, std::vector<int>(states.size(), 5), 0, pick);
    int n = 0;
    for (size_t r = 0; r < states.size(); ++r)
      if (pick[r]) {
        ++n;
        EXPECT_TRUE(states[r]->probe) << "drafting never pays here: only probes draft";
        p.observe_verify(states[r], 5, 0);
      }
    probes += n;
    launches += n > 0;
  }
  std::printf("[planner] 8 requests, 2000 steps: %d probes in %d draft launches\n", probes, launches);
  EXPECT_GE(probes, 8 * 10);  // each request still probes (4, 8, ... 256 steps apart)
  EXPECT_LE(2 * launches, probes);
}

TEST(FinishReason, Names) {
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(finish_reason_name(FinishReason::kError), "error");
}

}  // namespace
}  // namespace tandem
