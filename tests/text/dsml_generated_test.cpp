// Differential check of the DSML parser: assistant completions (reasoning, content, parallel tool
// calls with nested JSON, unicode and escapes) rendered by the official Python encoder, and what
// the official parse_message_from_completion_text returns for them. One-shot and byte-by-byte
// streaming must both give exactly the official reasoning, content, names and arguments strings.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "text/dsml.h"

#ifndef DSML_GENERATED_CASES
#define DSML_GENERATED_CASES TANDEM_SOURCE_DIR "/tests/text/data/encoding/generated_completions.jsonl"
#endif

namespace tandem {
namespace {

using nlohmann::ordered_json;

TEST(DsmlGenerated, MatchesOfficialParser) {
  std::ifstream f(DSML_GENERATED_CASES, std::ios::binary);
  ASSERT_TRUE(f) << "missing " << DSML_GENERATED_CASES;
  std::string line;
  int n = 0;
  while (std::getline(f, line) && !::testing::Test::HasFailure()) {
    if (line.empty()) continue;
    ordered_json c = ordered_json::parse(line, nullptr, false);
    ASSERT_FALSE(c.is_discarded()) << "case " << n;
    const std::string text = c["text"].get<std::string>();
    DsmlParserOptions opt;
    opt.thinking = c["thinking"].get<bool>();
    for (int mode = 0; mode < 2; ++mode) {
      DsmlParseResult r;
      if (mode == 0) {
        r = parse_dsml_completion(text, opt);
      } else {
        DsmlStreamParser p(opt);
        for (char ch : text) apply_dsml_deltas(p.push(std::string_view(&ch, 1)), r);
        apply_dsml_deltas(p.finish(), r);
        r.warnings = p.warnings();
      }
      const char* how = mode == 0 ? "one-shot" : "byte-by-byte";
      EXPECT_TRUE(r.warnings.empty()) << how << " case " << n << ": " << r.warnings.front();
      EXPECT_EQ(r.reasoning_content, c["reasoning_content"].get<std::string>()) << how << " case " << n;
      EXPECT_EQ(r.content, c["content"].get<std::string>()) << how << " case " << n;
      const ordered_json& calls = c["tool_calls"];
      ASSERT_EQ(r.tool_calls.size(), calls.size()) << how << " case " << n << "\n" << text;
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(r.tool_calls[i].name, calls[i][0].get<std::string>()) << how << " case " << n;
        EXPECT_EQ(r.tool_calls[i].arguments, calls[i][1].get<std::string>()) << how << " case " << n;
      }
    }
    ++n;
  }
  EXPECT_GE(n, 100);
}

}  // namespace
}  // namespace tandem
