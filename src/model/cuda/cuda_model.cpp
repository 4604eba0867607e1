// CudaModel: loading (bind on the host, upload once), the device layout of slot state and pool
// blocks, start-up allocation of every buffer, the per-step plan upload and forward() driver,
// rollback, slot-state export/import and the DSpark context insert. The layer math is in
// cuda_forward.cpp, the draft in cuda_dspark.cpp.
#include "model/cuda/cuda_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/comm.h"
#include "common/log.h"
#include "io/safetensors.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_rows.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/draft.h"
#include "model/slot_state.h"
#include "model/weights.h"

namespace tandem {

using OpClass = CudaModel::OpClass;

namespace cuda_model {
Status check_uploadable(const model::Weights& w);
size_t upload_bytes(const model::Weights& w);
DWeights upload_weights(const model::Weights& w, uint8_t* arena_base);

namespace {
int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }
KvRecordKind kind_of(KvDtype d) {
  switch (d) {
    case KvDtype::kFp8: return KvRecordKind::kFp8;
    case KvDtype::kBf16: return KvRecordKind::kBf16;
    case KvDtype::kNvfp4: return KvRecordKind::kNvfp4;
  }
  return KvRecordKind::kFp8;
}
}  // namespace

DeviceLayout plan_layout(const ModelConfig& cfg, const ModelOptions& opt, bool has_draft) {
  DeviceLayout d;
  d.rec = KvRecordLayout::make(kind_of(opt.kv_dtype), static_cast<int>(cfg.head_dim), cfg.qk_rope_head_dim);
  d.key = IndexKeyLayout::make(static_cast<int>(cfg.index_head_dim));
  d.win_ring = cfg.sliding_window + opt.max_rollback;
  const int nl = cfg.num_hidden_layers;
  d.layers.assign(nl, {});
  d.comp_ring.assign(nl, 0);
  d.icomp_ring.assign(nl, 0);
  d.comp_chans.assign(nl, 0);
  d.icomp_chans.assign(nl, 0);
  const int64_t bs = opt.block_size, hd = cfg.head_dim, ihd = cfg.index_head_dim;
  int64_t off = 0, boff = 0;
  for (int l = 0; l < nl; ++l) {
    LayerState& L = d.layers[l];
    L.win_off = off;
    off = align16(off + static_cast<int64_t>(d.win_ring) * d.rec.bytes);
    const int r = cfg.compress_ratios[l];
    if (!r) continue;
    d.comp_ring[l] = 2 * r + opt.max_rollback;
    d.comp_chans[l] = (r == 4 ? 2 : 1) * hd;
    L.comp_off = off;
    off = align16(off + static_cast<int64_t>(d.comp_ring[l]) * 2 * d.comp_chans[l] * 4);
    L.pool_main = boff;
    boff = align16(boff + (bs / r) * d.rec.bytes);
    if (r == 4) {
      d.icomp_ring[l] = 2 * r + opt.max_rollback;
      d.icomp_chans[l] = 2 * ihd;
      L.icomp_off = off;
      off = align16(off + static_cast<int64_t>(d.icomp_ring[l]) * 2 * d.icomp_chans[l] * 4);
      L.pool_idx = boff;
      boff = align16(boff + (bs / 4) * d.key.bytes);
    }
  }
  d.slot_bytes = std::max<int64_t>(off, 16);
  d.block_bytes = std::max<int64_t>(boff, 16);
  d.draft_ring = has_draft ? cfg.sliding_window + opt.max_rollback : 0;
  d.draft_slot_bytes = has_draft ? static_cast<int64_t>(cfg.num_draft_stages) * d.draft_ring * d.rec.bytes : 0;
  return d;
}
}  // namespace cuda_model


namespace {
// Snapshot: [length int64][slot rings][draft context rings] (model/slot_state.h, cuda_snapshots.cpp).
model::SnapshotFormat snapshot_format(const cuda_model::DeviceLayout& l) {
  return {static_cast<size_t>(l.slot_bytes), static_cast<size_t>(l.draft_slot_bytes)};
}
// The engine's slots' lengths (the padding slot of graph steps follows them).
std::span<int64_t> engine_slots(CudaModel::Impl& m) { return {m.slot_len.data(), static_cast<size_t>(m.opt.max_slots)}; }
}  // namespace

CudaModel::Impl::~Impl() {
  if (stream) cudaStreamSynchronize(stream);
  for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
  for (auto& [k, g] : draft_graphs) cudaGraphExecDestroy(g);
  if (plan_host) cudaFreeHost(plan_host);
  if (draft_host) cudaFreeHost(draft_host);
  if (sample_host) cudaFreeHost(sample_host);
  for (cudaStream_t s : {side_stream, comp_stream, ring_stream})
    if (s) cudaStreamSynchronize(s);
  for (cudaEvent_t e : {comb_fork, comb_join, comp_fork, comp_join_idx, comp_join, ring_fork, ring_join})
    if (e) cudaEventDestroy(e);
  for (cudaStream_t s : {side_stream, comp_stream, ring_stream})
    if (s) cudaStreamDestroy(s);
  if (stream) cudaStreamDestroy(stream);
}

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
const LoadReport& CudaModel::load_report() const { return impl_->report; }
bool CudaModel::has_draft() const { return impl_->w.has_draft; }
int CudaModel::draft_block_size() const { return impl_->w.has_draft ? impl_->cfg.dspark_block_size : 0; }
int CudaModel::draft_tokens() const { return impl_->w.has_draft ? impl_->draft_k : 0; }
int64_t CudaModel::max_logits_rows() const { return impl_->max_logits_rows; }
int64_t CudaModel::vocab_size() const { return impl_->cfg.vocab_size; }
int64_t CudaModel::tap_dim() const {
  return impl_->cfg.has_dspark()
             ? impl_->cfg.hidden_size * static_cast<int64_t>(impl_->cfg.dspark_target_layer_ids.size())
             : 0;
}
std::string CudaModel::device_name() const { return impl_->device_name; }
size_t CudaModel::slot_state_bytes() const { return snapshot_format(impl_->lay).bytes(); }
size_t CudaModel::pool_block_bytes() const { return static_cast<size_t>(impl_->lay.block_bytes); }

CudaModel::Memory CudaModel::memory() const {
  const Impl& m = *impl_;
  Memory r;
  r.weights = static_cast<int64_t>(m.weight_arena.bytes());
  r.pool = static_cast<int64_t>(m.pool.bytes());
  r.slot_state = static_cast<int64_t>(m.slot_state.bytes());
  r.draft_state = static_cast<int64_t>(m.draft_ctx.bytes());
  r.scratch = m.own_bytes - r.weights - r.pool - r.slot_state - r.draft_state;
  r.snapshots = static_cast<int64_t>(m.snapshots.bytes());  // allocated after own_bytes was measured
  return r;
}

Result<ModelStateSizes> CudaModel::state_sizes(const ModelConfig& config, const ModelOptions& options) {
  TANDEM_RETURN_IF_ERROR(model::validate_config(config));
  TANDEM_RETURN_IF_ERROR(model::validate_state_options(options));
  const auto lay = cuda_model::plan_layout(config, options, config.has_dspark() && options.load_draft);
  ModelStateSizes s;
  s.slot_state_bytes = snapshot_format(lay).bytes();
  s.pool_block_bytes = static_cast<size_t>(lay.block_bytes);
  return s;
}

Status CudaModel::Impl::init(const ModelConfig& config, const CudaModelOptions& options) {
  cfg = config;
  copt = options;
  opt = options.model;
  const int ndev = kernels::cuda::device_count();
  if (ndev == 0) return make_error(StatusCode::kUnavailable, "no CUDA device is visible (driver missing or no GPU)");
  if (copt.device < 0 || copt.device >= ndev)
    return invalid_argument("CUDA device {} does not exist ({} visible)", copt.device, ndev);
  TANDEM_CUDA_CHECK(cudaSetDevice(copt.device));
  device_name = kernels::cuda::device_description(copt.device);
  if (!kernels::cuda::binary_supports_device(copt.device))
    return make_error(StatusCode::kFailedPrecondition, "this build has no kernels for {} (built for sm_{}); rebuild with "
                               "-DTANDEM_CUDA_ARCH=all or the GPU's architecture",
                               device_name, TANDEM_CUDA_ARCHS);
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, copt.device));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&comb_fork, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&comb_join, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&comp_stream, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&comp_fork, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&comp_join_idx, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&comp_join, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&ring_stream, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ring_fork, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ring_join, cudaEventDisableTiming));
  return Status();
}

namespace cuda_model {

// Every device buffer, sized once from the config, the options and the weights' shapes. measure:
// nothing is allocated or written; returns the device bytes the buffers would take (start-up
// compares them with the free memory before allocating anything).
int64_t allocate_all(CudaModel::Impl& m, bool measure) {
  const ModelConfig& c = m.cfg;
  const ModelOptions& o = m.opt;
  const int64_t D = c.hidden_size, hc = c.hc_mult, HD = hc * D, hd = c.head_dim;
  const int64_t ql = c.q_lora_rank, R = c.o_lora_rank, E = c.n_routed_experts;
  const int64_t I = c.moe_intermediate_size, K = c.num_experts_per_tok, V = c.vocab_size;
  const int64_t ihd = c.index_head_dim, TK = c.index_topk;
  // This rank's query heads, output groups and index heads.
  const int64_t H = c.num_attention_heads / o.tp_size, G = c.o_groups / o.tp_size, IH = c.index_n_heads / o.tp_size;
  const int64_t KB = m.w.has_draft ? c.dspark_block_size : 0;
  m.max_draft_requests = m.copt.max_draft_requests > 0 ? m.copt.max_draft_requests : o.max_slots;
  const int64_t T = o.max_tokens_per_step;
  // Graph steps pad their sequence count to a power of two (padding runs in a spare slot).
  int64_t graph_seqs = 0;
  if (m.copt.max_graph_batch > 0) {
    graph_seqs = 1;
    while (graph_seqs < m.copt.max_graph_batch) graph_seqs *= 2;
    m.pad_slot = o.max_slots;
    m.pad_block = o.num_blocks;
  }
  m.max_rows = std::max<int64_t>({T, m.max_draft_requests * KB, graph_seqs * (o.max_rollback + 1)});
  const int64_t N = m.max_rows;
  // Logits rows: every row of a step when that costs at most 1 GiB, else what the engine asks for
  // (the last row of each sequence, or K+1 verify rows).
  if (m.copt.max_logits_rows > 0) {
    m.max_logits_rows = m.copt.max_logits_rows;
  } else {
    const int64_t all = std::max<int64_t>(T, m.max_draft_requests * KB);
    m.max_logits_rows = all * V * 4 <= (int64_t{1} << 30) ? all
                                                          : std::max<int64_t>(o.max_slots * (o.max_rollback + 1),
                                                                              m.max_draft_requests * KB);
  }
  m.max_logits_rows = std::max<int64_t>({m.max_logits_rows, m.max_draft_requests * KB, graph_seqs * (o.max_rollback + 1)});
  int64_t max_comp_chans = 0, max_icomp_chans = 0;
  bool any_idx = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    max_comp_chans = std::max(max_comp_chans, m.lay.comp_chans[l]);
    max_icomp_chans = std::max(max_icomp_chans, m.lay.icomp_chans[l]);
    any_idx = any_idx || m.lay.icomp_chans[l] > 0;
  }
  m.max_entries = std::max<int64_t>(1, c.max_position_embeddings / 4);
  // Indexer scores (bf16): up to 256 MiB, at least one row of the longest context; the top-k's
  // per-slice work for as many rows (up to 64 MiB). A step's rows run in chunks that fit both.
  const int64_t max_lds = (m.max_entries + 7) / 8 * 8;
  m.score_rows = any_idx ? std::max<int64_t>(1, std::min<int64_t>({N, int64_t{65535}, (int64_t{256} << 20) / (max_lds * 2)}))
                         : 0;
  m.max_blocks = static_cast<int>((c.max_position_embeddings + o.block_size - 1) / o.block_size);

  int64_t bytes = 0;
  // Every buffer goes through `take` (at least one element); measure only adds up its bytes, in
  // cudaMalloc's 512-byte granules.
  auto take = [&](auto& b, int64_t n) {
    using T0 = std::remove_reference_t<decltype(*b.get())>;
    n = std::max<int64_t>(n, 1);
    if (measure)
      bytes += (n * static_cast<int64_t>(sizeof(T0)) + 511) / 512 * 512;
    else
      b.reset(static_cast<size_t>(n));
  };
  take(m.h, N * HD);
  take(m.x, N * D);
  take(m.a, N * D);
  take(m.post, N * hc);
  take(m.comb, N * hc * hc);
  take(m.qr, N * ql);
  take(m.q, N * H * hd);
  take(m.kv, N * hd);
  take(m.o, N * H * hd);
  take(m.u, N * G * R);
  // The two compressors' projections, apart: the decode path computes all four in one launch.
  take(m.tmp_kv, N * max_comp_chans);
  take(m.tmp_gate, N * max_comp_chans);
  take(m.tmp_ikv, N * max_icomp_chans);
  take(m.tmp_igate, N * max_icomp_chans);
  take(m.comp_rows, N * 2 * max_comp_chans);
  take(m.icomp_rows, N * 2 * max_icomp_chans);
  take(m.entry, N * std::max(hd, ihd));
  take(m.iq, any_idx ? N * IH * ihd : 1);
  take(m.iw, any_idx ? N * IH : 1);
  take(m.idx_scores, m.score_rows * max_lds);
  take(m.topk_counters, static_cast<int64_t>(cuda_model::topk_counters_bytes(any_idx ? std::min<int64_t>(N, 65535) : 1)));
  take(m.topk_work, static_cast<int64_t>(std::min<size_t>(
                        cuda_model::topk_work_bytes(std::max<int64_t>(m.score_rows, 1), m.max_entries), size_t{64} << 20)));
  take(m.gate_logits, N * E);
  take(m.ew, N * K);
  take(m.xq, N * D);
  take(m.gact, N * K * I);
  take(m.gq, N * K * I);
  take(m.pair_out, N * K * D);
  int64_t sh_i = I;
  for (const auto& b : m.w.layers) sh_i = std::max(sh_i, b.ffn.sh_w1.w.n);
  take(m.sh_g, N * sh_i);
  take(m.sh_u, N * sh_i);
  take(m.sh_out, N * D);
  take(m.head_in, m.max_logits_rows * HD);
  take(m.head_y, N * D);
  take(m.yn, N * D);
  take(m.logits, m.max_logits_rows * V);
  if (o.tp_size > 1) {
    const int64_t P = (V + o.tp_size - 1) / o.tp_size;
    take(m.tp_local, m.max_logits_rows * P);
    take(m.tp_gather, o.tp_size * m.max_logits_rows * P);
  }
  const int64_t td = c.has_dspark() ? D * static_cast<int64_t>(c.dspark_target_layer_ids.size()) : 0;
  take(m.taps, N * std::max<int64_t>(td, 1));
  take(m.mh, T * std::max<int64_t>(td, 1));
  take(m.main_x, T * D);
  // Split-K attention partials: every (row, chunk) of a decode-size step at the longest context,
  // up to 2048 (about 135 MB at 32 heads of 512); longer steps fold per row (attention.h). Under
  // tensor parallelism, of this rank's heads.
  int64_t max_keys = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.compress_ratios[l];
    const bool csa = r == 4 && m.w.layers[l].attn.has_indexer;
    max_keys = std::max<int64_t>(max_keys, c.sliding_window + (csa ? TK : r ? c.max_position_embeddings / r : 0));
  }
  const int64_t max_chunks = (max_keys + cuda_model::kAttnChunk - 1) / cuda_model::kAttnChunk;
  m.attn_partial_slots = std::min<int64_t>(std::min<int64_t>(N, 96) * max_chunks, 2048);
  take(m.attn_partial, cuda_model::attn_partial_floats(static_cast<int>(H), static_cast<int>(hd), m.attn_partial_slots));
  // Key rows for the prefill attention (AttnArgs::key_rows): a step's KV rows in bf16, and one
  // sequence's compressed entries at the longest context, at most 65,536 (64 MB at hd 512: CSA's up
  // to 256K positions, HCA's up to 8M; a sequence whose entries do not fit reads its records).
  int64_t comp_entries = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (const int r = c.compress_ratios[l]) comp_entries = std::max<int64_t>(comp_entries, c.max_position_embeddings / r);
  m.attn_keys_rows = N + std::min<int64_t>(comp_entries, 65536);
  take(m.attn_keys, m.attn_keys_rows * hd);
  take(m.kv_rec, N * m.lay.rec.bytes);
  take(m.entry_rec, N * std::max(m.lay.rec.bytes, m.lay.key.bytes));
  take(m.entry_pos, N);
  take(m.flag, N);
  take(m.visible, N);
  take(m.topk, N * TK);
  take(m.eids, N * K);
  take(m.draft_pos, N);
  take(m.draft_ids, N);
  take(m.route_rec, static_cast<int64_t>(c.num_hidden_layers + (m.w.has_draft ? c.num_draft_stages : 0)) * N * K);
  take(m.fill_table, m.max_blocks);
  if (m.w.has_draft) {
    const int64_t B = m.max_draft_requests, Rk = c.dspark_markov_rank;
    take(m.base, B * KB * V);
    take(m.bias, B * V);
    take(m.e_row, B * Rk);
    take(m.d_draft_in, 32 * B);
    take(m.d_tokens, B * KB);
    take(m.d_conf, B * KB);
    take(m.d_zlogits, B * KB * V);
    take(m.d_probs, B * KB * V);
    take(m.markov_scratch, static_cast<int64_t>(cuda_model::markov_scratch_bytes(B, V)));
    take(m.q_store, static_cast<int64_t>(o.max_slots) * KB * V);
    m.draft_host_bytes = static_cast<size_t>(B) * (4 + 4 + 8 + 8 + 8) + static_cast<size_t>(B * KB) * (4 + 4);
    if (!measure) TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.draft_host), m.draft_host_bytes));
  }
  bytes += m.alloc_sampling(measure);

  // The GEMM op quantizes its input into a per-device scratch: reserve it for the widest
  // act-quant linear and the most rows any call sees, so no step ever grows it.
  int64_t max_k = 0;
  auto lk = [&](const cuda_model::DLinear& l) {
    if (l.act_quant) max_k = std::max(max_k, l.w.k);
  };
  auto block_k = [&](const cuda_model::DBlock& b) {
    for (const auto* l : {&b.attn.wq_a, &b.attn.wq_b, &b.attn.wkv, &b.attn.wo_a, &b.attn.wo_b, &b.attn.idx_wq_b,
                          &b.attn.idx_wproj, &b.attn.comp.wkv, &b.attn.comp.wgate, &b.attn.icomp.wkv,
                          &b.attn.icomp.wgate, &b.ffn.gate, &b.ffn.sh_w1, &b.ffn.sh_w2, &b.ffn.sh_w3})
      lk(*l);
  };
  for (const auto& b : m.w.layers) block_k(b);
  for (const auto& b : m.w.draft.stages) block_k(b);
  lk(m.w.head);
  lk(m.w.draft.main_proj);
  lk(m.w.draft.markov_w2);
  const size_t gemm_x = static_cast<size_t>(N * max_k) * sizeof(float);
  if (measure) {
    bytes += static_cast<int64_t>(gemm_x > kernels::cuda::scratch_bytes(kernels::cuda::ScratchSlot::kGemmX) ? gemm_x : 0);
  } else {
    kernels::cuda::reserve_scratch(kernels::cuda::ScratchSlot::kGemmX, gemm_x);
  }
  // Tensor-core scratch (and wo_a bf16 copies) for steps of more than tc_min_rows rows
  // (cuda_prefill.cpp); the decode kernels' activation operand and MoE scratch (cuda_decode.cpp).
  bytes += m.alloc_prefill(measure);
  bytes += m.dec_allocate(measure);

  // The step plan: one pinned host region mirrored on the device.
  const int64_t S = std::max<int64_t>({o.max_slots, m.max_draft_requests, graph_seqs});
  m.plan_capacity = CudaModel::Impl::PlanLayout::pack(N, S, std::max<int64_t>(m.max_logits_rows, 1), m.max_blocks).bytes;
  take(m.plan_dev, static_cast<int64_t>(m.plan_capacity));

  // State.
  const int64_t slots = o.max_slots + (m.pad_slot >= 0 ? 1 : 0);
  const int64_t blocks = o.num_blocks + (m.pad_block >= 0 ? 1 : 0);
  take(m.slot_state, slots * m.lay.slot_bytes);
  take(m.pool, blocks * m.lay.block_bytes);
  if (m.lay.draft_slot_bytes) take(m.draft_ctx, slots * m.lay.draft_slot_bytes);  // + the padding's
  if (measure) return bytes;

  TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.plan_host), m.plan_capacity));
  m.meta.block_size = o.block_size;
  // The indexer top-k's counters start at zero (every call leaves them zero again).
  TANDEM_CUDA_CHECK(cudaMemsetAsync(m.topk_counters.get(), 0, m.topk_counters.bytes(), m.stream));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(m.slot_state.get(), 0, m.slot_state.bytes(), m.stream));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(m.pool.get(), 0, m.pool.bytes(), m.stream));
  if (m.draft_ctx.get()) TANDEM_CUDA_CHECK(cudaMemsetAsync(m.draft_ctx.get(), 0, m.draft_ctx.bytes(), m.stream));
  if (m.markov_scratch.get())
    TANDEM_CUDA_CHECK(cudaMemsetAsync(m.markov_scratch.get(), 0, m.markov_scratch.bytes(), m.stream));
  m.slot_len.assign(slots, 0);
  if (m.pad_slot >= 0) {
    m.pad_table.assign(m.max_blocks, m.pad_block);
    m.pad_tokens.assign(o.max_rollback + 1, 0);
    m.padded.seqs.reserve(graph_seqs);
  }

  // RoPE tables (as DsV4Model: SWA layers and draft stages without YaRN, compressed layers with).
  model::RopeTable swa, comp;
  const bool yarn = c.rope_scaling_type == "yarn";
  swa.build(c.qk_rope_head_dim, 0, c.rope_theta, 1.0, c.rope_beta_fast, c.rope_beta_slow);
  comp.build(c.qk_rope_head_dim, yarn ? c.rope_original_max_position : 0, c.compress_rope_theta, c.rope_factor,
             c.rope_beta_fast, c.rope_beta_slow);
  m.rope_swa.reset(swa.freqs.size());
  m.rope_comp.reset(comp.freqs.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(m.rope_swa.get(), swa.freqs.data(), 4 * swa.freqs.size(), cudaMemcpyHostToDevice));
  TANDEM_CUDA_CHECK(cudaMemcpy(m.rope_comp.get(), comp.freqs.data(), 4 * comp.freqs.size(), cudaMemcpyHostToDevice));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return bytes;
}

}  // namespace cuda_model


Result<std::unique_ptr<CudaModel>> CudaModel::from_tensors(const ModelConfig& config,
                                                           const std::vector<const TensorView*>& tensors,
                                                           const CudaModelOptions& options) {
  TANDEM_RETURN_IF_ERROR(cuda_model::validate_start(config, options));
  auto impl = std::make_unique<Impl>();
  impl->draft_k = options.draft_tokens > 0 ? options.draft_tokens : config.dspark_block_size;
  TANDEM_RETURN_IF_ERROR(impl->init(config, options));
  model::LoadCounts counts;
  // This rank's slices only (tp_size 1: everything).
  auto weights = model::load_weights(config, tensors, options.model.load_draft, counts,
                                     model::Shard{options.model.tp_rank, options.model.tp_size});
  if (!weights.ok()) return weights.status();
  TANDEM_RETURN_IF_ERROR(cuda_model::check_uploadable(*weights));
  const size_t wbytes = cuda_model::upload_bytes(*weights);
  impl->report = LoadReport::from_counts(counts, wbytes);
  // Every buffer measured first (the upload's walk without an arena gives the shapes), so a model
  // that does not fit is refused before anything is allocated.
  impl->w = cuda_model::upload_weights(*weights, nullptr);
  impl->lay = cuda_model::plan_layout(config, options.model, impl->w.has_draft);
  TANDEM_RETURN_IF_ERROR(cuda_model::check_fits(*impl, static_cast<int64_t>(wbytes), cuda_model::allocate_all(*impl, true)));
  const int64_t before = kernels::cuda::alloc_stats().bytes;
  impl->weight_arena.reset(wbytes);
  impl->w = cuda_model::upload_weights(*weights, impl->weight_arena.get());
  cuda_model::allocate_all(*impl, false);
  impl->own_bytes = kernels::cuda::alloc_stats().bytes - before;
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

Result<std::unique_ptr<CudaModel>> CudaModel::load(const std::string& dir, const CudaModelOptions& options) {
  auto open = model::open_checkpoint(dir);
  if (!open.ok()) return open.status();
  // The weights are copied to the device; the mapped shards are released when this returns.
  auto model = from_tensors(open->config, open->tensors, options);
  if (!model.ok()) return model.status().with_context("loading " + dir);
  (*model)->impl_->origin = dir;
  TLOG_INFO("model", "{} on {}: {}; {}", dir, (*model)->device_name(), (*model)->load_report().summary(),
            (*model)->memory_summary());
  return model;
}

Status CudaModel::Impl::validate_step(const StepBatch& batch) const {
  TANDEM_RETURN_IF_ERROR(validate_step_batch(batch, cfg, opt, std::span<const int64_t>(slot_len.data(), opt.max_slots)));
  int64_t lrows = 0;
  for (const SeqStep& q : batch.seqs) {
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (n > 0 && q.logits != LogitsMode::kNone) lrows += q.logits == LogitsMode::kAll ? n : 1;
  }
  if (lrows > max_logits_rows)
    return invalid_argument("step asks for {} logits rows, more than the {} this runner was sized for", lrows,
                            max_logits_rows);
  return Status();
}

// ---- forward: prepare (validate, plan into pinned memory), launch (one H2D copy of the plan, then
// every kernel: capturable), finish (host copies, synchronize, slot lengths) ----

Status CudaModel::Impl::prepare(const StepBatch& batch, StepOutput* host_out) {
  TANDEM_RETURN_IF_ERROR(validate_step(batch));
  prepare_plan(batch, host_out);
  step.end_bound = step.max_end;
  return Status();
}

int64_t CudaModel::step_logits_rows(const StepBatch& batch, std::vector<int64_t>& out) {
  out.assign(batch.seqs.size(), -1);
  int64_t lrows = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqStep& q = batch.seqs[i];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (q.logits == LogitsMode::kNone || n == 0) continue;
    out[i] = lrows;
    lrows += q.logits == LogitsMode::kAll ? n : 1;
  }
  return lrows;
}

CudaModel::Impl::PlanLayout CudaModel::Impl::PlanLayout::pack(int64_t rows, int64_t seqs, int64_t lrows, int64_t width) {
  PlanLayout l;
  size_t off = 0;
  auto at = [&off](int64_t n) {
    const size_t here = off;
    off = (off + static_cast<size_t>(n) + 15) / 16 * 16;
    return here;
  };
  l.tokens = at(4 * rows);
  l.positions = at(8 * rows);
  l.row_seq = at(4 * rows);
  l.seq_start = at(8 * seqs);
  l.seq_row0 = at(4 * seqs);
  l.seq_len = at(4 * seqs);
  l.seq_slot = at(4 * seqs);
  l.head_src = at(4 * lrows);
  l.taps_dst = at(4 * rows);
  l.block_tables = at(4 * seqs * width);
  l.bytes = off;
  return l;
}

void CudaModel::Impl::prepare_plan(const StepBatch& batch, StepOutput* host_out, int64_t bound) {
  const size_t ns = batch.seqs.size();
  // The logits layout is step_logits_rows' (one function, so the rows a caller plans before the
  // step are the rows the step writes).
  const int64_t lrows_n = step_logits_rows(batch, step.logits_row);
  int64_t rows_n = 0;
  step.max_end = 0;
  for (const SeqStep& q : batch.seqs) {
    rows_n += static_cast<int64_t>(q.tokens.size());
    step.max_end = std::max<int64_t>(step.max_end, q.start_pos + static_cast<int64_t>(q.tokens.size()));
  }
  if (bound <= 0) bound = graph_bound(step.max_end);
  TANDEM_CHECK(bound >= step.max_end);
  step.table_width = static_cast<int>(std::clamp<int64_t>((bound + opt.block_size - 1) / opt.block_size, 1, max_blocks));
  const int64_t width = step.table_width;
  // This step's layout: each array as long as the step needs (the same for every step a graph
  // replays: its rows, sequences, logits rows and bucket are the key's), packed from the start of
  // the staging, so the copy is the step's bytes only.
  const PlanLayout& lay = step.plan = PlanLayout::pack(rows_n, static_cast<int64_t>(ns), lrows_n, width);
  TANDEM_CHECK(lay.bytes <= plan_capacity);  // every array within its longest (validate_step)
  const uint8_t* dv = plan_dev.get();
  meta.tokens = reinterpret_cast<const int32_t*>(dv + lay.tokens);
  meta.positions = reinterpret_cast<const int64_t*>(dv + lay.positions);
  meta.row_seq = reinterpret_cast<const int32_t*>(dv + lay.row_seq);
  meta.seq_start = reinterpret_cast<const int64_t*>(dv + lay.seq_start);
  meta.seq_row0 = reinterpret_cast<const int32_t*>(dv + lay.seq_row0);
  meta.seq_len = reinterpret_cast<const int32_t*>(dv + lay.seq_len);
  meta.seq_slot = reinterpret_cast<const int32_t*>(dv + lay.seq_slot);
  meta.block_tables = reinterpret_cast<const int32_t*>(dv + lay.block_tables);
  meta.max_blocks = step.table_width;
  uint8_t* hp = plan_host;
  auto* tokens = reinterpret_cast<int32_t*>(hp + lay.tokens);
  auto* positions = reinterpret_cast<int64_t*>(hp + lay.positions);
  auto* row_seq = reinterpret_cast<int32_t*>(hp + lay.row_seq);
  auto* seq_start = reinterpret_cast<int64_t*>(hp + lay.seq_start);
  auto* seq_row0 = reinterpret_cast<int32_t*>(hp + lay.seq_row0);
  auto* seq_len = reinterpret_cast<int32_t*>(hp + lay.seq_len);
  auto* seq_slot = reinterpret_cast<int32_t*>(hp + lay.seq_slot);
  auto* tables = reinterpret_cast<int32_t*>(hp + lay.block_tables);
  auto* head_src = reinterpret_cast<int32_t*>(hp + lay.head_src);
  auto* taps_dst = reinterpret_cast<int32_t*>(hp + lay.taps_dst);
  step.taps_row.assign(ns, -1);
  int64_t total = 0, lrows = 0, trows = 0, longest = 0;
  for (size_t i = 0; i < ns; ++i) {
    const SeqStep& q = batch.seqs[i];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    seq_start[i] = q.start_pos;
    seq_row0[i] = static_cast<int32_t>(total);
    seq_len[i] = static_cast<int32_t>(n);
    seq_slot[i] = q.slot;
    const int64_t need = (q.start_pos + n + opt.block_size - 1) / opt.block_size;
    std::memcpy(tables + i * width, q.block_table.data(), sizeof(int32_t) * need);
    if (step.logits_row[i] >= 0) {
      const int64_t first = q.logits == LogitsMode::kAll ? 0 : n - 1;
      for (int64_t t = first; t < n; ++t) head_src[lrows++] = static_cast<int32_t>(total + t);
    }
    if (q.collect_taps && n > 0) step.taps_row[i] = trows;
    for (int64_t t = 0; t < n; ++t) {
      tokens[total + t] = q.tokens[t];
      positions[total + t] = q.start_pos + t;
      row_seq[total + t] = static_cast<int32_t>(i);
      taps_dst[total + t] = q.collect_taps ? static_cast<int32_t>(trows + t) : -1;
    }
    if (q.collect_taps) trows += n;
    total += n;
    longest = std::max(longest, n);
  }
  step.rows = total;
  step.seqs = ns;
  // A step of short sequences with more rows than the decode MoE holds (moe_max_tokens) takes the
  // tensor cores too: they are much faster there, and such steps are prefill bursts.
  const int64_t gemv_cap = dec.enabled ? dec.moe_max_tokens : max_rows;
  step.tc = longest > copt.tc_min_rows || (total > gemv_cap && total > copt.tc_min_rows);
  step.lrows = lrows;
  step.trows = trows;
  step.batch = &batch;
  // Every row collects taps, no sequence adds more than a verify's rows, and the stages' records fit
  // the scratch: the step inserts its rows into the draft's context rings itself.
  step.ctx_in_step = copt.draft_insert_in_step && w.has_draft && total > 0 && trows == total &&
                     longest <= opt.max_rollback + 1 && total <= opt.max_tokens_per_step &&
                     cfg.num_draft_stages * total <= max_rows;
  if (host_out) {
    host_out->logits_row = step.logits_row;
    host_out->taps_row = step.taps_row;
    host_out->num_logits_rows = lrows;
    host_out->num_taps_rows = trows;
  }
}

void CudaModel::Impl::launch() {
  const int64_t total = step.rows;
  if (total == 0) return;
  const ModelConfig& c = cfg;
  const int64_t D = c.hidden_size, HD = c.hc_mult * D;
  const int64_t td = c.has_dspark() ? D * static_cast<int64_t>(c.dspark_target_layer_ids.size()) : 0;
  section(OpClass::kOther);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(plan_dev.get(), plan_host, step.plan.bytes, cudaMemcpyHostToDevice, stream));
  in_step = true;  // the GEMMs follow step.tc (tc_rows)
  embed_tokens(meta.tokens, total);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    block_forward(l, total);
    for (size_t ti = 0; ti < c.dspark_target_layer_ids.size(); ++ti)
      if (c.dspark_target_layer_ids[ti] == l && step.trows > 0) {
        section(OpClass::kOther);
        cuda_model::taps_mean({h.get(), reinterpret_cast<const int32_t*>(plan_dev.get() + step.plan.taps_dst), total,
                               c.hc_mult, D, taps.get(), td, static_cast<int64_t>(ti) * D},
                              stream);
      }
  }
  if (step.ctx_in_step) insert_step_context();
  if (step.lrows > 0) {
    section(OpClass::kLmHead);
    kernels::RowsCopyParams g;
    g.src = h.get();
    g.dst = head_in.get();
    g.rows = reinterpret_cast<const int32_t*>(plan_dev.get() + step.plan.head_src);
    g.count = step.lrows;
    g.cols = HD;
    g.gather = true;
    kernels::cuda::rows_copy(g, stream);
    head_logits(head_in.get(), step.lrows, w, w.hc_head_fn, w.hc_head_scale, w.hc_head_base, w.norm, head_y.get(),
                logits.get());
  }
  join_comb();  // every branch ends in the step (hc_post joins each; this is the backstop)
  join_ring();
  in_step = false;
}

void CudaModel::Impl::finish(StepOutput* host_out, bool synchronize) {
  const int64_t V = cfg.vocab_size;
  const int64_t td = cfg.has_dspark() ? cfg.hidden_size * static_cast<int64_t>(cfg.dspark_target_layer_ids.size()) : 0;
  if (host_out && step.rows > 0) {
    if (host_out->logits.size() < static_cast<size_t>(step.lrows * V)) host_out->logits.resize(step.lrows * V);
    if (host_out->taps.size() < static_cast<size_t>(step.trows * td)) host_out->taps.resize(step.trows * td);
    if (step.lrows)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_out->logits.data(), logits.get(), sizeof(float) * step.lrows * V,
                                        cudaMemcpyDeviceToHost, stream));
    if (step.trows)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_out->taps.data(), taps.get(), sizeof(float) * step.trows * td,
                                        cudaMemcpyDeviceToHost, stream));
  }
  // The plan's pinned staging is reused by the next step: finish before returning (or leave it to
  // the caller's next synchronizing call, forward(..., synchronize = false)).
  if (synchronize || host_out) wait_stream();
  for (const SeqStep& q : step.batch->seqs) slot_len[q.slot] += static_cast<int64_t>(q.tokens.size());
  if (pad_slot >= 0) slot_len[pad_slot] = 0;  // padding sequences always start at position 0
}

int64_t CudaModel::Impl::graph_bound(int64_t end) const {
  int64_t bound = 256;
  while (bound < end) bound *= 2;
  return std::min<int64_t>(bound, std::max<int64_t>(end, cfg.max_position_embeddings));
}

// A step replays a graph when every sequence adds the same small number of tokens (decode or
// verify); it is padded to a power-of-two sequence count with sequences at position 0 of the
// spare slot, whose outputs are dropped.
bool CudaModel::Impl::graph_step(const StepBatch& batch) {
  const size_t ns = batch.seqs.size();
  if (copt.max_graph_batch <= 0 || ns == 0 || static_cast<int>(ns) > copt.max_graph_batch) return false;
  const SeqStep& f = batch.seqs[0];
  const size_t n = f.tokens.size();
  if (n == 0 || static_cast<int64_t>(n) > opt.max_rollback + 1) return false;
  for (const SeqStep& q : batch.seqs)
    if (q.tokens.size() != n || q.logits != f.logits || q.collect_taps != f.collect_taps) return false;
  return true;
}

Status CudaModel::forward(const StepBatch& batch, StepOutput* host_out, bool synchronize) {
  Impl& m = *impl_;
  const Impl::CallTimer timer(m);
  if (!m.graph_step(batch)) {
    TANDEM_RETURN_IF_ERROR(m.prepare(batch, host_out));
    m.launch();
    m.finish(host_out, synchronize);
    ++m.gstats.eager;
    // A failed collective leaves the group's state undefined: the caller drops the whole group.
    return std::exchange(m.comm_status, Status());
  }
  TANDEM_RETURN_IF_ERROR(m.validate_step(batch));
  const size_t ns = batch.seqs.size();
  size_t padded = 1;
  while (padded < ns) padded *= 2;
  const SeqStep& f = batch.seqs[0];
  const size_t n = f.tokens.size();
  m.padded.seqs.assign(batch.seqs.begin(), batch.seqs.end());
  for (size_t i = ns; i < padded; ++i)
    m.padded.seqs.push_back({m.pad_slot, 0, std::span<const int32_t>(m.pad_tokens.data(), n), m.pad_table, f.logits,
                             f.collect_taps});
  m.prepare_plan(m.padded, nullptr);
  m.step.seqs = ns;  // the caller's sequences: the padding's come after them and are not reported
  const int64_t bound = m.graph_bound(m.step.max_end);
  m.step.end_bound = bound;
  const Impl::GraphKey key{static_cast<int>(padded), static_cast<int>(n), static_cast<int>(f.logits),
                           f.collect_taps ? 1 : 0, bound, m.graph_srows};
  auto it = m.graphs.find(key);
  if (it == m.graphs.end()) {
    m.capture(key);  // a context bucket not captured at start-up: one eager step, then the graph
  } else {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(it->second, m.stream));
    ++m.gstats.replays;
  }
  // Outputs in the caller's batch order: the padding's rows come after every real row.
  const int64_t per = f.logits == LogitsMode::kAll ? static_cast<int64_t>(n) : (f.logits == LogitsMode::kLast ? 1 : 0);
  m.step.lrows = per * static_cast<int64_t>(ns);
  m.step.trows = f.collect_taps ? static_cast<int64_t>(n * ns) : 0;
  if (host_out) {
    host_out->logits_row.assign(m.step.logits_row.begin(), m.step.logits_row.begin() + ns);
    host_out->taps_row.assign(m.step.taps_row.begin(), m.step.taps_row.begin() + ns);
    host_out->num_logits_rows = m.step.lrows;
    host_out->num_taps_rows = m.step.trows;
  }
  m.finish(host_out, synchronize);
  return std::exchange(m.comm_status, Status());
}

// First step of a shape: run it eagerly (kernel attributes and scratch are set up outside any
// capture), then capture the same launches for the next steps of this shape.
void CudaModel::Impl::capture(const GraphKey& key) {
  const int srows = std::get<5>(key);
  graphs.emplace(key, capture_after_eager([this, srows] {
                   launch();
                   if (srows > 0) {
                     section(OpClass::kOther);
                     kernels::cuda::sample_rows_device({sample_inputs(), d_srows.get(), srows, d_sscratch.get(), d_sres.get()},
                                                       stream);
                   }
                 }));
}

void CudaModel::Impl::capture_draft(int64_t B, bool want_probs) {
  draft_graphs.emplace(std::pair<int64_t, bool>{B, want_probs},
                       capture_after_eager([this, B, want_probs] { launch_draft(B, want_probs); }));
}

int CudaModel::capture_graphs(bool taps, bool sampler) {
  Impl& m = *impl_;
  if (m.copt.max_graph_batch <= 0 || m.pad_slot < 0) return 0;
  const int64_t before = m.gstats.captures;
  taps = taps && m.w.has_draft;
  m.graph_sampler = sampler;
  if (m.sample_rows_cap > 0) {
    // Greedy placeholder rows over the padding's logits: what the capture's sampler reads, or, without
    // it, what the sampler's one separate launch below reads.
    std::vector<SampleRow> dummy(static_cast<size_t>(m.sample_rows_cap));
    for (int r = 0; r < m.sample_rows_cap; ++r) dummy[r].logits_row = r;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.d_srows.get(), dummy.data(), sizeof(SampleRow) * dummy.size(),
                                      cudaMemcpyHostToDevice, m.stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // `dummy` is pageable and local
  }
  // Decode and verify steps: only padding sequences (the spare slot and block, position 0), so no
  // engine slot changes; every context bucket up to graph_context (a step's grids are sized by its
  // bucket, not by where its sequences are, so a bucket's graph captured at position 0 serves every
  // position in it; longer contexts capture their bucket on first use).
  // (no sequence outgrows the KV pool or the model's positions)
  const int64_t longest = std::min<int64_t>(static_cast<int64_t>(m.opt.num_blocks) * m.opt.block_size,
                                            m.cfg.max_position_embeddings);
  // Under tensor parallelism only the first bucket: the budget below reads this rank's free memory,
  // and ranks that chose different buckets would wait for each other in a capture's collectives.
  const int64_t last_bucket =
      m.opt.tp_size > 1 ? 256 : std::min<int64_t>(std::max<int64_t>(m.copt.graph_context, 256), longest);
  // A bucket's graphs take about the device memory the first bucket's took (the same launches):
  // further buckets only while the graphs stay within graph_memory_budget and half the free memory.
  auto free_now = [] {
    size_t f = 0, t = 0;
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return static_cast<int64_t>(f);
  };
  const int64_t free_start = free_now();
  int64_t first_bucket_bytes = 0;
  m.graph_context_captured = 0;
  for (int64_t bucket = 256;; bucket *= 2) {
    if (bucket > 256) {
      const int64_t free = free_now();
      if (free_start - free + first_bucket_bytes >= m.copt.graph_memory_budget || first_bucket_bytes > free / 2) break;
    }
    for (int b = 1; b <= m.copt.max_graph_batch; b *= 2) {
      for (int n = 1; n <= m.opt.max_rollback + 1; ++n) {
        const LogitsMode lm = n == 1 ? LogitsMode::kLast : LogitsMode::kAll;
        m.padded.seqs.clear();
        for (int i = 0; i < b; ++i)
          m.padded.seqs.push_back({m.pad_slot, 0, std::span<const int32_t>(m.pad_tokens.data(), static_cast<size_t>(n)),
                                   m.pad_table, lm, taps});
        // forward()'s bound of a step whose sequences end in (bucket / 2, bucket]
        const int64_t bound = m.graph_bound(std::min<int64_t>(bucket, m.cfg.max_position_embeddings));
        m.prepare_plan(m.padded, nullptr, bound);  // the tables laid out as the bucket's steps lay them
        m.step.end_bound = bound;
        const int per = lm == LogitsMode::kAll ? n : 1;
        const int srows = sampler && b * per <= m.sample_rows_cap ? b * per : 0;
        const Impl::GraphKey key{b, n, static_cast<int>(lm), taps ? 1 : 0, bound, srows};
        if (!m.graphs.count(key)) m.capture(key);
        TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
        m.slot_len[m.pad_slot] = 0;
      }
    }
    if (bucket == 256) first_bucket_bytes = std::max<int64_t>(free_start - free_now(), 0);
    m.graph_context_captured = std::min<int64_t>(bucket, longest);
    if (bucket >= last_bucket) break;
  }
  if (!sampler && m.sample_rows_cap > 0) {
    // A model that samples separately (sample()) runs its sampler once here, over the first
    // placeholder row (the graphs' eager runs wrote the logits it reads): the kernel is then loaded
    // (lazy module loading takes device memory on a kernel's first launch) before any step samples,
    // as the captured sampler's is.
    kernels::cuda::sample_rows_device({m.sample_inputs(), m.d_srows.get(), 1, m.d_sscratch.get(), m.d_sres.get()},
                                      m.stream);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  }
  // Drafts of 1..min(max_graph_batch, max_draft_requests) requests, with and without q: staged
  // requests in slots 0.. at position 1 (a draft reads context and writes only its outputs).
  if (m.w.has_draft) {
    const int64_t bmax = std::min<int64_t>(m.copt.max_graph_batch, std::min<int64_t>(m.max_draft_requests, m.opt.max_slots));
    for (int64_t B = 1; B <= bmax; ++B) {
      uint8_t* hs = m.draft_host;
      for (int64_t b = 0; b < B; ++b) {
        reinterpret_cast<int32_t*>(hs)[b] = static_cast<int32_t>(b);
        reinterpret_cast<int32_t*>(hs + 4 * B)[b] = 0;
        reinterpret_cast<int64_t*>(hs + 8 * B)[b] = 1;
        reinterpret_cast<double*>(hs + 16 * B)[b] = 0.0;
        reinterpret_cast<uint64_t*>(hs + 24 * B)[b] = 0;
      }
      for (bool probs : {false, true})
        if (!m.draft_graphs.count({B, probs})) m.capture_draft(B, probs);
    }
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return static_cast<int>(m.gstats.captures - before);
}

// Every blocking wait on the stream goes through wait_stream(), so the device-wait and device-submit
// figures count it (forward_sample's fallback synchronizes here before sampling separately).
void CudaModel::synchronize() { impl_->wait_stream(); }

CudaModel::GraphStats CudaModel::graph_stats() const { return impl_->gstats; }

double CudaModel::device_wait_seconds() const { return impl_->wait_s; }

double CudaModel::device_submit_seconds() const { return impl_->submit_s; }

int64_t CudaModel::graph_context_captured() const { return impl_->graph_context_captured; }

void CudaModel::Impl::wait_stream() {
  const auto t0 = std::chrono::steady_clock::now();
  if (call_open) {
    submit_s += std::chrono::duration<double>(t0 - call_t0).count();
    call_open = false;
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t CudaModel::slot_length(int slot) const { return model::slot_length(engine_slots(*impl_), slot); }

Status CudaModel::rollback(int slot, int64_t new_length) {
  return model::rollback_slot(engine_slots(*impl_), impl_->opt.max_rollback, slot, new_length);
}

void CudaModel::reset(int slot) {
  TANDEM_CHECK(slot >= 0 && slot < impl_->opt.max_slots);
  impl_->slot_len[slot] = 0;
  draft_reset(slot);
}

void CudaModel::draft_reset(int slot) {
  Impl& m = *impl_;
  TANDEM_CHECK(slot >= 0 && slot < m.opt.max_slots);
  if (!m.lay.draft_slot_bytes) return;
  TANDEM_CUDA_CHECK(cudaMemsetAsync(m.draft_ctx.get() + slot * m.lay.draft_slot_bytes, 0,
                                    static_cast<size_t>(m.lay.draft_slot_bytes), m.stream));
}

}  // namespace tandem
