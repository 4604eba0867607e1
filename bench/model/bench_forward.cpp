// CPU forward throughput on the built-in tiny model (data/builtin, DeepSeek-V4 architecture with a
// DSpark draft): prefill tok/s, one-token decode tok/s, DSpark draft proposals/s, with 1 and 2
// threads. Prints a table and writes bench/results/cpu-forward-<date>.json (date, commit, CPU,
// load average: the build machine is shared, real time suffers first).
// Usage: bench_bench_forward [MODEL_DIR] [KV_DTYPE fp8|bf16|nvfp4] [MAX_THREADS 1|2]; with a KV
// dtype given, the results go to cpu-forward-<date>-kv-<dtype>.json (the plain file stays the
// default run's).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "../bench_results.h"
#include "model/model.h"

namespace {

// Resident set size (kB) of this process: the weights are mmapped views (file pages count once
// touched), scratch and state are heap.
long rss_kb(const char* key = "VmRSS:") {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
  return -1;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  const std::string dir = argc > 1 ? argv[1] : std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  const std::string kv_name = argc > 2 ? argv[2] : "fp8";
  auto kv = parse_kv_dtype(kv_name);
  if (!kv.ok()) {
    std::fprintf(stderr, "bench_forward: %s\n", kv.status().to_string().c_str());
    return 1;
  }
  const int max_threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int prefill_len = 256, decode_len = 64, reps = 3;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-8s %-10s %12s %14s\n", "threads", "phase", "tok/s", "ms/step");
  for (int threads : {1, 2}) {
    if (threads > max_threads) break;
    ModelOptions opt;
    opt.kv_dtype = *kv;
    opt.max_slots = 1;
    opt.num_blocks = 4;
    opt.max_tokens_per_step = prefill_len;
    opt.num_threads = threads;
    auto m = DsV4Model::load(dir, opt);
    if (!m.ok()) {
      std::fprintf(stderr, "bench_forward: %s\n", m.status().to_string().c_str());
      return 1;
    }
    DsV4Model& model = **m;
    const long rss_load = rss_kb();
    std::mt19937 rng(1);
    std::vector<int32_t> toks(prefill_len + decode_len);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % (model.vocab_size() - 1));
    std::vector<int32_t> table(opt.num_blocks);
    std::iota(table.begin(), table.end(), 0);
    StepOutput out;
    auto record = [&](const char* phase, double tok_s, double ms) {
      std::printf("%-8d %-10s %12.1f %14.3f\n", threads, phase, tok_s, ms);
      rows.push_back({{"threads", threads}, {"phase", phase}, {"kv_dtype", kv_name}, {"tok_per_s", tok_s},
                      {"ms_per_step", ms}});
    };
    // prefill: whole 256-token prompt, logits of the last token, taps collected
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      model.reset(0);
      StepBatch b;
      b.seqs.push_back({0, 0, std::span<const int32_t>(toks.data(), prefill_len), table, LogitsMode::kLast,
                        model.has_draft()});
      const double t0 = now_s();
      if (!model.forward(b, out).ok()) return 1;
      best = std::min(best, now_s() - t0);
    }
    record("prefill", prefill_len / best, best * 1e3);
    // decode: 64 one-token steps after the prompt
    const double t0 = now_s();
    for (int i = 0; i < decode_len; ++i) {
      StepBatch b;
      b.seqs.push_back({0, prefill_len + i, std::span<const int32_t>(toks.data() + prefill_len + i, 1), table,
                        LogitsMode::kLast, model.has_draft()});
      if (!model.forward(b, out).ok()) return 1;
    }
    const double dt = now_s() - t0;
    record("decode", decode_len / dt, dt / decode_len * 1e3);
    if (model.has_draft()) {
      // DSpark: one K-token proposal after inserting the context of the whole history
      model.draft_reset(0);
      std::vector<float> taps;
      model.reset(0);
      StepBatch b;
      b.seqs.push_back({0, 0, std::span<const int32_t>(toks.data(), prefill_len), table, LogitsMode::kNone, true});
      if (!model.forward(b, out).ok()) return 1;
      if (!model.draft_insert_context(0, 0, std::span<const float>(out.taps.data(), prefill_len * model.tap_dim())).ok())
        return 1;
      DraftRequest req{0, toks[prefill_len], prefill_len};
      std::vector<DraftResult> res;
      std::mt19937_64 r64(1);
      const int n = 16;
      const double d0 = now_s();
      for (int i = 0; i < n; ++i)
        if (!model.draft_propose(std::span<const DraftRequest>(&req, 1), DraftSampling(), r64, res).ok()) return 1;
      const double dd = (now_s() - d0) / n;
      record("draft", model.draft_block_size() / dd, dd * 1e3);
    }
    const long rss_run = rss_kb(), hwm = rss_kb("VmHWM:");
    std::printf("%-8d resident: %.1f MiB after load, %.1f MiB after the run (peak %.1f MiB)\n", threads,
                rss_load / 1024.0, rss_run / 1024.0, hwm / 1024.0);
    rows.push_back({{"threads", threads}, {"phase", "memory"}, {"rss_after_load_mib", rss_load / 1024.0},
                    {"rss_after_run_mib", rss_run / 1024.0}, {"peak_rss_mib", hwm / 1024.0}});
  }
  nlohmann::json outj = tandem::bench::run_info();
  outj["model"] = dir;
  outj["kv_dtype"] = kv_name;
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");  // spinning barriers cost ms on a busy box
  outj["omp_wait_policy"] = wait_policy ? wait_policy : "";
  outj["note"] = "prefill: one 256-token step (last-token logits + DSpark taps); decode: 64 one-token steps "
                 "after it; draft: one DSpark proposal of K tokens (tok/s counts K drafted tokens). "
                 "weights kept quantized (views into the mmapped checkpoint), linears through kernels::Ops::gemm, "
                 "reference numerics (FP8/FP4 activation round trips). memory rows: process RSS (the second "
                 "load happens with the first model freed).";
  outj["results"] = rows;
  tandem::bench::write_result(
      outj, tandem::bench::result_path("cpu-forward", argc > 2 ? "-kv-" + kv_name : std::string()));
  return 0;
}
