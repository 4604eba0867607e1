// DeepSeek-V4 prompt encoder. Mirrors the official encoder's pipeline: normalize the OpenAI
// messages, merge tool results into user turns, sort them by call order, drop old reasoning, then
// render each message followed by its transition tokens. Every text constant here is part of the
// model's training format: change nothing without a fixture proving it.
#include "text/encoding_dsv4.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "text/dsml.h"

namespace tandem {

using nlohmann::ordered_json;

namespace {

// ---- Text of the official encoder (0731) ----

constexpr std::string_view kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

constexpr std::string_view kEffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles "
    "and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

constexpr std::string_view kToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";

constexpr std::string_view kToolsTail =
    "\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const std::map<std::string, std::string_view, std::less<>>& task_tokens() {
  static const std::map<std::string, std::string_view, std::less<>> kTasks = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"},   {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
  };
  return kTasks;
}

// Python truthiness of a JSON value (the official code tests `if tools:` / `if response_format:`).
bool truthy(const ordered_json& v) {
  switch (v.type()) {
    case ordered_json::value_t::null: return false;
    case ordered_json::value_t::boolean: return v.get<bool>();
    case ordered_json::value_t::number_integer: return v.get<int64_t>() != 0;
    case ordered_json::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case ordered_json::value_t::number_float: return v.get<double>() != 0.0;
    case ordered_json::value_t::string: return !v.get_ref<const std::string&>().empty();
    case ordered_json::value_t::array:
    case ordered_json::value_t::object: return !v.empty();
    default: return false;
  }
}

// ---- Normalized message ----

struct Block {
  bool tool_result = false;
  std::string text;         // text block text, or the tool result's content
  std::string tool_use_id;  // tool results only
};

struct Msg {
  std::string role;
  std::string content;
  std::vector<Block> blocks;  // user messages after merging
  ordered_json tools;         // null unless truthy
  ordered_json response_format;  // null unless truthy
  ordered_json tool_calls;    // null unless a non-empty array (assistant)
  std::string reasoning;
  std::optional<std::string> task;
  bool wo_eos = false;
  std::string tool_call_id;
};

bool is_role(std::string_view r) {
  return r == "system" || r == "user" || r == "assistant" || r == "tool" || r == "developer" ||
         r == "latest_reminder";
}

// content: string | null | [{"type":"text","text":...}, ...]
Result<std::string> content_text(const ordered_json& msg, const std::string& path, std::string_view joiner) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return invalid_argument("{}.content: must be a string, null or an array of text parts", path);
  std::string out;
  for (size_t j = 0; j < it->size(); ++j) {
    const ordered_json& part = (*it)[j];
    std::string ppath = fmt::format("{}.content[{}]", path, j);
    if (!part.is_object()) return invalid_argument("{}: must be an object", ppath);
    auto t = part.find("type");
    if (t == part.end() || !t->is_string()) return invalid_argument("{}.type: must be a string", ppath);
    if (*t != "text") {
      return invalid_argument("{}.type: unsupported content part type '{}' (only text)", ppath,
                              t->get<std::string>());
    }
    auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string()) return invalid_argument("{}.text: must be a string", ppath);
    if (j > 0) out += joiner;
    out += tx->get_ref<const std::string&>();
  }
  return out;
}

Result<std::string> optional_string(const ordered_json& msg, const char* key, const std::string& path) {
  auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return std::string();
  if (!it->is_string()) return invalid_argument("{}.{}: must be a string", path, key);
  return it->get<std::string>();
}

Status validate_tools(const ordered_json& tools, const std::string& path) {
  if (!tools.is_array()) return invalid_argument("{}: must be an array of tools", path);
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    auto fn = t.is_object() ? t.find("function") : t.end();
    if (!t.is_object() || fn == t.end() || !fn->is_object()) {
      return invalid_argument("{}[{}].function: must be an object (OpenAI function tool)", path, i);
    }
  }
  return Status();
}

Result<Msg> normalize(const ordered_json& m, size_t index) {
  std::string path = fmt::format("messages[{}]", index);
  if (!m.is_object()) return invalid_argument("{}: must be an object", path);
  Msg out;
  auto rit = m.find("role");
  if (rit == m.end() || !rit->is_string()) return invalid_argument("{}.role: must be a string", path);
  out.role = rit->get<std::string>();
  if (!is_role(out.role)) {
    return invalid_argument("{}.role: unsupported role '{}' (system, user, assistant, tool, developer, "
                            "latest_reminder)", path, out.role);
  }
  TANDEM_ASSIGN_OR_RETURN(out.content, content_text(m, path, out.role == "tool" ? "\n\n" : "\n"));
  if (out.role == "developer" && out.content.empty()) {
    return invalid_argument("{}.content: a developer message needs non-empty content", path);
  }
  if (auto it = m.find("tools"); it != m.end() && truthy(*it)) {
    TANDEM_RETURN_IF_ERROR(validate_tools(*it, path + ".tools"));
    out.tools = *it;
  }
  if (auto it = m.find("response_format"); it != m.end() && truthy(*it)) out.response_format = *it;
  if (out.role == "assistant") {
    if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
      if (!it->is_array()) return invalid_argument("{}.tool_calls: must be an array", path);
      if (!it->empty()) out.tool_calls = *it;
    }
  }
  TANDEM_ASSIGN_OR_RETURN(out.reasoning, optional_string(m, "reasoning_content", path));
  if (auto it = m.find("task"); it != m.end() && !it->is_null()) {
    if (!it->is_string() || !task_tokens().count(it->get<std::string>())) {
      return invalid_argument("{}.task: must be one of action, query, authority, domain, title, read_url", path);
    }
    out.task = it->get<std::string>();
  }
  if (auto it = m.find("wo_eos"); it != m.end() && !it->is_null()) {
    if (!it->is_boolean()) return invalid_argument("{}.wo_eos: must be a boolean", path);
    out.wo_eos = it->get<bool>();
  }
  TANDEM_ASSIGN_OR_RETURN(out.tool_call_id, optional_string(m, "tool_call_id", path));
  return out;
}

// Tool messages become <tool_result> blocks of a user turn; consecutive user turns (and a user turn
// right after tool results) merge into one, unless the earlier one carries a task.
std::vector<Msg> merge_tool_messages(std::vector<Msg> msgs) {
  std::vector<Msg> merged;
  for (Msg& m : msgs) {
    if (m.role == "tool") {
      Block b{true, std::move(m.content), std::move(m.tool_call_id)};
      if (!merged.empty() && merged.back().role == "user" && !merged.back().blocks.empty()) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Msg u;
        u.role = "user";
        u.blocks.push_back(std::move(b));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      Block b{false, m.content, ""};
      if (!merged.empty() && merged.back().role == "user" && !merged.back().blocks.empty() &&
          !merged.back().task) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Msg u;  // the official code keeps only content, task and wo_eos of a user message
        u.role = "user";
        u.content = std::move(m.content);
        u.blocks.push_back(std::move(b));
        u.task = std::move(m.task);
        u.wo_eos = m.wo_eos;
        merged.push_back(std::move(u));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

std::string call_id(const ordered_json& call) {
  if (!call.is_object()) return "";
  if (auto it = call.find("id"); it != call.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
    return it->get<std::string>();
  }
  if (auto fn = call.find("function"); fn != call.end() && fn->is_object()) {
    if (auto it = fn->find("id"); it != fn->end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

// Tool results of one user turn follow the order of the calls in the last assistant turn with
// calls (unknown ids sort as position 0; the sort is stable).
void sort_tool_results(std::vector<Msg>& msgs) {
  std::map<std::string, size_t> order;
  for (Msg& m : msgs) {
    if (m.role == "assistant" && !m.tool_calls.is_null()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        std::string id = call_id(m.tool_calls[i]);
        if (!id.empty()) order[id] = i;
      }
    } else if (m.role == "user" && !m.blocks.empty()) {
      std::vector<Block> results;
      for (const Block& b : m.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() <= 1 || order.empty()) continue;
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) {
        auto ia = order.find(a.tool_use_id), ib = order.find(b.tool_use_id);
        size_t ka = ia == order.end() ? 0 : ia->second, kb = ib == order.end() ? 0 : ib->second;
        return ka < kb;
      });
      size_t k = 0;
      for (Block& b : m.blocks) {
        if (b.tool_result) b = results[k++];
      }
    }
  }
}

int last_user_index(const std::vector<Msg>& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    if (msgs[i].role == "user" || msgs[i].role == "developer") return i;
  }
  return -1;
}

// Before the last user turn: assistant turns lose their reasoning, developer turns are dropped.
std::vector<Msg> drop_thinking(std::vector<Msg> msgs) {
  int last_user = last_user_index(msgs);
  std::vector<Msg> out;
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    Msg& m = msgs[i];
    bool keep = m.role == "user" || m.role == "system" || m.role == "tool" || m.role == "latest_reminder";
    if (keep || i >= last_user) {
      out.push_back(std::move(m));
    } else if (m.role == "assistant") {
      m.reasoning.clear();
      out.push_back(std::move(m));
    }
  }
  return out;
}

Status append_system_extras(std::string& prompt, const Msg& m, size_t index) {
  if (!m.tools.is_null()) {
    TANDEM_ASSIGN_OR_RETURN(std::string tools, render_tools_section(m.tools, fmt::format("messages[{}].tools", index)));
    prompt += "\n\n";
    prompt += tools;
  }
  if (!m.response_format.is_null()) {
    prompt += "\n\n";
    prompt += kResponseFormatHead;
    prompt += python_json_dumps(m.response_format);
  }
  return Status();
}

Status render_message(std::string& prompt, size_t index, const std::vector<Msg>& msgs, const EncodeOptions& opt,
                      bool drop, std::string_view effort_prefix) {
  const Msg& m = msgs[index];
  const int last_user = last_user_index(msgs);
  if (index == 0 && opt.thinking) prompt += effort_prefix;

  if (m.role == "system") {
    prompt += m.content;
    TANDEM_RETURN_IF_ERROR(append_system_extras(prompt, m, index));
  } else if (m.role == "developer") {
    prompt += dsv4::kUser;
    prompt += m.content;
    TANDEM_RETURN_IF_ERROR(append_system_extras(prompt, m, index));
  } else if (m.role == "user") {
    prompt += dsv4::kUser;
    for (size_t i = 0; i < m.blocks.size(); ++i) {
      if (i > 0) prompt += "\n\n";
      const Block& b = m.blocks[i];
      if (b.tool_result) {
        prompt += "<tool_result>";
        prompt += b.text;
        prompt += "</tool_result>";
      } else {
        prompt += b.text;
      }
    }
  } else if (m.role == "latest_reminder") {
    prompt += dsv4::kLatestReminder;
    prompt += m.content;
  } else if (m.role == "assistant") {
    std::string calls;
    if (!m.tool_calls.is_null()) {
      TANDEM_ASSIGN_OR_RETURN(calls, render_dsml_tool_calls(m.tool_calls, fmt::format("messages[{}].tool_calls", index)));
    }
    bool prev_has_task = index > 0 && msgs[index - 1].task.has_value();
    if (opt.thinking && !prev_has_task && (!drop || static_cast<int>(index) > last_user)) {
      prompt += m.reasoning;
      prompt += dsv4::kThinkEnd;
    }
    prompt += m.content;
    prompt += calls;
    if (!m.wo_eos) prompt += dsv4::kEos;
  } else {
    return Status(StatusCode::kInternal, "unmerged role " + m.role);  // merge removed tool messages
  }

  // Transition: only before an assistant / latest_reminder turn or at the end of the conversation.
  if (index + 1 < msgs.size() && msgs[index + 1].role != "assistant" && msgs[index + 1].role != "latest_reminder") {
    return Status();
  }
  if (m.task) {
    if (*m.task == "action") {
      prompt += dsv4::kAssistant;
      prompt += opt.thinking ? dsv4::kThinkStart : dsv4::kThinkEnd;
    }
    prompt += task_tokens().find(*m.task)->second;
  } else if (m.role == "user" || m.role == "developer") {
    prompt += dsv4::kAssistant;
    bool think = opt.thinking && (!drop || static_cast<int>(index) >= last_user);
    prompt += think ? dsv4::kThinkStart : dsv4::kThinkEnd;
  }
  return Status();
}

}  // namespace

Result<std::string> render_tools_section(const ordered_json& tools, const std::string& path) {
  TANDEM_RETURN_IF_ERROR(validate_tools(tools, path));
  std::string out(kToolsHead);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) out += "\n";
    out += python_json_dumps(tools[i]["function"]);
  }
  out += kToolsTail;
  return out;
}

Result<std::string> encode_messages(const ordered_json& messages, const ordered_json& tools,
                                    const EncodeOptions& options) {
  std::string_view effort_prefix;
  if (options.reasoning_effort == "high") {
    effort_prefix = kEffortHigh;
  } else if (options.reasoning_effort == "max") {
    effort_prefix = kEffortMax;
  } else if (!options.reasoning_effort.empty() && options.reasoning_effort != "low") {
    return invalid_argument("reasoning_effort: '{}' is not one of low, high, max", options.reasoning_effort);
  }
  if (!messages.is_array()) return invalid_argument("messages: must be an array");
  // Everything below may recurse over the JSON (copies, writer): refuse absurd nesting first.
  if (json_nesting_exceeds(messages)) return invalid_argument("messages: nested deeper than {} levels", kMaxJsonNesting);
  if (json_nesting_exceeds(tools)) return invalid_argument("tools: nested deeper than {} levels", kMaxJsonNesting);

  std::vector<Msg> msgs;
  msgs.reserve(messages.size() + 1);
  for (size_t i = 0; i < messages.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(Msg m, normalize(messages[i], i));
    msgs.push_back(std::move(m));
  }
  if (options.continue_final_message && !msgs.empty() && msgs.back().role == "assistant") {
    msgs.back().wo_eos = true;
  }
  if (!tools.is_null() && !(tools.is_array() && tools.empty())) {
    TANDEM_RETURN_IF_ERROR(validate_tools(tools, "tools"));
    if (!msgs.empty() && msgs[0].role == "system") {
      if (!msgs[0].tools.is_null()) {
        return invalid_argument("tools: given both in the request and in messages[0].tools");
      }
      msgs[0].tools = tools;
    } else {
      Msg sys;
      sys.role = "system";
      sys.tools = tools;
      msgs.insert(msgs.begin(), std::move(sys));
    }
  }

  msgs = merge_tool_messages(std::move(msgs));
  sort_tool_results(msgs);
  bool drop = options.drop_thinking;
  for (const Msg& m : msgs) {
    if (!m.tools.is_null()) drop = false;
  }
  if (options.thinking && drop) msgs = drop_thinking(std::move(msgs));

  std::string prompt = options.add_bos ? std::string(dsv4::kBos) : std::string();
  for (size_t i = 0; i < msgs.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(render_message(prompt, i, msgs, options, drop, effort_prefix));
  }
  return prompt;
}

Result<std::string> encode_messages(const nlohmann::json& messages, const nlohmann::json& tools,
                                    const EncodeOptions& options) {
  if (json_nesting_exceeds(messages)) return invalid_argument("messages: nested deeper than {} levels", kMaxJsonNesting);
  if (json_nesting_exceeds(tools)) return invalid_argument("tools: nested deeper than {} levels", kMaxJsonNesting);
  // Different basic_json specialisations: round-trip through text (objects come out sorted).
  ordered_json m = ordered_json::parse(messages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                      nullptr, /*allow_exceptions=*/false);
  ordered_json t = ordered_json::parse(tools.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                      nullptr, /*allow_exceptions=*/false);
  return encode_messages(m, t, options);
}

std::string_view generation_prefix(bool thinking) {
  return thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return prompt.size() >= dsv4::kThinkStart.size() &&
         prompt.substr(prompt.size() - dsv4::kThinkStart.size()) == dsv4::kThinkStart;
}

Status apply_openai_reasoning_effort(std::string_view value, EncodeOptions& options) {
  if (value == "none") {
    options.thinking = false;
    options.reasoning_effort.clear();
  } else if (value == "minimal" || value == "low") {
    options.reasoning_effort = "low";
  } else if (value == "medium" || value == "high") {
    options.reasoning_effort = "high";
  } else if (value == "xhigh" || value == "max") {
    options.reasoning_effort = "max";
  } else {
    return invalid_argument("reasoning_effort: unsupported value '{}' (none, minimal, low, medium, high, xhigh, max)",
                            value);
  }
  return Status();
}

}  // namespace tandem
