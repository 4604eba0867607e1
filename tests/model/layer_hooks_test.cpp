// The CPU oracle's layer-by-layer test hooks (model/model_testing.h) against its normal path: a
// step run layer half by layer half, then the LM head, gives forward()'s logits and leaves the
// same state, bit for bit; the draft run stage by stage gives draft_propose()'s result. The CUDA
// layer comparison (tests/cuda/layer_test.cpp) feeds the CPU's hook outputs to the device, so
// they must be the oracle's own numbers.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/model.h"
#include "model/model_testing.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"

namespace tandem {
namespace {

namespace mt = model_testing;
using testing::table_for;
using testing::tiny_config;
using testing::tiny_weights;
using testing::tokens;

ModelOptions opts() {
  ModelOptions o;
  o.max_slots = 3;
  o.num_blocks = 12;
  o.block_size = 256;
  o.max_rollback = 8;
  o.max_tokens_per_step = 512;
  return o;
}

TEST(LayerHooks, LayerHalvesReproduceForwardAndItsState) {
  const ModelConfig cfg = tiny_config(true);
  auto tw = tiny_weights(cfg, 7);
  auto a = DsV4Model::from_tensors(cfg, tw.ptrs(), opts());
  auto b = DsV4Model::from_tensors(cfg, tw.ptrs(), opts());
  ASSERT_TRUE(a.ok() && b.ok());
  DsV4Model& ref = **a;
  DsV4Model& hk = **b;
  const int64_t V = cfg.vocab_size;
  auto toks = tokens(280, 3);
  auto t1 = tokens(30, 4);
  auto table0 = table_for(0), table1 = table_for(1);
  // Prefill chunks, a decode, a verify and a two-sequence batch.
  struct Seq {
    int slot;
    int64_t start, n;
  };
  const std::vector<std::vector<Seq>> script = {{{0, 0, 131}}, {{0, 131, 131}}, {{0, 262, 1}}, {{0, 263, 6}},
                                                {{0, 269, 1}, {1, 0, 30}}};
  for (const auto& step : script) {
    StepBatch batch;
    int64_t rows = 0;
    for (const Seq& q : step) {
      const auto& tl = q.slot == 0 ? toks : t1;
      batch.seqs.push_back({q.slot, q.start, std::span<const int32_t>(tl.data() + q.start, q.n),
                            q.slot == 0 ? table0 : table1, LogitsMode::kAll, false});
      rows += q.n;
    }
    StepOutput out;
    ASSERT_TRUE(ref.forward(batch, out).ok());
    std::vector<float> h, logits;
    ASSERT_TRUE(mt::cpu_begin_step(hk, batch, h).ok());
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
      mt::cpu_attention_half(hk, l, batch, h.data());
      mt::cpu_ffn_half(hk, l, batch, h.data());
    }
    mt::cpu_logits(hk, h.data(), rows, logits);
    mt::cpu_end_step(hk, batch);
    ASSERT_EQ(out.num_logits_rows, rows);
    EXPECT_EQ(std::memcmp(logits.data(), out.logits.data(), sizeof(float) * rows * V), 0)
        << "step at " << step[0].start;
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(hk.slot_length(k), ref.slot_length(k));
      auto x = mt::cpu_slot_floats(hk, k), y = mt::cpu_slot_floats(ref, k);
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << "slot " << k;
    }
    auto px = mt::cpu_pool_floats(hk), py = mt::cpu_pool_floats(ref);
    EXPECT_EQ(std::memcmp(px.data(), py.data(), px.size_bytes()), 0) << "pool";
  }
  // The pieces a layer leaves behind have the documented shapes: top-k ids within the visible
  // entries, K distinct experts.
  std::vector<float> h, scores, gate;
  std::vector<int32_t> topk, experts;
  auto dec = tokens(1, 9);
  StepBatch batch;
  batch.seqs.push_back({0, 270, dec, table0, LogitsMode::kNone, false});
  ASSERT_TRUE(mt::cpu_begin_step(hk, batch, h).ok());
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    mt::cpu_attention_half(hk, l, batch, h.data());
    if (mt::cpu_layer_state(hk, l).has_indexer) {
      mt::cpu_last_indexer(hk, 1, 271 / 4, scores, topk);
      ASSERT_EQ(topk.size(), static_cast<size_t>(cfg.index_topk));
      for (int32_t id : topk) EXPECT_TRUE(id >= 0 && id < 271 / 4) << id;
    }
    mt::cpu_ffn_half(hk, l, batch, h.data());
    mt::cpu_last_routing(hk, 1, gate, experts);
    ASSERT_EQ(experts.size(), static_cast<size_t>(cfg.num_experts_per_tok));
    EXPECT_NE(experts[0], experts[1]);
    EXPECT_EQ(mt::cpu_gate_bias(hk, l).empty(), l < cfg.num_hash_layers);
  }
}

TEST(LayerHooks, DraftStagesReproduceDraftPropose) {
  const ModelConfig cfg = tiny_config(true);
  auto tw = tiny_weights(cfg, 7);
  auto a = DsV4Model::from_tensors(cfg, tw.ptrs(), opts());
  ASSERT_TRUE(a.ok());
  DsV4Model& m = **a;
  auto toks = tokens(151, 21);
  std::vector<float> taps;
  testing::run(m, 2, std::vector<int32_t>(toks.begin(), toks.begin() + 150), {}, &taps);
  m.draft_reset(2);
  ASSERT_TRUE(m.draft_insert_context(2, 0, taps).ok());
  std::vector<DraftRequest> reqs = {{2, toks[150], 150}, {2, toks[143], 143}};
  std::vector<DraftResult> want, got;
  ASSERT_TRUE(m.draft_propose(reqs, DraftSampling(), want).ok());
  std::vector<float> h;
  int64_t K = 0;
  ASSERT_TRUE(mt::cpu_draft_begin(m, reqs, h, &K).ok());
  ASSERT_EQ(K, cfg.dspark_block_size);
  for (int st = 0; st < cfg.num_draft_stages; ++st) {
    mt::cpu_draft_stage_attention(m, st, reqs, K, h.data());
    mt::cpu_draft_stage_ffn(m, st, static_cast<int64_t>(reqs.size()) * K, h.data());
  }
  ASSERT_TRUE(mt::cpu_draft_finish(m, reqs, K, h.data(), got).ok());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    EXPECT_EQ(got[i].confidence, want[i].confidence) << i;
    EXPECT_EQ(got[i].logits, want[i].logits) << i;
  }
  EXPECT_EQ(mt::cpu_draft_context(m, 2).size(),
            static_cast<size_t>(cfg.num_draft_stages) * cfg.sliding_window * cfg.head_dim);
}

}  // namespace
}  // namespace tandem
