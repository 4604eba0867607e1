// The per-rank tensor plan against the official catalog (every tensor, every byte: tensor counts
// and totals of the real 0731 and preview inventories), against the loader's own slicing on an
// in-memory checkpoint, and the built-in official configs against their config.json files.
#include "model/shard_plan.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "io/official_configs.h"
#include "model/tiny_weights.h"
#include "model/weights.h"

namespace tandem {
namespace {

ModelConfig file_config(const std::string& name) {
  auto c = load_model_config(std::string(TANDEM_SOURCE_DIR) + "/tests/io/data/" + name + ".config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

TEST(OfficialConfigs, BuiltInEqualsTheConfigFiles) {
  for (const std::string& name : official_config_names()) {
    auto built = official_config(name);
    ASSERT_TRUE(built.ok()) << built.status().to_string();
    EXPECT_EQ(model_config_to_json(*built), model_config_to_json(file_config(name))) << name;
  }
  auto bad = official_config("deepseek-v4-pro");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deepseek-v4-flash-0731"), std::string::npos) << bad.status().message();
}

// Bytes of the catalog tensors whose name contains ".ffn.experts." (the routed experts).
uint64_t expert_bytes(const Catalog& cat, int64_t* tensors) {
  uint64_t b = 0;
  *tensors = 0;
  for (const auto& t : cat.tensors)
    if (t.name.find(".ffn.experts.") != std::string::npos) {
      b += t.nbytes();
      ++*tensors;
    }
  return b;
}

TEST(ShardPlan, Release0731EveryTensorEveryByte) {
  const ModelConfig c = *official_config("deepseek-v4-flash-0731");
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->tensors.size(), 72317u);
  const uint64_t total = cat->total_bytes();
  ASSERT_EQ(total, 166878536440ull);
  int64_t expert_tensors = 0;
  const uint64_t experts = expert_bytes(*cat, &expert_tensors);
  EXPECT_EQ(expert_tensors, 46 * 256 * 3 * 2);  // 43 layers + 3 DSpark stages, weight + scale

  auto one = model::plan_shard(c, *cat, {0, 1}, true);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->held_tensors, 72317);
  EXPECT_EQ(one->held_bytes, total);
  EXPECT_EQ(one->other_rank_tensors, 0);
  EXPECT_EQ(one->skipped_tensors, 0);

  for (int n : {2, 4, 8}) {
    uint64_t sum_held = 0, sum_sharded = 0, replicated = 0;
    for (int r = 0; r < n; ++r) {
      auto p = model::plan_shard(c, *cat, {r, n}, true);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      EXPECT_EQ(p->held_tensors + p->other_rank_tensors, 72317) << "TP=" << n << " rank " << r;
      EXPECT_EQ(p->other_rank_tensors, expert_tensors - expert_tensors / n) << "TP=" << n << " rank " << r;
      EXPECT_EQ(p->held_bytes, p->replicated_bytes + p->sharded_bytes);
      if (r == 0) replicated = p->replicated_bytes;
      EXPECT_EQ(p->replicated_bytes, replicated) << "every rank holds the same whole tensors";
      sum_held += p->held_bytes;
      sum_sharded += p->sharded_bytes;
      // The vocabulary-parallel embedding and LM head: V / n rows each (129280 divides by 8).
      const model::TensorSlice* e = p->find("embed.weight");
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->local.shape, (std::vector<int64_t>{129280 / n, 4096}));
      EXPECT_EQ(e->begin, r * (129280 / n));
      const model::TensorSlice* s = p->find("layers.4.attn.wq_b.scale");
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(s->local.shape, (std::vector<int64_t>{256 / n, 8}));
      const model::TensorSlice* wob = p->find("layers.7.attn.wo_b.scale");
      EXPECT_EQ(wob->local.shape, (std::vector<int64_t>{32, 64 / n}));
      EXPECT_EQ(p->find("mtp.2.attn.indexer.wq_b.weight"), nullptr);  // draft stages have no indexer
      if (n == 2)
        std::printf("[ 0731 TP=2 rank %d ] %lld tensors, %.2f GB (replicated %.2f GB, sharded %.2f GB)\n", r,
                    static_cast<long long>(p->held_tensors), p->held_bytes / 1e9, p->replicated_bytes / 1e9,
                    p->sharded_bytes / 1e9);
    }
    // The slices partition every sharded tensor; the rest is on every rank.
    EXPECT_EQ(sum_sharded + replicated, total) << "TP=" << n;
    EXPECT_EQ(sum_held, total + static_cast<uint64_t>(n - 1) * replicated) << "TP=" << n;
    EXPECT_GE(sum_sharded, experts);
  }
  // One rank of TP=2 fits an H200 (141 GB): about 85 GB.
  auto r0 = model::plan_shard(c, *cat, {0, 2}, true);
  EXPECT_GT(r0->held_bytes, 80e9);
  EXPECT_LT(r0->held_bytes, 90e9);
}

TEST(ShardPlan, PreviewSkipsTheClassicMtpStage) {
  const ModelConfig c = *official_config("deepseek-v4-flash-preview");
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->tensors.size(), 69187u);
  auto p = model::plan_shard(c, *cat, {1, 2}, true);
  ASSERT_TRUE(p.ok());
  int64_t mtp = 0;
  for (const auto& t : cat->tensors) mtp += t.name.rfind("mtp.", 0) == 0;
  EXPECT_GT(mtp, 0);
  EXPECT_EQ(p->skipped_tensors, mtp);
  EXPECT_EQ(p->held_tensors + p->other_rank_tensors + p->skipped_tensors, 69187);
}

TEST(ShardPlan, RefusesShapesThatDoNotShard) {
  const ModelConfig c = *official_config("deepseek-v4-flash-0731");
  auto cat = build_catalog(c);
  auto p = model::plan_shard(c, *cat, {0, 3}, true);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("num_attention_heads"), std::string::npos) << p.status().message();
  EXPECT_FALSE(model::plan_shard(c, *cat, {2, 2}, true).ok());
}

// The plan restates the loader's rules: on an in-memory checkpoint, every rank binds exactly the
// planned tensors, and the bound matrices have the planned local shapes.
TEST(ShardPlan, AgreesWithTheLoader) {
  for (bool dspark : {true, false}) {
    const ModelConfig c = testing::tiny_config(dspark);
    const testing::TinyWeights tw = testing::tiny_weights(c, 3);
    auto cat = build_catalog(c);
    ASSERT_TRUE(cat.ok());
    for (int n : {1, 2}) {
      for (int r = 0; r < n; ++r) {
        model::LoadCounts counts;
        auto w = model::load_weights(c, tw.ptrs(), true, counts, {r, n});
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        auto p = model::plan_shard(c, *cat, {r, n}, true);
        ASSERT_TRUE(p.ok()) << p.status().to_string();
        EXPECT_EQ(p->held_tensors, counts.target_loaded + counts.draft_loaded) << "TP=" << n << " rank " << r;
        EXPECT_EQ(p->other_rank_tensors, counts.other_ranks);
        EXPECT_EQ(p->skipped_tensors, counts.skipped);
        for (int l = 0; l < c.num_hidden_layers; ++l) {
          const std::string pre = "layers." + std::to_string(l) + ".";
          const model::AttentionW& a = w->layers[l].attn;
          EXPECT_EQ(p->find(pre + "attn.wq_b.weight")->local.shape, (std::vector<int64_t>{a.wq_b.out, a.wq_b.in}));
          EXPECT_EQ(p->find(pre + "attn.wo_a.weight")->local.shape, (std::vector<int64_t>{a.wo_a.out, a.wo_a.in}));
          EXPECT_EQ(p->find(pre + "attn.wo_b.weight")->local.shape, (std::vector<int64_t>{a.wo_b.out, a.wo_b.in}));
          EXPECT_EQ(p->find(pre + "attn.attn_sink")->local.shape[0], static_cast<int64_t>(a.attn_sink.size()));
          if (a.has_indexer) {
            EXPECT_EQ(p->find(pre + "attn.indexer.wq_b.weight")->local.shape[0], a.indexer.wq_b.out);
            EXPECT_EQ(p->find(pre + "attn.indexer.weights_proj.weight")->local.shape[0], a.indexer.weights_proj.out);
          }
        }
        EXPECT_EQ(p->find("embed.weight")->local.shape[0], w->embed.out);
        EXPECT_EQ(p->find("head.weight")->local.shape[0], w->head.out);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
