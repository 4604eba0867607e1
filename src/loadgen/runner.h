// The serving benchmark's sweep: for each workload x concurrency x repeat, one run of staggered
// streams against the target, the server's counters scraped before and after, every request kept.
// The result is the report JSON (its layout is documented in docs/PERFORMANCE.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "loadgen/workloads.h"
#include "common/status.h"

namespace tandem::loadgen {

struct BenchOptions {
  std::string base_url, model, api_key;
  std::vector<Workload> workloads;
  std::vector<int> concurrency = {1, 2, 4, 8, 16};
  int repeats = 3;
  double stagger_s = 0.1;          // stream i of a run starts i * stagger_s after the first
  int requests_per_stream = 1;     // sent back to back by each stream
  int max_tokens = 0;              // 0: each workload's default
  int long_prompt_words = 8000;
  double temperature = 0;
  int warmup = 1;                  // requests before the sweep (reported apart)
  double connect_timeout_s = 10, timeout_s = 600;
  std::string notes;               // free text recorded with the results (machine, load, ...)
  std::string client_commit;       // commit of the tandem binary
};

Status validate(const BenchOptions& o);

// Problems found in a finished report, counted over every run (the exit status depends on them).
struct Tally {
  int64_t requests = 0, failed = 0, inconsistent = 0, counter_mismatches = 0;
};

// Runs the sweep. Fails (a Status) only when the target cannot be used at all: unreachable, or it
// refuses the API key. Failed and inconsistent requests are in the report, never dropped.
// `progress` receives one printable line per run.
Result<nlohmann::json> run_benchmark(const BenchOptions& o, const std::function<void(const std::string&)>& progress);
Tally tally(const nlohmann::json& report);

// Reduces one run's records to its JSON entry (exposed for tests).
struct RunData {
  std::string workload;
  int concurrency = 0, repeat = 0, max_tokens = 0;
  double wall_s = 0;
  std::vector<RequestRecord> requests;
  bool counters_ok = false;               // /metrics scraped before and after
  nlohmann::json server_counters;         // to_json(ServerCounters) when counters_ok
};
nlohmann::json summarize_run(const RunData& d);
// Per workload x concurrency: medians and spread over the repeats.
nlohmann::json summarize_sweep(const nlohmann::json& runs);

}  // namespace tandem::loadgen
