// libFuzzer target: the OpenAI request parser (a pure function body -> request | error) and the
// JSON-schema grammar compiler on whatever schema the body carries. Neither may crash, throw or
// hang on any input; a parsed request must satisfy the invariants the server relies on.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/check.h"
#include "server/openai_request.h"
#include "text/json_schema_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::server;
  if (size > (1 << 16)) return 0;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  // A leading '1' selects /v1/completions so one corpus covers both endpoints.
  Endpoint ep = Endpoint::kChatCompletions;
  if (!body.empty() && body[0] == '1') {
    ep = Endpoint::kCompletions;
    body.remove_prefix(1);
  }
  ParseOutcome r = parse_openai_request(ep, body);
  if (!r.ok()) {
    TANDEM_CHECK(r.error.http_status == 400);
    TANDEM_CHECK(!r.error.message.empty());
    return 0;
  }
  const ParsedRequest& p = *r.request;
  TANDEM_CHECK(p.n >= 1 && p.n <= 16);
  // max_tokens 0 only scores the prompt (echo / prompt_logprobs), which the engine then requires.
  TANDEM_CHECK(p.sampling.max_tokens >= 1 || (p.sampling.max_tokens == 0 && p.sampling.prompt_logprobs >= 0));
  TANDEM_CHECK(p.sampling.prompt_logprobs >= -1 && p.sampling.prompt_logprobs <= 20);
  TANDEM_CHECK(p.prompt_logprobs < 0 || !p.stream);
  TANDEM_CHECK(p.sampling.temperature >= 0.0 && p.sampling.temperature <= 2.0);
  TANDEM_CHECK(p.sampling.logprobs >= -1 && p.sampling.logprobs <= 20);
  if (ep == Endpoint::kChatCompletions) TANDEM_CHECK(!p.messages.empty());
  if (ep == Endpoint::kCompletions) {  // one prompt or a batch, none empty, within the choices' bound
    TANDEM_CHECK(!p.prompts.empty());
    TANDEM_CHECK(static_cast<int64_t>(p.prompts.size()) * p.n <= tandem::server::kMaxCompletionChoices);
    for (const auto& q : p.prompts) TANDEM_CHECK(q.is_ids ? !q.ids.empty() : !q.text.empty());
  }
  if (p.response_format == ResponseFormat::kJsonSchema || p.tool_choice == ToolChoice::kRequired) {
    auto g = tandem::json_grammar::compile(p.response_format == ResponseFormat::kJsonSchema
                                               ? p.json_schema
                                               : required_tool_calls_schema(p));
    if (g.ok()) {
      tandem::json_grammar::Matcher m(*g);
      (void)m.advance(body.substr(0, 256));
      (void)m.is_complete();
    }
  }
  return 0;
}
