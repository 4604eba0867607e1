// The three seed workloads on the trained built-in model (data/builtin), CPU, through the public
// engine API only: counting 1-300 (highly predictable), twenty Python dataclasses (structured code),
// technical prose (low predictability). Arms: no speculation, DSpark K=5 fixed, DSpark K=5 auto.
// Greedy, concurrency 1, plus the counting workload at concurrency 8. Reports output tokens, decode
// tok/s, acceptance rate (accepted / drafted), mean accepted length (tokens per verify step, vLLM's
// 1 + accepted / drafts) and speed-up over no speculation; greedy outputs must agree across arms.
// Prints a table and writes bench/results/seeds-builtin-<date>.json.
//   bench_bench_seeds [MODEL_DIR] [THREADS] [REPS]   (concurrency-1 rows: best of REPS runs, default 2)
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_results.h"
#include "common/log.h"
#include "engine/engine.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

using namespace tandem;

namespace {

struct Workload {
  std::string name;
  std::string user;
  int max_tokens;
  int concurrency;
  bool raw = false;  // plain completion of `user` after BOS (no chat template), EOS ignored
};

struct Arm {
  std::string name;
  std::string mode;  // "" = no speculation
};

struct Row {
  std::string workload, arm;
  int concurrency = 1;
  int64_t prompt_tokens = 0, output_tokens = 0, drafts = 0, draft_tokens = 0, accepted = 0;
  double wall_s = 0, decode_s = 0, tok_s = 0, decode_tok_s = 0, acceptance_rate = 0, mean_accepted_length = 1,
         speedup = 1, mean_ttft_s = 0;
  std::vector<std::vector<int32_t>> outputs;
  std::string finish;
  std::string sample_text;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_seeds: %s\n", msg.c_str());
  std::exit(1);
}

Row run(const std::string& dir, int threads, const Workload& w, const Arm& arm) {
  EngineConfig ec;
  ec.model_dir = dir;
  ec.device = "cpu";
  ec.max_num_seqs = w.concurrency;
  ec.max_num_batched_tokens = 1024;
  ec.block_size = 128;
  ec.max_model_len = 2048;
  ec.num_threads = threads;
  ec.enable_prefix_caching = false;  // each arm and request pays its own prefill
  if (!arm.mode.empty()) {
    ec.speculative.method = "dspark";
    ec.speculative.num_speculative_tokens = 5;
    ec.speculative.verify_mode = parse_verify_mode(arm.mode).value();
  }
  auto eng_r = Engine::create(ec);
  if (!eng_r.ok()) die(eng_r.status().to_string());
  auto engine = std::move(eng_r).value();

  nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", w.user}}});
  auto prompt = encode_messages(messages, nlohmann::json(), EncodeOptions{});
  if (!prompt.ok()) die(prompt.status().to_string());
  std::vector<int32_t> ids = engine->tokenizer().encode(w.raw ? "<｜begin▁of▁sentence｜>" + w.user : *prompt);

  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  Row row;
  row.workload = w.name;
  row.arm = arm.name;
  row.concurrency = w.concurrency;
  row.outputs.resize(w.concurrency);
  std::vector<double> first_token_s(w.concurrency, -1.0);
  std::vector<Usage> usage(w.concurrency);
  std::vector<std::string> text(w.concurrency);
  std::string finish;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < w.concurrency; ++i) {
    Request r;
    r.request_id = w.name + "-" + std::to_string(i);
    r.prompt_tokens = ids;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = w.max_tokens;
    r.sampling.ignore_eos = w.raw;
    Status st = engine->submit(std::move(r), [&, i](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (!ev.tokens.empty() && first_token_s[i] < 0)
        first_token_s[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row.outputs[i].insert(row.outputs[i].end(), ev.tokens.begin(), ev.tokens.end());
      text[i] += ev.text;
      if (ev.finish != FinishReason::kNone) {
        if (ev.finish == FinishReason::kError) die("request failed: " + ev.error);
        usage[i] = ev.usage;
        finish = finish_reason_name(ev.finish);
        ++done;
        cv.notify_all();
      }
    });
    if (!st.ok()) die(st.to_string());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == w.concurrency; });
  }
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineMetrics m = engine->metrics();
  engine->shutdown(5.0);

  double first = 1e30, ttft_sum = 0;
  for (int i = 0; i < w.concurrency; ++i) {
    row.prompt_tokens += usage[i].prompt_tokens;
    row.output_tokens += static_cast<int64_t>(row.outputs[i].size());
    first = std::min(first, first_token_s[i]);
    ttft_sum += first_token_s[i];
  }
  row.drafts = m.spec_decode_num_drafts_total;
  row.draft_tokens = m.spec_decode_num_draft_tokens_total;
  row.accepted = m.spec_decode_num_accepted_tokens_total;
  row.mean_ttft_s = ttft_sum / w.concurrency;
  // Decode time: from the first token of the batch to the last finish (prefill excluded).
  row.decode_s = row.wall_s - first;
  row.tok_s = row.output_tokens / row.wall_s;
  row.decode_tok_s = row.decode_s > 0 ? (row.output_tokens - w.concurrency) / row.decode_s : 0.0;
  row.acceptance_rate = row.draft_tokens ? double(row.accepted) / row.draft_tokens : 0.0;
  row.mean_accepted_length = row.drafts ? 1.0 + double(row.accepted) / row.drafts : 1.0;
  row.finish = finish;
  row.sample_text = text[0].substr(0, 240);
  return row;
}

double load1() {
  double l[3] = {0, 0, 0};
  return getloadavg(l, 3) > 0 ? l[0] : -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  set_log_level(std::getenv("TANDEM_SEEDS_VERBOSE") ? LogLevel::kInfo : LogLevel::kWarn);
  const std::string dir = argc > 1 ? argv[1] : std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 2;
  if (!std::ifstream(dir + "/config.json").good()) die("no model at " + dir);
  const std::string dataclasses =
      "Write twenty Python dataclasses for an online bookshop (Book, Author, Order, Customer, ...), each with "
      "typed fields and a short docstring.";
  const std::string prose =
      "Explain in a few paragraphs how a log-structured merge tree trades write amplification against read "
      "amplification, and when a B-tree is the better choice.";
  // The 35M built-in model was trained on chat samples (counting, lists, greetings) and on raw
  // Python-stdlib source and docs, so it answers the code and prose chat prompts with a short canned
  // reply and stops. The "-raw" rows give it what it knows in that domain: a plain-text prefix
  // (dataclass source, reStructuredText-style docs prose), 400 tokens, EOS ignored.
  const std::string dataclasses_raw =
      "from dataclasses import dataclass, field\nfrom typing import Optional\n\n\n@dataclass\nclass Book:\n"
      "    \"\"\"A book in the catalogue.\"\"\"\n    title: str\n    author: str\n    price: float = 0.0\n\n\n"
      "@dataclass\nclass Author:\n";
  const std::string prose_raw =
      "The garbage collector in this module is generational: objects that survive a collection are moved "
      "to an older generation, which is examined less often. ";
  const std::vector<Workload> workloads = {
      {"count-1-300", "Count from 1 to 300.", 1500, 1},
      {"python-dataclasses", dataclasses, 600, 1},
      {"python-dataclasses-raw", dataclasses_raw, 400, 1, true},
      {"technical-prose", prose, 400, 1},
      {"technical-prose-raw", prose_raw, 400, 1, true},
      {"count-1-300-x8", "Count from 1 to 300.", 900, 8},  // 900: keeps the run under 10 min
  };
  std::vector<Arm> arms = {{"no-spec", ""},
                           {"dspark-K5-fixed", "fixed"},
                           {"dspark-K5-threshold", "threshold"},
                           {"dspark-K5-auto", "auto"}};
  // Quick runs: TANDEM_SEEDS_WORKLOADS / TANDEM_SEEDS_ARMS = comma-separated names (no JSON then).
  auto listed = [](const char* env, const std::string& name) {
    const char* v = std::getenv(env);
    if (!v || !*v) return true;
    std::string l = std::string(",") + v + ",";
    return l.find("," + name + ",") != std::string::npos;
  };
  const bool filtered = std::getenv("TANDEM_SEEDS_WORKLOADS") || std::getenv("TANDEM_SEEDS_ARMS");
  std::erase_if(arms, [&](const Arm& a) { return a.mode.empty() ? false : !listed("TANDEM_SEEDS_ARMS", a.name); });
  const double load_before = load1();
  std::printf("%-22s %-19s %4s %6s %6s %8s %9s %7s %6s %7s %s\n", "workload", "arm", "conc", "out", "drafts",
              "tok/s", "decode/s", "accept", "MAL", "speedup", "same");
  std::vector<Row> rows;
  bool all_same = true;
  for (const auto& w : workloads) {
    if (!listed("TANDEM_SEEDS_WORKLOADS", w.name)) continue;
    const Row* base = nullptr;
    size_t base_index = rows.size();
    for (const auto& arm : arms) {
      // Best of `reps` runs: the machine is shared, and other jobs only ever make a run slower.
      Row r = run(dir, threads, w, arm);
      for (int rep = 1; rep < (w.concurrency == 1 ? reps : 1); ++rep) {
        Row again = run(dir, threads, w, arm);
        if (again.outputs != r.outputs) all_same = false;
        if (again.decode_tok_s > r.decode_tok_s) r = std::move(again);
      }
      bool same = true;
      if (rows.size() > base_index) {
        base = &rows[base_index];
        same = r.outputs == base->outputs;
        r.speedup = base->decode_tok_s > 0 ? r.decode_tok_s / base->decode_tok_s : 0.0;
      }
      all_same = all_same && same;
      std::printf("%-22s %-19s %4d %6lld %6lld %8.1f %9.1f %7.3f %6.2f %7.2f %s\n", r.workload.c_str(),
                  r.arm.c_str(), r.concurrency, static_cast<long long>(r.output_tokens),
                  static_cast<long long>(r.drafts), r.tok_s, r.decode_tok_s, r.acceptance_rate,
                  r.mean_accepted_length, r.speedup, same ? "yes" : "NO");
      std::fflush(stdout);
      rows.push_back(std::move(r));
    }
  }
  const double load_after = load1();
  std::printf("greedy outputs identical across arms: %s\n", all_same ? "yes" : "NO");

  if (filtered) return all_same ? 0 : 1;
  nlohmann::json j = bench::run_info();
  j["benchmark"] = "seeds-builtin";
  j["threads"] = threads;
  j["repetitions_concurrency_1"] = reps;
  j["repetitions_concurrency_8"] = 1;
  j["load_average_1min_before"] = load_before;
  j["load_average_1min_after"] = load_after;
  j["model"] = "data/builtin (trained 35M target + DSpark draft), CPU DsV4Model, public Engine API, greedy, "
               "chat mode prompts via encode_messages, prefix caching off";
  j["definitions"] = {
      {"decode_tok_s", "(output tokens - requests) / (time from first token to last finish)"},
      {"acceptance_rate", "accepted draft tokens / drafted tokens"},
      {"mean_accepted_length", "tokens emitted per verify step = 1 + accepted / drafts (vLLM)"},
      {"speedup", "decode_tok_s / decode_tok_s of no-spec on the same workload"}};
  j["greedy_outputs_identical_across_arms"] = all_same;
  for (const auto& w : workloads)
    j["workloads"][w.name] = {{"prompt", w.user},
                              {"max_tokens", w.max_tokens},
                              {"concurrency", w.concurrency},
                              {"raw_completion_ignore_eos", w.raw}};
  for (const auto& r : rows)
    j["results"].push_back({{"workload", r.workload},
                            {"arm", r.arm},
                            {"concurrency", r.concurrency},
                            {"prompt_tokens", r.prompt_tokens},
                            {"output_tokens", r.output_tokens},
                            {"finish", r.finish},
                            {"wall_s", r.wall_s},
                            {"mean_ttft_s", r.mean_ttft_s},
                            {"tok_s", r.tok_s},
                            {"decode_tok_s", r.decode_tok_s},
                            {"drafts", r.drafts},
                            {"draft_tokens", r.draft_tokens},
                            {"accepted_tokens", r.accepted},
                            {"acceptance_rate", r.acceptance_rate},
                            {"mean_accepted_length", r.mean_accepted_length},
                            {"speedup_vs_no_spec", r.speedup},
                            {"output_head", r.sample_text}});
  bench::write_result(j, bench::result_path("seeds-builtin"));
  return 0;
}
