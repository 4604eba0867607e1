// The serving benchmark's sweep and its reduction to the report JSON.
#include "loadgen/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <thread>

#include "loadgen/prometheus.h"
#include "loadgen/stats.h"
#include "common/version.h"

namespace tandem::loadgen {

Status validate(const BenchOptions& o) {
  if (o.model.empty()) return invalid_argument("--model: required (the name the server serves)");
  if (o.workloads.empty()) return invalid_argument("--workloads: empty list");
  if (o.concurrency.empty()) return invalid_argument("--concurrency: empty list");
  for (int c : o.concurrency)
    if (c < 1 || c > 4096) return invalid_argument("--concurrency: {} is outside 1..4096", c);
  if (o.repeats < 1) return invalid_argument("--repeats must be >= 1");
  if (o.stagger_s < 0 || !std::isfinite(o.stagger_s)) return invalid_argument("--stagger-ms must be >= 0");
  if (o.requests_per_stream < 1) return invalid_argument("--requests-per-stream must be >= 1");
  if (o.max_tokens < 0) return invalid_argument("--max-tokens must be >= 0 (0 = each workload's default)");
  if (o.long_prompt_words < 1 || o.long_prompt_words > 10'000'000)
    return invalid_argument("--long-prompt-words must be in 1..10000000");
  if (o.temperature < 0 || !std::isfinite(o.temperature)) return invalid_argument("--temperature must be >= 0");
  if (o.warmup < 0) return invalid_argument("--warmup must be >= 0");
  if (!(o.timeout_s > 0) || !(o.connect_timeout_s > 0)) return invalid_argument("timeouts must be > 0");
  return Status();
}

namespace {

double round_to(double v, double unit) { return std::isfinite(v) ? std::round(v / unit) * unit : v; }

nlohmann::json record_json(const RequestRecord& r, WorkloadKind kind) {
  nlohmann::json j = {{"stream", r.stream},
                      {"start_s", round_to(r.start_s, 1e-6)},
                      {"ok", r.ok},
                      {"http_status", r.http_status},
                      {"ttft_s", r.ttft_s >= 0 ? nlohmann::json(round_to(r.ttft_s, 1e-6)) : nlohmann::json()},
                      {"e2e_s", round_to(r.e2e_s, 1e-6)},
                      {"decode_s", round_to(r.decode_s, 1e-6)},
                      {"token_chunks", r.token_chunks},
                      {"usage_present", r.usage_present},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.completion_tokens},
                      {"cached_tokens", r.cached_tokens},
                      {"finish_reason", r.finish_reason}};
  if (!r.ok) j["error"] = r.error;
  if (r.ok && !r.token_check.empty()) j["token_check"] = r.token_check;
  if (r.ok && r.completion_tokens >= 2 && r.decode_s > 0)
    j["decode_tok_s"] = (r.completion_tokens - 1) / r.decode_s;
  if (!r.itl_s.empty()) {
    j["itl_median_s"] = median(r.itl_s);
    j["itl_max_s"] = quantile(r.itl_s, 1.0);
  }
  if (kind == WorkloadKind::kCount && r.ok) {
    CountCheck c = check_count(r.text, 300, r.finish_reason);
    j["output_check"] = count_check_name(c);
    if (c == CountCheck::kWrong) j["output_head"] = r.text.substr(0, 160);
  }
  if (kind == WorkloadKind::kDataclasses && r.ok) j["dataclasses_found"] = count_dataclasses(r.text);
  return j;
}

const Workload& workload_named(const std::string& name) {
  for (const auto& w : all_workloads())
    if (w.name == name) return w;
  return all_workloads().front();
}

// nullopt when /metrics is absent or not Prometheus text.
std::optional<std::map<std::string, double>> scrape(const Endpoint& ep, const ClientOptions& co) {
  auto r = http_get(ep, co, "/metrics");
  if (!r.ok() || r->status != 200) return std::nullopt;
  auto m = parse_prometheus(r->body);
  if (m.empty()) return std::nullopt;
  return m;
}

std::string iso_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

nlohmann::json host_info() {
  std::string cpu;
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 1);
      cpu.erase(0, cpu.find_first_not_of(' '));
      break;
    }
  }
  double l[3] = {0, 0, 0};
  const int n = getloadavg(l, 3);
  return {{"cpu", cpu},
          {"cores", std::thread::hardware_concurrency()},
          {"loadavg", n == 3 ? nlohmann::json::array({l[0], l[1], l[2]}) : nlohmann::json()}};
}

int max_tokens_for(const BenchOptions& o, const Workload& w) { return o.max_tokens > 0 ? o.max_tokens : w.max_tokens; }

}  // namespace

nlohmann::json summarize_run(const RunData& d) {
  const WorkloadKind kind = workload_named(d.workload).kind;
  nlohmann::json j = {{"workload", d.workload}, {"concurrency", d.concurrency}, {"repeat", d.repeat},
                      {"max_tokens", d.max_tokens}, {"wall_s", d.wall_s}};
  int64_t ok = 0, failed = 0, inconsistent = 0, completion = 0, prompt = 0, cached = 0, chunks = 0;
  std::vector<double> decode, ttft, itl, prefill;
  std::map<std::string, int64_t> checks;
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : d.requests) {
    records.push_back(record_json(r, kind));
    if (!r.ok) {
      ++failed;
      continue;
    }
    ++ok;
    if (!r.token_check.empty()) ++inconsistent;
    completion += r.completion_tokens;
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    chunks += r.token_chunks;
    if (r.completion_tokens >= 2 && r.decode_s > 0) decode.push_back((r.completion_tokens - 1) / r.decode_s);
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    if (r.ttft_s > 0 && r.prompt_tokens > r.cached_tokens) prefill.push_back((r.prompt_tokens - r.cached_tokens) / r.ttft_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (records.back().contains("output_check")) ++checks[records.back()["output_check"].get<std::string>()];
  }
  j["requests"] = d.requests.size();
  j["succeeded"] = ok;
  j["failed"] = failed;
  j["inconsistent_token_counts"] = inconsistent;
  j["completion_tokens"] = completion;
  j["prompt_tokens"] = prompt;
  j["cached_prompt_tokens"] = cached;
  j["tokens_per_chunk"] = chunks > 0 ? double(completion) / double(chunks) : 0.0;
  j["aggregate_tok_s"] = d.wall_s > 0 ? completion / d.wall_s : 0.0;
  j["per_stream_decode_tok_s"] = distribution(decode);
  j["ttft_s"] = distribution(ttft);
  j["itl_s"] = distribution(itl);
  j["prefill_tok_s"] = distribution(prefill);
  if (!checks.empty()) j["output_checks"] = checks;
  if (d.counters_ok) {
    nlohmann::json s = d.server_counters;
    if (s.contains("generation_tokens")) {
      const double gen = s["generation_tokens"].get<double>();
      s["tok_s"] = d.wall_s > 0 ? gen / d.wall_s : 0.0;
      // Only comparable when every request finished; another client's traffic also shows here.
      if (failed == 0 && std::llround(gen) != completion) {
        j["counter_mismatch"] = fmt::format("server generation_tokens {} vs client usage sum {}", gen, completion);
      }
    }
    if (s.contains("spec_draft_tokens") && s["spec_draft_tokens"].get<double>() > 0)
      s["acceptance_rate"] = s.value("spec_accepted_tokens", 0.0) / s["spec_draft_tokens"].get<double>();
    if (s.contains("spec_drafts") && s["spec_drafts"].get<double>() > 0)
      s["mean_accepted_length"] = 1.0 + s.value("spec_accepted_tokens", 0.0) / s["spec_drafts"].get<double>();
    j["server"] = s;
  } else {
    j["server"] = nullptr;
  }
  j["request_records"] = records;
  return j;
}

nlohmann::json summarize_sweep(const nlohmann::json& runs) {
  // Keyed in the order the runs came (workload, then concurrency).
  std::vector<std::pair<std::string, int>> keys;
  for (const auto& r : runs) {
    std::pair<std::string, int> k{r["workload"].get<std::string>(), r["concurrency"].get<int>()};
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  auto pick = [](const nlohmann::json& r, const char* a, const char* b) -> std::optional<double> {
    if (!r.contains(a) || r[a].is_null()) return std::nullopt;
    const auto& x = b ? r[a][b] : r[a];
    if (!x.is_number()) return std::nullopt;
    return x.get<double>();
  };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [w, c] : keys) {
    std::vector<double> agg, dec, ttft, itl, prefill, srv, acc, mal;
    int64_t requests = 0, failed = 0, inconsistent = 0, mismatches = 0, repeats = 0;
    std::map<std::string, int64_t> checks;
    for (const auto& r : runs) {
      if (r["workload"] != w || r["concurrency"] != c) continue;
      ++repeats;
      requests += r["requests"].get<int64_t>();
      failed += r["failed"].get<int64_t>();
      inconsistent += r["inconsistent_token_counts"].get<int64_t>();
      if (r.contains("counter_mismatch")) ++mismatches;
      if (r.contains("output_checks"))
        for (const auto& [k, v] : r["output_checks"].items()) checks[k] += v.get<int64_t>();
      if (r["succeeded"].get<int64_t>() > 0) agg.push_back(r["aggregate_tok_s"].get<double>());
      if (auto v = pick(r, "per_stream_decode_tok_s", "median")) dec.push_back(*v);
      if (auto v = pick(r, "ttft_s", "median")) ttft.push_back(*v);
      if (auto v = pick(r, "itl_s", "median")) itl.push_back(*v);
      if (auto v = pick(r, "prefill_tok_s", "median")) prefill.push_back(*v);
      if (r["server"].is_object()) {
        if (auto v = pick(r["server"], "tok_s", nullptr)) srv.push_back(*v);
        if (auto v = pick(r["server"], "acceptance_rate", nullptr)) acc.push_back(*v);
        if (auto v = pick(r["server"], "mean_accepted_length", nullptr)) mal.push_back(*v);
      }
    }
    nlohmann::json s = {{"workload", w},
                        {"concurrency", c},
                        {"repeats", repeats},
                        {"requests", requests},
                        {"failed", failed},
                        {"inconsistent_token_counts", inconsistent},
                        {"counter_mismatches", mismatches},
                        {"aggregate_tok_s", spread(agg)},
                        {"per_stream_decode_tok_s", spread(dec)},
                        {"ttft_s", spread(ttft)},
                        {"itl_s", spread(itl)},
                        {"prefill_tok_s", spread(prefill)},
                        {"server_tok_s", spread(srv)},
                        {"acceptance_rate", spread(acc)},
                        {"mean_accepted_length", spread(mal)}};
    if (!checks.empty()) s["output_checks"] = checks;
    out.push_back(s);
  }
  return out;
}

Tally tally(const nlohmann::json& report) {
  Tally t;
  for (const auto& r : report["runs"]) {
    t.requests += r["requests"].get<int64_t>();
    t.failed += r["failed"].get<int64_t>();
    t.inconsistent += r["inconsistent_token_counts"].get<int64_t>();
    if (r.contains("counter_mismatch")) ++t.counter_mismatches;
  }
  return t;
}

Result<nlohmann::json> run_benchmark(const BenchOptions& o, const std::function<void(const std::string&)>& progress) {
  TANDEM_RETURN_IF_ERROR(validate(o));
  TANDEM_ASSIGN_OR_RETURN(Endpoint ep, parse_base_url(o.base_url));
  ClientOptions co;
  co.api_key = o.api_key;
  co.connect_timeout_s = o.connect_timeout_s;
  co.read_timeout_s = o.timeout_s;

  nlohmann::json report;
  report["tool"] = "tandem bench";
  report["tandem_version"] = version_string();
  report["client_commit"] = o.client_commit;
  report["date"] = iso_now();
  report["notes"] = o.notes;
  report["client_host"] = host_info();

  // Preflight: an unreachable server or a refused key stops here with a clear message.
  nlohmann::json target = {{"base_url", o.base_url}, {"model", o.model}};
  TANDEM_ASSIGN_OR_RETURN(HttpReply models, http_get(ep, co, "/v1/models"));
  if (models.status == 401 || models.status == 403)
    return make_error(StatusCode::kPermissionDenied,
                      "{} refused the API key (HTTP {} on GET /v1/models): pass --api-key or set OPENAI_API_KEY",
                      o.base_url, models.status);
  target["models_status"] = models.status;
  nlohmann::json served = nlohmann::json::array();
  if (models.status == 200) {
    auto j = nlohmann::json::parse(models.body, nullptr, false);
    if (j.is_object() && j.contains("data") && j["data"].is_array())
      for (const auto& m : j["data"])
        if (m.is_object() && m.contains("id") && m["id"].is_string()) {
          nlohmann::json e = {{"id", m["id"]}};
          if (m.contains("max_model_len")) e["max_model_len"] = m["max_model_len"];
          served.push_back(e);
        }
  }
  target["served_models"] = served;
  bool listed = false;
  for (const auto& m : served) listed = listed || m["id"] == o.model;
  target["model_listed"] = listed;
  if (!listed)
    progress(fmt::format("warning: '{}' is not among the models {} lists (GET /v1/models: HTTP {}); its requests "
                         "will likely fail and be counted as failed",
                         o.model, o.base_url, models.status));
  const bool metrics = scrape(ep, co).has_value();
  target["metrics_available"] = metrics;
  if (!metrics) progress("note: no Prometheus /metrics at the target; server-side counters are left out");
  report["target"] = target;

  nlohmann::json settings = {{"workloads", nlohmann::json::array()},
                             {"concurrency", o.concurrency},
                             {"repeats", o.repeats},
                             {"stagger_ms", o.stagger_s * 1000},
                             {"requests_per_stream", o.requests_per_stream},
                             {"max_tokens_override", o.max_tokens},
                             {"long_prompt_words", o.long_prompt_words},
                             {"temperature", o.temperature},
                             {"warmup_requests", o.warmup},
                             {"timeout_s", o.timeout_s},
                             {"api_key_sent", !o.api_key.empty()}};
  for (const auto& w : o.workloads)
    settings["workloads"].push_back({{"name", w.name},
                                     {"description", w.description},
                                     {"max_tokens", max_tokens_for(o, w)},
                                     {"prompt_head", user_message(w, "<unique>", o.long_prompt_words).substr(0, 200)}});
  report["settings"] = settings;

  // A nonce per invocation, so even a rerun against the same server finds no cached long prompt.
  std::random_device rd;
  const std::string nonce = fmt::format("{:x}-{:08x}", static_cast<long long>(std::time(nullptr)), rd());

  auto epoch0 = Clock::now();
  nlohmann::json warm = nlohmann::json::array();
  for (int i = 0; i < o.warmup; ++i) {
    const Workload& w = o.workloads.front();
    ChatRequest req{o.model, user_message(w, nonce + "-warmup-" + std::to_string(i), o.long_prompt_words),
                    std::min(max_tokens_for(o, w), 64), o.temperature};
    warm.push_back(record_json(stream_chat(ep, co, req, epoch0), w.kind));
  }
  report["warmup"] = warm;

  progress(fmt::format("{:<12} {:>4} {:>3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}", "workload", "conc", "rep",
                       "ok/req", "agg tok/s", "decode/s", "ttft ms", "itl ms", "srv tok/s", "accept"));
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& w : o.workloads) {
    const int max_tokens = max_tokens_for(o, w);
    for (int c : o.concurrency) {
      for (int rep = 0; rep < o.repeats; ++rep) {
        RunData d;
        d.workload = w.name;
        d.concurrency = c;
        d.repeat = rep;
        d.max_tokens = max_tokens;
        // The server is idle between runs, but it may publish the previous run's (or the warm-up's)
        // last tokens a moment after their stream ended: take the baseline once two scrapes 100 ms
        // apart agree, so none of that tail is counted in this run.
        auto before = metrics ? scrape(ep, co) : std::nullopt;
        for (int settle = 0; before && settle < 20; ++settle) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          auto again = scrape(ep, co);
          if (!again) break;
          auto g = counter_deltas(*before, *again).generation_tokens;
          before = again;
          if (!g || std::llround(*g) == 0) break;
        }
        const auto epoch = Clock::now();
        std::vector<std::vector<RequestRecord>> per_stream(c);
        std::vector<std::thread> threads;
        for (int s = 0; s < c; ++s) {
          threads.emplace_back([&, s] {
            std::this_thread::sleep_until(epoch + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(s * o.stagger_s)));
            for (int k = 0; k < o.requests_per_stream; ++k) {
              const std::string unique = fmt::format("{}-{}-{}-{}-{}", nonce, c, rep, s, k);
              ChatRequest req{o.model, user_message(w, unique, o.long_prompt_words), max_tokens, o.temperature};
              RequestRecord r = stream_chat(ep, co, req, epoch);
              r.stream = s;
              per_stream[s].push_back(std::move(r));
            }
          });
        }
        for (auto& t : threads) t.join();
        double end = 0;
        int64_t client_tokens = 0;
        bool all_ok = true;
        for (auto& v : per_stream)
          for (auto& r : v) {
            end = std::max(end, r.start_s + r.e2e_s);
            client_tokens += r.completion_tokens;
            all_ok = all_ok && r.ok;
            d.requests.push_back(std::move(r));
          }
        d.wall_s = end;
        auto after = before ? scrape(ep, co) : std::nullopt;
        auto deltas = [&] { return counter_deltas(*before, *after); };
        if (before && after && all_ok) {
          // Servers that publish counters from a periodic stats loop may lag the last chunk.
          auto g = deltas().generation_tokens;
          if (g && std::llround(*g) != client_tokens) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            after = scrape(ep, co);
          }
        }
        if (before && after) {
          d.counters_ok = true;
          d.server_counters = to_json(deltas());
        }
        nlohmann::json rj = summarize_run(d);
        auto med = [&](const char* key, double scale) {
          return rj[key].is_null() ? std::string("-") : fmt::format("{:.1f}", rj[key]["median"].get<double>() * scale);
        };
        std::string issues;
        if (rj["failed"].get<int64_t>() > 0) issues += fmt::format(" FAILED {}", rj["failed"].get<int64_t>());
        if (rj["inconsistent_token_counts"].get<int64_t>() > 0)
          issues += fmt::format(" INCONSISTENT {}", rj["inconsistent_token_counts"].get<int64_t>());
        if (rj.contains("counter_mismatch")) issues += " COUNTER-MISMATCH";
        std::string accept = "-";
        if (rj["server"].is_object() && rj["server"].contains("acceptance_rate"))
          accept = fmt::format("{:.3f}", rj["server"]["acceptance_rate"].get<double>());
        std::string srv = "-";
        if (rj["server"].is_object() && rj["server"].contains("tok_s"))
          srv = fmt::format("{:.1f}", rj["server"]["tok_s"].get<double>());
        progress(fmt::format("{:<12} {:>4} {:>3} {:>4}/{:<4} {:>9.1f} {:>9} {:>9} {:>9} {:>9} {:>7}{}", w.name, c, rep,
                             rj["succeeded"].get<int64_t>(), rj["requests"].get<int64_t>(),
                             rj["aggregate_tok_s"].get<double>(), med("per_stream_decode_tok_s", 1.0),
                             med("ttft_s", 1000.0), med("itl_s", 1000.0), srv, accept, issues));
        runs.push_back(std::move(rj));
      }
    }
  }
  report["runs"] = runs;
  report["summary"] = summarize_sweep(runs);
  const Tally t = tally(report);
  report["totals"] = {{"requests", t.requests},
                      {"failed", t.failed},
                      {"inconsistent_token_counts", t.inconsistent},
                      {"counter_mismatches", t.counter_mismatches}};
  report["client_host"]["loadavg_after"] = host_info()["loadavg"];
  report["definitions"] = {
      {"ttft_s", "request sent -> first chunk carrying content, reasoning or a tool call"},
      {"itl_s", "gaps between consecutive token-bearing chunks (a chunk may carry several tokens)"},
      {"per_stream_decode_tok_s", "(usage.completion_tokens - 1) / (last token chunk - first token chunk), per request"},
      {"aggregate_tok_s", "sum of usage.completion_tokens of the run's succeeded requests / run wall time"},
      {"wall_s", "first request sent -> last stream ended"},
      {"server.tok_s", "delta of the server's generation-token counter over the run / run wall time"},
      {"acceptance_rate", "delta accepted draft tokens / delta draft tokens (server counters)"},
      {"mean_accepted_length", "1 + delta accepted / delta drafts: tokens per verify step (vLLM)"},
      {"prefill_tok_s", "(prompt_tokens - cached_tokens) / ttft_s, per request"},
      {"inconsistent_token_counts",
       "succeeded requests whose usage is missing, is below the count of token-bearing chunks, exceeds max_tokens, "
       "or ends on 'length' short of max_tokens"},
      {"failed", "transport error, HTTP status other than 200, error inside the stream, no finish_reason or no [DONE]"},
      {"counter_mismatch", "server generation-token delta differs from the client's usage sum (run had no failures)"}};
  return report;
}

}  // namespace tandem::loadgen
