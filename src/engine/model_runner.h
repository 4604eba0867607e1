// ModelRunner: the engine's view of a model. Exactly what the scheduler, KV manager and DSpark
// loop need from DsV4Model (per-slot state, paged compressed KV addressed by block tables, batched
// forward, rollback, slot-state snapshots for prefix caching, DSpark draft). Sampling is the
// runner's: a step returns token ids (and requested logprobs), never logits, so a device runner
// keeps logits, draft distributions and taps on its device. A step crosses this seam as three
// calls: forward (the batch, with each new sequence's slot reset or restore folded in), commit
// (what the engine keeps of each sequence after sampling: rollback, draft context, snapshot) and
// draft_propose; under tensor parallelism each call is one plan to every rank. Prefix-cache
// snapshots live in the runner (device memory on a GPU), numbered 0 .. num_snapshots-1; the
// engine only decides which number holds what. The engine is built
// and tested against this interface; dsv4_runner.cpp adapts the CPU model, cuda_runner.cpp the
// CUDA one (both through slot_runner.h), fake_model.h a toy one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/runtime_facts.h"
#include "kernels/sampling.h"
#include "model/draft_request.h"

namespace tandem {

class Tokenizer;

// What the runner needs to know to size its pools (called once, before any forward).
struct RunnerAllocation {
  int num_blocks = 0;           // paged KV pool size
  int block_size = 256;         // tokens per block
  int max_slots = 0;            // sequences with live per-slot state (= max_num_seqs)
  int max_tokens_per_step = 0;  // scratch sizing (= max_num_batched_tokens)
  int max_verify_tokens = 1;    // K+1 (SpeculativeConfig::max_verify_tokens): the most a slot rolls back in one step
  int num_draft_tokens = 0;     // K: tokens each draft_propose drafts (0 = no drafting)
  std::string kv_cache_dtype;   // canonical: "bf16" | "fp8" | "nvfp4"
  // Prefix-cache snapshot buffers the runner keeps (slot_state_bytes() each, in the memory it
  // computes in), named by SlotCommit::snapshot and RunnerSeq::restore; 0 = no prefix caching.
  int num_snapshots = 0;
};

// One sequence's slice of a step: tokens at positions [start_pos, start_pos + tokens.size()).
struct RunnerSeq {
  int slot = 0;
  int64_t start_pos = 0;
  std::span<const int32_t> tokens;
  std::span<const int32_t> block_table;  // covers at least start_pos + tokens.size() positions
  // The last sample_rows new tokens' rows yield tokens (0: a prefill chunk; 1: the next token; 1 + L:
  // L drafts verified and the token after them). Their SampleRows are StepSamples::rows
  // [sample_begin, sample_begin + sample_rows).
  int sample_rows = 0;
  int sample_begin = 0;
  bool collect_taps = false;             // DSpark target taps for every new token (kept in the runner)
  // The slot starts over with this step (a new, resumed or preempted request): before the forward
  // the runner resets it (target state, draft context, stored draft distributions), then, when
  // `restore` >= 0, loads the prefix-cache snapshot of that number (saved by an earlier commit).
  bool reset = false;
  int restore = -1;
};

// What the engine keeps of one sequence of the last forward, decided after sampling. The runner
// applies, in this order: the slot's length becomes `length` (positions past it, at most
// max_verify_tokens, are rolled back); the first `context_rows` taps rows of that batch entry
// (positions start_pos..) enter the slot's draft context; then, when `snapshot` >= 0, the slot's
// state is saved as prefix-cache snapshot of that number (replacing what it held).
struct SlotCommit {
  int slot = 0;
  int batch_index = 0;      // the sequence's entry in the last forward's batch
  int64_t length = 0;       // start_pos + tokens, less the rejected drafts
  int64_t context_rows = 0; // 0: nothing enters the draft's context (no draft, or none accepted)
  int snapshot = -1;
};

// The rows a step samples and the arrays they index (host arrays, built by the engine; see
// kernels/sampling.h). The runner sets each row's logits_row, and maps q_row, which the engine
// sets to the draft's index within the slot's last sampled proposal (or -1), to where it keeps
// that proposal's distributions.
struct StepSamples {
  std::vector<SampleRow> rows;
  std::vector<int32_t> prompt_ids;   // SampleRow::prompt_begin/count
  std::vector<int32_t> counts;       // (token, count) pairs: SampleRow::counts_begin/count
  std::vector<uint32_t> masks;       // [mask rows, mask_words]
  int64_t mask_words = 0;
  void clear() {
    rows.clear();
    prompt_ids.clear();
    counts.clear();
    masks.clear();
  }
};

// What a step returns: one result per StepSamples row. Logits and taps stay in the runner.
struct RunnerOutput {
  std::vector<SampleRowResult> samples;
};

// Draft proposals for one sequence: slot, anchor token (the last sampled, not yet in the target
// cache) and its position, temperature (greedy when is_greedy), seed (the draft keys its draws by
// (seed, drafted position)). One struct for the engine and both models.
using DraftQuery = DraftRequest;
struct DraftProposal {
  std::vector<int32_t> tokens;      // K tokens for positions anchor_pos+1 .. anchor_pos+K
  std::vector<float> confidence;    // K values in [0,1] (sigmoid of the head's raw projection)
  // A sampled proposal's draft distributions q [K, vocab] stay in the runner, keyed by the slot,
  // until the slot's next draft_propose or reset (RunnerSeq::reset); verification reads them there
  // (SampleRow::q_row).
  bool sampled = false;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_model_len() const = 0;
  virtual int32_t eos_token_id() const = 0;
  virtual int32_t noise_token_id() const = 0;  // DSpark noise id, never emitted; -1 if none
  virtual std::string device() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;

  // "bf16" | "fp8" | "nvfp4": OK if this runner can store its KV in that dtype.
  virtual Status check_kv_cache_dtype(const std::string& dtype) const = 0;
  // Bytes one block of block_size tokens occupies in the paged pool for that dtype.
  virtual int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const = 0;
  // Fixed bytes per slot (window ring, compressor state), outside the pool.
  virtual int64_t slot_state_bytes() const = 0;
  virtual Status allocate(const RunnerAllocation& alloc) = 0;

  // Resets or restores the slots of sequences that start over (RunnerSeq::reset), then runs every
  // sequence's new tokens and samples the rows `samples` describes (null: compute the same logits,
  // sample nothing: tensor-parallel worker ranks); fills `out`. Errors are internal (shape/capacity
  // bugs, a snapshot of the wrong size) and leave the step's slots unchanged.
  virtual Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) = 0;
  // Applies what the engine keeps of the last forward's sequences (SlotCommit), once per step,
  // before the next forward or draft_propose. Errors are internal.
  virtual Status commit(std::span<const SlotCommit> commits) = 0;

  // The most rows one forward may sample, all its sequences together (each row needs its logits);
  // the engine keeps every step within it (a prompt whose log-probabilities are asked for samples
  // a row per token). Default: no limit.
  virtual int64_t max_sample_rows() const { return INT64_MAX; }

  // ---- DSpark draft ----
  virtual bool has_draft() const = 0;
  virtual int num_draft_tokens() const = 0;  // the draft block size: the largest K it can draft
  virtual Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) = 0;

  // Not OK once the runner can no longer serve (a tensor-parallel rank was lost); callable from
  // any thread.
  virtual Status health() const { return Status(); }
  // ---- operations (additive, with defaults that fit a CPU runner; model_runner.cpp) ----
  // Device facts and the kernel path per op class, for the runtime audit. Default: this process's
  // CPU, "cpu-reference" (src/kernels/cpu) for every op class, no graph capture.
  virtual DeviceFacts device_facts() const;
  // Adds this runner's named pools for `alloc` to `plan` (called before allocate()). Default: the
  // KV pool, per-slot state and the prefix-cache snapshots (kPoolPrefixSnapshots) on the host. A device runner adds weights, activations for the
  // largest step and graph shape, workspaces and communication buffers on its device, and that
  // device's free memory as a MemoryDomain; the engine adds the host's MemAvailable.
  virtual void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const;
  // Device allocations made after allocate() returned (must stay 0 under load); -1 = not counted.
  virtual int64_t device_allocations_after_start() const { return -1; }
  // CUDA graphs this runner has instantiated so far (each takes device memory); -1 = not counted.
  // And the device's free memory now, as the driver sees every allocation (cudaMemGetInfo: raw
  // runtime allocations, graphs, lazily loaded kernels, a grown stack); -1 = not measured. The
  // engine reads both when its start-up is over (graphs captured, the planner's shapes profiled)
  // and reports how far they moved since (must be 0 under load).
  virtual int64_t device_graph_instantiations() const { return -1; }
  virtual int64_t device_free_bytes() const { return -1; }
  // Seconds the runner has spent blocked waiting for the device since start-up (forward and draft
  // synchronizations); -1 = not measured.
  virtual double device_wait_seconds() const { return -1; }
  // Seconds the runner has spent in forward and draft calls before their wait for the device
  // (packing, uploads, launches); -1 = not measured.
  virtual double device_submit_seconds() const { return -1; }
};

// "model name" of /proc/cpuinfo (or "unknown CPU").
std::string host_cpu_name();

}  // namespace tandem
