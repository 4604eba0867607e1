// `tandem bench-model --model DIR`: step costs of the device-resident CUDA model. For each batch
// size, every sequence holds --context tokens, then a decode step (1 token each), a verify step
// (K+1 tokens each) and the DSpark draft are each run eagerly and as a captured CUDA graph; the
// table gives the kernels and copies per step and the median step times. JSON to --out.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/log.h"
#include "model/model.h"
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/sample_rows.h"
#include "model/cuda/cuda_model.h"
#endif

namespace tandem {
namespace {

#ifdef TANDEM_HAVE_CUDA_RUNNER
std::string today_utc() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return date;
}

struct BenchArgs {
  std::string model_dir, out, kv_dtype = "fp8", batches = "1,2,4,8";
  int context = 200, reps = 50;
  int prefill = 0;  // tokens of one prompt to prefill in one step (0 = skip)
};

Status bench(const BenchArgs& a) {
  std::vector<int> batches;
  {
    std::stringstream ss(a.batches);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      char* end = nullptr;
      const long v = std::strtol(tok.c_str(), &end, 10);
      if (!end || *end || v < 1 || v > 256) return invalid_argument("--batches: '{}' is not a batch size in [1, 256]", tok);
      batches.push_back(static_cast<int>(v));
    }
  }
  if (batches.empty()) return invalid_argument("--batches is empty");
  if (a.context < 8) return invalid_argument("--context must be >= 8");
  if (a.reps < 1) return invalid_argument("--reps must be >= 1");
  int max_b = 1;
  for (int b : batches) max_b = std::max(max_b, b);
  auto cfg = load_model_config(a.model_dir + "/config.json");
  if (!cfg.ok()) return cfg.status().with_context("loading " + a.model_dir);
  const int K = cfg->has_dspark() ? cfg->dspark_block_size : 0;
  CudaModelOptions o;
  o.model.max_slots = max_b;
  o.model.block_size = 256;
  if (a.prefill < 0) return invalid_argument("--prefill must be >= 0");
  const int blocks_per_seq = (a.context + K + 2 + 255) / 256;
  const int prefill_blocks = (a.prefill + 255) / 256;
  o.model.num_blocks = std::max(max_b * blocks_per_seq, prefill_blocks);
  o.model.max_rollback = K + 1;
  o.model.max_tokens_per_step = std::max({a.context, max_b * (K + 1), a.prefill});
  TANDEM_ASSIGN_OR_RETURN(o.model.kv_dtype, parse_kv_dtype(a.kv_dtype));
  o.max_logits_rows = max_b * (K + 1);
  TANDEM_ASSIGN_OR_RETURN(auto model, CudaModel::load(a.model_dir, o));
  const int64_t V = model->vocab_size();

  nlohmann::json j;
  j["date"] = today_utc();
  const char* commit = std::getenv("TANDEM_COMMIT");
  j["commit"] = commit ? commit : "unknown";
  j["gpu"] = model->device_name();
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  j["cuda_driver"] = drv;
  j["cuda_runtime"] = rt;
  j["model"] = a.model_dir;
  j["kv_cache_dtype"] = a.kv_dtype;
  j["context_tokens"] = a.context;
  j["reps"] = a.reps;
  const auto mem = model->memory();
  j["device_memory_bytes"] = {{"weights", mem.weights}, {"kv_pool", mem.pool}, {"slot_state", mem.slot_state},
                              {"draft_state", mem.draft_state}, {"scratch", mem.scratch}};
  j["rows"] = nlohmann::json::array();
  std::printf("%-8s %6s %8s %7s %7s %11s %11s\n", "step", "batch", "tok/seq", "kernels", "copies", "eager us", "graph us");

  uint64_t x = 12345;
  auto next_tok = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int32_t>(2 + (x >> 33) % static_cast<uint64_t>(std::min<int64_t>(V - 2, 1000)));
  };
  for (int B : batches) {
    std::vector<std::vector<int32_t>> tables(B), toks(B);
    StepOutput out;
    for (int s = 0; s < B; ++s) {
      model->reset(s);
      for (int b = 0; b < blocks_per_seq; ++b) tables[s].push_back(s * blocks_per_seq + b);
      toks[s].resize(a.context + K + 2);
      for (auto& t : toks[s]) t = next_tok();
      StepBatch pb;
      pb.seqs.push_back({s, 0, std::span<const int32_t>(toks[s].data(), a.context), tables[s], LogitsMode::kLast,
                         model->has_draft()});
      TANDEM_RETURN_IF_ERROR(model->forward(pb, &out));
      if (model->has_draft())
        TANDEM_RETURN_IF_ERROR(model->draft_insert_context(
            s, 0, std::span<const float>(out.taps.data(), static_cast<size_t>(a.context) * model->tap_dim())));
    }
    auto record = [&](const char* name, int tok_per_seq, const CudaModel::StepProfile& p) {
      std::printf("%-8s %6d %8d %7d %7d %11.1f %11.1f\n", name, B, tok_per_seq, p.kernels, p.copies, p.eager_us,
                  p.graph_us);
      j["rows"].push_back({{"step", name}, {"batch", B}, {"tokens_per_seq", tok_per_seq}, {"kernels", p.kernels},
                           {"copies", p.copies}, {"eager_us_median", p.eager_us}, {"graph_us_median", p.graph_us}});
    };
    for (int n : {1, K + 1}) {
      if (n == K + 1 && K == 0) continue;
      StepBatch sb;
      for (int s = 0; s < B; ++s)
        sb.seqs.push_back({s, model->slot_length(s), std::span<const int32_t>(toks[s].data() + model->slot_length(s), n),
                           tables[s], n == 1 ? LogitsMode::kLast : LogitsMode::kAll, false});
      TANDEM_ASSIGN_OR_RETURN(auto p, model->profile_step(sb, a.reps, &out));
      record(n == 1 ? "decode" : "verify", n, p);
      for (int s = 0; s < B; ++s) TANDEM_RETURN_IF_ERROR(model->rollback(s, model->slot_length(s) - n));
      if (n > 1) {
        // The device sampler over this verify step's logits, as the engine calls it after every step
        // (rows uploaded, sampled, results copied back, one synchronization): greedy verification
        // of K drafts + the bonus row per sequence, and the same rows sampled with top-p.
        for (bool greedy : {true, false}) {
          std::vector<SampleRow> rows;
          for (int s = 0; s < B; ++s)
            for (int jr = 0; jr < n; ++jr) {
              SampleRow r;
              r.logits_row = s * n + jr;
              r.draft = jr < n - 1 ? toks[s][a.context + jr + 1] : -1;
              r.temperature = greedy ? 0.0 : 0.8;
              r.top_p = greedy ? 1.0 : 0.9;
              r.seed = static_cast<uint64_t>(s);
              r.position = a.context + jr + 1;
              rows.push_back(r);
            }
          std::vector<SampleRowResult> res(rows.size());
          std::vector<double> us;
          for (int r = 0; r < a.reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            TANDEM_RETURN_IF_ERROR(model->sample(rows, {}, {}, {}, 0, res));
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
          std::sort(us.begin(), us.end());
          const char* name = greedy ? "sample-greedy" : "sample-top-p";
          std::printf("%-13s %3d %8d rows %27.1f us (wall, median)\n", name, B, static_cast<int>(rows.size()),
                      us[us.size() / 2]);
          j["rows"].push_back({{"step", name}, {"batch", B}, {"rows", rows.size()}, {"wall_us_median", us[us.size() / 2]}});
        }
      }
    }
    if (model->has_draft()) {
      std::vector<CudaModel::DraftQueryDev> qs;
      for (int s = 0; s < B; ++s) qs.push_back({s, toks[s][a.context], a.context, 0.0, 0});
      TANDEM_ASSIGN_OR_RETURN(auto p, model->profile_draft(qs, a.reps));
      record("draft", K, p);
    }
  }
  {
    // The sampling op alone at DeepSeek-V4-Flash's vocabulary (129280) on random logits: 8 sequences
    // x 6 verify rows, greedy and top-p, kernel time per launch (device timer, median).
    constexpr int64_t kV = 129280;
    constexpr int kRows = 48;
    std::vector<float> hl(static_cast<size_t>(kRows) * kV);
    for (auto& v : hl) v = static_cast<float>(static_cast<int>(next_tok() % 2000) - 1000) / 100.0f;
    kernels::cuda::DeviceBuffer<float> dl(hl.size());
    kernels::cuda::DeviceBuffer<SampleRow> drows(kRows);
    kernels::cuda::DeviceBuffer<SampleRowResult> dres(kRows);
    kernels::cuda::DeviceBuffer<uint8_t> scratch(kernels::cuda::sample_rows_scratch_bytes(kRows, kV));
    TANDEM_CUDA_CHECK(cudaMemcpy(dl.get(), hl.data(), hl.size() * sizeof(float), cudaMemcpyHostToDevice));
    SampleInputs in;
    in.logits = dl.get();
    in.vocab = kV;
    cudaEvent_t e0, e1;
    TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
    TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
    for (bool greedy : {true, false}) {
      std::vector<SampleRow> rows(kRows);
      for (int r = 0; r < kRows; ++r) {
        rows[r].logits_row = r;
        rows[r].draft = r % 6 < 5 ? static_cast<int32_t>(next_tok()) : -1;
        rows[r].temperature = greedy ? 0.0 : 0.8;
        rows[r].top_p = greedy ? 1.0 : 0.9;
        rows[r].seed = static_cast<uint64_t>(r);
        rows[r].position = r;
      }
      TANDEM_CUDA_CHECK(cudaMemcpy(drows.get(), rows.data(), sizeof(SampleRow) * kRows, cudaMemcpyHostToDevice));
      std::vector<double> us;
      for (int r = 0; r < a.reps + 1; ++r) {
        TANDEM_CUDA_CHECK(cudaEventRecord(e0, nullptr));
        kernels::cuda::sample_rows_device({in, drows.get(), kRows, scratch.get(), dres.get()}, nullptr);
        TANDEM_CUDA_CHECK(cudaEventRecord(e1, nullptr));
        TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0) us.push_back(ms * 1000.0);
      }
      std::sort(us.begin(), us.end());
      const char* name = greedy ? "sample-greedy-129k" : "sample-top-p-129k";
      std::printf("%-18s %8d rows %22.1f us (kernel, median)\n", name, kRows, us[us.size() / 2]);
      j["rows"].push_back({{"step", name}, {"batch", 8}, {"rows", kRows}, {"vocab", kV},
                           {"kernel_us_median", us[us.size() / 2]}});
    }
    TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
    TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  }
  if (a.prefill > 0) {
    // One prompt of --prefill tokens in one step, from an empty slot, timed end to end (the plan
    // upload, every layer, the last row's logits copied back), median of 3 after one warm-up.
    std::vector<int32_t> prompt(a.prefill), table(prefill_blocks);
    for (auto& t : prompt) t = next_tok();
    for (int b = 0; b < prefill_blocks; ++b) table[b] = b;
    std::vector<double> ms;
    StepOutput out;
    for (int r = 0; r < 4; ++r) {
      model->reset(0);
      StepBatch pb;
      pb.seqs.push_back({0, 0, std::span<const int32_t>(prompt.data(), prompt.size()), table, LogitsMode::kLast, false});
      const auto t0 = std::chrono::steady_clock::now();
      TANDEM_RETURN_IF_ERROR(model->forward(pb, &out));
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) ms.push_back(dt);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("prefill  %6d tokens: %.1f ms (%.0f tok/s)\n", a.prefill, med, a.prefill / (med / 1000.0));
    j["prefill"] = {{"tokens", a.prefill}, {"ms_median", med}, {"tokens_per_s", a.prefill / (med / 1000.0)}};
  }
  const std::string path = a.out.empty() ? "bench-model-" + today_utc() + ".json" : a.out;
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return Status();
}
#endif

int bench_model_main(int argc, char** argv) {
  CLI::App app{"Step costs of the CUDA model: kernels per step, eager and graph-replay times (JSON to --out)."};
#ifdef TANDEM_HAVE_CUDA_RUNNER
  BenchArgs a;
  app.add_option("--model", a.model_dir, "model directory")->required();
  app.add_option("--out", a.out, "JSON output path (default bench-model-<date>.json)");
  app.add_option("--kv-cache-dtype", a.kv_dtype, "fp8 | bf16 | nvfp4 (default fp8)");
  app.add_option("--batches", a.batches, "comma-separated batch sizes (default 1,2,4,8)");
  app.add_option("--context", a.context, "tokens already in each sequence (default 200)");
  app.add_option("--reps", a.reps, "timed repetitions per shape (default 50)");
  app.add_option("--prefill", a.prefill, "also time one prompt of this many tokens prefilled in one step (default 0: skip)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  set_log_level(LogLevel::kWarn);
  Status st = bench(a);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem bench-model: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
#else
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::fprintf(stderr, "tandem bench-model: this build has no CUDA runner (no CUDA toolkit at build time)\n");
  return 1;
#endif
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(bench_model, "bench-model", "step costs of the CUDA model (kernels, graph and eager times)",
                        tandem::bench_model_main);
