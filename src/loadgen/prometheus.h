// The server's counters, read from its Prometheus /metrics text before and after each run. Names
// differ between servers (vLLM, SGLang, llama.cpp, Tandem uses vLLM's); ServerCounters maps the
// ones the benchmark uses onto one set of fields.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::loadgen {

// Sum over label sets of every sample, by metric name ("vllm:generation_tokens_total" -> value).
// Lines that do not parse are skipped: a scrape is evidence, not input that can fail the run.
std::map<std::string, double> parse_prometheus(const std::string& text);

// Counter deltas over one run (after - before), for the names found in both scrapes.
struct ServerCounters {
  std::optional<double> generation_tokens, prompt_tokens, requests_succeeded, preemptions;
  std::optional<double> spec_drafts, spec_draft_tokens, spec_accepted_tokens;
  std::optional<double> prefix_cache_queries, prefix_cache_hits;
  std::map<std::string, double> raw;  // every known name found, by its server's name
};

ServerCounters counter_deltas(const std::map<std::string, double>& before, const std::map<std::string, double>& after);
nlohmann::json to_json(const ServerCounters& c);

}  // namespace tandem::loadgen
