// The pure request parser: accepted shapes, rejected fields with their param, and robustness on
// random and mutated bodies (the same property the libFuzzer target checks, in a bounded loop).
#include <gtest/gtest.h>

#include <random>

#include "server/openai_request.h"

namespace tandem::server {
namespace {

using json = nlohmann::json;

TEST(RequestParser, ChatFields) {
  json body = {{"model", "m"},
               {"messages", {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
               {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", -1}, {"min_p", 0.1}, {"seed", 7},
               {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1},
               {"stop", "END"}, {"max_completion_tokens", 33}, {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 3},
               {"n", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
               {"chat_template_kwargs", {{"enable_thinking", true}}}, {"reasoning_effort", "max"}};
  auto r = parse_openai_request(Endpoint::kChatCompletions, body.dump());
  ASSERT_TRUE(r.ok()) << r.error.message;
  const auto& p = *r.request;
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.messages[1]["content"], "ab");
  EXPECT_DOUBLE_EQ(p.sampling.temperature, 0.5);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_EQ(p.sampling.seed.value(), 7u);
  EXPECT_EQ(p.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.sampling.max_tokens, 33);
  EXPECT_TRUE(p.max_tokens_set);
  EXPECT_EQ(p.sampling.logprobs, 3);
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.stream && p.include_usage && p.thinking);
  EXPECT_EQ(p.reasoning_effort, "max");
  EXPECT_EQ(p.ordered_messages.size(), 2u);
}

TEST(RequestParser, ToolsAndChoice) {
  json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}};
  json body = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}};
  auto r = parse_openai_request(Endpoint::kChatCompletions, body.dump());
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_EQ(r.request->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.request->tool_choice_name, "f");
  body["tool_choice"] = "required";
  body["parallel_tool_calls"] = false;
  r = parse_openai_request(Endpoint::kChatCompletions, body.dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.request->tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.request->parallel_tool_calls);
  body["tools"][0]["function"]["name"] = "bad name!";
  r = parse_openai_request(Endpoint::kChatCompletions, body.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.param, "tools[0].function.name");
  // Assistant history with tool_calls (arguments string must hold a JSON object).
  body = {{"messages", {{{"role", "assistant"}, {"content", nullptr},
                         {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "not json"}}}}}}}}}};
  r = parse_openai_request(Endpoint::kChatCompletions, body.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.param, "messages[0].tool_calls[0].function.arguments");
}

// Fields Tandem does not implement are refused with their param, not silently ignored; their empty
// forms (which change nothing) pass.
TEST(RequestParser, UnimplementedFieldsAreRefused) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  for (const auto& [field, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("logit_bias":{"50256":-100})", "logit_bias"},
           {R"("logit_bias":[1])", "logit_bias"},
           {R"("functions":[{"name":"f","parameters":{}}])", "functions"},
           {R"("function_call":"auto")", "function_call"}}) {
    auto r = parse_openai_request(Endpoint::kChatCompletions, "{" + msgs + "," + field + "}");
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.error.http_status, 400) << field;
    EXPECT_EQ(r.error.param, param) << field;
  }
  auto c = parse_openai_request(Endpoint::kCompletions, R"({"prompt":"a","logit_bias":{"1":5}})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error.param, "logit_bias");
  for (const char* empty : {R"("logit_bias":{})", R"("logit_bias":null)", R"("functions":[])", R"("function_call":null)"}) {
    auto r = parse_openai_request(Endpoint::kChatCompletions, "{" + msgs + "," + empty + "}");
    EXPECT_TRUE(r.ok()) << empty << ": " << r.error.message;
  }
}

TEST(RequestParser, NullsAreAbsent) {
  auto r = parse_openai_request(Endpoint::kChatCompletions,
                                R"({"messages":[{"role":"user","content":"x"}],"temperature":null,"stop":null,"tools":null,"n":null})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_FALSE(r.request->temperature_set);
}

// Constrained output (a JSON response format, a named or required tool call) starts at the first
// generated token: the request's thinking flag is cleared, so the prompt has no reasoning block.
TEST(RequestParser, ConstrainedOutputHasNoReasoning) {
  const std::string base = R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":true})";
  const std::string tool = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  struct Case {
    std::string extra;
    bool thinking;
  };
  for (const Case& c : {Case{"", true}, Case{R"(,"response_format":{"type":"json_object"})", false},
                        Case{"," + tool + R"(,"tool_choice":"required")", false},
                        Case{"," + tool + R"(,"tool_choice":{"type":"function","function":{"name":"f"}})", false},
                        Case{"," + tool + R"(,"tool_choice":"auto")", true}}) {
    auto r = parse_openai_request(Endpoint::kChatCompletions, base + c.extra + "}");
    ASSERT_TRUE(r.ok()) << c.extra << ": " << r.error.message;
    EXPECT_EQ(r.request->thinking, c.thinking) << c.extra;
  }
}

TEST(RequestParser, CompletionPrompts) {
  auto r = parse_openai_request(Endpoint::kCompletions, R"({"prompt":[1,2,3],"logprobs":2,"echo":true})");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.request->prompts.size(), 1u);
  EXPECT_TRUE(r.request->prompts[0].is_ids);
  EXPECT_EQ(r.request->prompts[0].ids.size(), 3u);
  EXPECT_EQ(r.request->sampling.logprobs, 2);
  r = parse_openai_request(Endpoint::kCompletions, R"({"prompt":[[5,6]]})");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.request->prompts.size(), 1u);
  EXPECT_EQ(r.request->prompts[0].ids, (std::vector<int32_t>{5, 6}));
  // Batches: all strings or all id arrays, each non-empty, at most kMaxCompletionChoices with n.
  r = parse_openai_request(Endpoint::kCompletions, R"({"prompt":["ab","c"],"n":2})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  ASSERT_EQ(r.request->prompts.size(), 2u);
  EXPECT_EQ(r.request->prompts[1].text, "c");
  EXPECT_EQ(r.request->prompts[0].text, "ab");
  r = parse_openai_request(Endpoint::kCompletions, R"({"prompt":[[1,2],[3]]})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  ASSERT_EQ(r.request->prompts.size(), 2u);
  EXPECT_EQ(r.request->prompts[1].ids, (std::vector<int32_t>{3}));
  std::string many = R"({"n":2,"prompt":[)";
  for (int i = 0; i < 129; ++i) many += std::string(i ? "," : "") + "\"p\"";
  many += "]}";
  for (const std::string& bad : {std::string(R"({"prompt":""})"), std::string(R"({"prompt":[-1]})"), std::string(R"({"prompt":{}})"),
                                 std::string(R"({})"), std::string(R"({"prompt":"a","logprobs":50})"),
                                 std::string(R"({"prompt":["a",[1]]})"), std::string(R"({"prompt":[[1],"a"]})"),
                                 std::string(R"({"prompt":["a",""]})"), std::string(R"({"prompt":[[1],[]]})"),
                                 std::string(R"({"prompt":[]})"), std::string(R"({"prompt":[[]]})"), many}) {
    auto e = parse_openai_request(Endpoint::kCompletions, bad);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.error.http_status, 400);
  }
}

TEST(RequestParser, RandomAndMutatedBodiesNeverThrow) {
  std::mt19937 rng(1234);
  const std::vector<std::string> seeds = {
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}})",
      R"({"prompt":[1,2,3],"max_tokens":5,"logprobs":3,"stop":["a","b"],"n":2})",
  };
  // Split literals: "\x00abc" would be one hex escape (a, b, c are hex digits) and a NUL would end
  // a plain C string; the s suffix keeps the NUL.
  using namespace std::string_literals;
  const std::string alphabet = "{}[]\":,0123456789.-eEtrufalsn \\u\xff" "\x00" "abc"s;
  ASSERT_EQ(alphabet.size(), 37u);
  ASSERT_EQ(alphabet[33], '\0');
  ASSERT_EQ(alphabet.substr(34), "abc");
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[i % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(pos, 1 + rng() % 4); break;
        default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    for (Endpoint ep : {Endpoint::kChatCompletions, Endpoint::kCompletions}) {
      auto r = parse_openai_request(ep, s);
      if (r.ok()) ++accepted;
      else {
        EXPECT_EQ(r.error.http_status, 400);
        EXPECT_FALSE(r.error.message.empty());
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tandem::server
