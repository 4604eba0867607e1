// CudaModel with synthetic weights (start-up without a checkpoint: the per-rank plan, a memory
// check before any allocation, generation on the device) and the measurement aids bench-model and
// the tests use: step profiles (eager and graph-replay times, a hook for a profiler, op-class
// marks), a synthetic context written straight into the KV pool and slot state, the routed
// experts of a step, the op-class names and the per-rank memory summary.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/comm.h"
#include "common/log.h"
#include "io/catalog.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/synthetic_fill.h"
#include "model/cuda/synthetic_weights.h"
#include "model/shard_plan.h"
#include "model/slot_state.h"
#include "model/weights.h"

namespace tandem {

namespace cuda_model {

Status validate_start(const ModelConfig& config, const CudaModelOptions& options) {
  TANDEM_RETURN_IF_ERROR(model::validate_state_options(options.model));
  if (options.tc_min_rows < 0) return invalid_argument("tc_min_rows {} must be >= 0", options.tc_min_rows);
  if (!attention_supports_head_dim(static_cast<int>(config.head_dim)))
    return invalid_argument("head_dim {}: the CUDA attention supports 128, 256 and 512", config.head_dim);
  if (options.draft_tokens < 0 || (config.has_dspark() && options.draft_tokens > config.dspark_block_size))
    return invalid_argument("draft_tokens {} outside [0, {}] (the draft block)", options.draft_tokens,
                            config.dspark_block_size);
  TANDEM_RETURN_IF_ERROR(model::validate_config(config));
  const ModelOptions& o = options.model;
  TANDEM_RETURN_IF_ERROR(model::validate_shard(config, {o.tp_rank, o.tp_size}));
  if (o.tp_size > 1 && !o.comm)
    return invalid_argument("model options: tp_size {} needs a data-plane communicator", o.tp_size);
  if (o.comm && (o.comm->size() != o.tp_size || o.comm->rank() != o.tp_rank))
    return invalid_argument("model options: rank {} of {} but the communicator is rank {} of {}", o.tp_rank, o.tp_size,
                            o.comm->rank(), o.comm->size());
  return Status();
}

Status check_fits(const CudaModel::Impl& m, int64_t weight_bytes, int64_t buffer_bytes) {
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t need = weight_bytes + buffer_bytes;
  if (need <= static_cast<int64_t>(free_b)) return Status();
  const int64_t pool = static_cast<int64_t>(m.opt.num_blocks) * m.lay.block_bytes;
  return make_error(StatusCode::kResourceExhausted,
                    "tensor-parallel rank {} of {} needs {:.2f} GiB of device memory (weights {:.2f} GiB, KV pool {:.2f} "
                    "GiB, slot state and scratch {:.2f} GiB), {:.2f} GiB are free on {} ({:.2f} GiB total)",
                    m.opt.tp_rank, m.opt.tp_size, need / 1073741824.0, weight_bytes / 1073741824.0, pool / 1073741824.0,
                    (buffer_bytes - pool) / 1073741824.0, free_b / 1073741824.0, m.device_name,
                    total_b / 1073741824.0);
}

}  // namespace cuda_model

namespace cuda_model {
namespace {

// Removes `victims` from a clone of `g`, joining each one's predecessors to its successors (at a
// fork or join of the step's side streams, every predecessor to every successor), so that the
// ablated graph keeps every ordering the victim implied, with the victim's outgoing edge types.
cudaGraph_t without_nodes(cudaGraph_t g, const std::vector<cudaGraphNode_t>& victims) {
  cudaGraph_t c;
  TANDEM_CUDA_CHECK(cudaGraphClone(&c, g));
  for (cudaGraphNode_t v : victims) {
    cudaGraphNode_t cv;
    TANDEM_CUDA_CHECK(cudaGraphNodeFindInClone(&cv, v, c));
    size_t ni = 0, no = 0;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(cv, nullptr, nullptr, &ni));
    TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(cv, nullptr, nullptr, &no));
    std::vector<cudaGraphNode_t> in(ni), out(no);
    std::vector<cudaGraphEdgeData> ein(ni), eout(no);
    if (ni) TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(cv, in.data(), ein.data(), &ni));
    if (no) TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(cv, out.data(), eout.data(), &no));
    TANDEM_CUDA_CHECK(cudaGraphDestroyNode(cv));
    for (cudaGraphNode_t a : in)
      for (size_t j = 0; j < no; ++j) {
        // Each join takes the victim's edge to that successor (a programmatic edge stays
        // programmatic: every kernel waits for its predecessors before touching their data, so
        // an earlier launch of the successor is safe); it needs kernels at both ends: after a copy
        // or memset node the join is a full dependency.
        cudaGraphNodeType tin;
        TANDEM_CUDA_CHECK(cudaGraphNodeGetType(a, &tin));
        const cudaGraphEdgeData e = tin == cudaGraphNodeTypeKernel ? eout[j] : cudaGraphEdgeData{};
        if (cudaGraphAddDependencies(c, &a, &out[j], &e, 1) != cudaSuccess) {
          (void)cudaGetLastError();  // an edge type these two nodes cannot take, or one that exists
          const cudaGraphEdgeData full{};
          if (cudaGraphAddDependencies(c, &a, &out[j], &full, 1) != cudaSuccess) (void)cudaGetLastError();
        }
      }
  }
  return c;
}

std::vector<CudaModel::StepProfile::Ablation> ablate_kernels(cudaGraph_t g, const std::vector<cudaGraphNode_t>& nodes,
                                                             cudaStream_t stream,
                                                             const std::function<std::pair<double, double>(cudaGraphExec_t)>& timed_pair) {
  std::map<std::string, std::vector<cudaGraphNode_t>> by_name;
  std::vector<std::string> order;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams kp{};
    TANDEM_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &kp));
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kp.func) != cudaSuccess || !name) name = "unnamed";
    auto& v = by_name[name];
    if (v.empty()) order.push_back(name);
    v.push_back(node);
  }
  std::vector<CudaModel::StepProfile::Ablation> out;
  for (const std::string& name : order) {
    cudaGraph_t c = without_nodes(g, by_name[name]);
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, c, 0));
    const auto [without_us, saved_us] = timed_pair(ge);
    out.push_back({name, static_cast<int>(by_name[name].size()), without_us, saved_us});
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(c));
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace

CudaModel::StepProfile time_eager_and_graph(cudaStream_t stream, int reps, int eager_reps,
                                            const std::function<void()>& launch, const CudaModel::ReplayHook& hook,
                                            std::vector<CudaModel::ClassMark>** marks, bool ablate) {
  CudaModel::StepProfile prof;
  cudaEvent_t e0, e1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
  auto timed = [&](const std::function<void()>& fn, int n, std::vector<double>& out) {
    for (int r = 0; r < n + 2; ++r) {  // two warm-up runs
      TANDEM_CUDA_CHECK(cudaEventRecord(e0, stream));
      fn();
      TANDEM_CUDA_CHECK(cudaEventRecord(e1, stream));
      TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) out.push_back(ms * 1000.0);
    }
  };
  std::vector<double> eager;
  timed(launch, eager_reps, eager);
  cudaGraph_t g;
  if (marks) *marks = &prof.marks;  // the launches record their op classes while captured
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch();
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  if (marks) *marks = nullptr;
  size_t nn = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nn));
  std::vector<cudaGraphNode_t> nodes(nn);
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &nn));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel) ++prof.kernels;
    else if (t == cudaGraphNodeTypeMemcpy || t == cudaGraphNodeTypeMemset) ++prof.copies;
  }
  cudaGraphExec_t ge;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  auto replay = [&] { TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, stream)); };
  timed(replay, reps, prof.graph_samples_us);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  if (ablate) {
    // Whole and ablated replays alternate, and the saving is the median of the paired differences,
    // so a drift of the clocks over the series (a few percent) does not enter it.
    prof.ablation = ablate_kernels(g, nodes, stream, [&](cudaGraphExec_t x) {
      auto once = [&](cudaGraphExec_t e) { return kernels::cuda::graph_launch_us(e, stream, e0, e1); };
      once(x);  // upload and warm-up
      std::vector<double> without, diff;
      for (int r = 0; r < std::max(5, reps / 3); ++r) {
        const double w = once(ge);
        without.push_back(once(x));
        diff.push_back(w - without.back());
      }
      return std::make_pair(median(without), median(diff));
    });
    // The step's state is the last full replay's again (the ablated replays left stale rows).
    replay();
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  if (hook) {
    // A fresh instantiation inside the hook: a profiler that starts recording there (CUPTI) sees a
    // graph instantiated while it records, then one replay.
    hook([&] {
      cudaGraphExec_t traced;
      TANDEM_CUDA_CHECK(cudaGraphInstantiate(&traced, g, 0));
      TANDEM_CUDA_CHECK(cudaGraphUpload(traced, stream));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      TANDEM_CUDA_CHECK(cudaGraphLaunch(traced, stream));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      TANDEM_CUDA_CHECK(cudaGraphExecDestroy(traced));
    });
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  prof.eager_us = median(eager);
  prof.graph_us = median(prof.graph_samples_us);
  return prof;
}
}  // namespace cuda_model

Result<CudaModel::StepProfile> CudaModel::profile_step(const StepBatch& batch, int reps, StepOutput* host_out,
                                                      const ReplayHook& hook, int eager_reps, bool ablate) {
  Impl& m = *impl_;
  for (const SeqStep& q : batch.seqs)
    if (static_cast<int64_t>(q.tokens.size()) > m.opt.max_rollback + 1)
      return invalid_argument("profile_step: a replayed step may add at most max_rollback + 1 tokens per sequence");
  TANDEM_RETURN_IF_ERROR(m.prepare(batch, host_out));
  // Replaying the same step is idempotent (it rewrites the same ring rows and pool entries).
  StepProfile prof = cuda_model::time_eager_and_graph(m.stream, reps, eager_reps < 0 ? reps : eager_reps,
                                                      [&m] { m.launch(); }, hook, &m.marks, ablate);
  // the timing graph (the profiler's, the ablated ones)
  m.gstats.instantiations += (hook ? 2 : 1) + static_cast<int64_t>(prof.ablation.size());
  // The outputs are those of the last graph replay.
  m.finish(host_out);
  TANDEM_RETURN_IF_ERROR(std::exchange(m.comm_status, Status()));
  return prof;
}

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
            static_cast<int64_t>(m.cfg.num_draft_stages) * m.lay.draft_ring, RecordKind::kKv, m.lay.rec.bytes, 7);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.slot_len[slot] = length;
  return Status();
}

Result<std::vector<int32_t>> CudaModel::routing_of_step(const StepBatch& batch) {
  Impl& m = *impl_;
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

void CudaModel::set_moe_timeline(uint64_t* records, int layer) {
  impl_->moe_timeline = records;
  impl_->moe_timeline_layer = layer;
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
