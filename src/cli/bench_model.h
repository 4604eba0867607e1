// `tandem bench-model`: the pieces shared by its files. bench_model.cpp parses the flags, starts the
// model (a checkpoint, or an official config with synthetic weights: one tensor-parallel rank
// alone, its collectives replaced by StandinComm) and writes the report; bench_model_steps.cpp
// measures steps (decode, verify, draft, long context, chunked prefill, allocations under load);
// bench_model_bytes.cpp counts the bytes a step reads and checks the performance targets.
#pragma once

#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "io/model_config.h"
#include "kernels/cuda/cupti_trace.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/standin_comm.h"
#include "model/shard_plan.h"

namespace tandem::bench_model {

struct Args {
  std::string model_dir, synthetic, out, kv_dtype = "fp8", cupti;
  int tp_size = 1, rank = 0;
  uint64_t seed = 1;
  std::vector<int> batches = {1, 2, 4, 8, 16};
  int verify_tokens = 6;               // tokens per sequence of the verify step (K + 1)
  int64_t context = 4096;              // tokens already in each sequence of the step sweep
  std::vector<int64_t> long_contexts = {4096, 163840, 1048576};
  std::vector<int64_t> prefill = {8192, 32768, 131072};
  std::vector<int64_t> ttft = {163840, 1048576};
  // Offsets of the extra CUPTI-traced prefill chunks (prefill_chunk_kernels_at).
  std::vector<int64_t> trace_offsets;
  // Chunks of the canonical runtime profile (--max-num-batched-tokens 4096, shared/seeds).
  int prefill_chunk = 4096, ttft_chunk = 4096, prefill_samples = 3;
  int reps = 30;
  double shape_seconds = 1.5;          // timing budget per step shape (reps adapt to it)
  double max_seconds = 240;            // wall budget: later sections are skipped past it
  double collective_us = 6.5;          // modelled cost of one collective (one-row all-reduce in a graph)
  double gpu_memory_utilization = 0.90;
  bool ablate = true;                  // the batch-1 decode step's per-kernel ablation
  int moe_timeline_layer = -2;         // the batch-1 decode step's MoE timeline: layer (-2: the middle one, -1: none)
  bool hc_comb_side = true;            // CudaModelOptions::hc_comb_side
  bool compressor_side = true;         // CudaModelOptions::compressor_side
  bool ring_commit_side = true;        // CudaModelOptions::ring_commit_side
};

// Modelled per-collective latencies measured on 2x H200 inside a CUDA graph (issue 21).
struct CollectivePath {
  const char* name;
  double us;
};
inline const CollectivePath kCollectivePaths[] = {
    {"nccl_graph", 6.5}, {"nccl_symmetric_window", 4.1}, {"peer_oneshot_read", 5.0}};

using Clock = std::chrono::steady_clock;

// What the measurements share.
struct Bench {
  Args a;
  ModelConfig cfg;
  std::unique_ptr<cuda_model::StandinComm> comm;  // one rank alone (tp_size > 1)
  std::unique_ptr<CudaModel> model;
  model::ShardPlan plan;                           // this rank's tensors (the byte model)
  std::unique_ptr<kernels::cuda::CuptiTrace> cupti;
  std::string cupti_status;                        // "libcupti.so.13" or why there is no breakdown
  double copy_bw = 0;                              // measured device copy bandwidth, bytes/s (read + write)
  int64_t vocab_begin = 0, vocab_end = 0;          // this rank's vocabulary rows (step tokens come from them)
  uint64_t rng = 0x2545f4914f6cdd1dull;
  Clock::time_point start = Clock::now();
  nlohmann::json j;                                // the report
  // Figures the targets read (negative: not measured).
  double decode_b1_us = -1, decode_b16_us = -1, verify_b1_us = -1, verify_b8_us = -1, draft_b1_us = -1;
  // Unique bytes the same steps read (weights + KV state): their time at the copy bandwidth is a floor.
  double decode_b1_bytes = -1, decode_b16_bytes = -1, verify_b1_bytes = -1, verify_b8_bytes = -1, draft_b1_bytes = -1;
  int kernels_b1 = -1;
  double moe_layer_b1_us = -1;
  nlohmann::json class_fraction_1row, class_fraction_48rows;
  double ctx_us[3] = {-1, -1, -1};                 // decode at long_contexts[0..2]
  double prefill_8k_tok_s = -1, ttft_160k_s = -1, ttft_1m_s = -1;
  double sample_greedy_us = -1, sample_top_p_us = -1;
  double snapshot_save_us = -1, snapshot_load_us = -1, snapshot_host_us = -1;  // one slot's prefix-cache snapshot
  int64_t snapshot_bytes = -1;

  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  bool over_budget() const { return elapsed_s() > a.max_seconds; }
  int32_t token();                                 // a random token of this rank's vocabulary rows
  int blocks_for(int64_t tokens) const;            // pool blocks covering `tokens` positions (+ verify room)
};

// bench_model_steps.cpp
Status run_step_sweep(Bench& b);
Status run_long_context(Bench& b);
Status run_prefill(Bench& b);
Status run_allocations_under_load(Bench& b);
Status run_sampler(Bench& b);
Status run_snapshots(Bench& b);

// bench_model_bytes.cpp
// Bytes one step reads, by op class: this rank's weights actually touched (routed experts: the
// distinct experts `routing` selects, [layers, rows, topk] global ids) plus the KV records,
// indexer keys and compressor rows each sequence reads at its context.
struct StepShape {
  int batch = 1, tokens = 1;
  int64_t context = 0;
  bool draft = false;
};
nlohmann::json step_bytes(const Bench& b, const StepShape& s, const std::vector<int32_t>& routing, int64_t rows);
// The op classes of one graph replay: CUPTI records mapped onto the step's class marks.
nlohmann::json class_breakdown(const Bench& b, const CudaModel::StepProfile& prof,
                               const std::vector<kernels::cuda::ActivityRecord>& recs, const nlohmann::json& bytes,
                               double step_us);
// Distinct experts touched per layer (global and this rank's) from a routing record.
nlohmann::json distinct_experts(const Bench& b, const std::vector<int32_t>& routing, int64_t rows);
// The targets of the performance issues (23: decode, 24: prefill), each with its measured value.
nlohmann::json targets(const Bench& b);

}  // namespace tandem::bench_model

#endif  // TANDEM_HAVE_CUDA_RUNNER
