// The tiny tokenizer trainer: determinism, DeepSeek-V4 token layout, and that what it writes loads
// and round-trips through Tokenizer.
#include <gtest/gtest.h>

#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

std::unique_ptr<Tokenizer> load_tiny(uint64_t seed) {
  auto tok = Tokenizer::from_json(train_tiny_tokenizer_json(seed));
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(tok.value()) : nullptr;
}

TEST(TokenizerTrainer, SameSeedGivesIdenticalBytes) {
  EXPECT_EQ(generate_tiny_corpus(7), generate_tiny_corpus(7));
  EXPECT_NE(generate_tiny_corpus(7), generate_tiny_corpus(8));
  std::string a = train_tiny_tokenizer_json(7);
  EXPECT_EQ(a, train_tiny_tokenizer_json(7));
  EXPECT_NE(a, train_tiny_tokenizer_json(8));
}

TEST(TokenizerTrainer, CorpusCoversTheScriptsItShould) {
  std::string c = generate_tiny_corpus(0);
  EXPECT_GE(c.size(), 300u * 1024);
  for (const char* s : {"def ", "\"name\"", "你好", "カタカナ", "👩‍💻", "\r\n", "\t", "Καλημέρα",
                        "1, 2, 3", "<tool_result>"})
    EXPECT_NE(c.find(s), std::string::npos) << s;
}

TEST(TokenizerTrainer, DeepSeekLayout) {
  auto tok = load_tiny(0);
  ASSERT_TRUE(tok);
  const int32_t base = kTinyBaseVocabSize;
  EXPECT_EQ(tok->vocab_size(), base + kNumDeepSeekExtraAddedTokens);
  EXPECT_EQ(tok->token_to_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok->token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok->token_to_id("<｜User｜>"), base + kUserTokenOffset);
  EXPECT_EQ(tok->token_to_id("<｜Assistant｜>"), base + kAssistantTokenOffset);
  EXPECT_EQ(tok->token_to_id("<think>"), base + kThinkStartTokenOffset);
  EXPECT_EQ(tok->token_to_id("</think>"), base + kThinkEndTokenOffset);
  EXPECT_EQ(tok->token_to_id("｜DSML｜"), base + kDsmlTokenOffset);
  EXPECT_EQ(tok->token_to_id("<｜latest_reminder｜>"), base + kLatestReminderTokenOffset);
  EXPECT_EQ(tok->token_to_id("<｜place▁holder▁no▁799｜>"), base + kDspNoiseTokenOffset);
  EXPECT_EQ(tok->token_to_id("<｜action｜>"), base + 829);
  EXPECT_EQ(tok->token_to_id("<｜query｜>"), base + 830);
  EXPECT_EQ(tok->token_to_id("<｜authority｜>"), base + 831);
  EXPECT_EQ(tok->token_to_id("<｜domain｜>"), base + 832);
  EXPECT_EQ(tok->token_to_id("<｜title｜>"), base + 836);
  EXPECT_EQ(tok->token_to_id("<｜read_url｜>"), base + 845);
  EXPECT_TRUE(tok->is_special(0));
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(100));
  // Byte tokens start at 3 in byte-level code point order, as in the real file ('!' = 3).
  EXPECT_EQ(tok->encode("!"), std::vector<int32_t>{3});
  EXPECT_EQ(tok->encode(","), std::vector<int32_t>{14});
  EXPECT_EQ(tok->encode(" "), std::vector<int32_t>{223});
  EXPECT_EQ(tok->encode("\n"), std::vector<int32_t>{201});
}

TEST(TokenizerTrainer, EveryAddedTokenEncodesToItself) {
  auto tok = load_tiny(0);
  ASSERT_TRUE(tok);
  for (const auto& t : deepseek_v4_added_tokens(kTinyBaseVocabSize)) {
    EXPECT_EQ(tok->encode(t.content), std::vector<int32_t>{t.id}) << t.content;
    EXPECT_EQ(tok->decode({t.id}), t.content);
    EXPECT_EQ(tok->token_bytes(t.id), t.content);
  }
}

TEST(TokenizerTrainer, RoundTripsItsCorpusAndCompresses) {
  auto tok = load_tiny(3);
  ASSERT_TRUE(tok);
  std::string corpus = generate_tiny_corpus(11, 64 * 1024);
  auto ids = tok->encode(corpus);
  EXPECT_EQ(tok->decode(ids), corpus);
  // A 2000-entry BPE on its own kind of text should average well over 2 bytes per token.
  EXPECT_GT(double(corpus.size()) / double(ids.size()), 2.5);
  for (int32_t id : ids) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, kTinyBaseVocabSize);
  }
}

TEST(TokenizerTrainer, LargerVocabularyWithoutDeepSeekTokens) {
  BpeTrainOptions opt;
  opt.deepseek_added = false;
  auto tok = Tokenizer::from_json(train_bpe_tokenizer_json(generate_tiny_corpus(1), 4000, opt));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->vocab_size(), 4000);
  EXPECT_FALSE((*tok)->token_to_id("<｜User｜>").has_value());
  std::string s = "def total_count(items):\n    return 42  # 你好 🚀";
  EXPECT_EQ((*tok)->decode((*tok)->encode(s)), s);
}

}  // namespace
}  // namespace tandem
