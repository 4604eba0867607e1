// OpenAI /v1/chat/completions and /v1/completions body validation. Every field access checks the
// JSON type first (nlohmann's get<> throws on mismatch), and the whole parse is additionally
// wrapped so that no input can escape as an exception.
#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cctype>

#include "text/json_schema_grammar.h"

namespace tandem::server {
namespace {

using json = nlohmann::json;

struct Fail {
  ApiError error;
};

[[noreturn]] void fail(std::string message, std::string param) { throw Fail{bad_request(std::move(message), std::move(param))}; }

bool present(const json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

double get_number(const json& body, const char* key, double lo, double hi) {
  const json& v = body.at(key);
  if (!v.is_number()) fail(fmt::format("'{}' must be a number", key), key);
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) fail(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
  return x;
}

int64_t get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json& v = body.at(key);
  int64_t x = 0;
  if (v.is_number_integer()) {
    x = v.is_number_unsigned() ? (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v.get<uint64_t>()))
                               : v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e18) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    fail(fmt::format("'{}' must be an integer", key), key);
  }
  if (x < lo || x > hi) fail(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
  return x;
}

bool get_bool(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) fail(fmt::format("'{}' must be a boolean", key), key);
  return v.get<bool>();
}

std::string get_string(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_string()) fail(fmt::format("'{}' must be a string", key), key);
  return v.get<std::string>();
}

// Content: a string, null, or an array of {"type":"text","text":...} parts (joined).
json normalize_content(const json& content, const std::string& where, bool allow_null) {
  if (content.is_null()) {
    if (!allow_null) fail(where + ".content must not be null", where + ".content");
    return json(nullptr);
  }
  if (content.is_string()) return content;
  if (content.is_array()) {
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
      const json& part = content[i];
      std::string pw = fmt::format("{}.content[{}]", where, i);
      if (!part.is_object()) fail(pw + " must be an object", pw);
      auto type = part.find("type");
      if (type == part.end() || !type->is_string()) fail(pw + ".type must be a string", pw + ".type");
      if (*type != "text") fail(fmt::format("{}.type '{}' is not supported (text only)", pw, type->get<std::string>()), pw + ".type");
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) fail(pw + ".text must be a string", pw + ".text");
      text += t->get<std::string>();
    }
    return json(text);
  }
  fail(where + ".content must be a string or an array of text parts", where + ".content");
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

json parse_messages(const json& body) {
  if (!body.contains("messages")) fail("'messages' is required", "messages");
  const json& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty()) fail("'messages' must be a non-empty array", "messages");
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) fail(where + " must be an object", where);
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) fail(where + ".role must be a string", where + ".role");
    std::string role = role_it->get<std::string>();
    json n = {{"role", role}};
    if (role == "system" || role == "developer" || role == "user") {
      if (!m.contains("content")) fail(where + ".content is required", where + ".content");
      n["content"] = normalize_content(m["content"], where, false);
    } else if (role == "assistant") {
      n["content"] = normalize_content(m.value("content", json(nullptr)), where, true);
      if (present(m, "reasoning_content")) {
        if (!m["reasoning_content"].is_string()) fail(where + ".reasoning_content must be a string", where + ".reasoning_content");
        n["reasoning_content"] = m["reasoning_content"];
      }
      if (present(m, "tool_calls")) {
        const json& tcs = m["tool_calls"];
        if (!tcs.is_array()) fail(where + ".tool_calls must be an array", where + ".tool_calls");
        json calls = json::array();
        for (size_t k = 0; k < tcs.size(); ++k) {
          const json& tc = tcs[k];
          std::string tw = fmt::format("{}.tool_calls[{}]", where, k);
          if (!tc.is_object()) fail(tw + " must be an object", tw);
          auto fn = tc.find("function");
          if (fn == tc.end() || !fn->is_object()) fail(tw + ".function must be an object", tw + ".function");
          auto name = fn->find("name");
          if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
            fail(tw + ".function.name must be a non-empty string", tw + ".function.name");
          std::string args = "{}";
          if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
            if (a->is_string()) args = a->get<std::string>();
            else if (a->is_object()) args = dump_json(*a);
            else fail(tw + ".function.arguments must be a JSON string", tw + ".function.arguments");
            json parsed = json::parse(args, nullptr, false);
            if (parsed.is_discarded() || !parsed.is_object())
              fail(tw + ".function.arguments must be a JSON object encoded as a string", tw + ".function.arguments");
          }
          std::string id;
          if (auto idv = tc.find("id"); idv != tc.end() && idv->is_string()) id = idv->get<std::string>();
          calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", args}}}});
        }
        if (!calls.empty()) n["tool_calls"] = calls;
      }
      if (n["content"].is_null() && !n.contains("tool_calls")) n["content"] = "";
    } else if (role == "tool") {
      if (!m.contains("content")) fail(where + ".content is required", where + ".content");
      n["content"] = normalize_content(m["content"], where, false);
      if (present(m, "tool_call_id")) {
        if (!m["tool_call_id"].is_string()) fail(where + ".tool_call_id must be a string", where + ".tool_call_id");
        n["tool_call_id"] = m["tool_call_id"];
      }
    } else {
      fail(fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool", where, role), where + ".role");
    }
    out.push_back(std::move(n));
  }
  return out;
}

void parse_tools(const json& body, ParsedRequest& r) {
  if (present(body, "tools")) {
    const json& tools = body["tools"];
    if (!tools.is_array()) fail("'tools' must be an array", "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) fail(where + " must be an object", where);
      if (t.contains("type") && t["type"] != "function") fail(where + ".type must be \"function\"", where + ".type");
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) fail(where + ".function must be an object", where + ".function");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !valid_function_name(name->get<std::string>()))
        fail(where + ".function.name must match [A-Za-z0-9_.-]{1,64}", where + ".function.name");
      json f = {{"name", *name}};
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
        if (!d->is_string()) fail(where + ".function.description must be a string", where + ".function.description");
        f["description"] = *d;
      }
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object()) fail(where + ".function.parameters must be a JSON Schema object", where + ".function.parameters");
        f["parameters"] = *p;
      } else {
        f["parameters"] = {{"type", "object"}, {"properties", json::object()}};
      }
      for (const auto& other : r.tools)
        if (other["function"]["name"] == f["name"]) fail(where + ".function.name is duplicated", where + ".function.name");
      r.tools.push_back({{"type", "function"}, {"function", f}});
    }
  }
  if (present(body, "tool_choice")) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      std::string s = tc.get<std::string>();
      if (s == "auto") r.tool_choice = ToolChoice::kAuto;
      else if (s == "none") r.tool_choice = ToolChoice::kNone;
      else if (s == "required") r.tool_choice = ToolChoice::kRequired;
      else fail("'tool_choice' must be auto, none, required or {\"type\":\"function\",...}", "tool_choice");
    } else if (tc.is_object()) {
      auto fn = tc.find("function");
      if (fn == tc.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        fail("'tool_choice.function.name' must be a string", "tool_choice");
      r.tool_choice = ToolChoice::kNamed;
      r.tool_choice_name = (*fn)["name"].get<std::string>();
      bool found = false;
      for (const auto& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
      if (!found) fail(fmt::format("'tool_choice' names '{}', which is not in 'tools'", r.tool_choice_name), "tool_choice");
    } else {
      fail("'tool_choice' must be a string or an object", "tool_choice");
    }
    if ((r.tool_choice == ToolChoice::kRequired) && r.tools.empty())
      fail("'tool_choice' is required but no 'tools' were given", "tool_choice");
  }
  if (present(body, "parallel_tool_calls")) r.parallel_tool_calls = get_bool(body, "parallel_tool_calls");
}

void parse_response_format(const json& body, ParsedRequest& r) {
  if (!present(body, "response_format")) return;
  const json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    fail("'response_format' must be an object with a string 'type'", "response_format");
  std::string type = rf["type"].get<std::string>();
  if (type == "text") {
    r.response_format = ResponseFormat::kText;
  } else if (type == "json_object") {
    r.response_format = ResponseFormat::kJsonObject;
  } else if (type == "json_schema") {
    r.response_format = ResponseFormat::kJsonSchema;
    auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object()) fail("'response_format.json_schema' must be an object", "response_format.json_schema");
    auto schema = js->find("schema");
    if (schema == js->end() || !(schema->is_object() || schema->is_boolean()))
      fail("'response_format.json_schema.schema' must be a JSON Schema object", "response_format.json_schema.schema");
    r.json_schema = *schema;
    if (auto n = js->find("name"); n != js->end() && n->is_string()) r.json_schema_name = n->get<std::string>();
  } else {
    fail(fmt::format("'response_format.type' '{}' is not one of text, json_object, json_schema", type), "response_format.type");
  }
}

void parse_sampling(const json& body, ParsedRequest& r) {
  SamplingParams& s = r.sampling;
  if (present(body, "temperature")) { s.temperature = get_number(body, "temperature", 0.0, 2.0); r.temperature_set = true; }
  if (present(body, "top_p")) { s.top_p = get_number(body, "top_p", 0.0, 1.0); r.top_p_set = true;
    if (s.top_p <= 0.0) fail("'top_p' must be in (0, 1]", "top_p"); }
  if (present(body, "top_k")) { int64_t k = get_int(body, "top_k", -1, 1 << 20); s.top_k = k < 0 ? 0 : static_cast<int>(k); r.top_k_set = true; }
  if (present(body, "min_p")) s.min_p = get_number(body, "min_p", 0.0, 1.0);
  if (present(body, "presence_penalty")) s.presence_penalty = get_number(body, "presence_penalty", -2.0, 2.0);
  if (present(body, "frequency_penalty")) s.frequency_penalty = get_number(body, "frequency_penalty", -2.0, 2.0);
  if (present(body, "repetition_penalty")) {
    s.repetition_penalty = get_number(body, "repetition_penalty", 0.0, 10.0);
    if (s.repetition_penalty <= 0.0) fail("'repetition_penalty' must be > 0", "repetition_penalty");
  }
  if (present(body, "seed")) s.seed = static_cast<uint64_t>(get_int(body, "seed", INT64_MIN, INT64_MAX));
  // Not implemented: refused rather than silently ignored (an empty map changes nothing).
  if (present(body, "logit_bias")) {
    if (!body["logit_bias"].is_object()) fail("'logit_bias' must be an object", "logit_bias");
    if (!body["logit_bias"].empty()) fail("'logit_bias' is not supported", "logit_bias");
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (present(body, key)) {
      s.max_tokens = static_cast<int>(get_int(body, key, 0, 1 << 30));  // 0: checked below
      r.max_tokens_set = true;
    }
  }
  if (present(body, "ignore_eos")) s.ignore_eos = get_bool(body, "ignore_eos");
  if (present(body, "request_timeout")) {
    r.request_timeout_s = get_number(body, "request_timeout", 0.0, 604800.0);
    if (r.request_timeout_s <= 0.0) fail("'request_timeout' must be a number of seconds > 0", "request_timeout");
  }
  if (present(body, "stop")) {
    const json& st = body["stop"];
    if (st.is_string()) {
      if (!st.get<std::string>().empty()) s.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > 16) fail("'stop' may hold at most 16 strings", "stop");
      for (const auto& x : st) {
        if (!x.is_string()) fail("'stop' must be a string or an array of strings", "stop");
        if (!x.get<std::string>().empty()) s.stop.push_back(x.get<std::string>());
      }
    } else {
      fail("'stop' must be a string or an array of strings", "stop");
    }
  }
  if (present(body, "stop_token_ids")) {
    const json& st = body["stop_token_ids"];
    if (!st.is_array() || st.size() > 64) fail("'stop_token_ids' must be an array of at most 64 token ids", "stop_token_ids");
    for (const auto& x : st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        fail("'stop_token_ids' must hold non-negative integers", "stop_token_ids");
      s.stop_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  if (present(body, "prompt_logprobs")) r.prompt_logprobs = static_cast<int>(get_int(body, "prompt_logprobs", 0, 20));
  if (present(body, "n")) r.n = static_cast<int>(get_int(body, "n", 1, 16));
  if (present(body, "stream")) r.stream = get_bool(body, "stream");
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) fail("'stream_options' must be an object", "stream_options");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean()) fail("'stream_options.include_usage' must be a boolean", "stream_options.include_usage");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(body, "user")) r.user = get_string(body, "user");
}

void parse_chat(const json& body, ParsedRequest& r) {
  // The legacy function-calling fields: ignoring them would answer without the calls asked for.
  for (const char* key : {"functions", "function_call"})
    if (present(body, key) && !(body[key].is_array() && body[key].empty()))
      fail(fmt::format("'{}' is not supported: send 'tools' and 'tool_choice'", key), key);
  r.messages = parse_messages(body);
  parse_tools(body, r);
  parse_response_format(body, r);
  if (present(body, "logprobs")) r.logprobs = get_bool(body, "logprobs");
  if (present(body, "top_logprobs")) {
    r.top_logprobs = static_cast<int>(get_int(body, "top_logprobs", 0, 20));
    if (!r.logprobs && r.top_logprobs > 0) fail("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  }
  if (present(body, "chat_template_kwargs")) {
    const json& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (present(kw, key)) {
        if (!kw[key].is_boolean()) fail(fmt::format("'chat_template_kwargs.{}' must be a boolean", key), "chat_template_kwargs");
        r.thinking = kw[key].get<bool>();
      }
    }
    if (present(kw, "reasoning_effort")) {
      if (!kw["reasoning_effort"].is_string()) fail("'chat_template_kwargs.reasoning_effort' must be a string", "chat_template_kwargs");
      r.reasoning_effort = kw["reasoning_effort"].get<std::string>();
    }
  }
  if (present(body, "reasoning_effort")) r.reasoning_effort = get_string(body, "reasoning_effort");
  if (!r.reasoning_effort.empty()) {
    static const char* kLevels[] = {"none", "minimal", "low", "medium", "high", "max"};
    bool ok = false;
    for (const char* l : kLevels) ok = ok || r.reasoning_effort == l;
    if (!ok) fail(fmt::format("'reasoning_effort' '{}' is not one of none, minimal, low, medium, high, max", r.reasoning_effort), "reasoning_effort");
    // Asking for an effort level means asking for reasoning (as OpenAI's reasoning models do).
    if (r.reasoning_effort != "none" && !present(body, "chat_template_kwargs")) r.thinking = true;
    if (r.reasoning_effort == "none") r.thinking = false;
  }
}

void parse_completion(const json& body, ParsedRequest& r) {
  if (!body.contains("prompt")) fail("'prompt' is required", "prompt");
  const json& p = body["prompt"];
  auto ids_of = [&](const json& arr) {
    CompletionPrompt cp;
    cp.is_ids = true;
    for (const auto& x : arr) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        fail("'prompt' token ids must be non-negative integers", "prompt");
      cp.ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    if (cp.ids.empty()) fail("'prompt' must not be empty", "prompt");
    return cp;
  };
  auto text_of = [&](const json& x) {
    CompletionPrompt cp;
    cp.text = x.get<std::string>();
    if (cp.text.empty()) fail("'prompt' must not be empty", "prompt");
    return cp;
  };
  // A string, token ids, or a batch of either (all strings or all id arrays).
  if (p.is_string()) {
    r.prompts.push_back(text_of(p));
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompts.push_back(ids_of(p));
  } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    const bool strings = p[0].is_string();
    for (const auto& x : p) {
      if (strings ? !x.is_string() : !x.is_array())
        fail("a batch of prompts must be all strings or all arrays of token ids", "prompt");
      r.prompts.push_back(strings ? text_of(x) : ids_of(x));
    }
  } else {
    fail("'prompt' must be a string, an array of token ids, or a batch of either", "prompt");
  }
  if (present(body, "echo")) r.echo = get_bool(body, "echo");
  if (present(body, "suffix")) fail("'suffix' is not supported", "suffix");
  if (present(body, "logprobs")) {
    r.top_logprobs = static_cast<int>(get_int(body, "logprobs", 0, 20));
    r.logprobs = true;
  }
  if (present(body, "best_of") && get_int(body, "best_of", 1, 16) != 1) fail("'best_of' > 1 is not supported", "best_of");
  parse_response_format(body, r);
}

}  // namespace

json required_tool_calls_schema(const ParsedRequest& r) {
  json alts = json::array(), defs = json::object();
  for (size_t i = 0; i < r.tools.size(); ++i) {
    const json& t = r.tools[i];
    const json params = json_grammar::embed_schema(t["function"]["parameters"], "tool" + std::to_string(i), defs);
    alts.push_back({{"type", "object"},
                    {"properties", {{"name", {{"const", t["function"]["name"]}}}, {"parameters", params}}},
                    {"required", {"name", "parameters"}},
                    {"additionalProperties", false}});
  }
  json schema = {{"type", "array"}, {"items", {{"anyOf", alts}}}, {"minItems", 1}, {"$defs", defs}};
  if (!r.parallel_tool_calls) schema["maxItems"] = 1;
  return schema;
}

ParseOutcome parse_openai_request(Endpoint endpoint, std::string_view body_text) {
  ParseOutcome out;
  try {
    json body = json::parse(body_text.begin(), body_text.end(), nullptr, false);
    if (body.is_discarded()) fail("request body is not valid JSON", "");
    if (!body.is_object()) fail("request body must be a JSON object", "");
    ParsedRequest r;
    r.endpoint = endpoint;
    if (present(body, "model")) r.model = get_string(body, "model");
    if (endpoint == Endpoint::kChatCompletions) {
      parse_chat(body, r);
      // Validated above; parsed again keeping key order (part of the rendered prompt).
      auto ordered = nlohmann::ordered_json::parse(body_text.begin(), body_text.end(), nullptr, false);
      if (ordered.is_object()) {
        r.ordered_messages = ordered["messages"];
        for (auto& m : r.ordered_messages)
          if (m.is_object() && m.contains("content") && m["content"].is_null() && m.value("role", "") != "assistant")
            m["content"] = "";
        if (ordered.contains("tools") && ordered["tools"].is_array()) r.ordered_tools = ordered["tools"];
      }
    }
    else parse_completion(body, r);
    parse_sampling(body, r);
    // Constrained output starts at the first generated token: no reasoning block before it.
    if (r.response_format != ResponseFormat::kText || r.tool_choice == ToolChoice::kNamed ||
        r.tool_choice == ToolChoice::kRequired)
      r.thinking = false;
    if (!r.prompts.empty() && static_cast<int64_t>(r.prompts.size()) * r.n > kMaxCompletionChoices)
      fail(fmt::format("{} prompts x n = {} choices: at most {} a request", r.prompts.size(), r.n,
                       kMaxCompletionChoices),
           "prompt");
    r.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
    // The prompt's log-probabilities: asked for (vLLM's prompt_logprobs), or echoed with the
    // completion's (the legacy completions API), or the prompt alone when nothing is generated.
    if (r.prompt_logprobs >= 0 && r.stream)
      fail("'prompt_logprobs' is not available with 'stream': true", "prompt_logprobs");
    r.sampling.prompt_logprobs = r.prompt_logprobs;
    if (r.echo && r.logprobs) r.sampling.prompt_logprobs = std::max(r.sampling.prompt_logprobs, r.top_logprobs);
    if (r.max_tokens_set && r.sampling.max_tokens == 0) {
      if (!r.echo && r.prompt_logprobs < 0)
        fail("'max_tokens' must be >= 1 (0 only with 'echo' or 'prompt_logprobs': the prompt alone)", "max_tokens");
      r.sampling.prompt_logprobs = std::max(r.sampling.prompt_logprobs, 0);
    }
    out.request = std::move(r);
  } catch (const Fail& f) {
    out.error = f.error;
  } catch (const std::exception& e) {
    out.error = bad_request(std::string("malformed request: ") + e.what());
  }
  return out;
}

}  // namespace tandem::server
