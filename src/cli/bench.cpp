// `tandem bench --base-url URL --model NAME`: the serving benchmark client. Streams chat completions
// to any OpenAI-compatible server (Tandem, vLLM, SGLang, llama.cpp) over a concurrency sweep with
// repeats, and writes the report JSON and an SVG chart (src/loadgen/ does the work; docs/PERFORMANCE.md
// explains the method and fields). Exit status: 0 all requests succeeded with consistent token
// counts, 3 the report was written but some failed or disagreed, 1 the target could not be used,
// 2 bad flags.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "cli/command.h"
#include "common/run_info.h"
#include "loadgen/runner.h"
#include "loadgen/svg.h"

namespace tandem {
namespace {

std::string client_commit() {
  std::string c = run_info(TANDEM_SOURCE_DIR)["commit"].get<std::string>();
  if (c.empty()) return "unknown";
  if (!std::getenv("TANDEM_COMMIT") &&
      !shell_line("git -C " TANDEM_SOURCE_DIR " status --porcelain --untracked-files=no 2>/dev/null | head -1").empty())
    c += "+dirty";
  return c;
}

std::string default_output() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "tandem-bench-%Y%m%d-%H%M%S.json", std::gmtime(&t));
  return buf;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) return make_error(StatusCode::kNotFound, "cannot write {}", path);
  f << text;
  f.close();
  if (!f) return make_error(StatusCode::kDataLoss, "writing {} failed", path);
  return Status();
}

int bench_main(int argc, char** argv) {
  CLI::App app{"Serving benchmark against any OpenAI-compatible server: streamed chat completions, TTFT, "
               "inter-token latency, per-stream and aggregate tok/s, server counters from /metrics, over a "
               "concurrency sweep with repeats. Writes a JSON report and an SVG chart."};
  loadgen::BenchOptions o;
  std::string workloads = "count,dataclasses,prose,long-prompt";
  std::string output, svg;
  double stagger_ms = 100;
  if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
  app.add_option("--base-url", o.base_url, "server address, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
      ->required();
  app.add_option("--model", o.model, "model name the server serves (the request's \"model\")")->required();
  app.add_option("--api-key", o.api_key, "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  app.add_option("--workloads", workloads, "comma-separated: count, dataclasses, prose, long-prompt (default: all)");
  app.add_option("--concurrency", o.concurrency, "concurrent streams to sweep (default: 1 2 4 8 16)")
      ->delimiter(',')
      ->expected(1, -1);
  app.add_option("--repeats", o.repeats, "runs per workload and concurrency; medians and spread over them (default 3)");
  app.add_option("--stagger-ms", stagger_ms, "stream i starts i * this after the first; 0 = all at once (default 100)");
  app.add_option("--requests-per-stream", o.requests_per_stream, "requests each stream sends back to back (default 1)");
  app.add_option("--max-tokens", o.max_tokens,
                 "output bound for every workload (default per workload: count 1500, dataclasses 1024, prose 512, "
                 "long-prompt 16)");
  app.add_option("--long-prompt-words", o.long_prompt_words,
                 "length of the long-prompt workload's synthetic text in words (default 8000)");
  app.add_option("--temperature", o.temperature, "sampling temperature (default 0, greedy)");
  app.add_option("--warmup", o.warmup, "requests sent before the sweep, reported apart (default 1)");
  app.add_option("--timeout-s", o.timeout_s, "longest silence allowed within one response (default 600)");
  app.add_option("--notes", o.notes, "free text recorded with the results (hardware, load, server flags)");
  app.add_option("--output", output, "report JSON path (default tandem-bench-<UTC time>.json)");
  app.add_option("--svg", svg, "chart path (default: the report path with .svg)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError too
  }
  auto w = loadgen::select_workloads(workloads);
  if (!w.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", w.status().message().c_str());
    return 2;
  }
  o.workloads = *w;
  o.stagger_s = stagger_ms / 1000.0;
  o.client_commit = client_commit();
  if (Status st = loadgen::validate(o); !st.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", st.message().c_str());
    return 2;
  }
  if (output.empty()) output = default_output();
  if (svg.empty()) {
    svg = output;
    if (svg.size() > 5 && svg.compare(svg.size() - 5, 5, ".json") == 0) svg.resize(svg.size() - 5);
    svg += ".svg";
  }

  auto report = loadgen::run_benchmark(o, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (!report.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", report.status().message().c_str());
    return 1;
  }
  for (const auto& [path, text] : {std::pair{output, report->dump(2) + "\n"}, std::pair{svg, loadgen::render_svg(*report)}}) {
    if (Status st = write_file(path, text); !st.ok()) {
      std::fprintf(stderr, "tandem bench: %s\n", st.message().c_str());
      return 1;
    }
  }
  const loadgen::Tally t = loadgen::tally(*report);
  std::printf("wrote %s and %s\n%lld requests: %lld failed, %lld with inconsistent token counts, %lld runs whose "
              "server counters disagree with the client\n",
              output.c_str(), svg.c_str(), static_cast<long long>(t.requests), static_cast<long long>(t.failed),
              static_cast<long long>(t.inconsistent), static_cast<long long>(t.counter_mismatches));
  return t.failed || t.inconsistent || t.counter_mismatches ? 3 : 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(bench, "bench", "serving benchmark client for any OpenAI-compatible server",
                        tandem::bench_main);
