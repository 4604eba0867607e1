// `tandem proof --base-url URL --model NAME`: the seed deployments' qualification gates as one
// command against any OpenAI-compatible server, with a JSON report. Gates whose outcome depends on
// what the model knows (auto tool call, using a tool result, retrieving a key from a long prompt)
// are reported "not_meaningful" when the model failed a one-line capability probe — they are
// never passed on its behalf; the structural part of each gate (server accounting, parsing,
// schema validity) is checked for every model. Exit 0 when no gate failed, 1 otherwise, 2 on usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/version.h"

namespace {

using json = nlohmann::json;

struct ProofOptions {
  std::string base_url, model, api_key, output;
  int64_t context_tokens = 16384;
  double timeout_s = 3600;
  bool assume_capable = false;
};

struct Reply {
  int status = 0;  // 0 = no response
  std::string body;
  json j;          // parsed body (discarded when not JSON)
  std::string error;
};

class Client {
 public:
  explicit Client(const ProofOptions& o) : o_(o), cli_(o.base_url) {
    cli_.set_read_timeout(static_cast<time_t>(o.timeout_s), 0);
    cli_.set_write_timeout(600, 0);
    cli_.set_connection_timeout(10, 0);
  }
  Reply get(const std::string& path) { return finish(cli_.Get(path.c_str(), headers())); }
  Reply post(const std::string& path, const json& body) {
    return finish(cli_.Post(path.c_str(), headers(), body.dump(), "application/json"));
  }

 private:
  httplib::Headers headers() const {
    httplib::Headers h;
    if (!o_.api_key.empty()) h.emplace("Authorization", "Bearer " + o_.api_key);
    return h;
  }
  static Reply finish(const httplib::Result& r) {
    Reply out;
    if (!r) {
      out.error = "no response (" + httplib::to_string(r.error()) + ")";
      return out;
    }
    out.status = r->status;
    out.body = r->body;
    out.j = json::parse(r->body, nullptr, false);
    return out;
  }
  const ProofOptions& o_;
  httplib::Client cli_;
};

struct Gate {
  std::string name;
  std::string status = "fail";  // pass | fail | not_meaningful
  std::string detail;
  json evidence = json::object();
  double seconds = 0;
};

std::string content_of(const json& resp) {
  if (!resp.is_object() || !resp.contains("choices") || !resp["choices"].is_array() || resp["choices"].empty()) return "";
  const json& m = resp["choices"][0].value("message", json::object());
  return m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string reply_problem(const Reply& r) {
  if (r.status == 0) return r.error;
  if (r.status != 200) return "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
  if (r.j.is_discarded()) return "response is not JSON";
  return "";
}

json chat(const ProofOptions& o, json messages, int max_tokens) {
  return json{{"model", o.model}, {"messages", std::move(messages)}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

json user(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "Current weather for a city."},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}, {"enum", {"Paris", "Tokyo", "Berlin"}}}}}},
        {"required", {"city"}},
        {"additionalProperties", false}}}}}};

// Closed-world validation of the subset of JSON Schema the gates use (object, properties,
// required, additionalProperties false, enum, string/boolean/integer types).
std::string validate(const json& v, const json& schema, const std::string& at = "$") {
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == v;
    if (!found) return at + ": " + v.dump() + " is not in the enum";
  }
  const std::string type = schema.value("type", "");
  if (type == "object") {
    if (!v.is_object()) return at + ": not an object";
    const json props = schema.value("properties", json::object());
    for (const auto& r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return at + ": missing required \"" + r.get<std::string>() + "\"";
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!props.contains(it.key())) {
        if (schema.value("additionalProperties", true) == false) return at + ": unexpected key \"" + it.key() + "\"";
        continue;
      }
      std::string e = validate(it.value(), props[it.key()], at + "." + it.key());
      if (!e.empty()) return e;
    }
  } else if (type == "string" && !v.is_string()) {
    return at + ": not a string";
  } else if (type == "boolean" && !v.is_boolean()) {
    return at + ": not a boolean";
  } else if (type == "integer" && !v.is_number_integer()) {
    return at + ": not an integer";
  }
  return "";
}

// The first tool call of a response: {name, arguments (parsed)} or an error.
std::string first_tool_call(const json& resp, std::string& name, json& args) {
  const json& m = resp["choices"][0].value("message", json::object());
  if (!m.contains("tool_calls") || !m["tool_calls"].is_array() || m["tool_calls"].empty()) return "no tool_calls";
  const json& f = m["tool_calls"][0].value("function", json::object());
  name = f.value("name", "");
  std::string a = f.value("arguments", "");
  args = json::parse(a, nullptr, false);
  if (args.is_discarded()) return "arguments are not JSON: " + a.substr(0, 200);
  return "";
}

// A knowledge-dependent outcome: pass when correct; otherwise fail for a capable model and
// not_meaningful (with the evidence) for one that failed the capability probe.
void knowledge_outcome(Gate& g, bool correct, bool capable, const std::string& why) {
  if (correct) {
    g.status = "pass";
  } else if (capable) {
    g.status = "fail";
    g.detail = why;
  } else {
    g.status = "not_meaningful";
    g.detail = why + " (the model failed the capability probe, so this says nothing about the server)";
  }
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

int run_proof(int argc, char** argv) {
  ProofOptions o;
  if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
  if (const char* k = std::getenv("TANDEM_API_KEY")) o.api_key = k;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string& dst) {
      if (i + 1 >= argc) return false;
      dst = argv[++i];
      return true;
    };
    std::string v;
    bool ok = true;
    if (a == "--help" || a == "-h") {
      std::printf("usage: tandem proof --base-url URL --model NAME [--api-key KEY] [--context-tokens N (16384)]\n"
                  "                    [--output FILE] [--timeout SECONDS (3600)] [--assume-capable]\n");
      return 0;
    } else if (a == "--base-url") ok = value(o.base_url);
    else if (a == "--model") ok = value(o.model);
    else if (a == "--api-key") ok = value(o.api_key);
    else if (a == "--output") ok = value(o.output);
    else if (a == "--assume-capable") o.assume_capable = true;
    else if (a == "--context-tokens" || a == "--timeout") {
      ok = value(v);
      char* end = nullptr;
      double x = ok ? std::strtod(v.c_str(), &end) : 0;
      ok = ok && end && *end == 0 && x >= 1;
      if (a == "--context-tokens") o.context_tokens = static_cast<int64_t>(x);
      else o.timeout_s = x;
    } else {
      std::fprintf(stderr, "tandem proof: unknown argument %s\n", a.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "tandem proof: %s needs a valid value\n", a.c_str());
      return 2;
    }
  }
  if (o.base_url.empty() || o.model.empty()) {
    std::fprintf(stderr, "tandem proof: --base-url and --model are required\n");
    return 2;
  }
  while (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
  if (o.base_url.size() > 3 && o.base_url.compare(o.base_url.size() - 3, 3, "/v1") == 0)
    o.base_url.resize(o.base_url.size() - 3);

  Client c(o);
  std::vector<Gate> gates;
  auto timed = [&](const std::string& name, auto fn) {
    Gate g;
    g.name = name;
    auto t0 = std::chrono::steady_clock::now();
    fn(g);
    g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  %-34s %-15s %s\n", g.name.c_str(), g.status.c_str(), g.detail.substr(0, 160).c_str());
    gates.push_back(std::move(g));
  };

  // ---- capability probe: decides whether knowledge-dependent gates mean anything ----
  json probe;
  bool capable = o.assume_capable;
  {
    Reply r = c.post("/v1/chat/completions", chat(o, user("What is the capital of France? Answer with one word."), 16));
    std::string answer = reply_problem(r).empty() ? content_of(r.j) : "";
    bool knows = lower(answer).find("paris") != std::string::npos;
    capable = capable || knows;
    probe = {{"question", "What is the capital of France? Answer with one word."},
             {"answer", answer},
             {"error", reply_problem(r)},
             {"capable", capable},
             {"assumed", o.assume_capable}};
  }

  timed("served_model_identity", [&](Gate& g) {
    Reply r = c.get("/v1/models");
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = "/v1/models: " + p);
    json ids = json::array();
    bool listed = false;
    for (const auto& m : r.j.value("data", json::array())) {
      ids.push_back(m.value("id", ""));
      listed = listed || m.value("id", "") == o.model;
    }
    g.evidence["models"] = ids;
    Reply cr = c.post("/v1/chat/completions", chat(o, user("Say hello."), 4));
    if (auto p = reply_problem(cr); !p.empty()) return void(g.detail = "chat: " + p);
    std::string served = cr.j.value("model", "");
    g.evidence["response_model"] = served;
    if (!listed) g.detail = "\"" + o.model + "\" is not in /v1/models " + ids.dump();
    else if (served != o.model) g.detail = "responses report model \"" + served + "\"";
    else g.status = "pass";
  });

  timed("deterministic_temperature_0", [&](Gate& g) {
    json body = chat(o, user("Count from 1 to 20."), 64);
    Reply a = c.post("/v1/chat/completions", body), b = c.post("/v1/chat/completions", body);
    for (const Reply* r : {&a, &b})
      if (auto p = reply_problem(*r); !p.empty()) return void(g.detail = p);
    std::string x = content_of(a.j), y = content_of(b.j);
    g.evidence = {{"first", x.substr(0, 200)}, {"completion_tokens", a.j["usage"].value("completion_tokens", -1)}};
    if (x != y) g.detail = "outputs differ: \"" + x.substr(0, 80) + "\" vs \"" + y.substr(0, 80) + "\"";
    // Token counts only: the second request may legitimately hit the prefix cache.
    else if (a.j["usage"].value("completion_tokens", -1) != b.j["usage"].value("completion_tokens", -2) ||
             a.j["usage"].value("prompt_tokens", -1) != b.j["usage"].value("prompt_tokens", -2))
      g.detail = "usage differs: " + a.j["usage"].dump() + " vs " + b.j["usage"].dump();
    else g.status = "pass";
  });

  timed("tool_call_forced", [&](Gate& g) {
    json body = chat(o, user("What is the weather in Paris?"), 256);
    body["tools"] = json::array({kWeatherTool});
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    Reply r = c.post("/v1/chat/completions", body);
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = p);
    std::string name;
    json args;
    if (auto e = first_tool_call(r.j, name, args); !e.empty()) return void(g.detail = e);
    g.evidence = {{"name", name}, {"arguments", args}};
    if (name != "get_weather") return void(g.detail = "called \"" + name + "\"");
    std::string e = validate(args, kWeatherTool["function"]["parameters"]);
    if (!e.empty()) return void(g.detail = "arguments do not validate: " + e);
    g.status = "pass";
  });

  timed("tool_call_auto", [&](Gate& g) {
    json body = chat(o, user("Use the get_weather tool to look up the current weather in Tokyo."), 256);
    body["tools"] = json::array({kWeatherTool});
    body["tool_choice"] = "auto";
    Reply r = c.post("/v1/chat/completions", body);
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = p);
    std::string name;
    json args;
    std::string e = first_tool_call(r.j, name, args);
    g.evidence = {{"name", name}, {"content", content_of(r.j).substr(0, 200)}};
    if (e.empty()) {
      // A call was made: its structure is the server's responsibility whatever the model.
      std::string v = validate(args, kWeatherTool["function"]["parameters"]);
      if (name != "get_weather" || !v.empty()) return void(g.detail = "malformed call: " + name + " " + v);
    }
    knowledge_outcome(g, e.empty(), capable, "the model answered without calling the tool");
  });

  timed("tool_result_continuation", [&](Gate& g) {
    json msgs = json::array(
        {{{"role", "user"}, {"content", "What is the weather in Berlin?"}},
         {{"role", "assistant"},
          {"content", ""},
          {"tool_calls",
           json::array({{{"id", "call_proof_1"},
                         {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Berlin\"}"}}}}})}},
         {{"role", "tool"}, {"tool_call_id", "call_proof_1"}, {"content", "{\"temperature_c\": 17, \"sky\": \"overcast\"}"}}});
    json body = chat(o, msgs, 96);
    body["tools"] = json::array({kWeatherTool});
    Reply r = c.post("/v1/chat/completions", body);
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = p);
    std::string text = content_of(r.j);
    g.evidence = {{"content", text.substr(0, 300)}, {"finish_reason", r.j["choices"][0].value("finish_reason", "")}};
    if (text.empty()) return void(g.detail = "empty answer after the tool result");
    knowledge_outcome(g, text.find("17") != std::string::npos, capable, "the answer does not use the tool result (17 C)");
  });

  timed("strict_json_schema", [&](Gate& g) {
    const json schema = {{"type", "object"},
                         {"properties",
                          {{"city", {{"type", "string"}, {"enum", {"Paris", "London", "Rome"}}}},
                           {"is_capital", {{"type", "boolean"}}}}},
                         {"required", {"city", "is_capital"}},
                         {"additionalProperties", false}};
    // Room for the longest output the schema allows (grammars admit bounded whitespace runs).
    json body = chat(o, user("Which of Paris, London or Rome is the capital of France? Answer in JSON."), 256);
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "capital"}, {"strict", true}, {"schema", schema}}}};
    Reply r = c.post("/v1/chat/completions", body);
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = p);
    std::string text = content_of(r.j);
    json v = json::parse(text, nullptr, false);
    g.evidence = {{"content", text.substr(0, 300)}};
    if (v.is_discarded()) return void(g.detail = "output does not parse as JSON");
    std::string e = validate(v, schema);
    if (!e.empty()) return void(g.detail = "output does not validate: " + e);
    g.status = "pass";  // validity is the server's guarantee; the answer's truth is not part of it
    g.evidence["answer_correct"] = v["city"] == "Paris";
  });

  timed("uncached_long_context_retrieval", [&](Gate& g) {
    std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(std::time(nullptr)));
    char nonce[32];
    std::snprintf(nonce, sizeof nonce, "%016llx", static_cast<unsigned long long>(rng()));
    const std::string key = std::string("KEY-") + nonce;
    static const char* words[] = {"river", "stone", "garden", "window", "silver", "orange", "market", "winter",
                                  "pencil", "harbor", "cloud", "forest", "engine", "candle", "meadow", "valley"};
    std::string filler;
    const int64_t n = o.context_tokens;
    std::string prompt = std::string("Run ") + nonce + ". Read the notes and answer the question at the end.\n";
    for (int64_t i = 0; i < n; ++i) {
      if (i == n / 2) prompt += "\nThe secret key is " + key + ".\n";
      prompt += words[rng() % 16];
      prompt += (i % 12 == 11) ? ".\n" : " ";
    }
    prompt += "\nWhat is the secret key? Reply with the key only.";
    Reply r = c.post("/v1/chat/completions", chat(o, user(prompt), 32));
    if (auto p = reply_problem(r); !p.empty()) return void(g.detail = p);
    const json usage = r.j.value("usage", json::object());
    const int64_t prompt_tokens = usage.value("prompt_tokens", int64_t{-1});
    const json details = usage.value("prompt_tokens_details", json());
    const bool has_cached = details.is_object() && details.contains("cached_tokens") && details["cached_tokens"].is_number();
    const int64_t cached = has_cached ? details["cached_tokens"].get<int64_t>() : -1;
    std::string text = content_of(r.j);
    g.evidence = {{"nonce", nonce}, {"asked_tokens", n}, {"prompt_tokens", prompt_tokens},
                  {"cached_tokens", has_cached ? json(cached) : json(nullptr)}, {"answer", text.substr(0, 100)}};
    if (prompt_tokens < n) return void(g.detail = "prompt_tokens " + std::to_string(prompt_tokens) + " < asked " + std::to_string(n));
    if (!has_cached) return void(g.detail = "usage.prompt_tokens_details.cached_tokens not reported");
    if (cached != 0) return void(g.detail = "cached_tokens " + std::to_string(cached) + " != 0 (the prompt was not uncached)");
    knowledge_outcome(g, text.find(key) != std::string::npos, capable, "the answer does not contain " + key);
  });

  timed("streaming_usage_consistency", [&](Gate& g) {
    json body = chat(o, user("List five fruits."), 48);
    Reply plain = c.post("/v1/chat/completions", body);
    if (auto p = reply_problem(plain); !p.empty()) return void(g.detail = "non-streaming: " + p);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Reply s = c.post("/v1/chat/completions", body);
    if (s.status != 200) return void(g.detail = "streaming: " + reply_problem(s));
    std::string text;
    json usage;
    bool done = false;
    for (const auto& p : sse_payloads(s.body)) {
      if (p == "[DONE]") {
        done = true;
        continue;
      }
      json ch = json::parse(p, nullptr, false);
      if (ch.is_discarded()) return void(g.detail = "unparsable chunk: " + p.substr(0, 100));
      if (ch.contains("usage") && ch["usage"].is_object()) usage = ch["usage"];
      if (ch.contains("choices") && ch["choices"].is_array())
        for (const auto& choice : ch["choices"]) {
          const json d = choice.value("delta", json::object());
          if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
        }
    }
    const json& pu = plain.j["usage"];
    g.evidence = {{"stream_usage", usage}, {"usage", pu}};
    if (!done) g.detail = "stream did not end with [DONE]";
    else if (!usage.is_object()) g.detail = "no usage chunk despite stream_options.include_usage";
    else if (usage.value("prompt_tokens", -1) != pu.value("prompt_tokens", -2) ||
             usage.value("completion_tokens", -1) != pu.value("completion_tokens", -2))
      g.detail = "usage differs: stream " + usage.dump() + ", non-stream " + pu.dump();
    else if (text != content_of(plain.j)) g.detail = "streamed text differs from the non-streaming text";
    else g.status = "pass";
  });

  json report;
  report["schema"] = "tandem-proof/1";
  report["tandem_version"] = tandem::version_string();
  report["base_url"] = o.base_url;
  report["model"] = o.model;
  char when[32];
  std::time_t t = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  report["date"] = when;
  report["context_tokens"] = o.context_tokens;
  report["capability_probe"] = probe;
  int npass = 0, nfail = 0, nnm = 0;
  json jg = json::array();
  for (const auto& g : gates) {
    npass += g.status == "pass";
    nfail += g.status == "fail";
    nnm += g.status == "not_meaningful";
    jg.push_back({{"name", g.name}, {"status", g.status}, {"detail", g.detail}, {"seconds", g.seconds}, {"evidence", g.evidence}});
  }
  report["gates"] = jg;
  report["summary"] = {{"pass", npass}, {"fail", nfail}, {"not_meaningful", nnm}};
  report["pass"] = nfail == 0;
  std::string text = report.dump(2);
  if (!o.output.empty()) std::ofstream(o.output) << text << "\n";
  std::printf("%s\n", text.c_str());
  std::fprintf(stderr, "tandem proof: %d pass, %d fail, %d not meaningful%s\n", npass, nfail, nnm,
               capable ? "" : " (the model failed the capability probe)");
  return nfail == 0 ? 0 : 1;
}

}  // namespace

TANDEM_REGISTER_COMMAND(proof, "proof", "the seeds' qualification gates against any OpenAI-compatible server",
                        run_proof);
