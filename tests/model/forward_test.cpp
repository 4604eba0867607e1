// CPU forward consistency: whole prefill == chunked prefill (any chunk sizes) == one-token decode ==
// multi-token verify, across window, ratio-4 and ratio-128 block boundaries; rollback (incl. the
// compressor and indexer state) then recompute; batching slots at different positions; paged
// block tables; slot-state export/import; loader failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/numeric.h"
#include "io/safetensors.h"
#include "kernels/sampling.h"
#include "model/model.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"

namespace tandem {
namespace {

using testing::max_abs_diff;
using testing::run;
using testing::table_for;
using testing::tiny_config;
using testing::tokens;
using testing::tiny_weights;

struct Env {
  ModelConfig cfg = tiny_config();
  testing::TinyWeights tw = tiny_weights(cfg, 7);
  std::unique_ptr<DsV4Model> model;
  Env() {
    ModelOptions o;
    o.max_slots = 4;
    o.num_blocks = 16;
    o.block_size = 256;
    o.max_rollback = 8;
    o.max_tokens_per_step = 512;
    o.num_threads = 1;  // the test machine is shared; results do not depend on threads
    auto m = DsV4Model::from_tensors(cfg, tw.ptrs(), o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (m.ok()) model = std::move(m).value();
  }
};

Env& env() {
  static Env e;
  return e;
}

TEST(ModelLoad, ReportsCounts) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  const LoadReport& r = e.model->load_report();
  EXPECT_EQ(r.target_tensors_loaded, r.target_tensors_expected);
  EXPECT_EQ(r.draft_tensors_loaded, r.draft_tensors_expected);
  EXPECT_GT(r.draft_tensors_loaded, 0);
  EXPECT_EQ(r.skipped_tensors, 0);
  EXPECT_EQ(static_cast<size_t>(r.target_tensors_loaded + r.draft_tensors_loaded), e.tw.data.size());
  EXPECT_NE(r.summary().find("no skipped tensors"), std::string::npos) << r.summary();
}

TEST(ModelLoad, MissingTensorFails) {
  ModelConfig c = tiny_config();
  auto tw = tiny_weights(c, 3);
  tw.data.erase(std::remove_if(tw.data.begin(), tw.data.end(),
                               [](const TensorData& t) { return t.name == "layers.1.attn.indexer.wq_b.scale"; }),
                tw.data.end());
  tw.make_views();
  auto m = DsV4Model::from_tensors(c, tw.ptrs(), ModelOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("layers.1.attn.indexer.wq_b.scale"), std::string::npos) << m.status().message();
}

TEST(ModelLoad, MisShapedTensorFails) {
  ModelConfig c = tiny_config();
  auto tw = tiny_weights(c, 3);
  TensorData* t = tw.find("mtp.2.confidence_head.proj.weight");
  ASSERT_TRUE(t);
  t->shape = {2, t->shape[1] / 2};
  tw.make_views();
  auto m = DsV4Model::from_tensors(c, tw.ptrs(), ModelOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("mtp.2.confidence_head.proj.weight"), std::string::npos);
  EXPECT_NE(m.status().message().find("shape"), std::string::npos);
}

TEST(ModelLoad, UnexpectedTensorFails) {
  ModelConfig c = tiny_config();
  auto tw = tiny_weights(c, 3);
  TensorData extra;
  extra.name = "layers.0.attn.bogus.weight";
  extra.dtype = DType::kF32;
  extra.shape = {2};
  extra.bytes.resize(8);
  tw.data.push_back(extra);
  tw.make_views();
  auto m = DsV4Model::from_tensors(c, tw.ptrs(), ModelOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("layers.0.attn.bogus.weight"), std::string::npos);
}

TEST(ModelLoad, WrongDtypeFails) {
  ModelConfig c = tiny_config();
  auto tw = tiny_weights(c, 3);
  TensorData* t = tw.find("layers.2.attn.wq_a.scale");
  ASSERT_TRUE(t);
  t->dtype = DType::kU8;
  tw.make_views();
  auto m = DsV4Model::from_tensors(c, tw.ptrs(), ModelOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("layers.2.attn.wq_a.scale"), std::string::npos);
}

TEST(ModelLoad, SkipsDraftWhenAsked) {
  ModelConfig c = tiny_config();
  auto tw = tiny_weights(c, 3);
  ModelOptions o;
  o.load_draft = false;
  auto m = DsV4Model::from_tensors(c, tw.ptrs(), o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE((*m)->has_draft());
  EXPECT_GT((*m)->load_report().skipped_tensors, 0);
}

// 300 tokens: past the 128 window, two full ratio-128 blocks, many ratio-4 blocks and topk 16.
TEST(ModelForward, ChunkedEqualsWholeEqualsOneAtATime) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  auto toks = tokens(300, 11);
  auto whole = run(*e.model, 0, toks, {});
  auto ones = run(*e.model, 1, toks, {1});
  auto chunked = run(*e.model, 2, toks, {7, 1, 130, 3, 4, 125, 2});
  auto verify = run(*e.model, 3, toks, {250, 6, 6, 6, 6, 6, 6, 6, 6});
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(max_abs_diff(whole, ones), 0.0f);
  EXPECT_EQ(max_abs_diff(whole, chunked), 0.0f);
  EXPECT_EQ(max_abs_diff(whole, verify), 0.0f);
  // Not trivially equal: logits vary across positions.
  const int64_t V = e.model->vocab_size();
  float spread = 0.0f;
  for (int64_t v = 0; v < V; ++v) spread = std::max(spread, std::fabs(whole[v] - whole[299 * V + v]));
  EXPECT_GT(spread, 1e-3f);
}

TEST(ModelForward, BatchOfSlotsAtDifferentPositions) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  const int64_t V = m.vocab_size();
  auto a = tokens(140, 21), b = tokens(40, 22);
  auto ref_a = run(m, 0, a, {});
  auto ref_b = run(m, 1, b, {});
  // Prefill a[0:130] and b[0:37] separately, then one step with a[130:140] (kAll) and b[37:40] (kLast).
  run(m, 2, std::vector<int32_t>(a.begin(), a.begin() + 130), {});
  run(m, 3, std::vector<int32_t>(b.begin(), b.begin() + 37), {});
  auto ta = table_for(2), tb = table_for(3);
  StepBatch batch;
  SeqStep sa{2, 130, std::span<const int32_t>(a.data() + 130, 10), ta, LogitsMode::kAll, false};
  SeqStep sb{3, 37, std::span<const int32_t>(b.data() + 37, 3), tb, LogitsMode::kLast, false};
  batch.seqs = {sb, sa};
  StepOutput out;
  ASSERT_TRUE(m.forward(batch, out).ok());
  ASSERT_EQ(out.num_logits_rows, 11);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(out.logits_for(0, V)[v], ref_b[39 * V + v]);
  for (int t = 0; t < 10; ++t)
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(out.logits_for(1, V, t)[v], ref_a[(130 + t) * V + v]) << t;
  EXPECT_EQ(m.slot_length(2), 140);
  EXPECT_EQ(m.slot_length(3), 40);
}

// Rollback across ratio-4 and ratio-128 block completions, then different tokens.
TEST(ModelForward, RollbackThenRecomputeMatchesFresh) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  testing::expect_rollback_then_recompute_exact(m, {252, 254, 256});
  EXPECT_FALSE(m.rollback(0, m.slot_length(0) - 9).ok());  // beyond max_rollback
}

TEST(ModelForward, SlotStateExportImport) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  const int64_t V = m.vocab_size();
  auto toks = tokens(280, 41);
  auto ref = run(m, 0, toks, {});
  // slot 1 computes the first 256 tokens with slot 0's blocks, exports; slot 2 imports and continues.
  std::vector<int32_t> shared_table = table_for(1);
  m.reset(1);
  StepBatch b;
  StepOutput out;
  b.seqs = {{1, 0, std::span<const int32_t>(toks.data(), 256), shared_table, LogitsMode::kNone, false}};
  ASSERT_TRUE(m.forward(b, out).ok());
  std::vector<uint8_t> state(m.slot_state_bytes());
  ASSERT_TRUE(m.export_slot_state(1, state).ok());
  m.reset(1);
  ASSERT_TRUE(m.import_slot_state(2, state).ok());
  EXPECT_EQ(m.slot_length(2), 256);
  std::vector<int32_t> t2 = shared_table;  // block 0 shared, block 1 private to slot 2
  t2[1] = 2 * 4 + 1;
  b.seqs = {{2, 256, std::span<const int32_t>(toks.data() + 256, 24), t2, LogitsMode::kAll, false}};
  ASSERT_TRUE(m.forward(b, out).ok());
  for (int t = 0; t < 24; ++t)
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(out.logits[t * V + v], ref[(256 + t) * V + v]);
  EXPECT_FALSE(m.import_slot_state(2, std::span<const uint8_t>(state.data(), 8)).ok());
}

TEST(ModelForward, BadStepsAreErrors) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  m.reset(0);
  auto toks = tokens(10, 5);
  std::vector<int32_t> bad = {3, 9999};
  auto table = table_for(0);
  StepOutput out;
  StepBatch b;
  b.seqs = {{0, 1, toks, table, LogitsMode::kLast, false}};
  EXPECT_FALSE(m.forward(b, out).ok());  // start_pos != length
  b.seqs = {{0, 0, bad, table, LogitsMode::kLast, false}};
  EXPECT_FALSE(m.forward(b, out).ok());  // token out of vocab
  b.seqs = {{7, 0, toks, table, LogitsMode::kLast, false}};
  EXPECT_FALSE(m.forward(b, out).ok());  // slot
  b.seqs = {{0, 0, toks, std::span<const int32_t>(), LogitsMode::kLast, false}};
  EXPECT_FALSE(m.forward(b, out).ok());  // no block table
  std::vector<int32_t> oob = {99};
  b.seqs = {{0, 0, toks, oob, LogitsMode::kLast, false}};
  EXPECT_FALSE(m.forward(b, out).ok());  // block id outside pool
  EXPECT_EQ(m.slot_length(0), 0);
}

// Thread count changes nothing: every output element has one fixed summation order.
TEST(ModelForward, ThreadCountDoesNotChangeLogits) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  ModelOptions o = e.model->options();
  o.num_threads = 2;
  auto m2 = DsV4Model::from_tensors(e.cfg, e.tw.ptrs(), o);
  ASSERT_TRUE(m2.ok()) << m2.status().to_string();
  auto toks = tokens(140, 61);
  auto one = run(*e.model, 0, toks, {});
  auto two = run(**m2, 0, toks, {100, 40});
  EXPECT_EQ(max_abs_diff(one, two), 0.0f);
}

// The compressor state machine under random chunk sizes, random rollbacks (up to max_rollback,
// across ratio-4 and ratio-128 block completions and the 256-token pool block boundary) and
// slot-state moves to another slot at arbitrary positions: every position's logits equal a fresh
// whole-prompt run of the final history.
TEST(ModelForward, RandomChunksRollbacksAndSlotMovesMatchFresh) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  const int64_t V = m.vocab_size();
  for (uint64_t seed : {1u, 2u}) {
    testing::TinyRng r{seed * 977};
    std::vector<int32_t> hist;
    std::vector<float> got;
    int slot = 0;
    m.reset(0);
    m.reset(2);
    auto table = table_for(0);  // one sequence: the blocks follow it across slots
    const int sizes[] = {1, 1, 2, 3, 4, 5, 7, 8, 13, 64, 129};
    StepOutput out;
    std::vector<uint8_t> state(m.slot_state_bytes());
    while (hist.size() < 340) {
      const int n = sizes[r.next() % 11];
      std::vector<int32_t> chunk(n);
      for (auto& t : chunk) t = static_cast<int32_t>(r.next() % 500);
      StepBatch b;
      b.seqs = {{slot, static_cast<int64_t>(hist.size()), chunk, table, LogitsMode::kAll, false}};
      ASSERT_TRUE(m.forward(b, out).ok());
      got.resize((hist.size() + n) * V);
      std::copy(out.logits.begin(), out.logits.begin() + n * V, got.begin() + hist.size() * V);
      hist.insert(hist.end(), chunk.begin(), chunk.end());
      if (r.next() % 5 < 2) {
        const int back = 1 + static_cast<int>(r.next() % std::min<uint64_t>(n, 8));
        ASSERT_TRUE(m.rollback(slot, static_cast<int64_t>(hist.size()) - back).ok());
        hist.resize(hist.size() - back);
        got.resize(hist.size() * V);
      }
      if (r.next() % 7 == 0) {  // move the sequence to the other slot
        ASSERT_TRUE(m.export_slot_state(slot, state).ok());
        m.reset(slot);
        slot = 2 - slot;
        ASSERT_TRUE(m.import_slot_state(slot, state).ok());
      }
    }
    auto fresh = run(m, 1, hist, {});
    ASSERT_EQ(fresh.size(), got.size());
    for (size_t p = 0; p < hist.size(); ++p)
      for (int64_t v = 0; v < V; ++v) ASSERT_EQ(got[p * V + v], fresh[p * V + v]) << "seed " << seed << " pos " << p;
  }
}

// DSpark: taps do not depend on chunking; the draft is deterministic and consistent.
TEST(ModelDraft, TapsAndDraftConsistency) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  ASSERT_TRUE(m.has_draft());
  const int64_t V = m.vocab_size(), K = m.draft_block_size();
  auto toks = tokens(200, 51);
  std::vector<float> taps_whole, taps_chunk;
  run(m, 0, toks, {}, &taps_whole);
  run(m, 1, toks, {3, 60, 1, 200}, &taps_chunk);
  ASSERT_EQ(taps_whole.size(), 200u * m.tap_dim());
  EXPECT_EQ(max_abs_diff(taps_whole, taps_chunk), 0.0f);

  // context inserted all at once vs in pieces: same proposals
  ASSERT_TRUE(m.draft_insert_context(0, 0, taps_whole).ok());
  const int64_t td = m.tap_dim();
  ASSERT_TRUE(m.draft_insert_context(1, 0, std::span<const float>(taps_whole.data(), 50 * td)).ok());
  ASSERT_TRUE(m.draft_insert_context(1, 50, std::span<const float>(taps_whole.data() + 50 * td, 150 * td)).ok());
  DraftRequest r0{0, 42, 200}, r1{1, 42, 200};
  std::vector<DraftRequest> reqs = {r0, r1};
  DraftSampling greedy;
  greedy.want_probs = true;
  std::vector<DraftResult> res;
  ASSERT_TRUE(m.draft_propose(reqs, greedy, res).ok());
  ASSERT_EQ(res.size(), 2u);
  ASSERT_EQ(res[0].tokens.size(), static_cast<size_t>(K));
  EXPECT_EQ(res[0].tokens, res[1].tokens);
  EXPECT_EQ(max_abs_diff(res[0].logits, res[1].logits), 0.0f);
  EXPECT_EQ(max_abs_diff(res[0].confidence, res[1].confidence), 0.0f);
  for (int64_t i = 0; i < K; ++i) {
    const float* z = &res[0].logits[i * V];
    EXPECT_EQ(res[0].tokens[i], std::max_element(z, z + V) - z);
    EXPECT_TRUE(std::isfinite(res[0].confidence[i]));
    EXPECT_EQ(res[0].probs[i * V + res[0].tokens[i]], 1.0f);
  }
  // sampling: probabilities normalised, sampled tokens have positive probability
  DraftSampling samp;
  samp.want_probs = true;
  DraftRequest rs = r0;
  rs.temperature = 1.0;
  rs.seed = 42;
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&rs, 1), samp, res).ok());
  std::vector<DraftResult> again;
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&rs, 1), samp, again).ok());
  EXPECT_EQ(res[0].tokens, again[0].tokens);  // draws keyed by (seed, position): repeatable
  for (int64_t i = 0; i < K; ++i) {
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += res[0].probs[i * V + v];
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(res[0].probs[i * V + res[0].tokens[i]], 0.0f);
    // the draw is the host sampler's inverse CDF over q with the draft stream's uniform
    const double u = rng_uniform(rs.seed, rs.anchor_pos + i + 1, RngStream::kDraft);
    double cum = 0.0;
    int64_t want = -1;
    for (int64_t v = 0; v < V && want < 0; ++v) {
      cum += res[0].probs[i * V + v];
      if (u < cum && res[0].probs[i * V + v] > 0) want = v;
    }
    if (want >= 0) {
      EXPECT_EQ(res[0].tokens[i], want) << i;
    }
  }
  // the draft context travels with the slot state
  std::vector<uint8_t> state(m.slot_state_bytes());
  ASSERT_TRUE(m.export_slot_state(0, state).ok());
  m.reset(3);
  ASSERT_TRUE(m.import_slot_state(3, state).ok());
  DraftRequest r3{3, 42, 200};
  std::vector<DraftResult> res3, res0;
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&r3, 1), greedy, res3).ok());
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&r0, 1), greedy, res0).ok());
  EXPECT_EQ(res3[0].tokens, res0[0].tokens);
  EXPECT_EQ(max_abs_diff(res3[0].logits, res0[0].logits), 0.0f);
  // a different anchor changes the draft
  DraftRequest r2{0, 43, 200};
  std::vector<DraftResult> res2;
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&r2, 1), greedy, res2).ok());
  EXPECT_GT(max_abs_diff(res2[0].logits, res0[0].logits), 0.0f);
}

// Requests drafted together (one batch of B*K rows) get exactly what each gets drafted alone.
TEST(ModelDraft, BatchedProposalsEqualSingle) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  std::vector<DraftRequest> reqs;
  for (int slot = 0; slot < 3; ++slot) {
    auto toks = tokens(90 + 40 * slot, 300 + slot);  // different contexts and positions
    std::vector<float> taps;
    run(m, slot, toks, {}, &taps);
    ASSERT_TRUE(m.draft_insert_context(slot, 0, taps).ok());
    reqs.push_back({slot, static_cast<int32_t>(7 + slot), static_cast<int64_t>(toks.size())});
  }
  DraftSampling greedy;
  greedy.want_probs = true;
  std::vector<DraftResult> together, alone;
  ASSERT_TRUE(m.draft_propose(reqs, greedy, together).ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&reqs[i], 1), greedy, alone).ok());
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << i;
    EXPECT_EQ(max_abs_diff(together[i].logits, alone[0].logits), 0.0f) << i;
    EXPECT_EQ(max_abs_diff(together[i].confidence, alone[0].confidence), 0.0f) << i;
  }
  for (int slot = 0; slot < 3; ++slot) m.reset(slot);
}

// Decode-sized context inserts are deferred and projected in one batch (when the slot drafts, is
// exported, or 16 rows are waiting): proposals equal those of one whole insert, also across an
// export/import taken while rows were waiting and across a gap in positions.
TEST(ModelDraft, DeferredContextInsertsMatchWholeInsert) {
  Env& e = env();
  ASSERT_TRUE(e.model);
  DsV4Model& m = *e.model;
  const int64_t td = m.tap_dim();
  auto toks = tokens(200, 77);
  std::vector<float> taps;
  run(m, 0, toks, {}, &taps);
  m.reset(0);
  m.reset(2);
  m.reset(3);
  ASSERT_TRUE(m.draft_insert_context(0, 0, taps).ok());
  DraftSampling greedy;
  std::vector<DraftResult> want, got;
  // slot 2: 1-3 rows at a time, proposals requested at several points along the way
  int64_t pos = 0, step = 0;
  bool exported = false;
  std::vector<uint8_t> state(m.slot_state_bytes());
  while (pos < 200) {
    int64_t n = std::min<int64_t>(1 + step % 3, 200 - pos);
    ASSERT_TRUE(m.draft_insert_context(2, pos, std::span<const float>(taps.data() + pos * td, n * td)).ok());
    pos += n;
    ++step;
    if (pos >= 100 && !exported) {  // rows are waiting: the snapshot must include them
      exported = true;
      ASSERT_TRUE(m.export_slot_state(2, state).ok());
      ASSERT_TRUE(m.import_slot_state(3, state).ok());
      ASSERT_TRUE(m.draft_insert_context(3, pos, std::span<const float>(taps.data() + pos * td, (200 - pos) * td)).ok());
    }
  }
  for (int slot : {2, 3}) {
    DraftRequest a{0, 42, 200}, b{slot, 42, 200};
    ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&a, 1), greedy, want).ok());
    ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&b, 1), greedy, got).ok());
    EXPECT_EQ(got[0].tokens, want[0].tokens) << "slot " << slot;
    EXPECT_EQ(max_abs_diff(got[0].logits, want[0].logits), 0.0f) << "slot " << slot;
    EXPECT_EQ(max_abs_diff(got[0].confidence, want[0].confidence), 0.0f) << "slot " << slot;
  }
  // After a reset, waiting rows are dropped: a fresh insert of everything gives the same draft.
  ASSERT_TRUE(m.draft_insert_context(2, 200, std::span<const float>(taps.data(), 2 * td)).ok());
  m.reset(2);
  ASSERT_TRUE(m.draft_insert_context(2, 0, taps).ok());
  DraftRequest b{2, 42, 200}, a{0, 42, 200};
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&a, 1), greedy, want).ok());
  ASSERT_TRUE(m.draft_propose(std::span<const DraftRequest>(&b, 1), greedy, got).ok());
  EXPECT_EQ(max_abs_diff(got[0].logits, want[0].logits), 0.0f);
  for (int slot : {0, 2, 3}) m.reset(slot);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Weights are views, not copies: the grouped wo_a einsum runs on the FP8 weight as stored, and gives
// the same logits, bit for bit, as the bf16 tensor the reference dequantizes it to (here stored as
// BF16, and as F32, which the loader turns into an owned bf16 copy). Also checks that the model
// reads the caller's tensor data after load (mutating a weight changes the logits).
TEST(ModelWeights, Fp8WoaEqualsItsBf16AndF32DequantizationAndViewsAreLive) {
  ModelConfig c = tiny_config();
  ModelOptions o;
  o.max_slots = 1;
  o.num_blocks = 4;
  o.num_threads = 1;
  o.load_draft = false;
  auto toks = tokens(40, 91);
  auto fp8 = tiny_weights(c, 5);
  auto m0 = DsV4Model::from_tensors(c, fp8.ptrs(), o);
  ASSERT_TRUE(m0.ok()) << m0.status().to_string();
  const auto ref = run(**m0, 0, toks, {});

  for (DType dense : {DType::kBF16, DType::kF32}) {
    auto tw = tiny_weights(c, 5);
    int converted = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const std::string wname = "layers." + std::to_string(l) + ".attn.wo_a.weight";
      TensorData* w = tw.find(wname);
      TensorData* s = tw.find("layers." + std::to_string(l) + ".attn.wo_a.scale");
      ASSERT_TRUE(w && s) << wname;
      ASSERT_EQ(w->dtype, DType::kF8E4M3);
      const int64_t out = w->shape[0], in = w->shape[1];
      auto f = num::dequantize_fp8_block(w->bytes.data(), s->bytes.data(), out, in, 128);
      std::vector<uint8_t> bytes(f.size() * (dense == DType::kBF16 ? 2 : 4));
      for (size_t i = 0; i < f.size(); ++i) {
        ASSERT_EQ(f[i], num::round_bf16(f[i])) << "dequantized FP8 value is not a bf16 value";
        if (dense == DType::kBF16) {
          const uint16_t h = num::f32_to_bf16(f[i]);
          std::memcpy(&bytes[2 * i], &h, 2);
        } else {
          std::memcpy(&bytes[4 * i], &f[i], 4);
        }
      }
      w->dtype = dense;
      w->bytes = std::move(bytes);
      const std::string sname = s->name;
      tw.data.erase(std::remove_if(tw.data.begin(), tw.data.end(), [&](const TensorData& t) { return t.name == sname; }),
                    tw.data.end());
      ++converted;
    }
    ASSERT_GT(converted, 0);
    tw.make_views();
    auto m = DsV4Model::from_tensors(c, tw.ptrs(), o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(max_abs_diff(run(**m, 0, toks, {}), ref), 0.0f) << "wo_a stored as " << dtype_name(dense);
  }

  // Mutate the caller's FP8 bytes of one weight: a view-based model sees the change.
  TensorData* w = fp8.find("layers.0.attn.wq_a.weight");
  ASSERT_TRUE(w);
  for (size_t i = 0; i < w->bytes.size(); i += 7) w->bytes[i] ^= 0x08;
  EXPECT_GT(max_abs_diff(run(**m0, 0, toks, {}), ref), 0.0f);
}

}  // namespace
}  // namespace tandem
