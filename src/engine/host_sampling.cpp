// HostSampling: see host_sampling.h. The one place the engine's host-side runners reach the host
// sampler (kernels/cpu/sampling.h).
#include "engine/host_sampling.h"

#include <algorithm>

#include "kernels/cpu/sampling.h"

namespace tandem {

HostSampling::HostSampling() = default;
HostSampling::~HostSampling() = default;

void HostSampling::init(int64_t vocab, int32_t eos, int32_t noise, int max_slots) {
  vocab_ = vocab;
  eos_ = eos;
  noise_ = noise;
  q_.assign(static_cast<size_t>(max_slots), {});
  q_rows_.assign(static_cast<size_t>(max_slots), 0);
  sampler_ = std::make_unique<RowSampler>(vocab);
}

float* HostSampling::store_q(int slot, int k) {
  q_[slot].resize(static_cast<size_t>(k) * vocab_);
  q_rows_[slot] = k;
  return q_[slot].data();
}

void HostSampling::clear_q(int slot) { q_rows_[slot] = 0; }

Status HostSampling::run(std::span<const RunnerSeq> batch, const StepSamples& samples,
                         std::span<const int64_t> logits_first_row, const float* logits, RunnerOutput& out) {
  rows_.assign(samples.rows.begin(), samples.rows.end());
  int nq = 0;
  for (const SampleRow& r : rows_)
    if (r.q_row >= 0) ++nq;
  qbuf_.resize(static_cast<size_t>(nq) * vocab_);
  nq = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const RunnerSeq& s = batch[i];
    if (s.sample_rows == 0) continue;
    if (s.sample_begin < 0 || s.sample_begin + s.sample_rows > static_cast<int>(rows_.size()))
      return make_error(StatusCode::kInternal, "sampling: seq {} rows [{}, +{}) outside the step's {} rows", i,
                        s.sample_begin, s.sample_rows, rows_.size());
    for (int j = 0; j < s.sample_rows; ++j) {
      SampleRow& r = rows_[s.sample_begin + j];
      r.logits_row = static_cast<int32_t>(logits_first_row[i] + j);
      if (r.q_row < 0) continue;
      if (r.q_row >= q_rows_[s.slot])
        return make_error(StatusCode::kInternal, "sampling: slot {} has no stored draft distribution {}", s.slot,
                          r.q_row);
      std::copy_n(q_[s.slot].data() + static_cast<int64_t>(r.q_row) * vocab_, vocab_,
                  qbuf_.data() + static_cast<int64_t>(nq) * vocab_);
      r.q_row = nq++;
    }
  }
  SampleInputs in;
  in.logits = logits;
  in.q = qbuf_.data();
  in.masks = samples.masks.data();
  in.prompt_ids = samples.prompt_ids.data();
  in.counts = samples.counts.data();
  in.vocab = vocab_;
  in.mask_words = samples.mask_words;
  in.eos = eos_;
  in.noise = noise_;
  out.samples.resize(rows_.size());
  sample_rows_host(in, rows_, out.samples, *sampler_, scratch_);
  return Status();
}

}  // namespace tandem
