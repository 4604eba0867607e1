// Prometheus text parsing and the counter-name table of the serving benchmark.
#include "loadgen/prometheus.h"

#include <cstdlib>
#include <string_view>
#include <vector>

namespace tandem::loadgen {

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view l(text.data() + pos, end - pos);
    pos = end + 1;
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
    if (l.empty() || l.front() == '#') continue;
    size_t i = 0;
    while (i < l.size() && l[i] != '{' && l[i] != ' ' && l[i] != '\t') ++i;
    std::string name(l.substr(0, i));
    if (i < l.size() && l[i] == '{') {  // skip labels; values are quoted and may hold '}' or '\"'
      bool quoted = false;
      for (++i; i < l.size(); ++i) {
        if (quoted && l[i] == '\\') { ++i; continue; }
        if (l[i] == '"') quoted = !quoted;
        else if (!quoted && l[i] == '}') break;
      }
      if (i >= l.size()) continue;
      ++i;
    }
    while (i < l.size() && (l[i] == ' ' || l[i] == '\t')) ++i;
    std::string value(l.substr(i));
    if (size_t sp = value.find_first_of(" \t"); sp != std::string::npos) value.resize(sp);  // timestamp
    if (name.empty() || value.empty()) continue;
    char* stop = nullptr;
    double v = std::strtod(value.c_str(), &stop);
    if (stop == value.c_str() || *stop != '\0') continue;
    out[name] += v;
  }
  return out;
}

namespace {
struct Known {
  std::optional<double> ServerCounters::*field;
  std::vector<const char*> names;  // first one present wins
};
const std::vector<Known>& known() {
  static const std::vector<Known> k = {
      {&ServerCounters::generation_tokens,
       {"vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total"}},
      {&ServerCounters::prompt_tokens,
       {"vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"}},
      {&ServerCounters::requests_succeeded, {"vllm:request_success_total", "sglang:num_requests_total"}},
      {&ServerCounters::preemptions, {"vllm:num_preemptions_total"}},
      {&ServerCounters::spec_drafts, {"vllm:spec_decode_num_drafts_total"}},
      {&ServerCounters::spec_draft_tokens, {"vllm:spec_decode_num_draft_tokens_total"}},
      {&ServerCounters::spec_accepted_tokens, {"vllm:spec_decode_num_accepted_tokens_total"}},
      {&ServerCounters::prefix_cache_queries, {"vllm:prefix_cache_queries_total"}},
      {&ServerCounters::prefix_cache_hits, {"vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"}},
  };
  return k;
}
}  // namespace

ServerCounters counter_deltas(const std::map<std::string, double>& before, const std::map<std::string, double>& after) {
  ServerCounters c;
  for (const auto& k : known()) {
    for (const char* n : k.names) {
      auto a = after.find(n);
      if (a == after.end()) continue;
      auto b = before.find(n);
      // A counter absent before the run starts at zero (vLLM creates labelled series lazily).
      const double d = a->second - (b == before.end() ? 0.0 : b->second);
      c.*(k.field) = d;
      c.raw[n] = d;
      break;
    }
  }
  // Tandem's engine-thread counters (where a step's time goes), when the server has them.
  for (const auto& [n, v] : after) {
    if (!n.starts_with("tandem:engine_") || !n.ends_with("_total")) continue;
    auto b = before.find(n);
    c.raw[n] = v - (b == before.end() ? 0.0 : b->second);
  }
  return c;
}

nlohmann::json to_json(const ServerCounters& c) {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const char* key, const std::optional<double>& v) {
    if (v) j[key] = *v;
  };
  put("generation_tokens", c.generation_tokens);
  put("prompt_tokens", c.prompt_tokens);
  put("requests_succeeded", c.requests_succeeded);
  put("preemptions", c.preemptions);
  put("spec_drafts", c.spec_drafts);
  put("spec_draft_tokens", c.spec_draft_tokens);
  put("spec_accepted_tokens", c.spec_accepted_tokens);
  put("prefix_cache_queries", c.prefix_cache_queries);
  put("prefix_cache_hits", c.prefix_cache_hits);
  j["names"] = c.raw;
  return j;
}

}  // namespace tandem::loadgen
