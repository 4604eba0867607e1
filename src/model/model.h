// DsV4Model: the DeepSeek-V4-Flash forward pass on the CPU (the project's correctness oracle) and the
// DSpark draft. Owns the weights (kept quantized: views into the checkpoint), the per-slot fixed state (sliding
// window rings, compressor partial state) and the paged pool of compressed-KV blocks.
//
// Cache model (what the engine must know):
//  * A "slot" is one sequence's fixed state: for every layer a sliding-window ring of
//    (sliding_window + max_rollback) KV rows addressed by position % ring size, and for every
//    compressed layer a ring of the per-token compressor rows (kv, gate score + ape) covering the
//    current partial block, the previous block (ratio-4 overlap) and max_rollback more tokens.
//  * Compressed entries (CSA main entries, CSA indexer keys, HCA entries) of token positions
//    [b*block_size, (b+1)*block_size) of a sequence live in the pool block block_table[b]. Every
//    layer's entries of those positions share the one block id. block_size % 128 == 0.
//  * forward() appends `tokens` at positions start_pos.. of a slot; start_pos must equal the slot's
//    current length (after rollback, the rolled-back length). The block table must cover every
//    position < start_pos + tokens.size().
//  * rollback(slot, n) forgets positions >= n (n >= length - max_rollback).
//  * export/import_slot_state copy the slot's fixed state; valid at any position, meant for block
//    boundaries (prefix caching: the compressed entries themselves stay in the shared pool blocks).
//
// Every forward path (whole prefill, chunked prefill with any chunk sizes, one-token decode,
// multi-token verify, any mix in one batch) computes the same fp32 math per token, so all give
// identical logits for the same token history.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"
#include "model/draft_request.h"

namespace tandem {

struct CpuModelTestAccess;
class Checkpoint;
class DataComm;
struct TensorView;

// How the cached KV values are stored (the engine's --kv-cache-dtype, canonical names). The CPU
// model keeps every cached value as an fp32 float either way; the dtype decides which round trip
// the non-RoPE dims take before they are cached and attended to (the RoPE dims are bf16 in every
// mode, as in the reference). Applies to the sliding-window KV, the CSA/HCA compressed entries and
// the DSpark draft's KV (context window and block: the draft follows the target's dtype, as a
// serving engine stores both in one KV format). The CSA indexer keys keep their FP4 round trip.
//  * kFp8:   the reference's act_quant(kv[..., :nope], 64): e4m3 with one UE8M0 scale per 64
//            (the layout of vLLM's fp8_ds_mla record: 448 B NoPE + 8 B scales + 128 B bf16 RoPE).
//  * kBf16:  no round trip: the values stay the bf16 values kv_norm and RoPE produce.
//  * kNvfp4: NVFP4 on the NoPE dims: e2m1 with one e4m3 scale per 16 (global scale 1.0), see
//            num::round_nvfp4 (the nvfp4_ds_mla record: 224 B e2m1 + 28 B scales + 128 B bf16 RoPE,
//            384 B with padding, as FlashInfer #4955 / SGLang #38646 store DeepSeek-V4's 448+64 dims).
//            Groups start at NoPE dim 0 (448 = 28 x 16, no ragged group). Variants with FP8 RoPE
//            (FlashMLA's V3.2 "nvfp4.fp8rope") or a 512-wide NoPE (the GLM record of vLLM fork #82,
//            432 B) exist; the RoPE dims stay bf16 here, as in the reference and FlashInfer's DSV4
//            record, so the modes differ only in how the NoPE dims are rounded.
enum class KvDtype : uint8_t { kFp8, kBf16, kNvfp4 };
// "fp8" | "bf16" | "nvfp4" (the engine's canonical names); anything else is InvalidArgument.
Result<KvDtype> parse_kv_dtype(const std::string& name);
const char* kv_dtype_name(KvDtype dtype);

struct ModelOptions {
  int max_slots = 4;              // sequences with live state
  int num_blocks = 64;            // compressed-KV pool blocks (shared by all slots)
  int block_size = 256;           // tokens per pool block; multiple of 128
  int max_tokens_per_step = 1024; // scratch sizing: total new tokens of one forward()
  int max_rollback = 16;          // >= max verify tokens (K+1)
  int num_threads = 0;            // 0 = OpenMP default
  bool load_draft = true;         // load the DSpark stages when the checkpoint has them
  KvDtype kv_dtype = KvDtype::kFp8;  // fp8 = the reference's numerics (golden tests)
  // Tensor parallelism: this model is rank tp_rank of tp_size and binds only its slices (heads,
  // output groups, index heads, routed experts, vocabulary rows; see model/weights.h); `comm`, the
  // data plane (common/comm.h: host pointers and fp32 sums in rank order for the CPU model, device
  // pointers on the model's stream for CudaModel), carries the activations' collectives and must
  // outlive the model (required when tp_size > 1). Step plans are not the model's business (the
  // runner's control plane carries them). Every rank must make the same calls in the same order:
  // forward, draft_insert_context (projection is local, but keep them in step), draft_propose.
  // Every rank returns the full logits.
  int tp_rank = 0;
  int tp_size = 1;
  DataComm* comm = nullptr;
};

// The model's fixed memory for a config + options, without weights (what load() with the same
// options reports through slot_state_bytes() / pool_block_bytes()).
struct ModelStateSizes {
  size_t slot_state_bytes = 0;   // one slot's snapshot (window + compressor rings, DSpark context)
  size_t pool_block_bytes = 0;   // one compressed-KV pool block, all layers
};

enum class LogitsMode : uint8_t { kNone, kLast, kAll };

// One sequence's part of a step.
struct SeqStep {
  int slot = 0;
  int64_t start_pos = 0;                  // == the slot's current length
  std::span<const int32_t> tokens;        // new tokens at positions start_pos..
  std::span<const int32_t> block_table;   // pool block ids, block b covers [b*bs, (b+1)*bs)
  LogitsMode logits = LogitsMode::kLast;
  bool collect_taps = false;              // DSpark target taps for every new token
};

struct StepBatch {
  std::vector<SeqStep> seqs;
};

// Output rows are in batch order. logits: for each seq, 0 (kNone), 1 (kLast) or tokens.size()
// (kAll) rows of vocab_size floats, first row at logits_row[i]. taps: for each seq with
// collect_taps, tokens.size() rows of tap_dim() floats (mean over hc streams after each
// dspark_target_layer_ids layer, concatenated), first row at taps_row[i] (-1 when none).
// Buffers are reused across calls (no allocation once grown to the largest step).
struct StepOutput {
  std::vector<float> logits;
  std::vector<int64_t> logits_row;
  int64_t num_logits_rows = 0;
  std::vector<float> taps;
  std::vector<int64_t> taps_row;
  int64_t num_taps_rows = 0;

  std::span<const float> logits_for(size_t seq, int64_t vocab, int64_t row_in_seq = 0) const {
    return {logits.data() + (logits_row[seq] + row_in_seq) * vocab, static_cast<size_t>(vocab)};
  }
};

// DSpark proposal for one slot: DraftRequest (model/draft_request.h); the host sampler
// (kernels/cpu/sampling.h) draws a sampled request's tokens.

struct DraftSampling {
  bool want_probs = false;      // fill probs with q_i = softmax(z_i / T) (T=0: one-hot)
  // Tokens drafted per request: the block [anchor, noise x (K-1)] is cut to K rows, so a smaller
  // K costs proportionally less. 0 = the checkpoint's dspark_block_size.
  int64_t num_tokens = 0;
};

struct DraftResult {
  std::vector<int32_t> tokens;       // [K]
  std::vector<float> confidence;     // [K] raw confidence-head projection (no sigmoid)
  std::vector<float> logits;         // [K, vocab] Markov-corrected draft logits z_i
  std::vector<float> probs;          // [K, vocab] when want_probs
};

// The checks every backend runs on a step before touching state (InvalidArgument names the
// sequence and the field): slots in range and distinct, start_pos == the slot's length, token ids
// in the vocabulary, positions within max_position_embeddings, block tables long enough and in
// the pool, taps only with a draft, at most max_tokens_per_step tokens.
Status validate_step_batch(const StepBatch& batch, const ModelConfig& cfg, const ModelOptions& opt,
                           std::span<const int64_t> slot_len);

struct LoadReport {
  int64_t target_tensors_loaded = 0;
  int64_t target_tensors_expected = 0;
  int64_t draft_tensors_loaded = 0;
  int64_t draft_tensors_expected = 0;
  int64_t skipped_tensors = 0;       // checkpoint tensors not used (draft when load_draft=false)
  int64_t other_rank_tensors = 0;    // routed-expert tensors bound by other tensor-parallel ranks
  size_t weight_bytes = 0;           // weights this rank holds (its slices: views + copies)
  std::string summary() const;       // "N/N target tensors loaded; M/M draft tensors loaded; ..."
};

class DsV4Model {
 public:
  // Loads config.json + safetensors from `dir`. Missing, unexpected or mis-shaped tensors are
  // errors naming the tensor.
  static Result<std::unique_ptr<DsV4Model>> load(const std::string& dir, const ModelOptions& options);
  // Same from an already parsed config and a tensor lookup (tests build weights in memory).
  // `tensors` lists every tensor of the checkpoint. The model keeps the weight matrices in their
  // stored format as views into the tensors' data, which must outlive the model.
  static Result<std::unique_ptr<DsV4Model>> from_tensors(const ModelConfig& config,
                                                         const std::vector<const TensorView*>& tensors,
                                                         const ModelOptions& options);
  // Sizes from the config alone (the draft counts when config.has_dspark() && options.load_draft,
  // as load() decides). Invalid config or options are InvalidArgument, as load() reports them.
  static Result<ModelStateSizes> state_sizes(const ModelConfig& config, const ModelOptions& options);
  ~DsV4Model();
  DsV4Model(const DsV4Model&) = delete;
  DsV4Model& operator=(const DsV4Model&) = delete;

  const ModelConfig& config() const;
  const ModelOptions& options() const;
  const LoadReport& load_report() const;
  int64_t vocab_size() const;
  bool has_draft() const;
  int draft_block_size() const;      // K (dspark_block_size), 0 without draft
  int64_t tap_dim() const;           // hidden_size * len(dspark_target_layer_ids), 0 without draft

  // Runs one step. Errors (bad slot, start_pos != slot length, block table too short, too many
  // tokens, token id out of range) are InvalidArgument and leave every slot unchanged.
  Status forward(const StepBatch& batch, StepOutput& out);

  int64_t slot_length(int slot) const;
  Status rollback(int slot, int64_t new_length);
  void reset(int slot);

  // Prefix caching: the slot's fixed state (window rings + compressor rows + length, and the DSpark
  // context windows when the model has a draft).
  size_t slot_state_bytes() const;
  Status export_slot_state(int slot, std::span<uint8_t> out) const;
  Status import_slot_state(int slot, std::span<const uint8_t> in);
  size_t pool_block_bytes() const;   // bytes of one compressed-KV pool block (all layers)

  // DSpark. Inserts the context rows (taps from forward(), accepted positions only) at positions
  // start_pos.. into every stage's 128-position context window of `slot`.
  Status draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps_rows);
  void draft_reset(int slot);
  Status draft_propose(std::span<const DraftRequest> requests, const DraftSampling& sampling,
                       std::vector<DraftResult>& results);

  struct Impl;

 private:
  friend struct CpuModelTestAccess;  // test-only hooks (model/model_testing.h)
  explicit DsV4Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
