// CPU forward throughput on the built-in tiny model (data/builtin, DeepSeek-V4 architecture with a
// DSpark draft): prefill tok/s, one-token decode tok/s, DSpark draft proposals/s, a K+1-token verify
// step and a step of 8 sequences x 1 token, with 1 and 2 threads; the draft and verify rows also give
// their cost in decode steps (what the README quotes). Prints a table and writes bench/results/cpu-forward-<date>.json (date, commit, CPU,
// load average: the build machine is shared, real time suffers first).
// Usage: bench_bench_forward [MODEL_DIR] [KV_DTYPE fp8|bf16|nvfp4] [MAX_THREADS 1|2]; with a KV
// dtype given, the results go to cpu-forward-<date>-kv-<dtype>.json (the plain file stays the
// default run's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/bench_results.h"
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

// Median of per-step times: the machine is shared, and a median ignores the steps another
// process's burst lands on.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
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
    std::vector<double> dts;
    for (int i = 0; i < decode_len; ++i) {
      StepBatch b;
      b.seqs.push_back({0, prefill_len + i, std::span<const int32_t>(toks.data() + prefill_len + i, 1), table,
                        LogitsMode::kLast, model.has_draft()});
      const double t0 = now_s();
      if (!model.forward(b, out).ok()) return 1;
      dts.push_back(now_s() - t0);
    }
    const double decode_ms = median(dts) * 1e3;
    record("decode", 1e3 / decode_ms, decode_ms);
    if (model.has_draft()) {
      // verify: one step of the anchor + K drafted tokens (all logits and taps), then rolled back
      const int64_t len = prefill_len + decode_len;
      const int vk = model.draft_block_size() + 1;
      std::vector<int32_t> vt(vk);
      for (auto& t : vt) t = static_cast<int32_t>(rng() % (model.vocab_size() - 1));
      const int vreps = 16;
      std::vector<double> vts;
      for (int i = 0; i < vreps; ++i) {
        StepBatch b;
        b.seqs.push_back({0, len, std::span<const int32_t>(vt), table, LogitsMode::kAll, true});
        const double v0 = now_s();
        if (!model.forward(b, out).ok()) return 1;
        vts.push_back(now_s() - v0);
        if (!model.rollback(0, len).ok()) return 1;
      }
      const double vms = median(vts) * 1e3;
      record("verify", vk / vms * 1e3, vms);
      rows.back()["tokens_per_step"] = vk;
      rows.back()["decode_steps"] = vms / decode_ms;
    }
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
      const int n = 16;
      std::vector<double> dds;
      for (int i = 0; i < n; ++i) {
        const double d0 = now_s();
        if (!model.draft_propose(std::span<const DraftRequest>(&req, 1), DraftSampling(), res).ok()) return 1;
        dds.push_back(now_s() - d0);
      }
      const double dd = median(dds);
      record("draft", model.draft_block_size() / dd, dd * 1e3);
      rows.back()["decode_steps"] = dd * 1e3 / decode_ms;
    }
    const long rss_run = rss_kb(), hwm = rss_kb("VmHWM:");
    std::printf("%-8d resident: %.1f MiB after load, %.1f MiB after the run (peak %.1f MiB)\n", threads,
                rss_load / 1024.0, rss_run / 1024.0, hwm / 1024.0);
    rows.push_back({{"threads", threads}, {"phase", "memory"}, {"rss_after_load_mib", rss_load / 1024.0},
                    {"rss_after_run_mib", rss_run / 1024.0}, {"peak_rss_mib", hwm / 1024.0}});
  }
  // batched decode: 8 sequences (64-token prompts) x 1 token per step, one step = one forward call
  // whose row-wise work (weights read once) is shared by the 8 rows. A separate model with 8 slots,
  // loaded after the memory rows above so they keep describing the 1-slot model.
  for (int threads : {1, 2}) {
    if (threads > max_threads) break;
    const int nseq = 8, plen = 64, steps = 32;
    ModelOptions opt;
    opt.kv_dtype = *kv;
    opt.max_slots = nseq;
    opt.num_blocks = nseq;
    opt.max_tokens_per_step = nseq * plen;
    opt.num_threads = threads;
    auto m = DsV4Model::load(dir, opt);
    if (!m.ok()) {
      std::fprintf(stderr, "bench_forward: %s\n", m.status().to_string().c_str());
      return 1;
    }
    DsV4Model& model = **m;
    std::mt19937 rng(2);
    std::vector<int32_t> toks(nseq * (plen + steps));
    for (auto& t : toks) t = static_cast<int32_t>(rng() % (model.vocab_size() - 1));
    std::vector<std::vector<int32_t>> tables(nseq);
    StepOutput out;
    StepBatch pre;
    for (int s = 0; s < nseq; ++s) {
      tables[s] = {s};
      pre.seqs.push_back({s, 0, std::span<const int32_t>(toks.data() + s * (plen + steps), plen), tables[s],
                          LogitsMode::kLast, model.has_draft()});
    }
    if (!model.forward(pre, out).ok()) return 1;
    std::vector<double> bts;
    for (int i = 0; i < steps; ++i) {
      StepBatch b;
      for (int s = 0; s < nseq; ++s)
        b.seqs.push_back({s, plen + i, std::span<const int32_t>(toks.data() + s * (plen + steps) + plen + i, 1),
                          tables[s], LogitsMode::kLast, model.has_draft()});
      const double t0 = now_s();
      if (!model.forward(b, out).ok()) return 1;
      bts.push_back(now_s() - t0);
    }
    const double ms = median(bts) * 1e3;
    std::printf("%-8d %-10s %12.1f %14.3f\n", threads, "decode-x8", nseq / ms * 1e3, ms);
    rows.push_back({{"threads", threads}, {"phase", "decode-batch"}, {"kv_dtype", kv_name}, {"sequences", nseq},
                    {"tok_per_s", nseq / ms * 1e3}, {"ms_per_step", ms}});
  }
  nlohmann::json outj = tandem::bench::run_info();
  outj["model"] = dir;
  outj["kv_dtype"] = kv_name;
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");  // spinning barriers cost ms on a busy box
  outj["omp_wait_policy"] = wait_policy ? wait_policy : "";
  outj["note"] = "prefill: one 256-token step (last-token logits + DSpark taps), best of 3; decode: 64 one-token "
                 "steps after it, median step; draft: one DSpark proposal of K tokens (tok/s counts K drafted "
                 "tokens), median of 16; verify: one step of K+1 tokens (all logits, taps) after the decode, "
                 "rolled back, median of 16; decode_steps: the row's ms/step over the decode ms/step; "
                 "decode-batch: 8 sequences x 1 token per step after 64-token prompts, median of 32 steps. "
                 "weights kept quantized (views into the mmapped checkpoint), linears through kernels::Ops::gemm, "
                 "reference numerics (FP8/FP4 activation round trips). memory rows: process RSS (the second "
                 "load happens with the first model freed).";
  outj["results"] = rows;
  tandem::bench::write_result(
      outj, tandem::bench::result_path("cpu-forward", argc > 2 ? "-kv-" + kv_name : std::string()));
  return 0;
}
