// Chat prompt rendering for the server: OpenAI messages (+ tools, thinking, reasoning effort) ->
// the DeepSeek-V4 prompt text ending with the assistant generation prefix, through the
// official-format encoder (text/encoding_dsv4.h). Ordered JSON keeps the client's key order, which
// is part of the prompt (tool schemas, arguments).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/status.h"

namespace tandem::server {

struct PromptOptions {
  bool thinking = false;
  std::string reasoning_effort;   // "" = model default
  bool include_tools = true;      // tool_choice none drops the tool block
};

// Returns the prompt text (BOS included) that ends with "<｜Assistant｜><think>" (thinking) or
// "<｜Assistant｜></think>" (chat mode).
Result<std::string> render_chat_prompt(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       const PromptOptions& options);

}  // namespace tandem::server
