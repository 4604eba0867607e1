// DeepSeek-V4 prompt encoder: the four official fixtures byte for byte, plus the rules the
// fixtures do not reach (effort prefixes, tool attachment, result ordering, errors).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "text/dsml.h"
#include "text/encoding_dsv4.h"

namespace tandem {
namespace {

using nlohmann::ordered_json;

std::string read_file(const std::string& rel) {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/text/data/encoding/" + rel, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string encode_ok(const ordered_json& messages, const ordered_json& tools, const EncodeOptions& opt) {
  auto r = encode_messages(messages, tools, opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : std::string();
}

// ---- Official fixtures (cases.json says how each is called) ----

class OfficialFixture : public ::testing::TestWithParam<int> {};

TEST_P(OfficialFixture, MatchesByteForByte) {
  ordered_json cases = ordered_json::parse(read_file("cases.json"));
  const ordered_json& c = cases["cases"][GetParam()];
  ordered_json input = ordered_json::parse(read_file(c["input"].get<std::string>()));
  std::string expected = read_file(c["output"].get<std::string>());
  ASSERT_FALSE(expected.empty());
  EncodeOptions opt;
  opt.thinking = c["thinking_mode"] == "thinking";
  ordered_json messages = input.is_object() ? input["messages"] : input;
  ordered_json tools = input.is_object() ? input["tools"] : ordered_json();
  std::string got = encode_ok(messages, tools, opt);
  EXPECT_EQ(got, expected);
  if (got != expected) {
    size_t i = 0;
    while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
    ADD_FAILURE() << "first difference at byte " << i << ": got «" << got.substr(i, 80) << "» expected «"
                  << expected.substr(i, 80) << "»";
  }
}

INSTANTIATE_TEST_SUITE_P(Encoding, OfficialFixture, ::testing::Values(0, 1, 2, 3));

TEST(Encoding, Fixture1SameWithToolsOnSystemMessage) {
  // The official test attaches tools to messages[0]; giving them inside the message must agree.
  ordered_json input = ordered_json::parse(read_file("test_input_1.json"));
  ordered_json messages = input["messages"];
  messages[0]["tools"] = input["tools"];
  EncodeOptions opt;
  opt.thinking = true;
  EXPECT_EQ(encode_ok(messages, nullptr, opt), read_file("test_output_1.txt"));
}

TEST(Encoding, JsonOverloadAgreesWhenKeysAreSorted) {
  nlohmann::json messages = nlohmann::json::parse(read_file("test_input_2.json"));
  EncodeOptions opt;
  opt.thinking = true;
  auto r = encode_messages(messages, nlohmann::json(), opt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), read_file("test_output_2.txt"));
}

// ---- Generation prefix, modes, effort ----

TEST(Encoding, GenerationPrefixChatAndThinking) {
  ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":"Hi"}])");
  EncodeOptions chat;
  EXPECT_EQ(encode_ok(msgs, nullptr, chat), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EncodeOptions think;
  think.thinking = true;
  std::string p = encode_ok(msgs, nullptr, think);
  EXPECT_EQ(p, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
  EXPECT_TRUE(prompt_opens_reasoning(p));
  EXPECT_FALSE(prompt_opens_reasoning(encode_ok(msgs, nullptr, chat)));
  EXPECT_EQ(generation_prefix(true), "<｜Assistant｜><think>");
  EXPECT_EQ(generation_prefix(false), "<｜Assistant｜></think>");
  EncodeOptions nobos;
  nobos.add_bos = false;
  EXPECT_EQ(encode_ok(msgs, nullptr, nobos), "<｜User｜>Hi<｜Assistant｜></think>");
}

TEST(Encoding, ReasoningEffortPrefixes0731) {
  ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":"Hello"}])");
  EncodeOptions opt;
  opt.thinking = true;
  opt.reasoning_effort = "low";
  EXPECT_EQ(encode_ok(msgs, nullptr, opt), "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜><think>");
  opt.reasoning_effort = "high";
  std::string high = encode_ok(msgs, nullptr, opt);
  EXPECT_EQ(high,
            "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
            "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
            "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
            "adversarial scenarios.\n"
            "Explicitly write out your entire deliberation process, documenting every intermediate step, "
            "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
            "unchecked.\n\n<｜User｜>Hello<｜Assistant｜><think>");
  opt.reasoning_effort = "max";
  std::string max = encode_ok(msgs, nullptr, opt);
  EXPECT_EQ(max,
            "<｜begin▁of▁sentence｜>Reasoning Effort: Beyond maximum — exhaustive, relentless, and "
            "uncompromising.\n"
            "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
            "decompose the problem into its most fundamental components, trace every causal chain to its root, "
            "and resolve the underlying cause rather than any surface symptom.\n"
            "Do not stop reasoning until you have independently verified the solution from multiple angles and "
            "are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
            "<｜User｜>Hello<｜Assistant｜><think>");
  // Chat mode never carries a prefix.
  opt.thinking = false;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt), "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>");
  // The prefix goes before the system text.
  opt.thinking = true;
  ordered_json with_sys = ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"U"}])");
  std::string p = encode_ok(with_sys, nullptr, opt);
  EXPECT_EQ(p.find("Reasoning Effort: Beyond"), std::string("<｜begin▁of▁sentence｜>").size());
  EXPECT_NE(p.find("undiscovered.\n\nS<｜User｜>U"), std::string::npos);
  opt.reasoning_effort = "extreme";
  auto bad = encode_messages(msgs, nullptr, opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reasoning_effort"), std::string::npos);
}

TEST(Encoding, OpenAiReasoningEffortMapping) {
  EncodeOptions o;
  o.thinking = true;
  ASSERT_TRUE(apply_openai_reasoning_effort("medium", o).ok());
  EXPECT_EQ(o.reasoning_effort, "high");
  ASSERT_TRUE(apply_openai_reasoning_effort("xhigh", o).ok());
  EXPECT_EQ(o.reasoning_effort, "max");
  ASSERT_TRUE(apply_openai_reasoning_effort("minimal", o).ok());
  EXPECT_EQ(o.reasoning_effort, "low");
  ASSERT_TRUE(apply_openai_reasoning_effort("none", o).ok());
  EXPECT_FALSE(o.thinking);
  EXPECT_FALSE(apply_openai_reasoning_effort("turbo", o).ok());
}

// ---- drop_thinking ----

TEST(Encoding, DropThinkingKeepsOnlyCurrentTurnReasoning) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"A"},
    {"role":"assistant","reasoning_content":"r1","content":"a1"},
    {"role":"user","content":"B"},
    {"role":"assistant","reasoning_content":"r2","content":"a2"},
    {"role":"user","content":"C"}])");
  EncodeOptions opt;
  opt.thinking = true;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt),
            "<｜begin▁of▁sentence｜><｜User｜>A<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"
            "<｜User｜>B<｜Assistant｜></think>a2<｜end▁of▁sentence｜><｜User｜>C<｜Assistant｜><think>");
  opt.drop_thinking = false;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt),
            "<｜begin▁of▁sentence｜><｜User｜>A<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜>"
            "<｜User｜>B<｜Assistant｜><think>r2</think>a2<｜end▁of▁sentence｜><｜User｜>C<｜Assistant｜><think>");
}

TEST(Encoding, ToolsKeepAllReasoning) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"A"},
    {"role":"assistant","reasoning_content":"r1","content":"a1"},
    {"role":"user","content":"B"}])");
  ordered_json tools = ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":{}}}])");
  EncodeOptions opt;
  opt.thinking = true;
  std::string p = encode_ok(msgs, tools, opt);
  EXPECT_NE(p.find("<｜User｜>A<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜>"), std::string::npos) << p;
  // No system message: tools go into a new empty one at the start.
  EXPECT_EQ(p.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n\n", 0), 0u) << p.substr(0, 80);
  EXPECT_NE(p.find("{\"name\": \"f\", \"parameters\": {}}\n\nYou MUST strictly follow"), std::string::npos);
}

TEST(Encoding, DeveloperBeforeLastUserIsDroppedInThinkingMode) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"developer","content":"D"},
    {"role":"assistant","content":"x"},
    {"role":"user","content":"U"}])");
  EncodeOptions opt;
  opt.thinking = true;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt),
            "<｜begin▁of▁sentence｜>x<｜end▁of▁sentence｜><｜User｜>U<｜Assistant｜><think>");
  opt.thinking = false;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt),
            "<｜begin▁of▁sentence｜><｜User｜>D<｜Assistant｜></think>x<｜end▁of▁sentence｜><｜User｜>U<｜Assistant｜></think>");
}

// ---- Tool calls and results ----

TEST(Encoding, ToolResultsSortedByCallOrderAndMergedWithUser) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"Q"},
    {"role":"assistant","content":"","tool_calls":[
      {"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}},
      {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"b","content":"RB"},
    {"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"RA1"},{"type":"text","text":"RA2"}]},
    {"role":"user","content":"more"}])");
  EncodeOptions opt;
  std::string p = encode_ok(msgs, nullptr, opt);
  EXPECT_EQ(p,
            "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n"
            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
            "<｜end▁of▁sentence｜><｜User｜><tool_result>RA1\n\nRA2</tool_result>\n\n<tool_result>RB</tool_result>"
            "\n\nmore<｜Assistant｜></think>");
}

TEST(Encoding, ToolCallArgumentsRenderedWithPythonJson) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"Q"},
    {"role":"assistant","content":"ok","tool_calls":[{"type":"function","function":{"name":"f",
      "arguments":"{\"s\": \"line\\nnext \\\"q\\\"\", \"n\": 1.5, \"o\": {\"z\": [1, true, null], \"a\": \"é\"}}"}}]}])");
  EncodeOptions opt;
  std::string p = encode_ok(msgs, nullptr, opt);
  EXPECT_NE(p.find("ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                   "<｜DSML｜parameter name=\"s\" string=\"true\">line\nnext \"q\"</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"n\" string=\"false\">1.5</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"o\" string=\"false\">{\"z\": [1, true, null], \"a\": \"é\"}"
                   "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
            std::string::npos)
      << p;
}

TEST(Encoding, NonJsonArgumentsBecomeOneStringParameter) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"Q"},
    {"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"not json"}}]}])");
  std::string p = encode_ok(msgs, nullptr, EncodeOptions{});
  EXPECT_NE(p.find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"),
            std::string::npos);
}

TEST(Encoding, ResponseFormatTaskAndWoEos) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"system","content":"S","response_format":{"type":"json_object"}},
    {"role":"user","content":"q","task":"query"},
    {"role":"assistant","content":"partial","wo_eos":true}])");
  EXPECT_EQ(encode_ok(msgs, nullptr, EncodeOptions{}),
            "<｜begin▁of▁sentence｜>S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
            "reply:\n{\"type\": \"json_object\"}<｜User｜>q<｜query｜>partial");
}

TEST(Encoding, ContinueFinalMessageLeavesTheLastAssistantOpen) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":"Write a haiku"},{"role":"assistant","content":"Autumn moon"}])");
  EncodeOptions opt;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt),
            "<｜begin▁of▁sentence｜><｜User｜>Write a haiku<｜Assistant｜></think>Autumn moon<｜end▁of▁sentence｜>");
  opt.continue_final_message = true;
  EXPECT_EQ(encode_ok(msgs, nullptr, opt), "<｜begin▁of▁sentence｜><｜User｜>Write a haiku<｜Assistant｜></think>Autumn moon");
  // Only the final message: earlier assistant turns keep their EOS; a final user turn is unaffected.
  ordered_json ends_user = ordered_json::parse(R"([{"role":"user","content":"A"}])");
  EXPECT_EQ(encode_ok(ends_user, nullptr, opt), "<｜begin▁of▁sentence｜><｜User｜>A<｜Assistant｜></think>");
}

TEST(Encoding, ContentPartsJoinedAndConsecutiveUsersMerged) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"user","content":"c"}])");
  EXPECT_EQ(encode_ok(msgs, nullptr, EncodeOptions{}),
            "<｜begin▁of▁sentence｜><｜User｜>a\nb\n\nc<｜Assistant｜></think>");
}

TEST(Encoding, LatestReminderAfterUserGetsTransition) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role":"system","content":"S"},{"role":"latest_reminder","content":"R"},{"role":"user","content":"U"}])");
  EXPECT_EQ(encode_ok(msgs, nullptr, EncodeOptions{}),
            "<｜begin▁of▁sentence｜>S<｜latest_reminder｜>R<｜User｜>U<｜Assistant｜></think>");
}

// ---- Errors name the message and field ----

void expect_error(const char* messages_json, const std::string& needle, const ordered_json& tools = nullptr) {
  auto r = encode_messages(ordered_json::parse(messages_json), tools, EncodeOptions{});
  ASSERT_FALSE(r.ok()) << messages_json;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(Encoding, BadInputIsAnErrorNamingTheField) {
  expect_error(R"({"role":"user"})", "messages: must be an array");
  expect_error(R"([{"role":"user","content":"a"}, 5])", "messages[1]: must be an object");
  expect_error(R"([{"content":"a"}])", "messages[0].role");
  expect_error(R"([{"role":"wizard","content":"a"}])", "messages[0].role: unsupported role 'wizard'");
  expect_error(R"([{"role":"user","content":42}])", "messages[0].content");
  expect_error(R"([{"role":"user","content":[{"type":"image_url","image_url":{}}]}])",
               "messages[0].content[0].type: unsupported content part type 'image_url'");
  expect_error(R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0].text");
  expect_error(R"([{"role":"developer","content":""}])", "messages[0].content");
  expect_error(R"([{"role":"user","content":"a","task":"dance"}])", "messages[0].task");
  expect_error(R"([{"role":"assistant","content":"a","tool_calls":{}}])", "messages[0].tool_calls");
  expect_error(R"([{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}])",
               "messages[0].tool_calls[0].function.name");
  expect_error(R"([{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"[1]"}}]}])",
               "messages[0].tool_calls[0].function.arguments");
  expect_error(R"([{"role":"assistant","reasoning_content":7,"content":"a"}])", "messages[0].reasoning_content");
  expect_error(R"([{"role":"user","content":"a"}])", "tools[0].function", ordered_json::parse(R"([{"type":"x"}])"));
}

TEST(Encoding, DeepNestingIsRejectedNotACrash) {
  // 100,000 levels would overflow the stack of any recursive writer; it must be an error instead.
  // (Built from text: copying such a value would itself recurse.)
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ordered_json tools = ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":)" + deep + "}}]");
  ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":"a"}])");
  auto r = encode_messages(msgs, tools, EncodeOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tools: nested deeper than 512"), std::string::npos) << r.status().message();
  nlohmann::json deep_msgs = nlohmann::json::parse(R"([{"role":"user","content":)" + deep + "}]");
  auto r2 = encode_messages(deep_msgs, nlohmann::json(), EncodeOptions{});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("messages: nested deeper"), std::string::npos);
  ordered_json call = ordered_json::parse(R"({"type":"function","function":{"name":"f","arguments":"{\"x\": )" +
                                          deep + "}\"}}");
  auto d = render_dsml_invoke(call, "c");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("c.function.arguments: nested deeper"), std::string::npos);
  EXPECT_TRUE(json_nesting_exceeds(ordered_json::parse(std::string(513, '[') + std::string(513, ']'))));
  EXPECT_FALSE(json_nesting_exceeds(ordered_json::parse(std::string(512, '[') + std::string(512, ']'))));
  // The writer itself stays safe past the limit.
  EXPECT_EQ(python_json_dumps(ordered_json::parse(std::string(600, '[') + std::string(600, ']'))).size(),
            513u * 2 + 4);
}

// The encoder's DSML and the parser agree: parse(render(call)) gives the call's arguments as
// Python's json.dumps writes them.
TEST(Encoding, RenderedToolCallsParseBack) {
  const char* args_list[] = {
      R"({"location": "Beijing", "unit": "celsius"})",
      R"({})",
      R"({"n": -3, "f": 0.001, "big": 1e+30, "list": [1, [2, {"k": "v"}]], "t": false, "nul": null})",
      R"({"text": "multi\nline with \"quotes\" and \\ backslash and \t tab", "emoji": "😀 中文"})",
  };
  for (const char* a : args_list) {
    ordered_json call = {{"type", "function"}, {"function", {{"name", "tool_x"}, {"arguments", a}}}};
    ordered_json calls = ordered_json::array({call, call});
    auto dsml = render_dsml_tool_calls(calls, "calls");
    ASSERT_TRUE(dsml.ok()) << dsml.status().to_string();
    DsmlParseResult r = parse_dsml_completion("Sure." + dsml.value() + "<｜end▁of▁sentence｜>");
    EXPECT_TRUE(r.warnings.empty()) << a;
    EXPECT_EQ(r.content, "Sure.");
    ASSERT_EQ(r.tool_calls.size(), 2u) << a;
    for (const auto& c : r.tool_calls) {
      EXPECT_EQ(c.name, "tool_x");
      EXPECT_EQ(c.arguments, python_json_dumps(ordered_json::parse(a))) << a;
      EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
    }
  }
}

TEST(Encoding, PythonJsonDumpsMatchesPython) {
  // Expected strings are what CPython's json.dumps(..., ensure_ascii=False) prints.
  EXPECT_EQ(python_json_dumps(ordered_json::parse(R"({"b": 1, "a": [1.0, 2.5, 1e-05, 1e16, 123456789.125]})")),
            R"({"b": 1, "a": [1.0, 2.5, 1e-05, 1e+16, 123456789.125]})");
  EXPECT_EQ(python_json_dumps(ordered_json::parse(R"(["\u0001\u001f\u007f/é"])")), "[\"\\u0001\\u001f\x7f/é\"]");
  EXPECT_EQ(python_json_dumps(ordered_json::parse(R"({})")), "{}");
  EXPECT_EQ(python_json_dumps(ordered_json::parse(R"([])")), "[]");
  EXPECT_EQ(python_json_dumps(ordered_json::parse(R"([0.1, 100.0, 1e15, 0.0001, -0.0])")),
            "[0.1, 100.0, 1000000000000000.0, 0.0001, -0.0]");
  EXPECT_EQ(python_json_dumps(ordered_json::parse(
                "[1.5e16, 1.2345678901234567e-7, 5e-324, 1.7976931348623157e308, 123.456, 0.5, -2.5e-5, 1e100, "
                "12345678901234567890.0, 9.999999999999999e15]")),
            "[1.5e+16, 1.2345678901234566e-07, 5e-324, 1.7976931348623157e+308, 123.456, 0.5, -2.5e-05, 1e+100, "
            "1.2345678901234567e+19, 1e+16]");
}

}  // namespace
}  // namespace tandem
