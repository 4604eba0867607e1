// `tandem bench-model`: what the CUDA model's steps cost, at any size. With --synthetic NAME the
// official config runs with synthetic weights generated on the device; --tensor-parallel-size N
// --rank R runs rank R's slice alone on one GPU, its collectives replaced by a stand-in that does
// the same device work (StandinComm), and the report adds the communication from the collectives
// counted per step and a per-collective latency (--collective-us; the measured alternatives are
// listed beside it). Prints a table per section and writes one JSON report (date, commit, GPU) to
// --out (default bench/results/). Sections: step latency (decode, verify, draft) per batch, long
// context decode, chunked prefill and time to first token (estimated from timed chunks at sampled
// offsets: labelled), the sampler, device allocations under a 16-sequence load, the memory plan,
// KV capacity per cache dtype, and the targets of the performance issues.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/bench_model.h"
#include "cli/command.h"
#include "common/build_info.h"
#include "common/log.h"
#include "model/model.h"
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include "io/catalog.h"
#include "io/official_configs.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_impl.h"
#endif

namespace tandem {
#ifdef TANDEM_HAVE_CUDA_RUNNER
namespace bench_model {

int32_t Bench::token() {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  // Ids 0..2 are special tokens: keep clear of them.
  const int64_t lo = std::max<int64_t>(vocab_begin, 3), span = std::max<int64_t>(1, vocab_end - lo);
  return static_cast<int32_t>(lo + static_cast<int64_t>((rng >> 33) % static_cast<uint64_t>(span)));
}

int Bench::blocks_for(int64_t tokens) const {
  const int64_t bs = 256;
  return static_cast<int>((tokens + a.verify_tokens + 8 + bs - 1) / bs);
}

namespace {

std::string today_utc() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return date;
}

// Device copy bandwidth: a large device-to-device copy, bytes read + written per second.
double copy_bandwidth(nlohmann::json& j) {
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t bytes = std::min<size_t>(size_t{1} << 30, free_b / 4) & ~size_t{4095};
  kernels::cuda::DeviceBuffer<uint8_t> src(bytes), dst(bytes);
  TANDEM_CUDA_CHECK(cudaMemset(src.get(), 1, bytes));
  cudaEvent_t e0, e1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < 6; ++r) {
    TANDEM_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr));
    TANDEM_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) us.push_back(ms * 1000.0);
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  const double bw = 2.0 * static_cast<double>(bytes) / (med * 1e-6);
  j = {{"copy_bytes", bytes}, {"us_median", med}, {"bytes_per_s", bw},
       {"note", "device-to-device cudaMemcpyAsync; bandwidth counts bytes read + bytes written"}};
  std::printf("copy bandwidth: %.0f GB/s (read + write, %zu MiB copy, %.1f us)\n", bw / 1e9, bytes >> 20, med);
  return bw;
}

nlohmann::json kv_capacity(const Bench& b) {
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const auto mem = b.model->memory();
  // Everything this process holds on the device besides the KV pool (weights, state, scratch,
  // graphs, the CUDA context) stays; the pool gets the rest of the utilization budget.
  const int64_t used_other = static_cast<int64_t>(total_b - free_b) - mem.pool;
  const int64_t budget = static_cast<int64_t>(b.a.gpu_memory_utilization * static_cast<double>(total_b)) - used_other;
  nlohmann::json out = nlohmann::json::array();
  std::printf("\nKV capacity at --gpu-memory-utilization %.2f (budget %.2f GiB after %.2f GiB of other device memory):\n",
              b.a.gpu_memory_utilization, budget / 1073741824.0, used_other / 1073741824.0);
  for (KvDtype d : {KvDtype::kFp8, KvDtype::kBf16, KvDtype::kNvfp4}) {
    ModelOptions o;
    o.kv_dtype = d;
    o.block_size = 256;
    auto s = CudaModel::state_sizes(b.cfg, o);
    if (!s.ok()) continue;
    // The arithmetic bound: exact bytes per token (records per token of every layer, no padding).
    const auto lay = cuda_model::plan_layout(b.cfg, o, false);
    double per_token = 0;
    for (int l = 0; l < b.cfg.num_hidden_layers; ++l) {
      const int r = b.cfg.compress_ratios[l];
      if (r) per_token += static_cast<double>(lay.rec.bytes) / r;
      if (r == 4) per_token += static_cast<double>(lay.key.bytes) / 4;
    }
    const int64_t blocks = budget > 0 ? budget / static_cast<int64_t>(s->pool_block_bytes) : 0;
    const int64_t tokens = blocks * 256;
    const double bound = budget > 0 ? budget / per_token : 0;
    std::printf("  %-6s %8.1f bytes/token  block %9zu B  capacity %12lld tokens  bound %12.0f (%.4f)\n",
                kv_dtype_name(d), per_token, s->pool_block_bytes, static_cast<long long>(tokens), bound,
                bound > 0 ? tokens / bound : 0.0);
    out.push_back({{"kv_cache_dtype", kv_dtype_name(d)}, {"bytes_per_token", per_token},
                   {"block_bytes", s->pool_block_bytes}, {"budget_bytes", budget}, {"capacity_tokens", tokens},
                   {"bound_tokens", bound}, {"capacity_over_bound", bound > 0 ? tokens / bound : 0.0},
                   {"slot_state_bytes_per_sequence", s->slot_state_bytes}});
  }
  return {{"gpu_memory_utilization", b.a.gpu_memory_utilization}, {"device_total_bytes", total_b},
          {"other_device_bytes", used_other}, {"budget_bytes", budget}, {"per_dtype", out},
          {"note", "one rank; budget = utilization x device memory - everything else this process holds; "
                   "capacity in whole 256-token pool blocks; bound = budget / exact record bytes per token"}};
}

Status bench(Args a) {
  Bench b;
  b.a = a;
  if (!a.synthetic.empty()) {
    TANDEM_ASSIGN_OR_RETURN(b.cfg, synthetic_config(a.synthetic));
  } else {
    auto c = load_model_config(a.model_dir + "/config.json");
    if (!c.ok()) return c.status().with_context("loading " + a.model_dir);
    b.cfg = *c;
  }
  const ModelConfig& c = b.cfg;
  const int K = c.has_dspark() ? c.dspark_block_size : 0;
  const int64_t maxpos = c.max_position_embeddings;
  // Contexts at the model's limit leave room for the step's tokens.
  auto clamp_ctx = [&](int64_t& x) { x = std::min<int64_t>(x, maxpos - a.verify_tokens - 2); };
  clamp_ctx(b.a.context);
  for (auto& x : b.a.long_contexts) clamp_ctx(x);
  for (auto& x : b.a.prefill) x = std::min<int64_t>(x, maxpos);
  for (auto& x : b.a.ttft) x = std::min<int64_t>(x, maxpos);
  for (auto& x : b.a.trace_offsets) x = std::min<int64_t>(x, maxpos - a.prefill_chunk) / a.prefill_chunk * a.prefill_chunk;
  int max_b = 1;
  for (int x : a.batches) max_b = std::max(max_b, x);
  max_b = std::max(max_b, 16);  // the allocation check runs 16 sequences
  int64_t max_ctx = b.a.context;
  for (int64_t x : b.a.long_contexts) max_ctx = std::max(max_ctx, x);
  for (int64_t x : b.a.prefill) max_ctx = std::max(max_ctx, x);
  for (int64_t x : b.a.ttft) max_ctx = std::max(max_ctx, x);
  for (int64_t x : b.a.trace_offsets) max_ctx = std::max(max_ctx, x + a.prefill_chunk);

  CudaModelOptions o;
  o.model.max_slots = max_b;
  o.model.block_size = 256;
  o.model.num_blocks = std::max(max_b * b.blocks_for(b.a.context), b.blocks_for(max_ctx));
  o.model.max_rollback = std::max(a.verify_tokens, K + 1);
  o.model.max_tokens_per_step = std::max({a.prefill_chunk, a.ttft_chunk, max_b * a.verify_tokens});
  TANDEM_ASSIGN_OR_RETURN(o.model.kv_dtype, parse_kv_dtype(a.kv_dtype));
  o.model.tp_rank = a.rank;
  o.model.tp_size = a.tp_size;
  if (a.tp_size > 1) {
    b.comm = std::make_unique<cuda_model::StandinComm>(a.rank, a.tp_size);
    o.model.comm = b.comm.get();
  }
  o.hc_comb_side = a.hc_comb_side;
  o.compressor_side = a.compressor_side;
  o.ring_commit_side = a.ring_commit_side;
  o.max_logits_rows = max_b * std::max(a.verify_tokens, K);
  o.max_draft_requests = max_b;
  const auto t0 = Clock::now();
  if (!a.synthetic.empty()) {
    SyntheticOptions so;
    so.name = a.synthetic;
    so.seed = a.seed;
    TANDEM_ASSIGN_OR_RETURN(b.model, CudaModel::synthetic(c, o, so));
  } else {
    TANDEM_ASSIGN_OR_RETURN(b.model, CudaModel::load(a.model_dir, o));
  }
  const double startup_s = std::chrono::duration<double>(Clock::now() - t0).count();
  TANDEM_ASSIGN_OR_RETURN(Catalog catalog, build_catalog(c));
  TANDEM_ASSIGN_OR_RETURN(b.plan, model::plan_shard(c, catalog, {a.rank, a.tp_size}, true));
  const auto vr = model::vocab_range(c.vocab_size, {a.rank, a.tp_size});
  b.vocab_begin = vr.first;
  b.vocab_end = vr.second;
  std::string why;
  b.cupti = kernels::cuda::CuptiTrace::open(a.cupti, &why);
  b.cupti_status = b.cupti ? b.cupti->library() : why;

  nlohmann::json& j = b.j;
  j["date"] = today_utc();
  const char* commit = std::getenv("TANDEM_COMMIT");
  j["commit"] = commit ? std::string(commit) : build_info().commit + (build_info().commit_dirty ? "-dirty" : "");
  j["gpu"] = b.model->device_name();
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  j["cuda_driver"] = drv;
  j["cuda_runtime"] = rt;
  j["model"] = {{"source", a.synthetic.empty() ? a.model_dir : "synthetic " + a.synthetic},
                {"seed", a.synthetic.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.seed)},
                {"tensor_parallel_size", a.tp_size}, {"rank", a.rank}, {"kv_cache_dtype", a.kv_dtype},
                {"catalog_tensors", catalog.tensors.size()}, {"catalog_bytes", catalog.total_bytes()},
                {"rank_tensors", b.plan.held_tensors}, {"rank_catalog_bytes", b.plan.held_bytes},
                {"rank_replicated_bytes", b.plan.replicated_bytes}, {"rank_sharded_bytes", b.plan.sharded_bytes},
                {"load_report", b.model->load_report().summary()}, {"startup_s", startup_s},
                {"hc_comb_side", a.hc_comb_side}, {"compressor_side", a.compressor_side},
                {"ring_commit_side", a.ring_commit_side}};
  j["collectives"] = {{"path", a.tp_size > 1 ? "standin (one rank alone)" : "none (one rank)"},
                      {"latency_us_used", a.collective_us},
                      {"measured_paths_us", {{"nccl_graph", 6.5}, {"nccl_symmetric_window", 4.1}, {"peer_oneshot_read", 5.0}}},
                      {"note", "one-row all-reduce inside a CUDA graph on 2x H200; comm_us = collectives per step x "
                               "latency, added to the measured step (which includes the stand-in's own device work)"}};
  j["cupti"] = b.cupti_status;
  const auto mem = b.model->memory();
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  j["memory_plan"] = {{"rank", a.rank}, {"weights", mem.weights}, {"kv_pool", mem.pool}, {"slot_state", mem.slot_state},
                      {"draft_state", mem.draft_state}, {"scratch", mem.scratch}, {"total", mem.total()},
                      {"device_total", total_b}, {"device_free_after_start", free_b},
                      {"kv_pool_blocks", o.model.num_blocks}, {"max_tokens_per_step", o.model.max_tokens_per_step},
                      {"max_slots", o.model.max_slots}};
  std::printf("%s\n%s\nstart-up %.1f s; CUPTI: %s\n", b.model->load_report().summary().c_str(),
              b.model->memory_summary().c_str(), startup_s, b.cupti_status.c_str());
  b.copy_bw = copy_bandwidth(j["copy_bandwidth"]);

  auto section = [&](const char* name, Status (*fn)(Bench&)) -> Status {
    if (b.over_budget()) {
      std::printf("\n[%s] skipped: past --max-seconds %.0f\n", name, a.max_seconds);
      j["skipped"].push_back(name);
      return Status();
    }
    const auto s0 = Clock::now();
    Status st = fn(b).with_context(name);
    j["section_seconds"][name] = std::chrono::duration<double>(Clock::now() - s0).count();
    if (!st.ok()) {  // recorded; the other sections still run and the JSON is still written
      std::printf("\n[%s] failed: %s\n", name, st.to_string().c_str());
      j["section_errors"][name] = st.to_string();
    }
    return st;
  };
  Status failed;
  struct Section {
    const char* name;
    Status (*fn)(Bench&);
  };
  for (const Section& sec : {Section{"steps", run_step_sweep}, Section{"long_context", run_long_context},
                             Section{"sampler", run_sampler}, Section{"snapshots", run_snapshots},
                             Section{"allocations_under_load", run_allocations_under_load},
                             Section{"prefill", run_prefill}}) {
    Status st = section(sec.name, sec.fn);
    if (failed.ok() && !st.ok()) failed = st;
  }
  j["kv_capacity"] = kv_capacity(b);
  j["targets"] = targets(b);
  j["wall_seconds"] = b.elapsed_s();

  std::string path = a.out;
  if (path.empty()) {
    std::string name = a.synthetic.empty() ? std::filesystem::path(a.model_dir).filename().string() : a.synthetic;
    path = "bench/results/bench-model-" + name + "-tp" + std::to_string(a.tp_size) + "r" + std::to_string(a.rank) +
           "-" + today_utc() + ".json";
  }
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream f(path);
  if (!f) return make_error(StatusCode::kFailedPrecondition, "cannot write {}", path);
  f << j.dump(2) << "\n";
  std::printf("\nwrote %s (%.0f s)\n", path.c_str(), b.elapsed_s());
  return failed;
}

template <typename T>
Status parse_list(const std::string& text, const char* flag, T lo, T hi, std::vector<T>& out) {
  out.clear();
  if (text == "none") return Status();
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (!end || *end || v < static_cast<long long>(lo) || v > static_cast<long long>(hi))
      return invalid_argument("{}: '{}' is not a number in [{}, {}]", flag, tok, lo, hi);
    out.push_back(static_cast<T>(v));
  }
  return Status();
}

}  // namespace
}  // namespace bench_model
#endif

namespace {

int bench_model_main(int argc, char** argv) {
  CLI::App app{"Step costs of the CUDA model (a checkpoint, or an official config with synthetic weights, one "
               "tensor-parallel rank alone): latency, kernels, op classes, bytes and bandwidth, long context, "
               "chunked prefill, KV capacity, the performance targets. JSON to --out."};
#ifdef TANDEM_HAVE_CUDA_RUNNER
  bench_model::Args a;
  std::string batches = "1,2,4,8,16", longs = "4096,163840,1048576", prefill = "8192,32768,131072",
              ttft = "163840,1048576", traces = "auto";
  app.add_option("--model", a.model_dir, "model directory");
  app.add_option("--synthetic", a.synthetic, "an official config with synthetic weights generated on the GPU: "
                                             "deepseek-v4-flash-0731 | deepseek-v4-flash-preview");
  app.add_option("--seed", a.seed, "synthetic weights' seed (default 1)");
  app.add_option("--tensor-parallel-size", a.tp_size, "ranks of the group this rank belongs to (default 1)");
  app.add_option("--rank", a.rank, "the rank measured alone (default 0); its collectives run on a stand-in");
  app.add_option("--collective-us", a.collective_us,
                 "modelled latency of one collective, added per collective (default 6.5: NCCL one-row all-reduce in a "
                 "graph on 2x H200; 4.1 symmetric window, 5.0 one-shot peer read)");
  app.add_option("--out", a.out, "JSON path (default bench/results/bench-model-<model>-tp<N>r<R>-<date>.json)");
  app.add_option("--kv-cache-dtype", a.kv_dtype, "fp8 | bf16 | nvfp4 (default fp8)");
  app.add_option("--batches", batches, "batch sizes of the step sweep (default 1,2,4,8,16)");
  app.add_option("--verify-tokens", a.verify_tokens, "tokens per sequence of the verify step (default 6)");
  app.add_option("--context", a.context, "context of the step sweep's sequences (default 4096)");
  app.add_option("--long-contexts", longs, "contexts of the batch-1 decode (default 4096,163840,1048576)");
  app.add_option("--prefill", prefill, "prompt lengths for prefill throughput (default 8192,32768,131072; none: skip)");
  app.add_option("--ttft", ttft, "prompt lengths for time to first token (default 163840,1048576; none: skip)");
  app.add_option("--trace-offsets", traces,
                 "offsets of extra prefill chunks traced with CUPTI (default auto: the last chunk of the longest "
                 "--prefill prompt; none: skip)");
  app.add_option("--prefill-chunk", a.prefill_chunk,
                 "chunk of the prefill estimate (default 4096: the canonical runtime profile's --max-num-batched-tokens)");
  app.add_option("--ttft-chunk", a.ttft_chunk, "chunk of the time-to-first-token estimate (default 4096)");
  app.add_option("--prefill-samples", a.prefill_samples, "timed chunks per prompt (default 3)");
  app.add_option("--reps", a.reps, "most graph replays per step shape (default 30)");
  app.add_option("--shape-seconds", a.shape_seconds, "timing budget per step shape (default 1.5)");
  app.add_option("--max-seconds", a.max_seconds, "skip the remaining sections past this wall time (default 240)");
  app.add_option("--gpu-memory-utilization", a.gpu_memory_utilization, "for the KV capacity report (default 0.90)");
  app.add_option("--hc-comb-side", a.hc_comb_side,
                 "the decode path's mHC Sinkhorn on a side stream (default true; false: in the finishing kernel)");
  app.add_option("--compressor-side", a.compressor_side,
                 "the decode path's compressor chain on a second stream beside q/kv (default true; false: after them)");
  app.add_option("--ring-commit-side", a.ring_commit_side,
                 "each layer's ring commit on a third stream beside the output projections (default true; false: "
                 "after them)");
  app.add_option("--ablation", a.ablate,
                 "replay the batch-1 decode and draft steps once per kernel with that kernel's nodes removed: each "
                 "kernel's cost to the step (default true)");
  app.add_option("--moe-timeline-layer", a.moe_timeline_layer,
                 "record the per-CTA phase marks of this target layer's decode MoE inside the batch-1 decode step "
                 "(steps[0].moe_timeline; default: the middle layer; -1: none)");
  app.add_option("--cupti", a.cupti, "libcupti.so path (default: libcupti.so.13 from the usual places)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "tandem bench-model: %s\n", st.to_string().c_str());
    return 1;
  };
  if (a.model_dir.empty() == a.synthetic.empty()) return fail(invalid_argument("give one of --model DIR and --synthetic NAME"));
  if (a.tp_size < 1 || a.rank < 0 || a.rank >= a.tp_size)
    return fail(invalid_argument("--rank {} is not a rank of --tensor-parallel-size {}", a.rank, a.tp_size));
  if (a.verify_tokens < 1 || a.verify_tokens > 64) return fail(invalid_argument("--verify-tokens must be in [1, 64]"));
  if (a.reps < 1 || a.prefill_samples < 2 || a.prefill_chunk < 1 || a.ttft_chunk < 1 || a.context < 8)
    return fail(invalid_argument("--reps >= 1, --prefill-samples >= 2, chunks >= 1 and --context >= 8 are required"));
  if (!(a.collective_us >= 0) || !(a.gpu_memory_utilization > 0 && a.gpu_memory_utilization <= 1))
    return fail(invalid_argument("--collective-us must be >= 0 and --gpu-memory-utilization in (0, 1]"));
  Status st = bench_model::parse_list(batches, "--batches", 1, 256, a.batches);
  if (st.ok()) st = bench_model::parse_list<int64_t>(longs, "--long-contexts", 8, int64_t{1} << 24, a.long_contexts);
  if (st.ok()) st = bench_model::parse_list<int64_t>(prefill, "--prefill", 1, int64_t{1} << 24, a.prefill);
  if (st.ok()) st = bench_model::parse_list<int64_t>(ttft, "--ttft", 1, int64_t{1} << 24, a.ttft);
  if (st.ok() && traces != "auto") {
    st = bench_model::parse_list<int64_t>(traces, "--trace-offsets", 1, int64_t{1} << 24, a.trace_offsets);
  } else if (st.ok()) {  // the last chunk of the longest --prefill prompt
    int64_t longest = 0;
    for (int64_t x : a.prefill) longest = std::max(longest, x);
    if (longest > a.prefill_chunk) a.trace_offsets.push_back((longest - 1) / a.prefill_chunk * a.prefill_chunk);
  }
  if (st.ok() && a.batches.empty()) st = invalid_argument("--batches is empty");
  if (!st.ok()) return fail(st);
  set_log_level(LogLevel::kWarn);
  st = bench_model::bench(a);
  if (!st.ok()) return fail(st);
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

TANDEM_REGISTER_COMMAND(bench_model, "bench-model",
                        "step costs of the CUDA model (a checkpoint or synthetic full size, one rank alone)",
                        tandem::bench_model_main);
