// SSE splitting and chat.completion.chunk reading for the serving benchmark.
#include "loadgen/sse.h"

#include <nlohmann/json.hpp>

namespace tandem::loadgen {

void SseSplitter::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (c == '\n') {
      std::string_view l(line_);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      line(l);
      line_.clear();
    } else {
      line_ += c;
    }
  }
}

void SseSplitter::line(std::string_view l) {
  if (l.empty()) {  // blank line: the event is complete
    if (has_data_) on_data_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment (keep-alive)
  if (l.substr(0, 5) != "data:") return;
  l.remove_prefix(5);
  if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(l);
  has_data_ = true;
}

namespace {
std::string error_text(const nlohmann::json& e) {
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
  return e.dump();
}
int64_t int_field(const nlohmann::json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_number_integer() ? o[key].get<int64_t>() : 0;
}
}  // namespace

ChatChunk parse_chat_chunk(const std::string& data) {
  ChatChunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  auto j = nlohmann::json::parse(data, nullptr, false);
  if (!j.is_object()) {
    c.error = "unparsable stream chunk: " + data.substr(0, 200);
    return c;
  }
  if (j.contains("error") && !j["error"].is_null()) {
    c.error = error_text(j["error"]);
    return c;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const auto& ch = j["choices"][0];
    if (ch.is_object()) {
      if (ch.contains("delta") && ch["delta"].is_object()) {
        const auto& d = ch["delta"];
        // vLLM and Tandem say reasoning_content; newer vLLM and some servers say reasoning.
        for (const char* key : {"content", "reasoning_content", "reasoning"}) {
          if (d.contains(key) && d[key].is_string() && !d[key].get<std::string>().empty()) {
            c.text += d[key].get<std::string>();
            c.carries_tokens = true;
          }
        }
        if (d.contains("tool_calls") && d["tool_calls"].is_array() && !d["tool_calls"].empty())
          c.carries_tokens = true;
      }
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        c.finish_reason = ch["finish_reason"].get<std::string>();
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    c.has_usage = true;
    c.prompt_tokens = int_field(u, "prompt_tokens");
    c.completion_tokens = int_field(u, "completion_tokens");
    if (u.contains("prompt_tokens_details")) c.cached_tokens = int_field(u["prompt_tokens_details"], "cached_tokens");
  }
  return c;
}

}  // namespace tandem::loadgen
