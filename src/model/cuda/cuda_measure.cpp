// CudaModel with synthetic weights (start-up without a checkpoint: the per-rank plan, a memory
// check before any allocation, generation on the device) and the measurement aids bench-model and
// the tests use: a synthetic context written straight into the KV pool and slot state, the routed
// experts of a step, the op-class names and the per-rank memory summary.
#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "io/catalog.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/synthetic_fill.h"
#include "model/cuda/synthetic_weights.h"
#include "model/shard_plan.h"

namespace tandem {

const char* CudaModel::op_class_name(OpClass c) {
  switch (c) {
    case OpClass::kEmbed: return "embedding";
    case OpClass::kMhc: return "mhc_and_norms";
    case OpClass::kDense: return "dense_projections";
    case OpClass::kCompressor: return "compressor";
    case OpClass::kIndexer: return "indexer_and_topk";
    case OpClass::kAttention: return "attention";
    case OpClass::kRouter: return "router";
    case OpClass::kRoutedExperts: return "routed_experts";
    case OpClass::kSharedExperts: return "shared_experts";
    case OpClass::kLmHead: return "lm_head";
    case OpClass::kCollective: return "collectives";
    case OpClass::kOther: return "other";
    case OpClass::kCount: break;
  }
  return "?";
}

int CudaModel::tp_rank() const { return impl_->opt.tp_rank; }
int CudaModel::tp_size() const { return impl_->opt.tp_size; }

std::string CudaModel::memory_summary() const {
  const Memory mem = memory();
  return fmt::format("rank {}/{} device memory: weights {:.1f} MiB, KV pool {:.1f} MiB, slot state {:.1f} MiB, "
                     "draft state {:.1f} MiB, scratch {:.1f} MiB (total {:.1f} MiB)",
                     impl_->opt.tp_rank, impl_->opt.tp_size, mem.weights / 1048576.0, mem.pool / 1048576.0,
                     mem.slot_state / 1048576.0, mem.draft_state / 1048576.0, mem.scratch / 1048576.0,
                     mem.total() / 1048576.0);
}

Result<std::unique_ptr<CudaModel>> CudaModel::synthetic(const ModelConfig& config, const CudaModelOptions& options,
                                                        const SyntheticOptions& synth) {
  TANDEM_RETURN_IF_ERROR(cuda_model::validate_start(config, options));
  TANDEM_ASSIGN_OR_RETURN(Catalog catalog, build_catalog(config));
  const ModelOptions& o = options.model;
  TANDEM_ASSIGN_OR_RETURN(model::ShardPlan plan,
                          model::plan_shard(config, catalog, {o.tp_rank, o.tp_size}, o.load_draft));
  auto impl = std::make_unique<Impl>();
  impl->draft_k = options.draft_tokens > 0 ? options.draft_tokens : config.dspark_block_size;
  TANDEM_RETURN_IF_ERROR(impl->init(config, options));
  // Shapes and bytes first: a model that does not fit is refused before anything is allocated.
  TANDEM_ASSIGN_OR_RETURN(cuda_model::SyntheticBuild shapes,
                          cuda_model::build_synthetic_weights(config, plan, nullptr, synth.seed, impl->stream));
  impl->w = shapes.w;
  impl->lay = cuda_model::plan_layout(config, o, impl->w.has_draft);
  TANDEM_RETURN_IF_ERROR(cuda_model::check_fits(*impl, shapes.arena_bytes, cuda_model::allocate_all(*impl, true)));
  const int64_t before = kernels::cuda::alloc_stats().bytes;
  impl->weight_arena.reset(static_cast<size_t>(shapes.arena_bytes));
  TANDEM_ASSIGN_OR_RETURN(cuda_model::SyntheticBuild built,
                          cuda_model::build_synthetic_weights(config, plan, impl->weight_arena.get(), synth.seed,
                                                              impl->stream));
  impl->w = built.w;
  cuda_model::allocate_all(*impl, false);  // synchronizes the stream: the weights are generated
  impl->own_bytes = kernels::cuda::alloc_stats().bytes - before;
  LoadReport& rep = impl->report;
  rep.target_tensors_loaded = rep.target_tensors_expected = built.target_tensors;
  rep.draft_tensors_loaded = rep.draft_tensors_expected = built.tensors - built.target_tensors;
  rep.skipped_tensors = plan.skipped_tensors;
  rep.other_rank_tensors = plan.other_rank_tensors;
  rep.weight_bytes = static_cast<size_t>(built.arena_bytes);
  impl->origin = fmt::format("synthetic {} (seed {})", synth.name.empty() ? "model" : synth.name, synth.seed);
  std::unique_ptr<CudaModel> m(new CudaModel(std::move(impl)));
  TLOG_INFO("model", "{} on {}: {} of {} catalog tensors generated on the device ({:.2f} GB stored, {}); {}",
            m->impl_->origin, m->device_name(), built.tensors, catalog.tensors.size(), plan.held_bytes / 1e9,
            rep.summary(), m->memory_summary());
  return m;
}

Status CudaModel::fill_synthetic_context(int slot, int64_t length, std::span<const int32_t> block_table,
                                         uint64_t seed) {
  Impl& m = *impl_;
  const int64_t bs = m.opt.block_size;
  if (slot < 0 || slot >= m.opt.max_slots) return invalid_argument("fill_synthetic_context: slot {} out of range", slot);
  if (length < 0 || length > m.cfg.max_position_embeddings)
    return invalid_argument("fill_synthetic_context: length {} outside [0, {}]", length, m.cfg.max_position_embeddings);
  const int64_t nblocks = (length + bs - 1) / bs;
  if (static_cast<int64_t>(block_table.size()) < nblocks || nblocks > m.max_blocks)
    return invalid_argument("fill_synthetic_context: {} positions need {} blocks, the table has {}", length, nblocks,
                            block_table.size());
  for (int64_t b = 0; b < nblocks; ++b)
    if (block_table[b] < 0 || block_table[b] >= m.opt.num_blocks)
      return invalid_argument("fill_synthetic_context: block id {} outside the pool [0, {})", block_table[b],
                              m.opt.num_blocks);
  kernels::cuda::set_stream(m.stream);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // fill_table may still be read by an earlier fill
  if (nblocks)
    TANDEM_CUDA_CHECK(cudaMemcpy(m.fill_table.get(), block_table.data(), sizeof(int32_t) * nblocks,
                                 cudaMemcpyHostToDevice));
  namespace synth = cuda_model::synth;
  using synth::RecordKind;
  auto records = [&](uint8_t* base, const int32_t* blocks, int64_t regions, int64_t stride, int64_t off, int64_t count,
                     RecordKind kind, int64_t rec_bytes, uint64_t s) {
    synth::RecordFillArgs a;
    a.base = base;
    a.blocks = blocks;
    a.regions = regions;
    a.region_stride = stride;
    a.offset = off;
    a.count = count;
    a.kind = kind;
    a.rec = m.lay.rec;
    a.key = m.lay.key;
    a.rec_bytes = rec_bytes;
    a.seed = synth::hash(seed, s);
    synth::fill_records(a, m.stream);
  };
  uint8_t* st = m.slot_state.get() + static_cast<int64_t>(slot) * m.lay.slot_bytes;
  for (int l = 0; l < m.cfg.num_hidden_layers; ++l) {
    const cuda_model::LayerState& L = m.lay.layers[l];
    const int r = m.cfg.compress_ratios[l];
    const uint64_t ls = static_cast<uint64_t>(l) * 8;
    // The window ring (every position of the ring holds a record) and the compressor rows.
    records(st, nullptr, 1, 0, L.win_off, m.lay.win_ring, RecordKind::kKv, m.lay.rec.bytes, ls + 1);
    if (!r) continue;
    records(m.pool.get(), m.fill_table.get(), nblocks, m.lay.block_bytes, L.pool_main, bs / r, RecordKind::kKv,
            m.lay.rec.bytes, ls + 2);
    records(st, nullptr, 1, 0, L.comp_off, m.lay.comp_ring[l], RecordKind::kF32, 4 * 2 * m.lay.comp_chans[l], ls + 3);
    if (r == 4) {
      records(m.pool.get(), m.fill_table.get(), nblocks, m.lay.block_bytes, L.pool_idx, bs / 4, RecordKind::kKey,
              m.lay.key.bytes, ls + 4);
      records(st, nullptr, 1, 0, L.icomp_off, m.lay.icomp_ring[l], RecordKind::kF32, 4 * 2 * m.lay.icomp_chans[l],
              ls + 5);
    }
  }
  if (m.lay.draft_slot_bytes)
    records(m.draft_ctx.get() + static_cast<int64_t>(slot) * m.lay.draft_slot_bytes, nullptr, 1, 0, 0,
            static_cast<int64_t>(m.cfg.num_draft_stages) * m.cfg.sliding_window, RecordKind::kKv, m.lay.rec.bytes, 7);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.slot_len[slot] = length;
  return Status();
}

Result<std::vector<int32_t>> CudaModel::routing_of_step(const StepBatch& batch) {
  Impl& m = *impl_;
  kernels::cuda::set_stream(m.stream);
  TANDEM_RETURN_IF_ERROR(m.prepare(batch, nullptr));
  const int64_t rows = m.step.rows, K = m.cfg.num_experts_per_tok, L = m.cfg.num_hidden_layers;
  m.recording_routes = true;
  m.launch();
  m.recording_routes = false;
  m.finish(nullptr, true);
  ++m.gstats.eager;
  TANDEM_RETURN_IF_ERROR(std::exchange(m.comm_status, Status()));
  std::vector<int32_t> ids(static_cast<size_t>(L * rows * K));
  if (rows)
    TANDEM_CUDA_CHECK(cudaMemcpy2D(ids.data(), sizeof(int32_t) * rows * K, m.route_rec.get(),
                                   sizeof(int32_t) * m.max_rows * K, sizeof(int32_t) * rows * K, L,
                                   cudaMemcpyDeviceToHost));
  return ids;
}

Result<std::vector<int32_t>> CudaModel::routing_of_draft(std::span<const DraftQueryDev> requests) {
  Impl& m = *impl_;
  if (!m.w.has_draft) return invalid_argument("routing_of_draft: the model has no DSpark draft");
  const int64_t B = static_cast<int64_t>(requests.size()), K = m.cfg.num_experts_per_tok, N = B * m.draft_k;
  const int64_t L = m.cfg.num_hidden_layers, S = m.cfg.num_draft_stages;
  std::vector<DraftResult> res;
  const int graphs = m.copt.max_graph_batch;
  m.copt.max_graph_batch = 0;  // eager: a replayed graph would not record
  m.recording_routes = true;
  Status st = draft_propose(requests, false, res);
  m.recording_routes = false;
  m.copt.max_graph_batch = graphs;
  TANDEM_RETURN_IF_ERROR(st);
  std::vector<int32_t> ids(static_cast<size_t>(S * N * K));
  if (N)
    TANDEM_CUDA_CHECK(cudaMemcpy2D(ids.data(), sizeof(int32_t) * N * K, m.route_rec.get() + L * m.max_rows * K,
                                   sizeof(int32_t) * m.max_rows * K, sizeof(int32_t) * N * K, S,
                                   cudaMemcpyDeviceToHost));
  return ids;
}

}  // namespace tandem
