// Differential check of the prompt encoder: random conversations (system/developer tools,
// response_format, tasks, parallel tool calls with shuffled results, wo_eos, latest_reminder,
// chat/thinking, drop_thinking on/off, effort) whose expected prompts were produced by the official
// Python encoder (preview release, its "max" effort text being 0731's "high"). The generator is
// described in tests/text/data/encoding/README.md.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "text/encoding_dsv4.h"

#ifndef ENCODING_GENERATED_CASES
#define ENCODING_GENERATED_CASES TANDEM_SOURCE_DIR "/tests/text/data/encoding/generated_cases.jsonl"
#endif

namespace tandem {
namespace {

using nlohmann::ordered_json;

TEST(EncodingGenerated, MatchesOfficialEncoderOnRandomConversations) {
  std::ifstream f(ENCODING_GENERATED_CASES, std::ios::binary);
  ASSERT_TRUE(f) << "missing " << ENCODING_GENERATED_CASES;
  std::string line;
  int n = 0, failures = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    ordered_json c = ordered_json::parse(line, nullptr, false);
    ASSERT_FALSE(c.is_discarded()) << "case " << n;
    EncodeOptions opt;
    opt.thinking = c["thinking"].get<bool>();
    opt.drop_thinking = c["drop_thinking"].get<bool>();
    opt.reasoning_effort = c["reasoning_effort"].get<std::string>();
    auto got = encode_messages(c["messages"], nullptr, opt);
    const std::string& expected = c["expected"].get_ref<const std::string&>();
    if (!got.ok()) {
      ADD_FAILURE() << "case " << n << ": " << got.status().to_string();
      ++failures;
    } else if (*got != expected) {
      size_t i = 0;
      while (i < got->size() && i < expected.size() && (*got)[i] == expected[i]) ++i;
      ADD_FAILURE() << "case " << n << " differs at byte " << i << ": got «" << got->substr(i, 60)
                    << "» expected «" << expected.substr(i, 60) << "»\nmessages: " << c["messages"].dump();
      ++failures;
    }
    ++n;
    if (failures >= 5) break;
  }
  EXPECT_GE(n, 100);
}

}  // namespace
}  // namespace tandem
