// Sampling on the device for CudaModel: the rows of a step (kernels/sampling.h) run by the CUDA
// sampling op (kernels/cuda/sample_rows.h) over the logits the forward left on the device, with
// the draft distributions of sampled proposals kept per slot on the device (q_store). Only the
// rows' descriptors and the arrays they index go up, only token ids and logprobs come back.
#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_rows.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

int64_t CudaModel::Impl::alloc_sampling(bool measure) {
  const int64_t V = cfg.vocab_size;
  sample_rows_cap = static_cast<int>(std::max<int64_t>(max_logits_rows, 1));
  mask_words = (V + 31) / 32;
  // One row's arrays are at most V unique prompt ids and V (token, count) pairs: room for that and
  // more, so any row fits and most steps go in one launch.
  sample_ints_cap = std::max<int64_t>(3 * V + 1024, int64_t{1} << 20);
  const size_t scratch = std::max<size_t>(kernels::cuda::sample_rows_scratch_bytes(sample_rows_cap, V), 1);
  if (measure)
    return static_cast<int64_t>(sample_rows_cap * (sizeof(SampleRow) + sizeof(SampleRowResult)) +
                                sample_rows_cap * mask_words * 4 + sample_ints_cap * 4 + scratch);
  d_srows.reset(static_cast<size_t>(sample_rows_cap));
  d_sres.reset(static_cast<size_t>(sample_rows_cap));
  d_smasks.reset(static_cast<size_t>(sample_rows_cap * mask_words));
  d_sints.reset(static_cast<size_t>(sample_ints_cap));
  d_sscratch.reset(scratch);
  const size_t bytes = static_cast<size_t>(sample_rows_cap) * (sizeof(SampleRow) + sizeof(SampleRowResult)) +
                       static_cast<size_t>(sample_rows_cap * mask_words) * 4 + static_cast<size_t>(sample_ints_cap) * 4;
  TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&sample_host), bytes));
  return 0;
}

std::span<const int64_t> CudaModel::last_logits_rows() const {
  // The caller's entries only: a graph step ran a batch padded to its captured size.
  const Impl& m = *impl_;
  return {m.step.logits_row.data(), std::min(m.step.seqs, m.step.logits_row.size())};
}

Status CudaModel::sample(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                         std::span<const int32_t> counts, std::span<const uint32_t> masks, int64_t mask_words,
                         std::span<SampleRowResult> out) {
  const Impl::CallTimer timer(*impl_);
  Status st = impl_->check_sample_rows(rows, prompt_ids, counts, masks, mask_words, out.size());
  if (!st.ok()) {
    synchronize();  // the step this call was to finish (forward(..., synchronize = false))
    return st;
  }
  return impl_->sample_rows(rows, prompt_ids, counts, masks, mask_words, out);
}

Status CudaModel::Impl::check_sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                                          std::span<const int32_t> counts, std::span<const uint32_t> masks,
                                          int64_t mask_words, size_t out_size, int64_t lrows) const {
  const Impl& m = *this;
  if (lrows < 0) lrows = m.step.lrows;  // the last forward's logits rows
  const int64_t V = m.cfg.vocab_size;
  if (out_size < rows.size()) return invalid_argument("sample: {} results for {} rows", out_size, rows.size());
  if (!masks.empty() && mask_words != m.mask_words)
    return invalid_argument("sample: masks of {} words per row, the vocabulary needs {}", mask_words, m.mask_words);
  const int64_t qrows = m.w.has_draft ? static_cast<int64_t>(m.opt.max_slots) * m.draft_k : 0;
  for (const SampleRow& r : rows) {
    if (r.logits_row < 0 || r.logits_row >= lrows)
      return invalid_argument("sample: logits row {} outside the step's {} rows", r.logits_row, lrows);
    if (r.draft >= V || r.draft < -1 || r.q_row >= qrows || (r.q_row >= 0 && r.draft < 0))
      return invalid_argument("sample: draft {} / q row {} out of range", r.draft, r.q_row);
    if (r.mask_row >= 0 && (r.mask_row + 1) * mask_words > static_cast<int64_t>(masks.size()))
      return invalid_argument("sample: mask row {} outside the {} masks", r.mask_row, masks.size() / std::max<int64_t>(mask_words, 1));
    if (r.prompt_count < 0 || r.prompt_begin < 0 || r.prompt_begin + r.prompt_count > static_cast<int64_t>(prompt_ids.size()) ||
        r.counts_count < 0 || r.counts_begin < 0 || 2 * (r.counts_begin + r.counts_count) > static_cast<int64_t>(counts.size()))
      return invalid_argument("sample: a row's penalty arrays are out of range");
    if (r.prompt_count + 2 * static_cast<int64_t>(r.counts_count) + 1 > m.sample_ints_cap)  // + pair alignment
      return invalid_argument("sample: one row's penalty arrays ({} ints) exceed the {} the runner holds",
                              r.prompt_count + 2 * static_cast<int64_t>(r.counts_count), m.sample_ints_cap);
    if (r.top_logprobs > kMaxTopLogprobs) return invalid_argument("sample: top_logprobs {} > {}", r.top_logprobs, kMaxTopLogprobs);
  }
  return Status();
}

SampleInputs CudaModel::Impl::sample_inputs() const {
  SampleInputs in;
  in.logits = logits.get();
  in.q = w.has_draft ? q_store.get() : nullptr;
  in.masks = d_smasks.get();
  in.prompt_ids = d_sints.get();
  in.counts = d_sints.get();
  in.vocab = cfg.vocab_size;
  in.mask_words = mask_words;
  in.eos = static_cast<int32_t>(cfg.eos_token_id);
  in.noise = cfg.has_dspark() ? static_cast<int32_t>(cfg.dspark_noise_token_id) : -1;
  return in;
}

int CudaModel::Impl::pack_sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                                      std::span<const int32_t> counts, std::span<const uint32_t> masks,
                                      int64_t row_mask_words, size_t begin, int limit, int64_t& nints, int& nmask) {
  uint8_t* hs = sample_host;
  auto* h_rows = reinterpret_cast<SampleRow*>(hs);
  auto* h_masks = reinterpret_cast<uint32_t*>(hs + sample_rows_cap * (sizeof(SampleRow) + sizeof(SampleRowResult)));
  auto* h_ints = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(h_masks) + sample_rows_cap * mask_words * 4);
  int n = 0;
  nmask = 0;
  nints = 0;
  while (begin + n < rows.size() && n < limit) {
    const SampleRow& r = rows[begin + n];
    const int64_t need = r.prompt_count + 2 * static_cast<int64_t>(r.counts_count) + 1;  // + the pair alignment
    if (nints + need > sample_ints_cap) break;
    SampleRow& h = h_rows[n];
    h = r;
    h.prompt_begin = static_cast<int32_t>(nints);
    std::memcpy(h_ints + nints, prompt_ids.data() + r.prompt_begin, 4 * static_cast<size_t>(r.prompt_count));
    nints += r.prompt_count;
    if (nints % 2) ++nints;  // pairs start even: counts index pairs (2 * counts_begin)
    h.counts_begin = static_cast<int32_t>(nints / 2);
    std::memcpy(h_ints + nints, counts.data() + 2 * static_cast<int64_t>(r.counts_begin),
                8 * static_cast<size_t>(r.counts_count));
    nints += 2 * static_cast<int64_t>(r.counts_count);
    if (r.mask_row >= 0) {
      std::memcpy(h_masks + nmask * mask_words, masks.data() + r.mask_row * row_mask_words, 4 * mask_words);
      h.mask_row = nmask++;
    }
    ++n;
  }
  return n;
}

void CudaModel::Impl::upload_sample_rows(int n, int64_t nints, int nmask) {
  uint8_t* hs = sample_host;
  auto* h_masks = reinterpret_cast<uint32_t*>(hs + sample_rows_cap * (sizeof(SampleRow) + sizeof(SampleRowResult)));
  auto* h_ints = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(h_masks) + sample_rows_cap * mask_words * 4);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(d_srows.get(), hs, sizeof(SampleRow) * n, cudaMemcpyHostToDevice, stream));
  if (nmask)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(d_smasks.get(), h_masks, 4 * static_cast<size_t>(nmask * mask_words),
                                      cudaMemcpyHostToDevice, stream));
  if (nints)
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(d_sints.get(), h_ints, 4 * static_cast<size_t>(nints), cudaMemcpyHostToDevice, stream));
}

Status CudaModel::Impl::sample_rows(std::span<const SampleRow> rows, std::span<const int32_t> prompt_ids,
                                    std::span<const int32_t> counts, std::span<const uint32_t> masks,
                                    int64_t row_mask_words, std::span<SampleRowResult> out) {
  auto* h_res = reinterpret_cast<SampleRowResult*>(sample_host + sample_rows_cap * sizeof(SampleRow));
  const SampleInputs in = sample_inputs();
  // Rows are packed into the staging area (each row's arrays copied next to it), in chunks that fit.
  if (rows.empty()) wait_stream();
  size_t i = 0;
  while (i < rows.size()) {
    int64_t nints = 0;
    int nmask = 0;
    const int n = pack_sample_rows(rows, prompt_ids, counts, masks, row_mask_words, i, sample_rows_cap, nints, nmask);
    TANDEM_CHECK_MSG(n > 0, "sample: a row does not fit the staging area");
    upload_sample_rows(n, nints, nmask);
    kernels::cuda::sample_rows_device({in, d_srows.get(), n, d_sscratch.get(), d_sres.get()}, stream);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_res, d_sres.get(), sizeof(SampleRowResult) * n, cudaMemcpyDeviceToHost, stream));
    wait_stream();
    std::copy(h_res, h_res + n, out.begin() + static_cast<std::ptrdiff_t>(i));
    i += static_cast<size_t>(n);
  }
  return Status();
}

Status CudaModel::forward_sample(const StepBatch& batch, std::span<const SampleRow> rows,
                                 std::span<const int32_t> prompt_ids, std::span<const int32_t> counts,
                                 std::span<const uint32_t> masks, int64_t mask_words, std::span<SampleRowResult> out) {
  Impl& m = *impl_;
  const Impl::CallTimer timer(m);
  // The graph this step replays and the rows its sampler launch draws: one per logits row of the
  // padded batch (graph_step's shape, forward's padding).
  int srows = 0, per = 0;
  if (m.graph_sampler && m.graph_step(batch)) {
    size_t padded = 1;
    while (padded < batch.seqs.size()) padded *= 2;
    const SeqStep& f = batch.seqs[0];
    per = f.logits == LogitsMode::kAll ? static_cast<int>(f.tokens.size()) : f.logits == LogitsMode::kLast ? 1 : 0;
    if (static_cast<int64_t>(padded) * per <= m.sample_rows_cap) srows = static_cast<int>(padded) * per;
  }
  if (srows == 0) {  // no sampler in this step's graph: today's separate launch
    TANDEM_RETURN_IF_ERROR(forward(batch, nullptr, /*synchronize=*/false));
    return sample(rows, prompt_ids, counts, masks, mask_words, out);
  }
  // The rows must be the step's logits rows in order (the real sequences' rows come first) and fit
  // one staging chunk; the padding's rows are greedy placeholders.
  const int real = static_cast<int>(rows.size());
  bool in_graph = real <= srows && out.size() >= rows.size();
  for (int k = 0; in_graph && k < real; ++k) in_graph = rows[k].logits_row == k;
  int64_t nints = 0;
  int nmask = 0;
  if (in_graph) {
    // Rows that fail the checks leave the step unrun: check before anything is launched.
    TANDEM_RETURN_IF_ERROR(m.check_sample_rows(rows, prompt_ids, counts, masks, mask_words, out.size(),
                                               /*lrows=*/static_cast<int64_t>(batch.seqs.size()) * per));
    in_graph = m.pack_sample_rows(rows, prompt_ids, counts, masks, mask_words, 0, real, nints, nmask) == real;
  }
  auto* h_rows = reinterpret_cast<SampleRow*>(m.sample_host);
  if (!in_graph) {
    nints = 0;
    nmask = 0;
  }
  for (int k = in_graph ? real : 0; k < srows; ++k) {
    h_rows[k] = SampleRow();
    h_rows[k].logits_row = k;
  }
  m.upload_sample_rows(srows, nints, nmask);  // before the replay, on the same stream
  m.graph_srows = srows;
  Status st = forward(batch, nullptr, /*synchronize=*/false);
  m.graph_srows = 0;
  if (!st.ok()) {
    synchronize();
    return st;
  }
  if (!in_graph) {
    // The placeholders' upload reads the pinned staging that sample() packs again: let it finish.
    synchronize();
    return sample(rows, prompt_ids, counts, masks, mask_words, out);
  }
  auto* h_res = reinterpret_cast<SampleRowResult*>(m.sample_host + m.sample_rows_cap * sizeof(SampleRow));
  if (real > 0)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_res, m.d_sres.get(), sizeof(SampleRowResult) * real, cudaMemcpyDeviceToHost,
                                      m.stream));
  m.wait_stream();
  std::copy(h_res, h_res + real, out.begin());
  ++m.gstats.sampled_in_graph;
  return Status();
}

}  // namespace tandem
