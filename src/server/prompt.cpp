// Chat prompt rendering through the official-format encoder (text/encoding_dsv4.h).
#include "server/prompt.h"

#include "text/encoding_dsv4.h"

namespace tandem::server {

Result<std::string> render_chat_prompt(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       const PromptOptions& options) {
  EncodeOptions eo;
  eo.thinking = options.thinking;
  if (!options.reasoning_effort.empty() && options.thinking) {
    TANDEM_RETURN_IF_ERROR(apply_openai_reasoning_effort(options.reasoning_effort, eo));
    eo.thinking = options.thinking;
  }
  nlohmann::ordered_json t = options.include_tools ? tools : nlohmann::ordered_json::array();
  auto text = encode_messages(messages, t, eo);
  if (!text.ok()) return text.status();
  std::string out = std::move(*text);
  // encode_messages appends the generation prefix only after a user turn; a conversation ending
  // with tool results or an assistant prefix still needs one.
  auto prefix = generation_prefix(options.thinking);
  if (out.size() < prefix.size() || out.compare(out.size() - prefix.size(), prefix.size(), prefix) != 0) {
    out += std::string(prefix);
  }
  return out;
}

}  // namespace tandem::server
