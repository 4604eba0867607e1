// HostSampling: sampling for runners whose logits are on the host (the CPU model, the fake model).
// It keeps each slot's sampled draft distributions and runs the host sampler over a step's rows;
// the backend's sampler stays behind this file (the engine's headers name no backend).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model_runner.h"

namespace tandem {

class RowSampler;  // kernels/cpu/sampling.h

class HostSampling {
 public:
  HostSampling();
  ~HostSampling();
  void init(int64_t vocab, int32_t eos, int32_t noise, int max_slots);
  // Storage for the slot's proposal distributions [k, vocab] (the previous proposal's are dropped).
  float* store_q(int slot, int k);
  void clear_q(int slot);
  // The slot's stored distributions (null when its last proposal was greedy).
  const float* q(int slot) const { return q_rows_[slot] > 0 ? q_[slot].data() : nullptr; }
  // Samples `samples` for `batch`; logits_first_row[i]: the logits row of seq i's first sampled row.
  Status run(std::span<const RunnerSeq> batch, const StepSamples& samples, std::span<const int64_t> logits_first_row,
             const float* logits, RunnerOutput& out);

 private:
  int64_t vocab_ = 0;
  int32_t eos_ = -1, noise_ = -1;
  std::vector<std::vector<float>> q_;  // per slot [k, vocab]
  std::vector<int> q_rows_;            // per slot: rows stored
  std::vector<SampleRow> rows_;
  std::vector<float> qbuf_;
  std::unique_ptr<RowSampler> sampler_;
  std::vector<int32_t> scratch_;
};

}  // namespace tandem
