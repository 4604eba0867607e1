// Tokenizer unit tests: DeepSeek pre-tokenizer pieces, regex translation, UTF-8 repair, streaming
// decode, and the errors a bad tokenizer.json produces. Parity with HF is in
// tokenizer_parity_test.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <thread>

#include "text/bpe_trainer.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace tandem {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  static auto pt = text::PreTokenizer::deepseek_v4();
  EXPECT_TRUE(pt.ok());
  std::vector<text::Piece> ps;
  (*pt)->split(text, &ps);
  std::vector<std::string> out;
  size_t covered = 0;
  for (const auto& p : ps) {
    EXPECT_EQ(p.offset, covered);
    covered += p.length;
    out.emplace_back(text.substr(p.offset, p.length));
  }
  EXPECT_EQ(covered, text.size());
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, DeepSeekSplits) {
  EXPECT_EQ(pieces("Hello, world! 123\nsecond line"),
            (V{"Hello", ",", " world", "!", " ", "123", "\n", "second", " line"}));
  EXPECT_EQ(pieces("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces("x1y22"), (V{"x", "1", "y", "22"}));
  // Punctuation keeps its trailing newlines (DS4: getting this wrong corrupts long contexts).
  EXPECT_EQ(pieces("a>;\n\nb"), (V{"a", ">;\n\n", "b"}));
  EXPECT_EQ(pieces("foo;\r\n"), (V{"foo", ";\r\n"}));
  // \s+(?!\S): the last space of a run goes with the next word.
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("x   "), (V{"x", "   "}));
  EXPECT_EQ(pieces("a\n\n  b"), (V{"a", "\n\n", " ", " b"}));
  // A piece ends at a digit/CJK boundary, so lookaheads see the end of the piece there.
  EXPECT_EQ(pieces("a  1"), (V{"a", "  ", "1"}));
  EXPECT_EQ(pieces("中文abc日本"), (V{"中文", "abc", "日本"}));
  EXPECT_EQ(pieces("カ・ナ"), (V{"カ", "・", "ナ"}));
  EXPECT_EQ(pieces(".Net !Hi"), (V{".Net", " !", "Hi"}));
  EXPECT_EQ(pieces("a !Hi"), (V{"a", " !", "Hi"}));
  EXPECT_EQ(pieces("(!Hi"), (V{"(!", "Hi"}));
  // U+0085 is whitespace for Oniguruma (PCRE2's own \s would miss it).
  EXPECT_EQ(pieces("a\u0085\u0085b"), (V{"a", "\u0085", "\u0085b"}));
  EXPECT_EQ(pieces(""), V{});
}

// Past PCRE2's default match limit (10M steps), as a 10 MB whitespace run would be: HF still
// splits it, so must we.
TEST(PreTokenizer, HugeWhitespaceRunStillSplits) {
  std::string s(11'000'000, ' ');
  s += "x";
  static auto pt = text::PreTokenizer::deepseek_v4();
  ASSERT_TRUE(pt.ok());
  std::vector<text::Piece> ps;
  (*pt)->split(s, &ps);
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[1].offset, 10'999'999u);
  EXPECT_EQ(ps[1].length, 2u);
}

TEST(PreTokenizer, OnigToPcre2) {
  auto r = text::onig_to_pcre2(R"(\s+(?!\S)|[^\s\p{L}]|\u3040x)");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[^\t-\r\x{85}\p{Z}\p{L}]|\x{3040}x)");
  EXPECT_FALSE(text::onig_to_pcre2(R"([^\S])").ok());
  EXPECT_FALSE(text::onig_to_pcre2(R"(abc\)").ok());
  EXPECT_FALSE(text::onig_to_pcre2(R"([abc)").ok());
  EXPECT_FALSE(text::onig_to_pcre2(R"(\u12)").ok());
  auto bad = text::PreTokenizer::create({"(unclosed"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(Unicode, LossyRepairUsesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  EXPECT_EQ(text::utf8_lossy("ok"), "ok");
  EXPECT_EQ(text::utf8_lossy("\xFF"), r);
  EXPECT_EQ(text::utf8_lossy("a\xF0\x9F\x98"), "a" + r);           // truncated 4-byte: one
  EXPECT_EQ(text::utf8_lossy("\xE0\x80"), r + r);                  // E0 needs A0..BF next
  EXPECT_EQ(text::utf8_lossy("\xED\xA0\x80"), r + r + r);          // surrogate
  EXPECT_EQ(text::utf8_lossy("\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(text::utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
  EXPECT_EQ(text::utf8_lossy("\xE2\x82x"), r + "x");
  EXPECT_EQ(text::utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Unicode, ByteLevelMap) {
  EXPECT_EQ(text::bytes_to_byte_level(" hello\n"), "Ġhello\xC4\x8A");
  std::string back;
  ASSERT_TRUE(text::byte_level_to_bytes("Ġhello\xC4\x8A", &back));
  EXPECT_EQ(back, " hello\n");
  EXPECT_FALSE(text::byte_level_to_bytes("｜", &back));
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(text::unicode_to_byte(text::byte_to_unicode()[b]), b);
}

class TinyTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::from_json(train_tiny_tokenizer_json(0));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_ = std::move(t.value()).release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* TinyTokenizer::tok_ = nullptr;

TEST_F(TinyTokenizer, InvalidUtf8InputIsRepairedFirst) {
  EXPECT_EQ(tok_->encode("a\xFF" "b"), tok_->encode("a\uFFFD" "b"));
  EXPECT_EQ(tok_->decode(tok_->encode("a\xFF" "b")), "a\uFFFD" "b");
}

TEST_F(TinyTokenizer, SpecialTokensInlineAndSkipped) {
  const int32_t user = *tok_->token_to_id("<｜User｜>");
  auto ids = tok_->encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], user);
  EXPECT_EQ(ids[3], 1);
  EXPECT_EQ(tok_->decode(ids, /*skip_special=*/true), "<｜User｜>hi");  // User is not special
  // A cut-off special token is plain text.
  auto cut = tok_->encode("<｜User");
  EXPECT_GT(cut.size(), 1u);
  EXPECT_EQ(tok_->decode(cut), "<｜User");
  EXPECT_EQ(tok_->token_bytes(-1), "");
  EXPECT_EQ(tok_->token_bytes(int32_t(tok_->vocab_size())), "");
  EXPECT_EQ(tok_->decode({-5, 999999, 0}), "<｜begin▁of▁sentence｜>");
}

TEST_F(TinyTokenizer, IncrementalDecoderEmitsOnlyCompleteCharacters) {
  // "🚀" is four bytes; feed its byte tokens one by one.
  std::string rocket = "\xF0\x9F\x9A\x80";
  std::vector<int32_t> byte_ids;
  for (unsigned char c : rocket) {
    std::string spelled = text::bytes_to_byte_level(std::string(1, char(c)));
    auto id = tok_->token_to_id(spelled);
    ASSERT_TRUE(id.has_value());
    byte_ids.push_back(*id);
  }
  IncrementalDecoder d(*tok_);
  EXPECT_EQ(d.push(*tok_->token_to_id("a")), "a");
  EXPECT_EQ(d.push(byte_ids[0]), "");
  EXPECT_EQ(d.push(byte_ids[1]), "");
  EXPECT_EQ(d.push(byte_ids[2]), "");
  EXPECT_EQ(d.push(byte_ids[3]), rocket);
  // An invalid continuation: the stuck lead byte comes out as U+FFFD as soon as it is hopeless.
  EXPECT_EQ(d.push(byte_ids[0]), "");
  EXPECT_EQ(d.push(*tok_->token_to_id("a")), "\uFFFD" "a");
  // Whatever is incomplete at the end is flushed as U+FFFD.
  EXPECT_EQ(d.push(byte_ids[0]), "");
  EXPECT_EQ(d.push(byte_ids[1]), "");
  EXPECT_EQ(d.flush(), "\uFFFD");
  EXPECT_EQ(d.flush(), "");
  IncrementalDecoder skip(*tok_, /*skip_special=*/true);
  EXPECT_EQ(skip.push(1), "");
  EXPECT_EQ(skip.push(*tok_->token_to_id("a")), "a");
}

TEST_F(TinyTokenizer, LongInputsOfOneKind) {
  for (std::string s : {std::string(20000, 'a'), std::string(20000, ' '), std::string(9000, '7'),
                        std::string(5000, '\n') + "x"}) {
    auto ids = tok_->encode(s);
    EXPECT_EQ(tok_->decode(ids), s);
    EXPECT_LE(ids.size(), s.size());
  }
}

// ---- errors from bad tokenizer.json ------------------------------------------------------------

std::string tiny_with(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(train_bpe_tokenizer_json("hello hello world world", 270));
  edit(j);
  return j.dump();
}

void expect_error(const std::string& json_text, const std::string& needle) {
  auto r = Tokenizer::from_json(json_text);
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(TokenizerJson, RejectsWhatItDoesNotImplement) {
  expect_error("not json", "not a JSON object");
  expect_error("[1,2]", "not a JSON object");
  expect_error("{}", "missing 'model'");
  expect_error(tiny_with([](auto& j) { j["model"]["type"] = "WordPiece"; }), "WordPiece");
  expect_error(tiny_with([](auto& j) { j["model"]["unk_token"] = "<unk>"; }), "unk_token");
  expect_error(tiny_with([](auto& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback");
  expect_error(tiny_with([](auto& j) { j["model"]["dropout"] = 0.1; }), "dropout");
  expect_error(tiny_with([](auto& j) { j["model"]["merges"].push_back("zz qq"); }), "merges[");
  expect_error(tiny_with([](auto& j) { j["model"]["merges"].push_back(7); }), "merges[");
  expect_error(tiny_with([](auto& j) { j["model"]["vocab"]["x"] = -1; }), "vocab['x']");
  expect_error(tiny_with([](auto& j) { j["model"]["vocab"] = 3; }), "model.vocab");
  expect_error(tiny_with([](auto& j) { j["normalizer"] = {{"type", "NFC"}}; }), "normalizer");
  expect_error(tiny_with([](auto& j) { j["decoder"] = nullptr; }), "decoder");
  expect_error(tiny_with([](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "decoder");
  expect_error(tiny_with([](auto& j) { j["pre_tokenizer"] = nullptr; }), "pre_tokenizer");
  expect_error(tiny_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
               "Removed");
  expect_error(tiny_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(("}}; }),
               "((");
  expect_error(tiny_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][3]["add_prefix_space"] = true; }),
               "add_prefix_space");
  expect_error(tiny_with([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), "Whitespace");
  expect_error(tiny_with([](auto& j) { j["added_tokens"][0]["content"] = ""; }), "empty content");
  expect_error(tiny_with([](auto& j) { j["added_tokens"][1]["content"] = j["added_tokens"][0]["content"]; }),
               "twice");
  expect_error(tiny_with([](auto& j) { j["added_tokens"] = {{{"id", "x"}}}; }), "added_tokens[0]");
}

TEST(TokenizerJson, MergesAsPairsAndFromFile) {
  auto pairs = tiny_with([](auto& j) {
    for (auto& m : j["model"]["merges"]) {
      std::string s = m;
      m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
  });
  auto a = Tokenizer::from_json(pairs);
  auto b = Tokenizer::from_json(tiny_with([](auto&) {}));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->encode("hello world"), (*b)->encode("hello world"));
  EXPECT_LT((*a)->encode("hello world").size(), 5u);
  auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Arbitrary bytes (invalid UTF-8, NULs, partial special tokens) never break encode/decode:
// decode(encode(s)) is s with invalid sequences repaired, and streaming gives the same text.
TEST_F(TinyTokenizer, RandomBytesRoundTrip) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  const std::vector<std::string> fragments = {"<｜User｜>", "<｜Use", "｜DSML｜", "\xF0\x9F", "\x80",
                                              "\xE4\xB8\xAD", " ", "\n", "12345", "ab", "<think>"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    int n = int(next() % 40);
    for (int i = 0; i < n; ++i) {
      if (next() % 4 == 0)
        s += fragments[next() % fragments.size()];
      else
        s.push_back(char(next() % 256));
    }
    auto ids = tok_->encode(s);
    std::string want = text::utf8_lossy(s);
    ASSERT_EQ(tok_->decode(ids), want) << iter;
    IncrementalDecoder d(*tok_);
    std::string streamed;
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.flush();
    ASSERT_EQ(streamed, want) << iter;
  }
}

// Mutated tokenizer.json text: every outcome is a value (ok or an error), never a crash.
TEST(TokenizerJson, MutatedFilesNeverCrash) {
  const std::string base = train_bpe_tokenizer_json("hello world, hello 123 中文", 275);
  uint64_t state = 99;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  int ok = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string s = base;
    int edits = 1 + int(next() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = next() % s.size();
      switch (next() % 3) {
        case 0: s[pos] = "{}[]\",:0-1 tfn\\"[next() % 15]; break;
        case 1: s.erase(pos, 1 + next() % 8); break;
        default: s.insert(pos, 1, char(next() % 128));
      }
    }
    auto r = Tokenizer::from_json(s);
    if (r.ok()) {
      ++ok;
      (void)(*r)->encode("hello world 123");
    }
  }
  EXPECT_GE(ok, 0);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// One Tokenizer shared by server threads: concurrent encodes agree with a serial one.
TEST_F(TinyTokenizer, ConcurrentEncodeMatchesSerial) {
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) texts.push_back(generate_tiny_corpus(100 + uint64_t(i), 20000));
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok_->encode(t));
  std::vector<std::vector<int32_t>> got(texts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < texts.size(); ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) got[i] = tok_->encode(texts[i]);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace tandem
