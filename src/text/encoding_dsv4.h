// DeepSeek-V4 prompt encoder: OpenAI-style chat messages (+ tools) -> the prompt text, byte for byte
// as the official `encoding/encoding_dsv4.py` (0731 release) renders it. Covers system, user,
// assistant (content, reasoning_content, tool_calls as DSML), tool results merged into the next user
// turn, latest_reminder, developer, task tokens, response_format, chat vs thinking mode, drop_thinking
// and the 0731 reasoning-effort prefixes. Tool calls are rendered by text/dsml.h so that the encoder
// and the output parser agree.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tandem {

struct EncodeOptions {
  // Thinking mode ("thinking" in the official code): the answer opens with "<think>" and the
  // reasoning of the current turn is kept. false = chat mode ("</think>" right after Assistant).
  bool thinking = false;
  // 0731 levels: "" or "low" (default, no prefix), "high", "max". Only used in thinking mode.
  std::string reasoning_effort;
  // Drop reasoning_content of assistant turns before the last user message (official default).
  // Ignored (nothing dropped) when any message carries tools.
  bool drop_thinking = true;
  // Start with <｜begin▁of▁sentence｜> (the tokenizer adds no BOS by itself).
  bool add_bos = true;
  // When the conversation ends with an assistant message, leave it open (no EOS) so the model
  // continues it (the official per-message "wo_eos"; vLLM's continue_final_message).
  bool continue_final_message = false;
};

// Renders `messages` (a JSON array of OpenAI messages) with `tools` (an OpenAI "tools" array, or
// null / empty). Messages: role system | user | assistant | tool | developer | latest_reminder;
// content a string, null, or an array of {"type":"text","text":...} parts (joined with "\n"; tool
// results' parts with "\n\n" as the official encoder does); assistant tool_calls with
// function.arguments as a JSON string; tool messages with tool_call_id. Official extras are
// honoured: per-message "tools" / "response_format" (system, developer), "task", "wo_eos".
// `tools` are attached to messages[0] when it is a system message (as the official tests do),
// otherwise to a new empty system message put first.
// Bad input -> InvalidArgument naming the message index and field ("messages[2].content[0].type").
//
// Key order of tool schemas and of tool-call arguments is part of the prompt: pass
// nlohmann::ordered_json parsed from the request to reproduce the client's order. The
// nlohmann::json overload works too, but its objects are sorted by key.
Result<std::string> encode_messages(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                    const EncodeOptions& options);
Result<std::string> encode_messages(const nlohmann::json& messages, const nlohmann::json& tools,
                                    const EncodeOptions& options);

// What an assistant turn opens with after the last user message: "<｜Assistant｜><think>" in
// thinking mode, "<｜Assistant｜></think>" in chat mode. encode_messages appends it whenever the
// conversation ends with a user (or developer) message.
std::string_view generation_prefix(bool thinking);

// True when `prompt` leaves the model inside a reasoning block (it ends with "<think>"): the output
// parser (DsmlParserOptions::thinking) must then start in reasoning mode.
bool prompt_opens_reasoning(std::string_view prompt);

// Maps an OpenAI `reasoning_effort` onto the 0731 levels: "minimal"/"low" -> "low",
// "medium"/"high" -> "high", "xhigh"/"max" -> "max", "none" -> thinking off. Other values are an
// InvalidArgument error naming the field.
Status apply_openai_reasoning_effort(std::string_view value, EncodeOptions& options);

// The "## Tools" section for a list of OpenAI tools (exact TOOLS_TEMPLATE text).
Result<std::string> render_tools_section(const nlohmann::ordered_json& tools, const std::string& path);

}  // namespace tandem
