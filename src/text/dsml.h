// DSML, DeepSeek-V4's tool-call markup (spec 10.3): rendering OpenAI tool_calls into DSML (for the
// prompt encoder's assistant history) and an incremental parser turning model output into OpenAI
// streaming deltas (reasoning, content, tool-call start, argument fragments). Both sides share the
// Python-compatible JSON writer below so a rendered call parses back to the same arguments string.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tandem {

// Protocol strings of DeepSeek-V4 (the tokens are single special tokens; the tags are not).
namespace dsv4 {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
// What starts a tool-call block in the model's output ("\n\n" + this in the strict grammar).
inline constexpr std::string_view kToolCallsTag = "<｜DSML｜tool_calls";
}  // namespace dsv4

// ---- JSON exactly as Python's json.dumps(value, ensure_ascii=False) writes it ----
// Separators ", " and ": ", keys in stored order (use ordered_json to keep the input's order),
// non-ASCII written raw, control characters escaped (\n, \t, ... or \u00XX), '/' not escaped.
// Values nested deeper than kMaxJsonNesting are written as null (a guard against stack exhaustion;
// the encoder rejects such input before it gets here, as Python's recursion limit would).
std::string python_json_dumps(const nlohmann::ordered_json& value);
inline constexpr size_t kMaxJsonNesting = 512;
// True when `value` has arrays/objects nested more than `limit` deep (checked without recursion).
bool json_nesting_exceeds(const nlohmann::ordered_json& value, size_t limit = kMaxJsonNesting);
bool json_nesting_exceeds(const nlohmann::json& value, size_t limit = kMaxJsonNesting);
// The quoted JSON string literal of raw UTF-8 text (same escaping rules), appended to `out`.
void append_python_json_string(std::string& out, std::string_view text);

// ---- Rendering (encoder side) ----
// One OpenAI tool call {"id"?, "type"?, "function": {"name", "arguments"}} -> DSML invoke element.
// `arguments` is a JSON string (an object is accepted too); a string that is not JSON is passed
// through as one string parameter named "arguments", as the official encoder does.
// `path` names the call in error messages (e.g. "messages[3].tool_calls[0]").
Result<std::string> render_dsml_invoke(const nlohmann::ordered_json& tool_call, const std::string& path);
// The whole block as it follows an assistant's content: "\n\n<｜DSML｜tool_calls>\n...\n</｜DSML｜tool_calls>".
Result<std::string> render_dsml_tool_calls(const nlohmann::ordered_json& tool_calls, const std::string& path);

// ---- Parsing (server side) ----
struct DsmlToolCall {
  std::string id;         // "call_" + unique suffix
  std::string name;
  std::string arguments;  // JSON object text: {"key": value, ...} in emitted order
};

enum class DsmlDeltaKind {
  kReasoning,      // text: reasoning_content fragment
  kContent,        // text: content fragment
  kToolCallStart,  // tool_index, id, name: a new tool call (arguments follow)
  kToolCallArgs,   // tool_index, text: next fragment of that call's arguments string
};

struct DsmlDelta {
  DsmlDeltaKind kind = DsmlDeltaKind::kContent;
  std::string text;
  int tool_index = -1;
  std::string id;
  std::string name;
};

struct DsmlParserOptions {
  // The prompt ended with "<think>" (thinking mode): output starts as reasoning until "</think>".
  bool thinking = false;
  // Makes tool-call ids; default: "call_" + 24 random alphanumerics. Tests inject a counter.
  std::function<std::string()> make_id;
};

// Aggregated result (what a non-streaming response needs).
struct DsmlParseResult {
  std::string reasoning_content;
  std::string content;
  std::vector<DsmlToolCall> tool_calls;
  std::vector<std::string> warnings;  // malformed markup that was degraded to content, etc.
};

// Incremental parser. Feed decoded text (special tokens included, EOS optional) in chunks of any
// size, then call finish(). The deltas never contain a partial UTF-8 character nor a prefix of the
// tool-call trigger, and the result never depends on how the text was split into chunks.
//
// Degradation rules (never crash, never retract an emitted delta):
//  - markup broken before the first call's `<｜DSML｜invoke name="...">` is complete: the whole
//    block text (with its leading "\n\n") becomes content;
//  - broken after a call started: the open call's arguments are closed as valid JSON holding the
//    parameters completed so far, and the raw text from the broken element on becomes content;
//  - output that ends inside a block closes the open call (truncated output, e.g. max_tokens);
//  - non-whitespace text after </｜DSML｜tool_calls> becomes content;
//  - text after an EOS token is ignored.
// Each degradation adds a warning (also logged at warn level, component "dsml").
//
// Server use, per choice:
//   DsmlStreamParser p({.thinking = prompt_opens_reasoning(prompt)});   // encoding_dsv4.h
//   for each decoded text piece:  send(p.push(piece));   at the end:  send(p.finish());
// where send() maps kReasoning -> delta.reasoning_content, kContent -> delta.content,
// kToolCallStart -> delta.tool_calls[{index, id, type: "function", function: {name, arguments: ""}}],
// kToolCallArgs -> delta.tool_calls[{index, function: {arguments: text}}]; finish_reason is
// "tool_calls" when tool_call_count() > 0.
class DsmlStreamParser {
 public:
  explicit DsmlStreamParser(DsmlParserOptions options = {});
  std::vector<DsmlDelta> push(std::string_view chunk);
  std::vector<DsmlDelta> finish();

  const std::vector<std::string>& warnings() const { return warnings_; }
  int tool_call_count() const { return calls_started_; }

 private:
  enum class State {
    kReasoning, kContent, kBlockOpen, kBetween, kInvokeName, kParamName, kParamFlag,
    kStringValue, kJsonValue, kAfterBlock, kRawContent, kDone,
  };
  void feed(std::string_view text, std::vector<DsmlDelta>& out);  // after EOS filtering
  bool step(std::vector<DsmlDelta>& out);                         // false: needs more input
  bool step_text(std::vector<DsmlDelta>& out, bool reasoning);
  void consume(size_t n);
  void emit_text(std::vector<DsmlDelta>& out, DsmlDeltaKind kind, std::string_view text);
  void emit_args(std::vector<DsmlDelta>& out, std::string_view text);
  void fail(std::vector<DsmlDelta>& out, const std::string& why);
  void close_open_call(std::vector<DsmlDelta>& out);
  void warn(std::string message);

  DsmlParserOptions options_;
  State state_;
  std::string eos_pending_;  // input tail that may be the start of the EOS token
  std::string buf_;          // unconsumed text of the current state
  bool finishing_ = false;
  bool saw_eos_ = false;
  bool warned_after_eos_ = false;

  std::string block_raw_;    // raw text since the block's trigger, until the first call starts
  std::string elem_raw_;     // raw text of the element being parsed (after a call started)
  bool in_invoke_ = false;
  int calls_started_ = 0;
  int params_in_call_ = 0;
  std::string param_name_;
  size_t json_scan_from_ = 0;            // kJsonValue: where to resume looking for the end tag
  std::vector<std::string> param_names_;  // of the open call, to reject duplicates
  std::string after_block_ws_;
  std::vector<std::string> warnings_;
};

// One-shot parse: push(text) + finish(), aggregated.
DsmlParseResult parse_dsml_completion(std::string_view text, const DsmlParserOptions& options = {});

// Aggregates deltas into a result (what a client reassembles from a stream).
void apply_dsml_deltas(const std::vector<DsmlDelta>& deltas, DsmlParseResult& result);

// OpenAI "tool_calls" array: [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::json dsml_tool_calls_to_openai(const std::vector<DsmlToolCall>& calls);

}  // namespace tandem
