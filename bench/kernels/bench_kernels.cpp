// CPU kernel benchmarks: GEMMs on stored-format weights (decode M=1 and prefill M=128) and sparse
// attention / indexer at tiny and full single-layer DeepSeek-V4-Flash shapes. Prints Google
// Benchmark's table (GB/s of weight bytes, GFLOP/s) and writes bench/results/cpu-kernels-<date>.json
// with date, commit, CPU model and thread count. `--benchmark_filter=` works as usual.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_results.h"
#include "common/numeric.h"
#include "kernels/ops.h"

namespace {
using namespace tandem;
using namespace tandem::kernels;

std::vector<float> rnd(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = num::round_bf16(nd(rng));
  return v;
}

struct Stored {
  std::vector<uint8_t> data, scale;
  std::vector<uint16_t> bf16;
  WeightRef ref;
};

// Weights are random codes (dequantization cost does not depend on the values).
std::shared_ptr<Stored> make(WeightFormat f, int64_t n, int64_t k) {
  auto s = std::make_shared<Stored>();
  std::mt19937_64 rng(n * 31 + k);
  s->ref.format = f;
  s->ref.n = n;
  s->ref.k = k;
  switch (f) {
    case WeightFormat::kBf16:
      s->bf16.resize(n * k);
      for (auto& v : s->bf16) v = num::f32_to_bf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-5f);
      s->ref.data = s->bf16.data();
      break;
    case WeightFormat::kFp8Block:
      s->data.resize(n * k);
      for (auto& v : s->data) v = static_cast<uint8_t>(rng() % 0x7e);
      s->scale.assign(((n + 127) / 128) * ((k + 127) / 128), 120);
      s->ref.data = s->data.data();
      s->ref.scale = s->scale.data();
      break;
    case WeightFormat::kMxfp4:
      s->data.resize(n * k / 2);
      for (auto& v : s->data) v = static_cast<uint8_t>(rng());
      s->scale.assign(n * (k / 32), 120);
      s->ref.data = s->data.data();
      s->ref.scale = s->scale.data();
      break;
    case WeightFormat::kF32:
      break;
  }
  return s;
}

void BM_Gemm(benchmark::State& st, WeightFormat f, int64_t n, int64_t k) {
  const int64_t m = st.range(0);
  auto w = make(f, n, k);
  auto x = rnd(m * k, 1, 1.0f);
  std::vector<float> y(m * n);
  GemmParams p;
  p.x = x.data();
  p.w = w->ref;
  p.y = y.data();
  p.m = m;
  p.n = n;
  p.k = k;
  for (auto _ : st) {
    cpu::gemm(p);
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(st.iterations());
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(w->ref.bytes()) * it / 1e9, benchmark::Counter::kIsRate);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * it / 1e9, benchmark::Counter::kIsRate);
}

void BM_SparseAttn(benchmark::State& st, int64_t heads, int64_t dim, int64_t topk, int64_t kv_rows) {
  const int64_t T = st.range(0);
  auto q = rnd(T * heads * dim, 2, 1.0f);
  auto kv = rnd(kv_rows * dim, 3, 1.0f);
  auto sink = rnd(heads, 4, 1.0f);
  std::vector<int32_t> idx(T * topk);
  std::mt19937 rng(5);
  for (auto& v : idx) v = static_cast<int32_t>(rng() % kv_rows);
  std::vector<float> out(T * heads * dim);
  SparseAttnParams p;
  p.q = q.data();
  p.kv = kv.data();
  p.idx = idx.data();
  p.sink = sink.data();
  p.out = out.data();
  p.tokens = T;
  p.heads = heads;
  p.dim = dim;
  p.kv_rows = kv_rows;
  p.topk = topk;
  for (auto _ : st) {
    cpu::sparse_attn(p);
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(st.iterations());
  st.counters["GFLOP/s"] = benchmark::Counter(4.0 * T * heads * topk * dim * it / 1e9, benchmark::Counter::kIsRate);
  st.counters["GB/s"] = benchmark::Counter(4.0 * T * topk * dim * it / 1e9, benchmark::Counter::kIsRate);
}

void BM_IndexerScore(benchmark::State& st, int64_t heads, int64_t dim) {
  const int64_t S = st.range(0);
  auto q = rnd(heads * dim, 6, 1.0f);
  auto k = rnd(S * dim, 7, 1.0f);
  auto w = rnd(heads, 8, 0.1f);
  int32_t vis = static_cast<int32_t>(S);
  std::vector<float> s(S);
  IndexerScoreParams p;
  p.q = q.data();
  p.k = k.data();
  p.w = w.data();
  p.visible = &vis;
  p.tokens = 1;
  p.heads = heads;
  p.dim = dim;
  p.entries = S;
  p.scores = s.data();
  for (auto _ : st) {
    cpu::indexer_score(p);
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(st.iterations());
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * heads * dim * S * it / 1e9, benchmark::Counter::kIsRate);
}

void BM_ActQuantFp8(benchmark::State& st) {
  const int64_t rows = st.range(0);
  auto x0 = rnd(rows * 4096, 9, 1.0f);
  auto x = x0;
  ActQuantFp8Params p;
  p.x = x.data();
  p.rows = rows;
  p.cols = 4096;
  for (auto _ : st) {
    cpu::act_quant_fp8(p);
    benchmark::ClobberMemory();
  }
  st.counters["GB/s"] = benchmark::Counter(8.0 * rows * 4096 * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void register_all() {
  using F = WeightFormat;
  struct G {
    const char* name;
    F f;
    int64_t n, k;
  };
  const G gemms[] = {
      {"tiny_fp8_256x256", F::kFp8Block, 256, 256},
      {"tiny_fp4_256x256", F::kMxfp4, 256, 256},
      {"wq_a_fp8_1024x4096", F::kFp8Block, 1024, 4096},
      {"wq_b_fp8_32768x1024", F::kFp8Block, 32768, 1024},
      {"wo_b_fp8_4096x8192", F::kFp8Block, 4096, 8192},
      {"shared_w1_fp8_2048x4096", F::kFp8Block, 2048, 4096},
      {"expert_w1_fp4_2048x4096", F::kMxfp4, 2048, 4096},
      {"expert_w2_fp4_4096x2048", F::kMxfp4, 4096, 2048},
      {"compressor_wkv_bf16_1024x4096", F::kBf16, 1024, 4096},
      {"lm_head_bf16_129280x4096", F::kBf16, 129280, 4096},
  };
  for (const auto& g : gemms) {
    auto* b = benchmark::RegisterBenchmark((std::string("gemm/") + g.name).c_str(), BM_Gemm, g.f, g.n, g.k);
    b->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();
    if (g.n < 100000) b->Arg(128);
  }
  benchmark::RegisterBenchmark("sparse_attn/tiny_h8_d64_topk32", BM_SparseAttn, 8, 64, 32, 256)
      ->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();
  benchmark::RegisterBenchmark("sparse_attn/csa_h64_d512_topk640", BM_SparseAttn, 64, 512, 640, 8192)
      ->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();
  benchmark::RegisterBenchmark("indexer_score/h64_d128", BM_IndexerScore, 64, 128)
      ->Arg(1024)->Arg(16384)->Unit(benchmark::kMicrosecond)->UseRealTime();
  benchmark::RegisterBenchmark("act_quant_fp8/k4096", BM_ActQuantFp8)->Arg(1)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// Collects every run next to the console output.
class Collect : public benchmark::ConsoleReporter {
 public:
  nlohmann::json rows = nlohmann::json::array();
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      nlohmann::json j;
      j["name"] = r.benchmark_name();
      j["us"] = r.GetAdjustedRealTime();
      j["cpu_us_main_thread"] = r.GetAdjustedCPUTime();
      for (const auto& [k, c] : r.counters) j[k] = c.value;
      rows.push_back(j);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Own flags (after Google Benchmark consumed its): --threads=N, --out=PATH.
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) cpu::set_num_threads(std::atoi(a.c_str() + 10));
    if (a.rfind("--out=", 0) == 0) out_path = a.substr(6);
  }
  register_all();
  Collect rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();

  nlohmann::json out = tandem::bench::run_info();
  out["threads"] = cpu::num_threads();
  out["gemm_isa"] = cpu::gemm_isa_name();
  out["note"] = "GB/s counts stored weight bytes (fp8 1 B, fp4 0.5 B + scales, bf16 2 B) per call";
  out["results"] = rep.rows;
  tandem::bench::write_result(out, out_path.empty() ? tandem::bench::result_path("cpu-kernels") : out_path);
  return 0;
}
