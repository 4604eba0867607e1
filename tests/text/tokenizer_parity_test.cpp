// Exact parity with the HF `tokenizers` library: vectors made by
// tools/tokenizer/make_parity_vectors.mjs (encode with add_special_tokens=false, decode with and
// without skip_special_tokens) replayed against tandem::Tokenizer and IncrementalDecoder.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string data_path(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/data/tokenizer/" + name;
}

std::string shown(const std::string& s) {
  nlohmann::json j = s.size() > 120 ? s.substr(0, 120) + "..." : s;
  return j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// The tokenizer.json each vector file was made from.
std::string tokenizer_json_for(const std::string& name) {
  if (name == "tiny") return train_tiny_tokenizer_json(0);
  if (name == "big16k")
    return train_bpe_tokenizer_json(generate_tiny_corpus(1, 1 << 20), 16384);
  return read_text(data_path("hf-trained-tokenizer.json"));
}

void check_vectors(const std::string& name, const std::string& tokenizer_json,
                   const std::string& vec_text) {
  ASSERT_FALSE(vec_text.empty()) << "missing vectors for " << name;
  auto vec = nlohmann::json::parse(vec_text, nullptr, false);
  ASSERT_FALSE(vec.is_discarded());
  auto tok_r = Tokenizer::from_json(tokenizer_json);
  ASSERT_TRUE(tok_r.ok()) << tok_r.status().to_string();
  const Tokenizer& tok = **tok_r;
  // A different vocab size means the trainer changed since the vectors were made: regenerate
  // them (tools/tokenizer/README.md).
  ASSERT_EQ(tok.vocab_size(), vec["vocab_size"].get<int64_t>());

  int encode_failures = 0, checked = 0;
  for (const auto& v : vec["encode"]) {
    std::string text = v["text"];
    auto want = v["ids"].get<std::vector<int32_t>>();
    std::string want_text = v["decoded"];
    auto got = tok.encode(text);
    ++checked;
    if (got != want && ++encode_failures <= 10) {
      ADD_FAILURE() << name << ": encode(" << shown(text) << ") = "
                    << ::testing::PrintToString(got) << ", HF " << ::testing::PrintToString(want);
    }
    EXPECT_EQ(tok.decode(want), want_text) << shown(text);
    IncrementalDecoder stream(tok);
    std::string streamed;
    for (int32_t id : want) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, want_text) << shown(text);
  }
  EXPECT_EQ(encode_failures, 0) << "of " << checked;
  EXPECT_GT(checked, 100);

  for (const auto& v : vec["decode"]) {
    auto ids = v["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids), v["text"].get<std::string>()) << ::testing::PrintToString(ids);
    EXPECT_EQ(tok.decode(ids, true), v["text_skip_special"].get<std::string>())
        << ::testing::PrintToString(ids);
    for (bool skip : {false, true}) {
      IncrementalDecoder stream(tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      EXPECT_EQ(streamed, v[skip ? "text_skip_special" : "text"].get<std::string>());
    }
  }
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, EncodeDecodeAndStreamMatchHf) {
  const std::string name = GetParam();
  check_vectors(name, tokenizer_json_for(name), read_text(data_path("parity-" + name + ".json")));
}

// Optional: TANDEM_TOKENIZER_PARITY=<tokenizer.json>:<vectors.json> replays vectors made by
// make_parity_vectors.mjs for a tokenizer that is not in the repo (e.g. the real DeepSeek file).
TEST(TokenizerParity, ExternalVectorsFromEnvironment) {
  const char* env = std::getenv("TANDEM_TOKENIZER_PARITY");
  if (!env) GTEST_SKIP() << "TANDEM_TOKENIZER_PARITY not set";
  std::string spec = env;
  size_t colon = spec.find(':');
  ASSERT_NE(colon, std::string::npos);
  check_vectors(spec, read_text(spec.substr(0, colon)), read_text(spec.substr(colon + 1)));
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, Parity, ::testing::Values("tiny", "big16k", "hf"));

}  // namespace
}  // namespace tandem
