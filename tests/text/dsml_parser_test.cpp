// DSML output parser: one-shot results for well-formed and malformed output, and the streaming
// guarantees (any chunking gives the same result; no partial trigger or partial UTF-8 in deltas;
// tool-call arguments always valid JSON).
#include <gtest/gtest.h>

#include <random>

#include "common/log.h"
#include "text/dsml.h"

namespace tandem {
namespace {

// Malformed-output tests warn on purpose; keep the test log readable.
const bool kQuiet = (set_log_level(LogLevel::kError), true);

const std::string kBlockOpen = "\n\n<｜DSML｜tool_calls>\n";
const std::string kBlockClose = "</｜DSML｜tool_calls>";
const std::string kEos = "<｜end▁of▁sentence｜>";

std::string invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string param(const std::string& name, bool is_string, const std::string& value) {
  return "<｜DSML｜parameter name=\"" + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value +
         "</｜DSML｜parameter>\n";
}

DsmlParserOptions opts(bool thinking) {
  DsmlParserOptions o;
  o.thinking = thinking;
  auto counter = std::make_shared<int>(0);
  o.make_id = [counter] { return "call_" + std::to_string((*counter)++); };
  return o;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Feeds `text` split at `cuts` (sorted offsets); checks per-delta invariants; returns the aggregate.
DsmlParseResult parse_split(const std::string& text, const std::vector<size_t>& cuts, bool thinking) {
  DsmlStreamParser p(opts(thinking));
  DsmlParseResult r;
  std::vector<DsmlDelta> all;
  size_t prev = 0;
  for (size_t c : cuts) {
    auto d = p.push(std::string_view(text).substr(prev, c - prev));
    all.insert(all.end(), d.begin(), d.end());
    prev = c;
  }
  auto d = p.push(std::string_view(text).substr(prev));
  all.insert(all.end(), d.begin(), d.end());
  d = p.finish();
  all.insert(all.end(), d.begin(), d.end());
  const bool input_utf8 = valid_utf8(text);
  for (const DsmlDelta& x : all) {
    if (x.kind == DsmlDeltaKind::kContent || x.kind == DsmlDeltaKind::kReasoning) {
      EXPECT_FALSE(x.text.empty());
    }
    // Deltas of valid UTF-8 input never split a character.
    if (input_utf8) {
      EXPECT_TRUE(valid_utf8(x.text)) << "delta splits a UTF-8 character";
    }
  }
  apply_dsml_deltas(all, r);
  r.warnings = p.warnings();
  return r;
}

void expect_same(const DsmlParseResult& a, const DsmlParseResult& b, const std::string& what) {
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << what;
  }
}

void expect_args_valid(const DsmlParseResult& r, const std::string& what) {
  for (const auto& c : r.tool_calls) {
    EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << "args: " << c.arguments << "\nin: " << what;
    auto j = nlohmann::json::parse(c.arguments, nullptr, false);
    EXPECT_TRUE(j.is_object()) << what;
    EXPECT_FALSE(c.name.empty()) << what;
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
  }
}

// Every byte boundary, one byte at a time, and random splits agree with the one-shot parse.
void check_streaming(const std::string& text, bool thinking, int random_rounds = 30) {
  DsmlParseResult one = parse_dsml_completion(text, opts(thinking));
  expect_args_valid(one, text);
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_same(one, parse_split(text, bytes, thinking), "1-byte chunks: " + text);
  for (size_t i = 1; i < text.size(); ++i) {
    expect_same(one, parse_split(text, {i}, thinking), "split at " + std::to_string(i) + ": " + text);
  }
  std::mt19937 rng(1234);
  for (int round = 0; round < random_rounds; ++round) {
    std::vector<size_t> cuts;
    std::uniform_int_distribution<size_t> pos(0, text.size());
    int n = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int k = 0; k < n; ++k) cuts.push_back(pos(rng));
    std::sort(cuts.begin(), cuts.end());
    expect_same(one, parse_split(text, cuts, thinking), "random split: " + text);
  }
}

// ---- Well-formed output ----

TEST(Dsml, PlainContent) {
  auto r = parse_dsml_completion("Hello, world!\n\nSecond paragraph." + kEos, opts(false));
  EXPECT_EQ(r.content, "Hello, world!\n\nSecond paragraph.");
  EXPECT_TRUE(r.reasoning_content.empty());
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.warnings.empty());
}

TEST(Dsml, ThinkingSplitsReasoningAndContent) {
  auto r = parse_dsml_completion("Let me think.\nOK.</think>The answer is 4." + kEos, opts(true));
  EXPECT_EQ(r.reasoning_content, "Let me think.\nOK.");
  EXPECT_EQ(r.content, "The answer is 4.");
  // No </think> at all: everything is reasoning (output cut short).
  r = parse_dsml_completion("still thinking", opts(true));
  EXPECT_EQ(r.reasoning_content, "still thinking");
  EXPECT_EQ(r.content, "");
}

TEST(Dsml, SingleToolCall) {
  std::string text = "Checking." + kBlockOpen +
                     invoke("get_weather", param("location", true, "Beijing") + param("unit", true, "celsius")) +
                     kBlockClose + kEos;
  auto r = parse_dsml_completion(text, opts(false));
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_TRUE(r.warnings.empty());
  auto oa = dsml_tool_calls_to_openai(r.tool_calls);
  EXPECT_EQ(oa[0]["type"], "function");
  EXPECT_EQ(oa[0]["function"]["name"], "get_weather");
}

TEST(Dsml, ParallelCallsNestedJsonAndEscapes) {
  std::string text =
      kBlockOpen +
      invoke("search", param("queries", true, "a \"quoted\" \\ path\nnew line\ttab 中文 😀") +
                           param("limit", false, "5")) +
      invoke("open", param("open_list", false, R"([{"id": 3, "cursor": -1}, {"id": "https://x.y/z?a=1&b=2"}])") +
                         param("deep", false, "{\"a\": {\"b\": [1, 2.5, null, true, {\"c\": \"</think>\"}]}}") +
                         param("flag", false, "false")) +
      invoke("noargs", "") + kBlockClose;
  auto r = parse_dsml_completion(text, opts(false));
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  ASSERT_EQ(r.tool_calls.size(), 3u);
  EXPECT_EQ(r.tool_calls[0].arguments,
            "{\"queries\": \"a \\\"quoted\\\" \\\\ path\\nnew line\\ttab 中文 😀\", \"limit\": 5}");
  EXPECT_EQ(r.tool_calls[1].name, "open");
  EXPECT_EQ(r.tool_calls[1].arguments,
            "{\"open_list\": [{\"id\": 3, \"cursor\": -1}, {\"id\": \"https://x.y/z?a=1&b=2\"}], "
            "\"deep\": {\"a\": {\"b\": [1, 2.5, null, true, {\"c\": \"</think>\"}]}}, \"flag\": false}");
  EXPECT_EQ(r.tool_calls[2].name, "noargs");
  EXPECT_EQ(r.tool_calls[2].arguments, "{}");
  auto q = nlohmann::json::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(q["queries"], "a \"quoted\" \\ path\nnew line\ttab 中文 😀");
  check_streaming(text, false);
}

TEST(Dsml, ThinkingThenToolCalls) {
  std::string text = "I need the weather.</think>" + kBlockOpen +
                     invoke("get_weather", param("location", true, "Paris")) + kBlockClose + kEos;
  auto r = parse_dsml_completion(text, opts(true));
  EXPECT_EQ(r.reasoning_content, "I need the weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "Paris"})");
  check_streaming(text, true);
}

TEST(Dsml, StreamingDeltasOrderAndNoTriggerLeak) {
  std::string text = "Answer\n" + kBlockOpen + invoke("f", param("x", true, "abc")) + kBlockClose;
  DsmlStreamParser p(opts(false));
  std::vector<DsmlDelta> all;
  for (char c : text) {
    auto d = p.push(std::string(1, c));
    all.insert(all.end(), d.begin(), d.end());
  }
  auto d = p.finish();
  all.insert(all.end(), d.begin(), d.end());
  std::string content;
  int starts = 0, last_kind_args = 0;
  for (const auto& x : all) {
    if (x.kind == DsmlDeltaKind::kContent) {
      content += x.text;
      EXPECT_EQ(starts, 0) << "content after a tool call started";
    }
    if (x.kind == DsmlDeltaKind::kToolCallStart) {
      ++starts;
      EXPECT_EQ(x.tool_index, 0);
      EXPECT_EQ(x.name, "f");
      EXPECT_EQ(x.id, "call_0");
    }
    if (x.kind == DsmlDeltaKind::kToolCallArgs) {
      EXPECT_EQ(starts, 1) << "arguments before the start";
      ++last_kind_args;
    }
  }
  EXPECT_EQ(content, "Answer\n");
  EXPECT_EQ(starts, 1);
  EXPECT_GT(last_kind_args, 3) << "arguments should stream in several fragments";
  EXPECT_EQ(content.find("<｜"), std::string::npos);
}

TEST(Dsml, HeldBackNewlinesAndPartialTriggerAreReleasedAsContent) {
  // Content that merely resembles the trigger's start stays content, in order.
  std::string text = "a\n\n<｜DSML｜tool_cal and more\n\n<b>\n\n";
  auto r = parse_dsml_completion(text, opts(false));
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
  check_streaming(text, false);
  // Partial "</think>" in reasoning.
  std::string t2 = "x </thin y </th</think>done";
  auto r2 = parse_dsml_completion(t2, opts(true));
  EXPECT_EQ(r2.reasoning_content, "x </thin y </th");
  EXPECT_EQ(r2.content, "done");
  check_streaming(t2, true);
}

TEST(Dsml, TextAfterEosIgnored) {
  auto r = parse_dsml_completion("hi" + kEos + "junk", opts(false));
  EXPECT_EQ(r.content, "hi");
  EXPECT_EQ(r.warnings.size(), 1u);
  check_streaming("hi" + kEos + "junk", false);
  // A partial EOS at the very end is just text.
  auto r2 = parse_dsml_completion("hi<｜end", opts(false));
  EXPECT_EQ(r2.content, "hi<｜end");
}

// ---- Malformed output degrades, never crashes ----

TEST(Dsml, UnterminatedBlockBeforeAnyCallIsContent) {
  std::string text = "Hmm" + kBlockOpen + "<｜DSML｜invoke na";
  auto r = parse_dsml_completion(text, opts(false));
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, false);
}

TEST(Dsml, TruncatedInsideCallClosesIt) {
  std::string text = kBlockOpen + invoke("a", param("k", false, "[1, 2]")) + "<｜DSML｜invoke name=\"b\">\n" +
                     param("s", true, "done") + "<｜DSML｜parameter name=\"t\" string=\"true\">partial val";
  auto r = parse_dsml_completion(text, opts(false));
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"k": [1, 2]})");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"s": "done", "t": "partial val"})");
  EXPECT_EQ(r.content, "");
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, false);
}

TEST(Dsml, BadAttributesAndFlags) {
  const std::vector<std::string> bad = {
      kBlockOpen + "<｜DSML｜invoke nom=\"f\">\n</｜DSML｜invoke>\n" + kBlockClose,
      kBlockOpen + "<｜DSML｜invoke name=\"\">\n</｜DSML｜invoke>\n" + kBlockClose,
      kBlockOpen + invoke("f", "<｜DSML｜parameter name=\"x\" string=\"maybe\">1</｜DSML｜parameter>\n") + kBlockClose,
      kBlockOpen + invoke("f", "<｜DSML｜parameter name=\"x\" type=\"int\">1</｜DSML｜parameter>\n") + kBlockClose,
      "\n\n<｜DSML｜tool_calls oops",
      kBlockOpen + "garbage" + kBlockClose,
  };
  for (const std::string& text : bad) {
    auto r = parse_dsml_completion(text, opts(false));
    EXPECT_FALSE(r.warnings.empty()) << text;
    check_streaming(text, false, 10);
  }
  // Before any call started, the whole block is content.
  auto r = parse_dsml_completion("X" + bad[0], opts(false));
  EXPECT_EQ(r.content, "X" + bad[0]);
  EXPECT_TRUE(r.tool_calls.empty());
  // Inside a started call: the call keeps what parsed and the broken element on is content.
  auto r2 = parse_dsml_completion(bad[2], opts(false));
  ASSERT_EQ(r2.tool_calls.size(), 1u);
  EXPECT_EQ(r2.tool_calls[0].arguments, "{}");
  EXPECT_EQ(r2.content, "<｜DSML｜parameter name=\"x\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
                            kBlockClose);
}

TEST(Dsml, InvalidJsonValueWithStringFalse) {
  std::string text = kBlockOpen +
                     invoke("f", param("ok", true, "fine") + param("n", false, "{not json}") +
                                     param("later", true, "x")) +
                     kBlockClose;
  auto r = parse_dsml_completion(text, opts(false));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"ok": "fine"})");
  EXPECT_EQ(r.content.rfind("<｜DSML｜parameter name=\"n\" string=\"false\">{not json}", 0), 0u) << r.content;
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, false);
}

TEST(Dsml, DuplicateParameterIsMalformed) {
  std::string text = kBlockOpen + invoke("f", param("a", false, "1") + param("a", false, "2")) + kBlockClose;
  auto r = parse_dsml_completion(text, opts(false));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"a": 1})");
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, false);
}

TEST(Dsml, TextAfterBlockBecomesContent) {
  std::string text = "Pre" + kBlockOpen + invoke("f", param("a", true, "1")) + kBlockClose + "\n  trailing words";
  auto r = parse_dsml_completion(text, opts(false));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.content, "Pre\n  trailing words");
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, false);
  // Whitespace only after the block is dropped silently.
  auto r2 = parse_dsml_completion(kBlockOpen + invoke("f", "") + kBlockClose + "\n", opts(false));
  EXPECT_EQ(r2.content, "");
  EXPECT_TRUE(r2.warnings.empty());
}

TEST(Dsml, ToolCallInsideReasoningIsAccepted) {
  std::string text = "thinking..." + kBlockOpen + invoke("f", param("a", true, "1")) + kBlockClose;
  auto r = parse_dsml_completion(text, opts(true));
  EXPECT_EQ(r.reasoning_content, "thinking...");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_FALSE(r.warnings.empty());
  check_streaming(text, true);
}

// Random corruptions of a valid completion: never crash, arguments always a JSON object, and the
// result never depends on chunking.
#ifndef DSML_CORRUPTION_ROUNDS
#define DSML_CORRUPTION_ROUNDS 2000
#endif
constexpr int kCorruptionRounds = DSML_CORRUPTION_ROUNDS;

TEST(Dsml, RandomCorruptionsAreChunkInvariant) {
  std::string base = "Reason.</think>Intro" + kBlockOpen +
                     invoke("search", param("q", true, "x \"y\" 中") + param("n", false, "[1, {\"a\": 2}]")) +
                     invoke("open", param("id", false, "3")) + kBlockClose + kEos;
  const std::vector<std::string> pieces = {"<｜DSML｜", "</｜DSML｜parameter>", "\"", ">", "\n", "</think>",
                                           "<｜DSML｜tool_calls", "string=\"false\">", "{", "中", kEos};
  std::mt19937 rng(42);
  for (int round = 0; round < kCorruptionRounds; ++round) {
    std::string text = base;
    int edits = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int e = 0; e < edits; ++e) {
      size_t pos = std::uniform_int_distribution<size_t>(0, text.size())(rng);
      int op = std::uniform_int_distribution<int>(0, 2)(rng);
      if (op == 0 && pos < text.size()) {
        text.erase(pos, std::uniform_int_distribution<size_t>(1, 20)(rng));
      } else if (op == 1) {
        text.insert(pos, pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)]);
      } else {
        text.resize(pos);  // truncation
      }
    }
    bool thinking = round % 2 == 0;
    DsmlParseResult one = parse_dsml_completion(text, opts(thinking));
    expect_args_valid(one, text);
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    DsmlParseResult bytewise = parse_split(text, bytes, thinking);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "input: " << text;
      return;
    }
    expect_same(one, bytewise, text);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace tandem
