// Tensor catalog against the real checkpoints' inventories (spec 8.3/8.4): exact tensor counts,
// total bytes, per-dtype census and per-layer byte bookkeeping.
#include "io/catalog.h"

#include <gtest/gtest.h>

#include <fstream>

namespace tandem {
namespace {

ModelConfig load(const std::string& name) {
  std::string local = std::string(TANDEM_SOURCE_DIR) + "/tests/io/data/" + name;
  auto c = load_model_config(local);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

uint64_t bytes_with_prefix(const Catalog& cat, const std::string& prefix, bool experts) {
  uint64_t n = 0;
  for (const auto& t : cat.tensors) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    bool is_expert = t.name.find(".ffn.experts.") != std::string::npos;
    if (is_expert == experts) n += t.nbytes();
  }
  return n;
}

TEST(Catalog, Release0731MatchesRealInventory) {
  ModelConfig c = load("deepseek-v4-flash-0731.config.json");
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_EQ(cat->tensors.size(), 72317u);
  EXPECT_EQ(cat->total_bytes(), 166878536440ull);
  auto census = cat->census();
  EXPECT_EQ(census[DType::kBF16].tensors, 445);
  EXPECT_EQ(census[DType::kF32].tensors, 433);
  EXPECT_EQ(census[DType::kF8E4M3].tensors, 390);
  EXPECT_EQ(census[DType::kF8E8M0].tensors, 35718);
  EXPECT_EQ(census[DType::kI64].tensors, 3);
  EXPECT_EQ(census[DType::kI8].tensors, 35328);
  EXPECT_EQ(census.size(), 6u);
  // Spec 8.2 rounded sizes.
  EXPECT_NEAR(census[DType::kBF16].bytes / 1e9, 2.97, 0.005);
  EXPECT_NEAR(census[DType::kF8E4M3].bytes / 1e9, 6.30, 0.005);
  EXPECT_NEAR(census[DType::kF8E8M0].bytes / 1e9, 9.26, 0.005);
  EXPECT_NEAR(census[DType::kI8].bytes / 1e9, 148.18, 0.005);
  EXPECT_EQ(census[DType::kI64].bytes, 129280ull * 6 * 8 * 3);

  // Spec 8.4 per-layer bookkeeping.
  uint64_t expert = 0;
  for (const auto& t : cat->tensors) {
    if (t.name.rfind("layers.5.ffn.experts.7.", 0) == 0) expert += t.nbytes();
  }
  EXPECT_EQ(expert, 13369344ull);
  EXPECT_EQ(bytes_with_prefix(*cat, "layers.0.", false), 143596888ull);
  EXPECT_EQ(bytes_with_prefix(*cat, "layers.2.", false), 173503576ull);
  EXPECT_EQ(bytes_with_prefix(*cat, "layers.4.", false), 167299160ull);
  EXPECT_EQ(bytes_with_prefix(*cat, "layers.3.", false), 146044248ull);
  EXPECT_EQ(bytes_with_prefix(*cat, "layers.10.", true), 3422552064ull);

  // Spot checks of names, dtypes and shapes from spec 8.3.
  auto expect = [&](const std::string& name, DType dt, std::vector<int64_t> shape) {
    const TensorSpec* t = cat->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dt) << name;
    EXPECT_EQ(t->shape, shape) << name;
  };
  expect("layers.0.attn.wq_b.scale", DType::kF8E8M0, {256, 8});
  expect("layers.0.ffn.gate.tid2eid", DType::kI64, {129280, 6});
  expect("layers.3.ffn.gate.bias", DType::kF32, {256});
  expect("layers.3.attn.compressor.ape", DType::kF32, {128, 512});
  expect("layers.4.attn.compressor.wkv.weight", DType::kBF16, {1024, 4096});
  expect("layers.4.attn.indexer.wq_b.scale", DType::kF8E8M0, {64, 8});
  expect("layers.4.attn.indexer.compressor.ape", DType::kF32, {4, 256});
  expect("layers.42.ffn.experts.255.w2.weight", DType::kI8, {4096, 1024});
  expect("layers.42.ffn.experts.255.w2.scale", DType::kF8E8M0, {4096, 64});
  expect("layers.1.attn.wo_a.weight", DType::kF8E4M3, {8192, 4096});
  expect("mtp.0.main_proj.weight", DType::kF8E4M3, {4096, 12288});
  expect("mtp.0.main_proj.scale", DType::kF8E8M0, {32, 96});
  expect("mtp.2.markov_head.markov_w2.weight", DType::kBF16, {129280, 256});
  expect("mtp.2.confidence_head.proj.weight", DType::kBF16, {1, 4352});
  expect("mtp.2.hc_head_scale", DType::kF32, {1});
  expect("mtp.1.ffn.gate.bias", DType::kF32, {256});
  expect("hc_head_fn", DType::kF32, {4, 16384});
  EXPECT_EQ(cat->find("layers.3.ffn.gate.tid2eid"), nullptr);
  EXPECT_EQ(cat->find("layers.1.attn.compressor.ape"), nullptr);
  EXPECT_EQ(cat->find("layers.3.attn.indexer.wq_b.weight"), nullptr);
  EXPECT_EQ(cat->find("mtp.1.main_proj.weight"), nullptr);
  EXPECT_EQ(cat->find("mtp.0.e_proj.weight"), nullptr);
  EXPECT_EQ(cat->find("model.layers.0.attn_norm.weight"), nullptr);
}

TEST(Catalog, PreviewMatchesHfIndex) {
  ModelConfig c = load("deepseek-v4-flash-preview.config.json");
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_EQ(cat->tensors.size(), 69187u);
  EXPECT_EQ(cat->total_bytes(), 159609485896ull);  // = the HF index metadata.total_size
  const TensorSpec* e = cat->find("mtp.0.e_proj.scale");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{32, 32}));
  EXPECT_NE(cat->find("mtp.0.hnorm.weight"), nullptr);
  EXPECT_EQ(cat->find("mtp.1.attn_norm.weight"), nullptr);
  EXPECT_EQ(cat->find("mtp.0.markov_head.markov_w1.weight"), nullptr);
}

TEST(Catalog, BackboneOnly) {
  ModelConfig c = load("deepseek-v4-flash-preview.config.json");
  c.compress_ratios.resize(c.num_hidden_layers);
  c.num_draft_stages = 0;
  c.draft_kind = DraftKind::kNone;
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok());
  EXPECT_EQ(cat->tensors.size(), 67612u);
  EXPECT_EQ(cat->total_bytes(), 156015698140ull);
  uint64_t global = 0;
  for (const char* n : {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base",
                        "hc_head_scale"}) {
    global += cat->find(n)->nbytes();
  }
  EXPECT_EQ(global, 2118393876ull);
}

// A public header dump of a 0731-derived checkpoint pruned to 160 experts per layer (its config:
// the 0731 config with n_routed_experts 160) has 45,821 tensors and 107,803,320,952 bytes; the
// catalog reproduced every name, dtype and shape of that dump (checked once by script).
TEST(Catalog, Pruned160ExpertsMatchesRealHeaders) {
  ModelConfig c = load("deepseek-v4-flash-0731.config.json");
  c.n_routed_experts = 160;
  auto cat = build_catalog(c);
  ASSERT_TRUE(cat.ok());
  EXPECT_EQ(cat->tensors.size(), 45821u);
  EXPECT_EQ(cat->total_bytes(), 107803320952ull);
}

TEST(Catalog, Fp4NeedsDivisibleDims) {
  ModelConfig c = load("deepseek-v4-flash-0731.config.json");
  c.moe_intermediate_size = 2040;  // 8 mod 32
  auto cat = build_catalog(c);
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("w2.weight"), std::string::npos) << cat.status().message();
}

TEST(Catalog, Thousands) {
  EXPECT_EQ(with_thousands(0), "0");
  EXPECT_EQ(with_thousands(999), "999");
  EXPECT_EQ(with_thousands(1000), "1,000");
  EXPECT_EQ(with_thousands(166878536440ull), "166,878,536,440");
}

}  // namespace
}  // namespace tandem
