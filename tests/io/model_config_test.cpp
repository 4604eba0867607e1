// config.json parsing: the official 0731 and preview configs, derived draft stages, validation
// errors naming the key, and the official-layout round trip.
#include "io/model_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

const std::string kFixtures = "/work/shared/fixtures/configs/";

std::string fixture_path(const std::string& name) {
  // Fixtures live outside the repo on the dev machine; tests/io/data holds a committed copy.
  std::string local = std::string(TANDEM_SOURCE_DIR) + "/tests/io/data/" + name;
  if (std::ifstream(local)) return local;
  return kFixtures + name;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelConfig, Parses0731) {
  auto c = load_model_config(fixture_path("deepseek-v4-flash-0731.config.json"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_hidden_layers, 43);
  EXPECT_EQ(c->compress_ratios.size(), 46u);
  EXPECT_EQ(c->draft_kind, DraftKind::kDSpark);
  EXPECT_EQ(c->num_draft_stages, 3);          // not the stale num_nextn_predict_layers = 1
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_EQ(c->dspark_block_size, 5);
  EXPECT_EQ(c->dspark_noise_token_id, 128799);
  EXPECT_EQ(c->dspark_target_layer_ids, (std::vector<int>{40, 41, 42}));
  EXPECT_EQ(c->dspark_markov_rank, 256);
  EXPECT_EQ(c->expert_dtype, "fp4");
  EXPECT_EQ(c->quant_method, "fp8");
  EXPECT_EQ(c->weight_block_n, 128);
  EXPECT_EQ(c->weight_block_k, 128);
  EXPECT_EQ(c->rope_scaling_type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope_factor, 16.0);
  EXPECT_EQ(c->rope_original_max_position, 65536);
  EXPECT_DOUBLE_EQ(c->rope_beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c->compress_rope_theta, 160000.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c->swiglu_limit, 10.0);
  EXPECT_EQ(c->num_hash_layers, 3);
  EXPECT_EQ(c->hc_mix_dim(), 24);
  EXPECT_EQ(c->hc_dim(), 16384);
  EXPECT_EQ(c->compress_ratio(2), 4);
  EXPECT_EQ(c->compress_ratio(3), 128);
  EXPECT_EQ(c->compress_ratio(43), 0);
}

TEST(ModelConfig, ParsesPreview) {
  auto c = load_model_config(fixture_path("deepseek-v4-flash-preview.config.json"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->draft_kind, DraftKind::kMtp);
  EXPECT_EQ(c->num_draft_stages, 1);
  EXPECT_EQ(c->expert_dtype, "fp4");  // implied: the preview omits the key
  EXPECT_FALSE(c->has_expert_dtype_key);
  EXPECT_EQ(c->dspark_block_size, 0);
}

TEST(ModelConfig, RoundTripsOfficialLayout) {
  for (const char* name : {"deepseek-v4-flash-0731.config.json",
                           "deepseek-v4-flash-preview.config.json"}) {
    std::string text = read(fixture_path(name));
    auto c = parse_model_config(text);
    ASSERT_TRUE(c.ok()) << c.status().message();
    std::string out = model_config_to_json(*c);
    nlohmann::json a = nlohmann::json::parse(text);
    nlohmann::json b = nlohmann::json::parse(out);
    EXPECT_EQ(a, b) << name << "\n" << out;
    auto again = parse_model_config(out);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->num_draft_stages, c->num_draft_stages);
  }
  // The 0731 file's key order is reproduced exactly.
  std::string text = read(fixture_path("deepseek-v4-flash-0731.config.json"));
  auto c = parse_model_config(text);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(model_config_to_json(*c), text);
}

// Applies `edit` to the 0731 config and expects an InvalidArgument mentioning `needle`.
void expect_bad(const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
  nlohmann::json j = nlohmann::json::parse(read(fixture_path("deepseek-v4-flash-0731.config.json")));
  edit(j);
  auto c = parse_model_config(j.dump());
  ASSERT_FALSE(c.ok()) << "expected failure about " << needle;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

TEST(ModelConfig, ValidationErrorsNameTheKey) {
  expect_bad([](auto& j) { j["model_type"] = "deepseek_v3"; }, "'model_type'");
  expect_bad([](auto& j) { j["architectures"] = {"LlamaForCausalLM"}; }, "'architectures'");
  expect_bad([](auto& j) { j.erase("hidden_size"); }, "missing required key 'hidden_size'");
  expect_bad([](auto& j) { j["hidden_size"] = "4096"; }, "'hidden_size': expected an integer");
  expect_bad([](auto& j) { j["hidden_size"] = 0; }, "'hidden_size'");
  expect_bad([](auto& j) { j["num_attention_heads"] = 60; }, "'o_groups'");
  expect_bad([](auto& j) { j["qk_rope_head_dim"] = 512; }, "'head_dim'");
  expect_bad([](auto& j) { j["num_experts_per_tok"] = 300; }, "'num_experts_per_tok'");
  expect_bad([](auto& j) { j["num_hash_layers"] = 44; }, "'num_hash_layers'");
  expect_bad([](auto& j) { j["compress_ratios"][5] = 8; }, "'compress_ratios[5]'");
  expect_bad([](auto& j) { j["compress_ratios"][44] = 4; }, "'compress_ratios[44]'");
  expect_bad([](auto& j) { j["compress_ratios"] = {0, 0, 4}; }, "'compress_ratios'");
  expect_bad([](auto& j) { j["compress_ratios"][1] = "x"; }, "'compress_ratios[1]'");
  expect_bad([](auto& j) { j["dspark_target_layer_ids"] = {40, 43}; }, "'dspark_target_layer_ids[1]'");
  expect_bad([](auto& j) { j["dspark_target_layer_ids"] = {40, 40}; }, "'dspark_target_layer_ids[1]'");
  expect_bad([](auto& j) { j["dspark_noise_token_id"] = 129280; }, "'dspark_noise_token_id'");
  expect_bad([](auto& j) { j.erase("dspark_markov_rank"); }, "'dspark_markov_rank'");
  expect_bad([](auto& j) { j["compress_ratios"] = std::vector<int>(43, 0); }, "'compress_ratios'");
  expect_bad([](auto& j) { j["rope_scaling"]["type"] = "linear"; }, "'rope_scaling.type'");
  expect_bad([](auto& j) { j["rope_scaling"].erase("factor"); }, "'rope_scaling.factor'");
  expect_bad([](auto& j) { j["quantization_config"]["weight_block_size"] = {128}; },
             "'quantization_config.weight_block_size'");
  expect_bad([](auto& j) { j["quantization_config"]["quant_method"] = "awq"; },
             "'quantization_config.quant_method'");
  expect_bad([](auto& j) { j["expert_dtype"] = "int4"; }, "'expert_dtype'");
  expect_bad([](auto& j) { j["index_topk"] = -1; }, "'index_topk'");
  expect_bad([](auto& j) { j["eos_token_id"] = 1000000; }, "'eos_token_id'");
  expect_bad([](auto& j) { j["num_key_value_heads"] = 8; }, "'num_key_value_heads'");
  expect_bad([](auto& j) { j["norm_topk_prob"] = 1; }, "'norm_topk_prob'");
  expect_bad([](auto& j) { j["hidden_size"] = 1e300; }, "'hidden_size'");
  auto bad = parse_model_config("{ not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
  EXPECT_FALSE(parse_model_config("[1,2]").ok());
  auto missing = load_model_config("/nonexistent/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ModelConfig, DraftKindFromStages) {
  nlohmann::json j = nlohmann::json::parse(read(fixture_path("deepseek-v4-flash-preview.config.json")));
  j["compress_ratios"].erase(j["compress_ratios"].size() - 1);  // no MTP stage at all
  auto c = parse_model_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->draft_kind, DraftKind::kNone);
  EXPECT_EQ(c->num_draft_stages, 0);
  j.erase("quantization_config");
  auto bf16 = parse_model_config(j.dump());
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(bf16->quant_method, "");
  EXPECT_EQ(bf16->expert_dtype, "bf16");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Random byte edits of a real config must give a config or an error, never a crash or a throw.
TEST(ModelConfig, MutatedTextNeverCrashes) {
  const std::string base = read(fixture_path("deepseek-v4-flash-0731.config.json"));
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  const char alphabet[] = "0123456789-.eE[]{}\",: truefalsnl";
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = base;
    int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = next() % s.size();
      switch (next() % 3) {
        case 0: s[pos] = alphabet[next() % (sizeof(alphabet) - 1)]; break;
        case 1: s.erase(pos, 1 + next() % 8); break;
        default: s.insert(pos, 1, alphabet[next() % (sizeof(alphabet) - 1)]); break;
      }
      if (s.empty()) s = "{";
    }
    auto c = parse_model_config(s);
    if (c.ok()) {
      ++ok;
      EXPECT_EQ(c->compress_ratios.size(), static_cast<size_t>(c->num_hidden_layers + c->num_draft_stages));
    } else {
      EXPECT_FALSE(c.status().message().empty());
    }
  }
  EXPECT_GT(ok, 0);  // some edits (inside numbers or whitespace) still parse
}

TEST(ModelConfig, SanityBounds) {
  nlohmann::json j = nlohmann::json::parse(read(fixture_path("deepseek-v4-flash-0731.config.json")));
  j["n_routed_experts"] = 2000000000;
  auto c = parse_model_config(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'n_routed_experts'"), std::string::npos);
}

}  // namespace
}  // namespace tandem
