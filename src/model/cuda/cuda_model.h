// CudaModel: the DeepSeek-V4 forward pass and DSpark draft resident on one GPU. Same contract as
// the CPU oracle DsV4Model (src/model/model.h: slots, paged compressed KV addressed by block
// tables, rollback, slot-state snapshots, draft context and proposals), with everything on the
// device: weights uploaded once as stored (FP8 + E8M0 128x128, MXFP4 experts, bf16/fp32), the
// paged KV pool and the slot rings in real bytes for the cache dtype (kv_record.h), the step
// plan uploaded once per step into fixed buffers, and every buffer allocated at start-up
// (DeviceBuffer; nothing allocates on the step path afterwards). Logits stay on the device unless
// the caller asks for a host copy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"
#include "kernels/sampling.h"
#include "model/model.h"

namespace tandem {

struct CudaModelTestAccess;
struct TensorView;

// Synthetic weights (src/model/cuda/synthetic_weights.cpp): every tensor of the config's catalog
// that this rank binds, at its stored dtype and local shape, generated on the device from a seed.
struct SyntheticOptions {
  std::string name;       // what start-up logs call the model ("deepseek-v4-flash-0731")
  uint64_t seed = 1;
};

struct CudaModelOptions {
  ModelOptions model;        // slots, pool, block size, step size, rollback, KV dtype, draft
  int device = 0;            // CUDA device ordinal
  int max_logits_rows = 0;   // rows of logits one step may produce; 0 = derived (see cuda_model.cpp)
  int max_draft_requests = 0;  // 0 = model.max_slots
  // Steps of up to this many sequences, each adding the same 1..max_rollback+1 tokens, replay a
  // CUDA graph captured on first use for (sequences padded to a power of two, tokens per sequence,
  // logits/taps mode, longest context rounded up to a power of two); 0 = always eager.
  int max_graph_batch = 0;
  // Tokens each draft proposes (K; the engine's num_speculative_tokens); 0 = the whole draft block.
  // A shorter block [anchor, noise x (K-1)] is what the draft attends over, as on the CPU.
  int draft_tokens = 0;
  // Steps with more rows than this run their GEMMs on the tensor cores (prefill: FP8 block-scaled,
  // bf16, routed experts grouped by expert; kernels/cuda/gemm_tc.h); others on the GEMV kernels,
  // which sum in another order. 0 = every step on the tensor cores; a huge value = never (tests that compare
  // steps of different sizes bit for bit pin one path).
  int64_t tc_min_rows = 96;
  // Decode-size projections and MoE on the tensor-core decode kernels (kernels/cuda/decode_gemm.h,
  // model/cuda/moe_decode.h) where the weights suit them; false = the generic ops everywhere.
  bool decode_kernels = true;
  // The decode path's mHC Sinkhorn on a side stream (kernels::cuda::HcCombSide: a graph branch
  // beside the finishing kernel, joined by hc_post); false = inside the finishing kernel. Same bits.
  bool hc_comb_side = true;
  // The decode path's compressor chain (x's bf16 projections, the compressors' rows, entries and
  // pool stores) on a second stream beside q/kv (a graph branch joined before the indexer); false =
  // after them on the one stream. Same bits.
  bool compressor_side = true;
  // The layer's ring commit (the step's KV records, compressor and indexer rows into the slot
  // rings) on a third stream after the attention, a graph branch beside the output projections and
  // the FFN half, joined before the next layer's attention (which rewrites the rows it copies);
  // false = on the one stream after the output projections. Same bits.
  bool ring_commit_side = true;
  // The DSpark draft's context insertion (taps -> main_proj -> each stage's KV record -> its
  // context ring) inside a step whose every sequence collects taps and adds at most
  // max_rollback + 1 tokens (decode and verify steps, graph replays): every row of the step is
  // inserted at its position, accepted or not, and the engine's commit then has nothing left to
  // insert (draft_insert_context_from_step returns at once). The rings hold W + max_rollback rows,
  // so a rejected row's record never overwrites one the next draft reads, and the next steps rewrite
  // its position before any draft reads it. false = inserted at commit, the accepted rows only.
  // Same records at every position a draft reads.
  bool draft_insert_in_step = true;
  // capture_graphs captures the decode and verify graphs of every context bucket (powers of two
  // from 256) up to this many tokens, so no request crossing a bucket below it pays a capture (one
  // eager step and an instantiation per step shape, about 2.5 ms each on the built-in model) on
  // its path; longer contexts capture their bucket on first use. Buckets past the first are
  // captured only while the graphs' device memory (each bucket taking about what the first took)
  // stays below graph_memory_budget and half the free memory, and only on a single rank (ranks
  // deciding from their own free memory could capture different buckets, and a capture's eager
  // step runs the group's collectives).
  int64_t graph_context = 8192;
  int64_t graph_memory_budget = int64_t{1} << 30;
};

class CudaModel {
 public:
  static Result<std::unique_ptr<CudaModel>> load(const std::string& dir, const CudaModelOptions& options);
  static Result<std::unique_ptr<CudaModel>> from_tensors(const ModelConfig& config,
                                                         const std::vector<const TensorView*>& tensors,
                                                         const CudaModelOptions& options);
  // The model of `config` with synthetic weights generated directly in device memory (no host
  // copy, no file). Before allocating anything, start-up compares the device bytes this rank needs
  // (weights, KV pool, slot state, scratch) with the free device memory and refuses with both
  // figures (kResourceExhausted) when they do not fit.
  static Result<std::unique_ptr<CudaModel>> synthetic(const ModelConfig& config, const CudaModelOptions& options,
                                                      const SyntheticOptions& synth);
  // Device memory per slot state and per pool block for a config + options (no weights needed).
  static Result<ModelStateSizes> state_sizes(const ModelConfig& config, const ModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const;
  const LoadReport& load_report() const;
  bool has_draft() const;
  int draft_block_size() const;   // the checkpoint's block size (the largest K)
  int draft_tokens() const;       // K drafted per proposal
  int64_t max_logits_rows() const;  // logits rows (and sampled rows) one step may have
  int64_t tap_dim() const;
  int64_t vocab_size() const;
  // Graph replays and captures so far (tests, metrics). instantiations counts every
  // cudaGraphInstantiate of this model (captures, and profile_step / profile_draft's timing
  // graphs): each takes device memory, so after start-up it must not move under load.
  struct GraphStats {
    int64_t replays = 0, captures = 0, eager = 0, instantiations = 0;
    int64_t sampled_in_graph = 0;  // forward_sample steps whose rows the graph's sampler launch drew
  };
  GraphStats graph_stats() const;
  // Seconds the host has spent blocked on the device in the steps' and drafts' synchronizations.
  double device_wait_seconds() const;
  // Seconds the host has spent inside those calls before their synchronization: packing, uploads
  // and launches (forward, forward_sample, sample and draft_propose, from entry to the first wait).
  double device_submit_seconds() const;
  // Captures at start-up the graphs the engine's steps replay: decode and verify steps of
  // 1, 2, 4 .. max_graph_batch sequences x 1 .. max_rollback + 1 tokens (the context buckets up to
  // CudaModelOptions::graph_context; taps when `taps`) and drafts of 1 .. max_graph_batch requests.
  // Returns the graphs captured.
  // With `sampler` the decode and verify graphs end with the sampling launch (forward_sample) for
  // one row per logits row, where those rows fit the sampling buffers.
  int capture_graphs(bool taps, bool sampler = false);
  // The context the last capture_graphs covered with graphs (its last bucket; 0 before it ran).
  int64_t graph_context_captured() const;
  // Bytes of device memory held: weights, KV pool, slot states, scratch.
  struct Memory {
    int64_t weights = 0, pool = 0, slot_state = 0, draft_state = 0, scratch = 0, snapshots = 0;
    int64_t total() const { return weights + pool + slot_state + draft_state + scratch + snapshots; }
  };
  Memory memory() const;
  std::string device_name() const;

  // Runs one step on the device. `host_out` (optional) receives host copies of the logits and taps
  // in DsV4Model's StepOutput layout. Errors are InvalidArgument and change no slot. With
  // synchronize false (no host_out) the step is left running: the caller's next call that
  // synchronizes (sample(), synchronize()) must come before the next forward, which reuses the
  // step plan's pinned staging.
  Status forward(const StepBatch& batch, StepOutput* host_out, bool synchronize = true);
  void synchronize();

  // Op classes of a step's launches (bench-model's breakdown; set where the forward's sections begin).
  enum class OpClass : uint8_t {
    kEmbed, kMhc, kDense, kCompressor, kIndexer, kAttention, kRouter, kRoutedExperts, kSharedExperts, kLmHead,
    kCollective, kOther, kCount
  };
  static const char* op_class_name(OpClass c);
  // From the kernel_index-th kernel node (and copy_index-th copy node) of the step's graph on, the
  // launches belong to `cls` (nodes counted in capture order, which is the execution order of the
  // step's single-stream graph).
  struct ClassMark {
    int kernel_index = 0, copy_index = 0;
    OpClass cls = OpClass::kOther;
  };
  struct StepProfile {
    int kernels = 0, copies = 0;
    double eager_us = 0, graph_us = 0;     // medians
    std::vector<double> graph_samples_us;  // every timed graph replay
    std::vector<ClassMark> marks;          // the graph's op classes
    // With ablate: per kernel (by mangled name), the graph replayed with every node of it removed
    // (its neighbours joined by the removed node's outgoing edge, programmatic or not; at a fork or
    // join of the step's side streams, every predecessor to every successor). The
    // difference to graph_us is what that kernel costs the step, overlap with its neighbours
    // included; the data it would write goes stale, which does not change the other kernels' work
    // on this path (no data-dependent trip counts beyond routing, which stays the last replay's).
    struct Ablation {
      std::string kernel;
      int nodes = 0;
      double graph_us = 0;  // median replay without them
      double saved_us = 0;  // median of (whole - without) over alternating replay pairs
    };
    std::vector<Ablation> ablation;
  };
  // Called once after the timing with a function that instantiates the step's graph afresh and
  // replays it once (a profiler wraps it, e.g. CUPTI activity records of one replay).
  using ReplayHook = std::function<void(const std::function<void()>& replay)>;
  // Benchmark/test aid: runs `batch` (at most max_rollback + 1 tokens per sequence) eagerly
  // (eager_reps times; -1: reps) and as a captured CUDA graph reps times; the step's state effect
  // is applied once. Reports the kernels and copies in the step's graph, the median step times,
  // every replay's time and the op-class marks; host_out receives the graph replay's outputs.
  Result<StepProfile> profile_step(const StepBatch& batch, int reps, StepOutput* host_out,
                                   const ReplayHook& hook = {}, int eager_reps = -1, bool ablate = false);

  int64_t slot_length(int slot) const;
  Status rollback(int slot, int64_t new_length);
  void reset(int slot);
  size_t slot_state_bytes() const;
  Status export_slot_state(int slot, std::span<uint8_t> out) const;
  Status import_slot_state(int slot, std::span<const uint8_t> in);
  size_t pool_block_bytes() const;
  // Prefix-cache snapshots kept on the device: `count` buffers of one slot's rings and draft
  // context (slot_state_bytes() less the length, which stays on the host), allocated once at
  // start-up (kResourceExhausted, with the numbers, when the device lacks the memory; 0 frees
  // them). save/load copy a slot to/from buffer `index` device to device on the model's stream and
  // return without synchronizing: stream order puts a load after the save it reads and a save
  // after the step it snapshots. load needs a buffer that was saved (InvalidArgument otherwise).
  Status allocate_snapshots(int count);
  int num_snapshots() const;
  size_t snapshot_device_bytes() const;  // one buffer
  Status save_snapshot(int slot, int index);
  Status load_snapshot(int slot, int index);

  Status draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps_rows);
  // The same from the last forward's taps on the device: the first `rows` taps rows of batch entry
  // `seq` (which collected taps), at positions start_pos.. .
  Status draft_insert_context_from_step(int slot, int64_t start_pos, int seq, int64_t rows);
  void draft_reset(int slot);
  // Greedy (is_greedy(temperature), kernels/sampling.h) or sampled drafts, all requests in one
  // batch; sampled draws use the counter-based RNG keyed by (seed, drafted position) as the CPU
  // draft does, so a request's drafts never depend on its batch neighbours. A sampled request's
  // q [K, vocab] stays on the device in the slot's rows of the draft store (sample(): q_row =
  // slot * draft_tokens() + j); host copies of q in results[i].probs when want_probs, of the
  // Markov-corrected z in results[i].logits when want_logits.
  using DraftQueryDev = DraftRequest;  // model/draft_request.h
  Status draft_propose(std::span<const DraftQueryDev> requests, bool want_probs, std::vector<DraftResult>& results,
                       bool want_logits = false);
  // Samples rows of the last forward's logits on the device (kernels/sampling.h): row.logits_row
  // indexes that step's logits, row.q_row the draft store. prompt_ids / counts / masks are the host
  // arrays the rows index. Rows go through fixed pinned and device buffers sized at start-up (in
  // chunks when one step's arrays exceed them); only results come back. Synchronizes the stream
  // (also when it refuses the rows).
  Status sample(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                std::span<SampleRowResult> out);
  // forward(batch, nullptr) then sample(rows, ...), in one synchronization. When the step replays a
  // graph captured with the sampler (capture_graphs(.., true)), its rows are one per logits row in
  // order (row k samples logits row k) and fit one staging chunk, the rows' descriptors go up before
  // the replay and the graph's last launch samples them (padding sequences' rows are greedy
  // placeholders whose results are dropped); otherwise the same graph samples placeholders and the
  // rows take sample()'s separate launch. Results are the same either way.
  Status forward_sample(const StepBatch& batch, std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                        std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                        std::span<SampleRowResult> out);
  // Where each batch entry's logits rows start in the step's logits (-1: none), before the step runs:
  // entries in batch order, kAll one row per token, kLast one (what last_logits_rows() reports after).
  // Returns the step's logits rows.
  static int64_t step_logits_rows(const StepBatch& batch, std::vector<int64_t>& out);
  // Rows of logits the last forward left on the device, and where each batch entry's start.
  std::span<const int64_t> last_logits_rows() const;
  // profile_step for a greedy draft of `requests` (their context must be in place), `ablate` as there.
  Result<StepProfile> profile_draft(std::span<const DraftQueryDev> requests, int reps, const ReplayHook& hook = {},
                                    int eager_reps = -1, bool ablate = false);

  // ---- measurement aids (bench-model, tests) ----
  // Fills `slot` as if `length` tokens had been run through it: random valid records in the pool
  // blocks of `block_table` (every layer's compressed entries and indexer keys), the slot's window
  // and compressor rings and its DSpark context (seeded), and sets its length; no forward runs.
  Status fill_synthetic_context(int slot, int64_t length, std::span<const int32_t> block_table, uint64_t seed);
  // Runs `batch` once eagerly (as forward, state applied) and returns the routed expert ids
  // (global ids) of every target layer: [num_hidden_layers, rows, num_experts_per_tok].
  Result<std::vector<int32_t>> routing_of_step(const StepBatch& batch);
  // The same for a greedy draft of `requests`: [num_draft_stages, B * draft_tokens(), topk].
  Result<std::vector<int32_t>> routing_of_draft(std::span<const DraftQueryDev> requests);
  // While set, the decode MoE of target layer `layer` records its three kernels' per-CTA phase
  // timestamps into `records` (3 x kernels/cuda/timeline.cuh's kCtas records, MoeDecodeArgs::timeline)
  // in every step launched or captured; null: none. An instrument (bench-model's moe_timeline).
  void set_moe_timeline(uint64_t* records, int layer);
  int tp_rank() const;
  int tp_size() const;
  // "rank 0/2: weights 80.1 GiB, KV pool ..." (the start-up log line of every pool).
  std::string memory_summary() const;

  struct Impl;

 private:
  friend struct CudaModelTestAccess;  // test-only hooks (model/cuda/cuda_model_testing.h)
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
