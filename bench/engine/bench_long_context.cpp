// Long-context prefill on the CPU: one uncached prompt of N tokens (default 1,048,560: the 1M
// context less room for 16 generated tokens) on a tiny checkpoint written by the project
// (make-tiny preset, "long" by default: window and HCA layers; "default" adds CSA layers whose
// lightning indexer scores n/4 entries per token, quadratic in the prompt), through the threaded engine with the 1m profile's step budget (4,096 batched
// tokens, 256-token blocks, fp8 KV) and a KV pool of exactly the blocks the request needs.
// Records TTFT, prefill tok/s, progress samples from the engine metrics, capacity and peak RSS;
// prints a table and writes bench/results/long-context-cpu-<N>-<date>.json.
//   bench_bench_long_context [TOKENS] [THREADS] [PRESET]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/bench_results.h"
#include "common/log.h"
#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "io/tiny_checkpoint.h"
#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

using namespace tandem;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1048560;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const std::string preset = argc > 3 ? argv[3] : "long";
  constexpr int64_t kGen = 16, kBs = 256;
  if (n < 1 || n + kGen > 1048576) {
    std::fprintf(stderr, "TOKENS must be in [1, %d]\n", 1048576 - static_cast<int>(kGen));
    return 2;
  }
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("tandem-bench-long-" + std::to_string(getpid()))).string();
  TinyCheckpointOptions to;
  to.preset = preset;
  to.seed = 11;
  Status st = write_tiny_checkpoint(dir, to, train_tiny_tokenizer_json(to.seed));
  if (!st.ok()) {
    std::fprintf(stderr, "make-tiny: %s\n", st.message().c_str());
    return 1;
  }
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = 4096;
  ec.block_size = static_cast<int>(kBs);
  ec.kv_cache_dtype = "fp8";
  ec.enable_prefix_caching = false;
  ec.num_threads = threads;
  auto runner = create_dsv4_runner(ec);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().to_string().c_str());
    return 1;
  }
  const int64_t blocks = (n + kGen + kBs - 1) / kBs;
  const int64_t block_bytes = (*runner)->kv_bytes_per_block(static_cast<int>(kBs), "fp8");
  ec.kv_cache_memory = blocks * block_bytes;
  auto engine = create_engine_with_runner(std::move(runner).value(), ec);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const int64_t V = (*tok)->vocab_size();
  Request r;
  r.request_id = "long";
  r.prompt_tokens.resize(n);
  uint64_t x = 5;
  for (auto& t : r.prompt_tokens) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<int32_t>(2 + (x >> 33) % static_cast<uint64_t>(std::min<int64_t>(V - 2, 300)));
  }
  r.sampling.temperature = 0;
  r.sampling.max_tokens = kGen;
  r.sampling.ignore_eos = true;
  std::promise<void> first, done;
  bool got_first = false;
  Usage usage;
  FinishReason finish = FinishReason::kNone;
  auto t0 = std::chrono::steady_clock::now();
  st = (*engine)->submit(std::move(r), [&](const RequestEvent& ev) {
    if (!got_first && !ev.tokens.empty()) {
      got_first = true;
      first.set_value();
    }
    if (ev.finish != FinishReason::kNone) {
      usage = ev.usage;
      finish = ev.finish;
      if (!got_first) first.set_value();
      done.set_value();
    }
  });
  if (!st.ok()) {
    std::fprintf(stderr, "submit: %s\n", st.to_string().c_str());
    return 1;
  }
  nlohmann::json samples = nlohmann::json::array();
  auto f = first.get_future();
  while (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    EngineMetrics m = (*engine)->metrics();
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    samples.push_back({{"seconds", el}, {"prefilled", m.long_prefill_done_tokens}});
    std::printf("  %7.1f s  %9lld / %lld tokens  (%.0f tok/s)\n", el, static_cast<long long>(m.long_prefill_done_tokens),
                static_cast<long long>(n), el > 0 ? m.long_prefill_done_tokens / el : 0.0);
    std::fflush(stdout);
  }
  const double ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done.get_future().wait();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelInfo info = (*engine)->model_info();
  (*engine)->shutdown(1);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::error_code rm;
  fs::remove_all(dir, rm);

  nlohmann::json j = bench::run_info();
  j["benchmark"] = "long-context prefill, CPU, tiny checkpoint";
  j["preset"] = preset;
  j["threads"] = threads;
  j["prompt_tokens"] = n;
  j["usage"] = {{"prompt_tokens", usage.prompt_tokens}, {"completion_tokens", usage.completion_tokens},
                {"cached_tokens", usage.cached_tokens}};
  j["finish"] = finish_reason_name(finish);
  j["max_num_batched_tokens"] = ec.max_num_batched_tokens;
  j["kv_blocks"] = blocks;
  j["kv_block_bytes"] = block_bytes;
  j["kv_capacity_tokens"] = info.kv_capacity_tokens;
  j["ttft_s"] = ttft;
  j["prefill_tok_per_s"] = n / ttft;
  j["total_s"] = total;
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["progress"] = samples;
  std::printf("prompt %lld tokens: TTFT %.1f s (%.0f tok/s prefill), %lld generated, cached %lld, KV %lld blocks x %lld B, "
              "peak RSS %.0f MiB\n",
              static_cast<long long>(n), ttft, n / ttft, static_cast<long long>(usage.completion_tokens),
              static_cast<long long>(usage.cached_tokens), static_cast<long long>(blocks),
              static_cast<long long>(block_bytes), ru.ru_maxrss / 1024.0);
  bench::write_result(j, bench::result_path("long-context-cpu-" + std::to_string(n)));
  return finish == FinishReason::kLength && usage.prompt_tokens == n ? 0 : 1;
}
