// The non-template parts of slot_runner.h: the checkpoint facts a runner starts from, the model
// options of an allocation, and the batch / draft translations both runners use.
#include "engine/slot_runner.h"

#include <cmath>

namespace tandem {

Result<RunnerCheckpoint> open_runner_checkpoint(const EngineConfig& config, StateSizesFn state_sizes) {
  RunnerCheckpoint ck;
  ck.dir = config.model_dir;
  TANDEM_ASSIGN_OR_RETURN(ck.tokenizer, Tokenizer::from_file(ck.dir + "/tokenizer.json"));
  auto cfg = load_model_config(ck.dir + "/config.json");
  if (!cfg.ok()) return cfg.status().with_context("loading " + ck.dir);
  ck.config = std::move(cfg).value();
  // Sizes from the config alone; the weights are loaded once, in allocate().
  ck.probe.max_slots = 1;
  ck.probe.num_blocks = 1;
  ck.probe.block_size = 256;
  ck.probe.max_tokens_per_step = 8;
  ck.probe.max_rollback = config.speculative.max_verify_tokens();  // as allocate() gets it
  ck.probe.num_threads = config.num_threads;
  ck.probe.load_draft = true;
  auto sizes = state_sizes(ck.config, ck.probe);
  if (!sizes.ok()) return sizes.status().with_context("loading " + ck.dir);
  ck.sizes = *sizes;
  return ck;
}

Result<ModelOptions> model_options_for(const RunnerAllocation& alloc) {
  if (alloc.block_size % 128 != 0)
    return invalid_argument("--block-size {} must be a multiple of 128 for DeepSeek-V4 (compression ratio 128)",
                            alloc.block_size);
  ModelOptions o;
  o.max_slots = alloc.max_slots;
  o.num_blocks = alloc.num_blocks;
  o.block_size = alloc.block_size;
  o.max_tokens_per_step = alloc.max_tokens_per_step;
  o.max_rollback = std::max(alloc.max_verify_tokens, 1);
  o.load_draft = true;
  TANDEM_ASSIGN_OR_RETURN(o.kv_dtype, parse_kv_dtype(alloc.kv_cache_dtype.empty() ? "fp8" : alloc.kv_cache_dtype));
  return o;
}

LogitsMode logits_mode(const RunnerSeq& r) {
  return r.sample_rows == 0 ? LogitsMode::kNone : r.sample_rows == 1 ? LogitsMode::kLast : LogitsMode::kAll;
}

void to_step_batch(std::span<const RunnerSeq> batch, bool has_draft, StepBatch& out) {
  out.seqs.clear();  // no allocation once grown to the largest batch
  for (const RunnerSeq& r : batch) {
    SeqStep s;
    s.slot = r.slot;
    s.start_pos = r.start_pos;
    s.tokens = r.tokens;
    s.block_table = r.block_table;
    s.logits = logits_mode(r);
    s.collect_taps = r.collect_taps && has_draft;
    out.seqs.push_back(s);
  }
}

void first_sampled_row(std::span<const RunnerSeq> batch, std::span<const int64_t> logits_row, std::vector<int64_t>& out) {
  out.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const RunnerSeq& r = batch[i];
    const int64_t rows = logits_mode(r) == LogitsMode::kAll ? static_cast<int64_t>(r.tokens.size()) : 1;
    out.push_back(r.sample_rows == 0 ? -1 : logits_row[i] + rows - r.sample_rows);
  }
}

void to_draft_proposal(const DraftResult& r, bool sampled, DraftProposal& p) {
  p.tokens = r.tokens;
  p.confidence.resize(r.confidence.size());
  for (size_t k = 0; k < r.confidence.size(); ++k)
    p.confidence[k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(r.confidence[k]))));
  p.sampled = sampled;
}

}  // namespace tandem
