// A deterministic toy model and tokenizer behind the ModelRunner interface, for engine tests and
// benchmarks. Logits are a hash of the whole token history (carried in per-slot "compressor" state
// that must be snapshotted/restored exactly), every forward cross-checks the tokens it reads back
// through the block table, and the fake DSpark draft agrees with the target's greedy choice a
// controllable fraction of the time. Optional busy-wait costs imitate a weight-streaming GPU step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "engine/host_sampling.h"
#include "text/tokenizer.h"

namespace tandem {

struct FakeModelConfig {
  int64_t vocab_size = 64;     // ids: 0 <s>, 1 </s>, vocab-1 noise, 2..4 UTF-8 pieces, rest words
  int64_t max_model_len = 8192;
  int num_draft_tokens = 5;
  bool has_draft = true;
  double draft_agree = 0.7;    // chance a draft position agrees with the target's argmax
  double eos_logit_penalty = 6.0;  // keeps EOS rare unless a test wants it
  double logit_scale = 4.0;
  std::vector<std::string> kv_dtypes = {"bf16", "fp8"};  // nvfp4 unsupported on purpose
  // Simulated cost (busy-wait): fixed per forward + per token, fixed per draft call + per request.
  double forward_fixed_us = 0, forward_per_token_us = 0, draft_fixed_us = 0, draft_per_seq_us = 0;
  int64_t max_sample_rows = 0;  // ModelRunner::max_sample_rows (0 = no limit); forward refuses more
};

// Tiny tokenizer for the fake vocab (no merges; encode is longest-match over the token strings).
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(int64_t vocab_size);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
};

class FakeModelRunner : public ModelRunner {
 public:
  explicit FakeModelRunner(FakeModelConfig config);

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_model_len() const override { return config_.max_model_len; }
  int32_t eos_token_id() const override { return 1; }
  int32_t noise_token_id() const override { return static_cast<int32_t>(config_.vocab_size - 1); }
  std::string device() const override { return "cpu"; }
  const Tokenizer& tokenizer() const override { return tokenizer_; }
  Status check_kv_cache_dtype(const std::string& dtype) const override;
  int64_t kv_bytes_per_block(int block_size, const std::string& dtype) const override;
  int64_t slot_state_bytes() const override;
  Status allocate(const RunnerAllocation& alloc) override;
  Status forward(std::span<const RunnerSeq> batch, const StepSamples* samples, RunnerOutput& out) override;
  Status commit(std::span<const SlotCommit> commits) override;
  bool has_draft() const override { return config_.has_draft; }
  int num_draft_tokens() const override { return config_.num_draft_tokens; }
  int64_t max_sample_rows() const override {
    return config_.max_sample_rows > 0 ? config_.max_sample_rows : ModelRunner::max_sample_rows();
  }
  Status draft_propose(std::span<const DraftQuery> reqs, std::vector<DraftProposal>& out) override;

  // ---- oracles for tests ----
  // Raw logits after the history `tokens` (predicting position tokens.size()).
  void reference_logits(const std::vector<int32_t>& tokens, std::vector<float>& logits) const;
  int64_t draft_context_errors() const { return draft_context_errors_; }
  // The slot's last sampled proposal's q [K, vocab] as the runner keeps it (null when greedy).
  const float* stored_q(int slot) const { return sampling_.q(slot); }
  int64_t forward_calls() const { return forward_calls_; }
  int64_t forward_tokens() const { return forward_tokens_; }
  int num_snapshots() const { return static_cast<int>(snapshots_.size()); }  // RunnerAllocation's
  int64_t snapshots_saved() const { return snapshots_saved_; }
  const FakeModelConfig& config() const { return config_; }

 private:
  static constexpr int kRing = 64;  // history kept per slot for rollback and cross-checks
  struct SlotState {
    int64_t len = 0;
    uint64_t acc[kRing] = {};      // acc after position p at [p % kRing]
    int32_t token[kRing] = {};     // token at position p at [p % kRing]
    int64_t draft_len = 0;         // draft context rows inserted (positions [0, draft_len))
  };
  uint64_t acc_at(const SlotState& s, int64_t p) const;
  // The context rows a commit sends to the draft, checked against the slot's history.
  void insert_context(const SlotCommit& c, int64_t start_pos);
  void logits_from_acc(uint64_t acc, float* out) const;
  int32_t greedy_from_acc(uint64_t acc) const;

  FakeModelConfig config_;
  FakeTokenizer tokenizer_;
  RunnerAllocation alloc_;
  std::vector<SlotState> slots_;
  std::vector<SlotState> snapshots_;   // the prefix-cache snapshots, by number
  std::vector<uint8_t> snap_saved_;
  int64_t snapshots_saved_ = 0;
  std::vector<int32_t> pool_;      // [num_blocks * block_size] token written at each KV position
  std::vector<float> scratch_;
  std::vector<float> logits_;              // the last forward's sampled rows
  std::vector<int64_t> logits_first_row_;  // per batch entry
  std::vector<float> taps_;                // the last forward's taps: (token, position) per row
  std::vector<int64_t> taps_first_row_;    // per batch entry (-1: none)
  std::vector<std::pair<int, int64_t>> last_;  // the last forward's (slot, start_pos) per batch entry
  HostSampling sampling_;
  int64_t draft_context_errors_ = 0;
  int64_t forward_calls_ = 0;
  int64_t forward_tokens_ = 0;
};

// Mixing helpers shared with the sampler's counter-based RNG.
uint64_t fake_mix(uint64_t a, uint64_t b);
double fake_u01(uint64_t h);  // [0,1)

}  // namespace tandem
