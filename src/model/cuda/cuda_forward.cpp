// The target forward pass on the device: the same layer structure as src/model/forward.cpp (the
// CPU oracle), over every row of the step at once. Generic math goes through the launchers of
// src/kernels/cuda (cuda_ops.h) on the model's stream; the paged-KV, compressor, indexer, attention
// and routed-expert pieces are the runner's own kernels (model_kernels.h: one .cu per concern),
// which read each row's sequence, position, slot and block table from the step plan on the device.
// Under tensor parallelism each rank runs its heads, output groups, index heads, routed experts and
// vocabulary rows, and the collectives sit where the CPU's are (attention output, routed MoE sum,
// indexer scores, embedding, LM head), through the data-plane communicator (common/comm.h) on the
// model's stream, whichever path (generic, decode-size, tensor-core prefill) computed the partials.
#include <algorithm>
#include <cmath>
#include <optional>

#include "common/check.h"
#include "common/comm.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/smem_bounds.h"

namespace tandem {

using cuda_model::DAttn;
using cuda_model::DComp;
using cuda_model::DLinear;
using cuda_model::DMoE;
using OpClass = CudaModel::OpClass;

// ---- tensor parallelism ----

void CudaModel::Impl::all_reduce(float* xx, int64_t n) { all_reduce_raw(xx, n, CommDtype::kF32); }

void CudaModel::Impl::all_reduce_raw(void* xx, int64_t n, CommDtype dtype) {
  if (!comm_status.ok() || n == 0) return;
  const OpClass prev = cur_class;
  section(OpClass::kCollective);
  comm_status = opt.comm->all_reduce_sum(xx, static_cast<size_t>(n), dtype, stream);
  section(prev);
}

void CudaModel::Impl::embed_tokens(const int32_t* ids, int64_t n) {
  section(OpClass::kEmbed);
  const int64_t D = cfg.hidden_size;
  if (!tp()) {
    cuda_model::embed_rows({w.embed.w, ids, n, cfg.hc_mult, D, h.get()}, stream);
    return;
  }
  // Vocabulary-parallel: the rank owning a token's row contributes it, the others zeros; one
  // all-reduce, then the row goes to every hc stream.
  cuda_model::EmbedArgs e{w.embed.w, ids, n, 1, D, x.get()};
  e.vocab_begin = w.vocab_begin;
  e.vocab_end = w.vocab_end;
  cuda_model::embed_rows(e, stream);
  all_reduce(x.get(), n * D);
  cuda_model::replicate_hc({x.get(), n, cfg.hc_mult, D, h.get()}, stream);
}

void CudaModel::Impl::head_gemm(const DLinear& head, const float* yn_rows, int64_t n, float* out) {
  if (n == 0) return;
  if (!tp()) {
    linear(head, yn_rows, n, out, false);
    return;
  }
  const int64_t V = cfg.vocab_size, P = (V + opt.tp_size - 1) / opt.tp_size, mine = w.vocab_end - w.vocab_begin;
  // [n, mine] with row stride P (the last rank's share may be shorter: the rest of its rows is zero),
  // on the kernels linear() picks for the head at this row count (decode GEMV, tensor cores, generic).
  if (mine < P) TANDEM_CUDA_CHECK(cudaMemsetAsync(tp_local.get(), 0, sizeof(float) * n * P, stream));
  if (mine > 0) linear(head, yn_rows, n, tp_local.get(), false, P);
  if (!comm_status.ok()) return;
  const OpClass prev = cur_class;
  section(OpClass::kCollective);
  comm_status = opt.comm->all_gather(tp_local.get(), sizeof(float) * n * P, tp_gather.get(), stream);
  section(prev);
  // Every rank's [n, P] block into its vocabulary columns of [n, V].
  for (int r = 0; r < opt.tp_size; ++r) {
    const int64_t cnt = std::max<int64_t>(0, std::min(P, V - r * P));
    if (cnt == 0) continue;
    TANDEM_CUDA_CHECK(cudaMemcpy2DAsync(out + r * P, sizeof(float) * V, tp_gather.get() + r * n * P,
                                        sizeof(float) * P, sizeof(float) * cnt, n, cudaMemcpyDeviceToDevice, stream));
  }
}

// ---- op classes for the step profile (bench-model): counted only while a profiled step is captured ----

void CudaModel::Impl::section(OpClass c) {
  cur_class = c;
  if (!marks) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaGraph_t g = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &st, nullptr, &g, nullptr, nullptr, nullptr));
  if (st != cudaStreamCaptureStatusActive || !g) return;
  size_t nn = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nn));
  std::vector<cudaGraphNode_t> nodes(nn);
  if (nn) TANDEM_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &nn));
  CudaModel::ClassMark m;
  m.cls = c;
  if (marks->empty()) mark_types.clear();  // a new capture
  for (cudaGraphNode_t node : nodes) {
    auto it = mark_types.find(node);
    if (it == mark_types.end()) {
      cudaGraphNodeType t;
      TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
      it = mark_types.emplace(node, t).first;
    }
    if (it->second == cudaGraphNodeTypeKernel) ++m.kernel_index;
    else if (it->second == cudaGraphNodeTypeMemcpy || it->second == cudaGraphNodeTypeMemset) ++m.copy_index;
  }
  if (!marks->empty() && marks->back().kernel_index == m.kernel_index && marks->back().copy_index == m.copy_index)
    marks->back().cls = c;  // nothing launched since the last mark
  else
    marks->push_back(m);
}

void CudaModel::Impl::linear(const DLinear& l, const float* xx, int64_t m, float* y, bool round_out, int64_t ldy) {
  if (m == 0) return;
  if (linear_tc(l, xx, m, y, round_out, ldy)) return;  // prefill rows: tensor cores (cuda_prefill.cpp)
  if (dec_linear(l, xx, m, y, round_out, ldy)) return;  // decode-size kernels (cuda_decode.cpp)
  kernels::GemmParams p;
  p.x = xx;
  p.w = l.w;
  p.y = y;
  p.m = m;
  p.n = l.w.n;
  p.k = l.w.k;
  p.ldy = ldy;
  p.round_bf16 = round_out;
  p.quantize_x_block = l.act_quant ? 128 : 0;
  kernels::cuda::gemm(p, stream);
}

void CudaModel::Impl::norm_rows(float* xx, int64_t rows, int64_t dim, const float* weight) {
  dec.packed_x = nullptr;  // rows are rewritten: no codes left by dec_norm_rows stay valid
  if (rows == 0) return;
  kernels::RmsNormParams p;
  p.x = xx;
  p.y = xx;
  p.weight = weight;
  p.rows = rows;
  p.dim = dim;
  p.eps = static_cast<float>(cfg.rms_norm_eps);
  p.round_bf16 = true;
  kernels::cuda::rms_norm(p, stream);
}

void CudaModel::Impl::hc_pre(const float* hh, int64_t n, const float* fn, const float* scale, const float* base,
                             float* xo, float* posto, float* combo, const float* norm_weight) {
  join_comb();             // a pending comb branch still reads the mix's partials this call rewrites
  dec.packed_x = nullptr;  // xo is rewritten
  kernels::HcPreParams p;
  p.h = hh;
  p.fn = fn;
  p.scale = scale;
  p.base = base;
  p.tokens = n;
  p.hc = cfg.hc_mult;
  p.dim = cfg.hidden_size;
  p.norm_eps = static_cast<float>(cfg.rms_norm_eps);
  p.hc_eps = static_cast<float>(cfg.hc_eps);
  p.sinkhorn_iters = cfg.hc_sinkhorn_iters;
  p.x = xo;
  p.post = posto;
  p.comb = combo;
  if (norm_weight && dec_hc_pre_norm(p, norm_weight)) return;
  kernels::cuda::hc_pre(p, stream);
  if (norm_weight) dec_norm_rows(xo, n, p.dim, norm_weight);
}

void CudaModel::Impl::join_comb() {
  if (!comb_pending) return;
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, comb_join, 0));
  comb_pending = false;
}

void CudaModel::Impl::join_ring() {
  if (!ring_pending) return;
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ring_join, 0));
  ring_pending = false;
}

void CudaModel::Impl::hc_post(const float* aa, const float* rr, int64_t n, float* hh) {
  join_comb();  // comb (hc_pre_pack's side branch)
  kernels::HcPostParams p;
  p.f = aa;
  p.res = rr;
  p.post = post.get();
  p.comb = comb.get();
  p.out = hh;
  p.tokens = n;
  p.hc = cfg.hc_mult;
  p.dim = cfg.hidden_size;
  p.round_bf16 = true;
  // Under tensor parallelism every sub-block output (wo_b's, the MoE's) is all-reduced and leaves its
  // epilogue for this load: one missing here would skip a bf16 round or the shared expert.
  TANDEM_CHECK(!tp() || f_epilogue.f == aa);
  if (f_epilogue.f == aa && epilogue_launches) {  // the test hook's reference: in place on aa, then plain
    if (f_epilogue.add) {
      cuda_model::moe_add_shared({f_epilogue.f, f_epilogue.add, n * p.dim}, stream);
    } else {
      kernels::RoundBf16Params rb;
      rb.x = f_epilogue.f;
      rb.rows = n;
      rb.cols = p.dim;
      kernels::cuda::round_bf16(rb, stream);
    }
  } else if (f_epilogue.f == aa) {  // aa's all-reduce epilogue (wo_b, moe_reduce_shared)
    p.f_add = f_epilogue.add;
    p.f_round = true;
  }
  f_epilogue = {};
  kernels::cuda::hc_post(p, stream);
}

// ---- MoE: routing on the device, this rank's routed experts per (token, expert) pair (prefill rows:
// grouped by expert on the tensor cores; decode rows: moe_decode), the shared expert, and a combine
// in ascending expert order (the CPU's accumulation order). Under tensor parallelism the routed sum
// is a partial sum over this rank's experts: all-reduced in fp32, then the (whole) shared expert is
// added, as the CPU does (by the consumer hc_post as it loads the sum: moe_reduce_shared).
void CudaModel::Impl::moe(const DMoE& m, const float* xx, const int32_t* tokens, int64_t n, float* y, int layer) {
  if (dec_moe(m, xx, tokens, n, y, layer)) {  // decode-size kernels (cuda_decode.cpp)
    last_routing = {dec.moe.gate_logits, dec.moe.expert_ids};
    return;
  }
  last_routing = {gate_logits.get(), eids.get()};
  const int64_t D = cfg.hidden_size, E = cfg.n_routed_experts, I = cfg.moe_intermediate_size;
  const int K = cfg.num_experts_per_tok;
  section(OpClass::kRouter);
  linear(m.gate, xx, n, gate_logits.get(), false);
  kernels::MoeGateParams g;
  g.logits = gate_logits.get();
  g.bias = m.hash ? nullptr : m.bias;
  g.token_ids = m.hash ? tokens : nullptr;
  g.tid2eid = m.hash ? m.tid2eid : nullptr;
  g.tokens = n;
  g.n_experts = static_cast<int>(E);
  g.topk = K;
  g.route_scale = static_cast<float>(cfg.routed_scaling_factor);
  g.expert_ids = eids.get();
  g.weights = ew.get();
  kernels::cuda::moe_gate(g, stream);
  if (recording_routes && layer >= 0)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(route_rec.get() + static_cast<int64_t>(layer) * max_rows * K, eids.get(),
                                      sizeof(int32_t) * n * K, cudaMemcpyDeviceToDevice, stream));

  section(OpClass::kRoutedExperts);
  const int64_t pairs = n * K;
  // Prefill rows: pairs grouped by expert on the tensor cores (cuda_prefill.cpp); else per pair.
  const bool grouped = moe_routed_tc(m, xx, n);
  if (!grouped) {
    const float* up_in = xx;
    if (m.up_act_quant) {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(xq.get(), xx, sizeof(float) * n * D, cudaMemcpyDeviceToDevice, stream));
      kernels::ActQuantFp8Params q;
      q.x = xq.get();
      q.rows = n;
      q.cols = D;
      q.block = 128;
      kernels::cuda::act_quant_fp8(q, stream);
      up_in = xq.get();
    }
    cuda_model::MoePairsUpArgs up{up_in, eids.get(), ew.get(), pairs, K, m.w1_all, m.w3_all, I, D,
                                  static_cast<float>(cfg.swiglu_limit), gact.get()};
    up.expert_begin = m.expert_begin;
    up.expert_count = m.n_local;
    cuda_model::moe_pairs_up(up, stream);
    const float* down_in = gact.get();
    if (m.down_act_quant) {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(gq.get(), gact.get(), sizeof(float) * pairs * I, cudaMemcpyDeviceToDevice, stream));
      kernels::ActQuantFp8Params q;
      q.x = gq.get();
      q.rows = pairs;
      q.cols = I;
      q.block = 128;
      kernels::cuda::act_quant_fp8(q, stream);
      down_in = gq.get();
    }
    cuda_model::MoePairsDownArgs down{down_in, eids.get(), pairs, m.w2_all, I, D, pair_out.get()};
    down.expert_begin = m.expert_begin;
    down.expert_count = m.n_local;
    cuda_model::moe_pairs_down(down, stream);
  }

  section(OpClass::kSharedExperts);
  {
    TcShare share(*this, xx);  // sh_w1 and sh_w3 read x: quantized once (prefill rows)
    linear(m.sh_w1, xx, n, sh_g.get());
    linear(m.sh_w3, xx, n, sh_u.get());
  }
  kernels::SwigluParams sw;
  sw.gate = sh_g.get();
  sw.up = sh_u.get();
  sw.out = sh_g.get();
  sw.rows = n;
  sw.cols = m.sh_w1.w.n;
  sw.limit = static_cast<float>(cfg.swiglu_limit);
  sw.round_bf16 = true;
  kernels::cuda::swiglu(sw, stream);
  linear(m.sh_w2, sh_g.get(), n, sh_out.get());
  section(OpClass::kRoutedExperts);
  // Under tensor parallelism: this rank's routed sum in fp32 (shared == null), all-reduced, then
  // bf16(sum + shared) as the CPU (hc_post's load epilogue).
  const float* shared = tp() ? nullptr : sh_out.get();
  if (grouped) {
    cuda_model::moe_combine_local(pair_out.get(), eids.get(), shared, n, K, D, m.expert_begin, m.n_local, y, stream);
  } else {
    cuda_model::MoeCombineArgs cb{pair_out.get(), eids.get(), shared, n, K, D, y};
    cb.expert_begin = m.expert_begin;
    cb.expert_count = m.n_local;
    cuda_model::moe_combine(cb, stream);
  }
  if (tp()) moe_reduce_shared(y, sh_out.get(), n);
}

void CudaModel::Impl::moe_reduce_shared(float* y, const float* shared, int64_t n) {
  all_reduce(y, n * cfg.hidden_size);
  f_epilogue = {y, shared};  // bf16(y + shared) (moe_add_shared's): hc_post's, as it loads y
}

// q [n, H, hd] and kv [n, hd] projected, normalized and rotated (positions [n], RoPE table `rope`),
// kv's cache record in kv_rec; with the indexer, its queries iq [n, IH, ihd] projected from qr,
// rotated (RoPE, Hadamard) and FP4-rounded.
void CudaModel::Impl::q_and_kv(const DAttn& at, const float* xx, int64_t n, const float* rope,
                               const int64_t* positions) {
  section(OpClass::kDense);
  if (!dec_q_and_kv(at, xx, n)) {  // decode-size kernels (cuda_decode.cpp)
    {
      TcShare share(*this, xx);  // wq_a and wkv read x: quantized once (prefill rows)
      linear(at.wq_a, xx, n, qr.get());
      linear(at.wkv, xx, n, kv.get());
    }
    norm_rows(qr.get(), n, cfg.q_lora_rank, at.q_norm);
    TcShare share(*this, qr.get());  // wq_b and the indexer's wq_b read the normed qr
    linear(at.wq_b, qr.get(), n, q.get());
    if (at.has_indexer) linear(at.idx_wq_b, qr.get(), n, iq.get());
  } else if (at.has_indexer) {
    // The indexer's query projection of the normed qr (done already when dec_q_and_kv grouped it with wq_b).
    linear(at.idx_wq_b, qr.get(), n, iq.get());
  }
  if (n == 0) return;
  // q's per-head RMSNorm (bf16 chain) and RoPE, the indexer query heads' RoPE, Hadamard and FP4 round
  // trip, kv's RMSNorm (kv_norm), RoPE and record: one kernel.
  section(OpClass::kAttention);
  dec.packed_x = nullptr;  // rows are rewritten
  cuda_model::NormRopeArgs a;
  a.q = q.get();
  a.heads = at.n_heads;
  a.q_dim = static_cast<int>(cfg.head_dim);
  if (at.has_indexer) {
    TANDEM_CHECK(rope == rope_comp.get());  // the indexer's layers are compressed (ratio 4): one table
    a.iq = iq.get();
    a.iheads = at.n_idx_heads;
    a.iq_dim = static_cast<int>(cfg.index_head_dim);
  }
  a.k = kv.get();
  a.k_dim = static_cast<int>(cfg.head_dim);
  a.k_norm = at.kv_norm;
  a.rec = lay.rec;
  a.records = kv_rec.get();
  a.positions = positions;
  a.inv_freq = rope;
  a.rope_dim = static_cast<int>(cfg.qk_rope_head_dim);
  a.tokens = n;
  a.eps = static_cast<float>(cfg.rms_norm_eps);
  cuda_model::norm_rope(a, stream);
}

void CudaModel::Impl::output_proj(const DAttn& at, float* oo, int64_t n, float* y) {
  section(OpClass::kDense);
  if (dec_output_proj(at, oo, n, y)) return;  // decode-size kernels (cuda_decode.cpp)
  const int64_t H = at.n_heads, hd = cfg.head_dim, G = at.n_groups, R = cfg.o_lora_rank;
  const int64_t gin = H * hd / G;
  kernels::GemmParams p;
  p.x = oo;
  p.w = at.wo_a.w;
  p.y = u.get();
  p.m = n;
  p.n = R;
  p.k = gin;
  p.ldx = H * hd;
  p.ldy = G * R;
  p.batch = G;
  p.x_batch_stride = gin;
  p.y_batch_stride = R;
  p.w_batch_rows = R;
  p.round_bf16 = true;
  if (!gemm_bf16_tc(p)) kernels::cuda::gemm(p, stream);  // prefill rows: cuBLASLt (cuda_prefill.cpp)
  wo_b(at, n, y);
}

// Row-parallel under tensor parallelism: this rank's fp32 partial sums, all-reduced, then rounded
// (by hc_post as it loads y: f_epilogue).
void CudaModel::Impl::wo_b(const DAttn& at, int64_t n, float* y) {
  linear(at.wo_b, u.get(), n, y, !tp());
  if (!tp()) return;
  all_reduce(y, n * cfg.hidden_size);
  f_epilogue = {y, nullptr};  // bf16(y) (the CPU's all_reduce_bf16): hc_post's, as it loads y
}

void CudaModel::Impl::run_compressor(const DComp& cw, int64_t ring_off, int ring, float* rows_buf, int64_t pool_off,
                                     const float* xx, int64_t n, float* kv_buf, float* gate_buf) {
  const OpClass prev = cur_class;
  section(OpClass::kCompressor);
  const int64_t d = cw.head_dim, C = (cw.overlap ? 2 : 1) * d;
  linear(cw.wkv, xx, n, kv_buf, false);
  linear(cw.wgate, xx, n, gate_buf, false);
  // The step's compressor rows and the entries they complete: one launch (comp_rows_build + compress_entries).
  cuda_model::CompressArgs ca;
  ca.step_rows = rows_buf;
  ca.slot_state = slot_state.get();
  ca.slot_bytes = lay.slot_bytes;
  ca.ring_off = ring_off;
  ca.ring = ring;
  ca.chans = C;
  ca.ratio = cw.ratio;
  ca.d = d;
  ca.overlap = cw.overlap;
  ca.m = meta;
  ca.rows = n;
  ca.entry = entry.get();
  ca.entry_pos = entry_pos.get();
  ca.flag = flag.get();
  cuda_model::compress_step({kv_buf, gate_buf, cw.ape, meta, n, C, cw.ratio, rows_buf}, ca, stream);
  // The entries' RMSNorm, RoPE, (the indexer's: Hadamard) and records, and the completed entries'
  // records into the pool (store_entries): one kernel.
  if (n > 0) {
    cuda_model::NormRopeArgs nr;
    nr.k = entry.get();
    nr.k_dim = static_cast<int>(d);
    nr.k_norm = cw.norm;
    nr.rotate = cw.rotate;
    nr.rec = lay.rec;
    nr.key = lay.key;
    nr.records = entry_rec.get();
    nr.positions = entry_pos.get();
    nr.inv_freq = rope_comp.get();
    nr.rope_dim = static_cast<int>(cfg.qk_rope_head_dim);
    nr.tokens = n;
    nr.eps = static_cast<float>(cfg.rms_norm_eps);
    nr.store_flag = flag.get();
    nr.m = meta;
    nr.ratio = cw.ratio;
    nr.pool = pool.get();
    nr.block_bytes = lay.block_bytes;
    nr.pool_off = pool_off;
    cuda_model::norm_rope(nr, stream);
  }
  section(prev);
}

void CudaModel::Impl::attention_target(int layer, int64_t n, float* y) {
  const cuda_model::DBlock& b = w.layers[layer];
  const DAttn& at = b.attn;
  const cuda_model::LayerState& L = lay.layers[layer];
  const int64_t H = at.n_heads, hd = cfg.head_dim;
  const int ratio = b.ratio;
  const float* rope = ratio ? rope_comp.get() : rope_swa.get();

  join_ring();     // the previous layer's ring commit still reads the step rows this layer rewrites
  dec.n_done = 0;  // grouped launches' results belong to the layer that made them
  // Decode rows whose x projections group into one launch run the compressors' chain (that launch,
  // the compressors' rows, entries and pool stores) on comp_stream, forked here (x is final) and
  // joined before the indexer: it shares nothing with q_and_kv but x. Everything it calls then takes
  // the decode kernels (linear() finds the grouped projections done), which use no shared scratch.
  const bool branch = copt.compressor_side &&
                      dec_x_projections(at, ratio, x.get(), n, tmp_kv.get(), tmp_gate.get(), tmp_ikv.get(),
                                        tmp_igate.get(), false);
  if (branch) TANDEM_CUDA_CHECK(cudaEventRecord(comp_fork, stream));
  q_and_kv(at, x.get(), n, rope, meta.positions);
  const cudaStream_t main_stream = stream;
  if (branch) {
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(comp_stream, comp_fork, 0));
    stream = comp_stream;  // the branch's launches (every op below takes `stream`)
  }
  section(OpClass::kCompressor);
  dec_x_projections(at, ratio, x.get(), n, tmp_kv.get(), tmp_gate.get(), tmp_ikv.get(), tmp_igate.get());
  section(OpClass::kAttention);

  // The compressors' wkv and wgate and the indexer's weights_proj read x: one bf16 copy (prefill rows).
  // The indexer's compressor first: with the branch, the indexer joins its keys while the main
  // compressor's launches still run (the attention joins those).
  std::optional<TcShare> share_x;
  share_x.emplace(*this, x.get());
  if (at.has_indexer)
    run_compressor(at.icomp, L.icomp_off, lay.icomp_ring[layer], icomp_rows.get(), L.pool_idx, x.get(), n,
                   tmp_ikv.get(), tmp_igate.get());
  if (branch) TANDEM_CUDA_CHECK(cudaEventRecord(comp_join_idx, comp_stream));
  if (ratio)
    run_compressor(at.comp, L.comp_off, lay.comp_ring[layer], comp_rows.get(), L.pool_main, x.get(), n, tmp_kv.get(),
                   tmp_gate.get());
  if (branch) {
    TANDEM_CUDA_CHECK(cudaEventRecord(comp_join, comp_stream));
    stream = main_stream;
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, comp_join_idx, 0));  // the indexer's keys (and weights)
  }

  // Visible compressed entries bound the indexer's columns and the attention's key list: from the
  // step's context bound (exact when eager, its power-of-two bucket when replaying a graph).
  const int64_t max_vis4 = step.end_bound / 4;

  // This rank's index heads; the score scale counts all of them (the reference's n_heads ** -0.5).
  const int64_t IH = at.n_idx_heads, ihd = cfg.index_head_dim, TK = cfg.index_topk;
  const bool csa = ratio == 4 && at.has_indexer;
  section(OpClass::kIndexer);
  // The head weights' scale (scale_round's) is applied by the score kernel as it loads them (IndexerArgs::w_scale).
  const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ihd)) /
                                          std::sqrt(static_cast<double>(cfg.index_n_heads)));
  if (at.has_indexer) linear(at.idx_wproj, x.get(), n, iw.get());  // iq: projected, rotated and FP4-rounded by q_and_kv
  share_x.reset();
  if (csa && max_vis4 > 0) {
    // Scores and top-k in chunks of rows that the score buffer and the top-k's work hold. (Under
    // tensor parallelism the bf16 scores are summed over ranks before the top-k: then the indexer
    // must not count pass 1 (hist = null) and the top-k counts it (hist_ready = false).)
    const int64_t ncols = max_vis4, lds = (max_vis4 + 7) / 8 * 8;
    TANDEM_CHECK(ncols <= max_entries);
    const cuda_model::TopkState tst = cuda_model::topk_state(
        topk_counters.get(), static_cast<int64_t>(std::min<size_t>(max_rows, 65535)), topk_work.get(), topk_work.bytes());
    int64_t chunk = std::min<int64_t>({n, int64_t{65535}, tst.max_rows, static_cast<int64_t>(idx_scores.size()) / lds});
    while (chunk > 1 && cuda_model::topk_work_bytes(chunk, ncols) > tst.work_bytes) chunk = chunk * 7 / 8;
    TANDEM_CHECK(chunk >= 1);
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t rows = std::min(chunk, n - r0);
      cuda_model::StepMeta mc = meta;
      mc.tokens += r0;
      mc.positions += r0;
      mc.row_seq += r0;
      cuda_model::IndexerArgs ia;
      ia.q = iq.get() + r0 * IH * ihd;
      ia.w = iw.get() + r0 * IH;
      ia.w_scale = wscale;
      ia.m = mc;
      ia.rows = rows;
      ia.heads = static_cast<int>(IH);
      ia.dim = static_cast<int>(ihd);
      ia.pool = pool.get();
      ia.block_bytes = lay.block_bytes;
      ia.pool_idx = L.pool_idx;
      ia.key = lay.key;
      ia.scores = idx_scores.get();
      ia.n_cols = ncols;
      ia.lds = lds;
      ia.visible = visible.get() + r0;
      ia.hist = tp() ? nullptr : tst.hist1;
      ia.sm_count = sm_count;
      cuda_model::indexer_scores_paged(ia, stream);
      // Each rank summed its own heads (bf16); the reference all-reduces the bf16 scores (summed in
      // fp32 in rank order, rounded once: CommDtype::kBf16). The padding columns past n_cols ride along.
      if (tp()) all_reduce_raw(idx_scores.get(), rows * lds, CommDtype::kBf16);
      cuda_model::IndexerTopkArgs ta;
      ta.scores = idx_scores.get();
      ta.lds = lds;
      ta.n_cols = ncols;
      ta.visible = visible.get() + r0;
      ta.rows = rows;
      ta.k = static_cast<int>(TK);
      ta.out = topk.get() + r0 * TK;
      ta.ldo = TK;
      ta.state = tst;
      ta.hist_ready = !tp();
      cuda_model::indexer_topk(ta, stream);
      last_indexer = {r0, rows, lds, ncols};
    }
  }

  if (branch) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, comp_join, 0));  // the compressed entries
  section(OpClass::kAttention);
  cuda_model::AttnArgs aa;
  aa.q = q.get();
  aa.step_kv = kv.get();
  aa.slot_state = slot_state.get();
  aa.slot_bytes = lay.slot_bytes;
  aa.win_off = L.win_off;
  aa.win_ring = lay.win_ring;
  aa.window = cfg.sliding_window;
  aa.ratio = ratio;
  aa.pool = pool.get();
  aa.block_bytes = lay.block_bytes;
  aa.pool_main = L.pool_main;
  aa.topk = csa ? topk.get() : nullptr;
  aa.topk_ld = static_cast<int>(TK);
  aa.topk_k = static_cast<int>(TK);
  aa.sink = at.attn_sink;
  aa.heads = static_cast<int>(H);
  aa.hd = static_cast<int>(hd);
  aa.rec = lay.rec;
  aa.max_keys = cuda_model::attention_max_keys(cfg, ratio, csa, step.end_bound);
  aa.out = o.get();
  aa.out_inv_freq = rope;  // o's inverse RoPE in the attention's epilogue
  aa.out_rope_dim = static_cast<int>(cfg.qk_rope_head_dim);
  if (csa && max_vis4 == 0) aa.topk_k = 0;
  aa.m = meta;
  aa.rows = n;
  aa.partial = attn_partial.get();
  aa.partial_slots = attn_partial_slots;
  aa.sm_count = sm_count;
  aa.key_rows = attn_keys.get();
  aa.key_rows_cap = attn_keys_rows;
  aa.seqs = in_step && step.batch ? static_cast<int64_t>(step.batch->seqs.size()) : 0;
  aa.entries_bound = ratio ? step.end_bound / ratio : 0;
  cuda_model::attention(aa, stream);

  // Commit this step's rows into the slot rings (after every read of the old rows), in one launch:
  // on ring_stream beside the output projections (and the FFN half) when ring_commit_side, else
  // after them.
  const bool ring_side = copt.ring_commit_side;
  if (!ring_side) output_proj(at, o.get(), n, y);
  if (ring_side) {
    TANDEM_CUDA_CHECK(cudaEventRecord(ring_fork, stream));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(ring_stream, ring_fork, 0));
    stream = ring_stream;
  }
  section(OpClass::kAttention);
  cuda_model::RingCommitArgs rings[3];
  int nrings = 0;
  rings[nrings++] = {kv_rec.get(), lay.rec.bytes, meta, n, slot_state.get(), lay.slot_bytes, L.win_off, lay.win_ring};
  if (ratio)
    rings[nrings++] = {reinterpret_cast<const uint8_t*>(comp_rows.get()),
                       static_cast<int64_t>(sizeof(float)) * 2 * lay.comp_chans[layer], meta, n, slot_state.get(),
                       lay.slot_bytes, L.comp_off, lay.comp_ring[layer]};
  if (at.has_indexer)
    rings[nrings++] = {reinterpret_cast<const uint8_t*>(icomp_rows.get()),
                       static_cast<int64_t>(sizeof(float)) * 2 * lay.icomp_chans[layer], meta, n, slot_state.get(),
                       lay.slot_bytes, L.icomp_off, lay.icomp_ring[layer]};
  cuda_model::ring_commit_batch(rings, nrings, stream);
  if (ring_side) {
    TANDEM_CUDA_CHECK(cudaEventRecord(ring_join, ring_stream));
    stream = main_stream;
    ring_pending = true;
    output_proj(at, o.get(), n, y);
  }
}

void CudaModel::Impl::block_forward(int layer, int64_t n) {
  attention_half(layer, n);
  ffn_half(layer, n);
}

void CudaModel::Impl::attention_half(int layer, int64_t n) {
  const cuda_model::DBlock& b = w.layers[layer];
  section(OpClass::kMhc);
  // x = attn_norm(collapse), + x's codes for the decode q/kv
  hc_pre(h.get(), n, b.hc_attn_fn, b.hc_attn_scale, b.hc_attn_base, x.get(), post.get(), comb.get(), b.attn_norm);
  attention_target(layer, n, a.get());
  section(OpClass::kMhc);
  hc_post(a.get(), h.get(), n, h.get());  // the op reads every residual stream before writing
}

void CudaModel::Impl::ffn_half(int layer, int64_t n) {
  const cuda_model::DBlock& b = w.layers[layer];
  // x = ffn_norm(collapse), + x's codes for the decode MoE
  hc_pre(h.get(), n, b.hc_ffn_fn, b.hc_ffn_scale, b.hc_ffn_base, x.get(), post.get(), comb.get(), b.ffn_norm);
  moe(b.ffn, x.get(), meta.tokens, n, a.get(), layer);
  section(OpClass::kMhc);
  hc_post(a.get(), h.get(), n, h.get());  // the op reads every residual stream before writing
}

void CudaModel::Impl::head_logits(const float* hin, int64_t n, const cuda_model::DWeights& ww, const float* hc_fn,
                                  const float* hc_scale, const float* hc_base, const float* norm, float* y_out,
                                  float* logits_out) {
  const int64_t D = cfg.hidden_size;
  section(OpClass::kLmHead);
  kernels::HcHeadParams p;
  p.h = hin;
  p.fn = hc_fn;
  p.scale = hc_scale;
  p.base = hc_base;
  p.tokens = n;
  p.hc = cfg.hc_mult;
  p.dim = D;
  p.norm_eps = static_cast<float>(cfg.rms_norm_eps);
  p.hc_eps = static_cast<float>(cfg.hc_eps);
  p.y = y_out;
  p.round_bf16 = true;
  kernels::cuda::hc_head(p, stream);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(yn.get(), y_out, sizeof(float) * n * D, cudaMemcpyDeviceToDevice, stream));
  norm_rows(yn.get(), n, D, norm);
  head_gemm(ww.head, yn.get(), n, logits_out);
}

}  // namespace tandem
