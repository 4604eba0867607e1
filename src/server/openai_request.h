// The OpenAI request parser: a pure function from an HTTP body to a validated ParsedRequest or an
// ApiError (400 with the offending field). No engine, tokenizer or I/O, so it can be fuzzed alone
// (fuzz/fuzz_request.cpp). Rendering the prompt and resolving the model name happen later.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"

namespace tandem::server {

enum class Endpoint { kChatCompletions, kCompletions };

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };
enum class ResponseFormat { kText, kJsonObject, kJsonSchema };

struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};
// A completions request's prompts x n: the most choices one request may ask for.
inline constexpr int kMaxCompletionChoices = 256;

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;
  // chat: messages normalized to OpenAI form with string content (text parts joined).
  nlohmann::json messages = nlohmann::json::array();
  // completions: the prompts (one, or a batch; with n at most kMaxCompletionChoices), each a string
  // or token ids.
  std::vector<CompletionPrompt> prompts;
  bool echo = false;
  std::string suffix;

  nlohmann::json tools = nlohmann::json::array();  // [{"type":"function","function":{...}}]
  // The request's messages and tools as sent (key order kept) for the prompt encoder.
  nlohmann::ordered_json ordered_messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json ordered_tools = nlohmann::ordered_json::array();
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;                    // kNamed
  bool parallel_tool_calls = true;

  // chat_template_kwargs.thinking / enable_thinking / reasoning_effort; false when the output is
  // constrained (a JSON response format, a named or required tool call: it starts at the first token)
  bool thinking = false;
  std::string reasoning_effort;          // "" | low | medium | high | max

  ResponseFormat response_format = ResponseFormat::kText;
  nlohmann::json json_schema;            // kJsonSchema: the schema object
  std::string json_schema_name;

  SamplingParams sampling;               // fields the client did not set keep engine defaults
  bool max_tokens_set = false;
  double request_timeout_s = 0.0;        // "request_timeout" (seconds; 0 = the server's --request-timeout)
  bool temperature_set = false, top_p_set = false, top_k_set = false;
  int n = 1;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;                  // chat: top_logprobs; completions: logprobs=N
  // vLLM's prompt_logprobs (0..20 alternatives; -1 absent): in the response as vLLM lays it out.
  // The engine's SamplingParams::prompt_logprobs also covers echo with logprobs and max_tokens 0.
  int prompt_logprobs = -1;
  std::string user;
};

struct ParseOutcome {
  std::optional<ParsedRequest> request;
  ApiError error;  // when !request
  bool ok() const { return request.has_value(); }
};

// Never throws, never aborts, for any byte string.
ParseOutcome parse_openai_request(Endpoint endpoint, std::string_view body);

// tool_choice "required": the schema the output is constrained to, a JSON array of {"name",
// "parameters"} items, one of the tools each (at most one item without parallel_tool_calls); each
// tool's parameters keep their own $refs (json_grammar::embed_schema).
nlohmann::json required_tool_calls_schema(const ParsedRequest& r);

}  // namespace tandem::server
