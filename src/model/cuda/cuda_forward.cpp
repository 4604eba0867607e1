// The target forward pass on the device: the same layer structure as src/model/forward.cpp (the
// CPU oracle), over every row of the step at once. Generic math goes through kernels::Ops (the
// CUDA backend); the paged-KV, compressor, indexer, attention and routed-expert pieces are the
// runner's own kernels (model_kernels.cu), which read each row's sequence, position, slot and block
// table from the step plan on the device.
#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/smem_bounds.h"

namespace tandem {

using cuda_model::DAttn;
using cuda_model::DComp;
using cuda_model::DLinear;
using cuda_model::DMoE;

kernels::Ops& CudaModel::Impl::ops() { return kernels::cuda::cuda_ops(); }

void CudaModel::Impl::linear(const DLinear& l, const float* xx, int64_t m, float* y, bool round_out) {
  if (m == 0) return;
  kernels::GemmParams p;
  p.x = xx;
  p.w = l.w;
  p.y = y;
  p.m = m;
  p.n = l.w.n;
  p.k = l.w.k;
  p.round_bf16 = round_out;
  p.quantize_x_block = l.act_quant ? 128 : 0;
  ops().gemm(p);
}

void CudaModel::Impl::norm_rows(float* xx, int64_t rows, int64_t dim, const float* weight) {
  if (rows == 0) return;
  kernels::RmsNormParams p;
  p.x = xx;
  p.y = xx;
  p.weight = weight;
  p.rows = rows;
  p.dim = dim;
  p.eps = static_cast<float>(cfg.rms_norm_eps);
  p.round_bf16 = true;
  ops().rms_norm(p);
}

void CudaModel::Impl::rope_rows(const float* inv_freq, float* xx, const int64_t* positions, int64_t tokens,
                                int64_t heads, int64_t head_stride, bool inverse) {
  if (tokens == 0) return;
  kernels::RopeParams p;
  p.x = xx;
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.tokens = tokens;
  p.heads = heads;
  p.head_stride = head_stride;
  p.rope_offset = static_cast<int>(head_stride - cfg.qk_rope_head_dim);
  p.rope_dim = cfg.qk_rope_head_dim;
  p.inverse = inverse;
  p.round_bf16 = true;
  ops().rope(p);
}

void CudaModel::Impl::hc_pre(const float* hh, int64_t n, const float* fn, const float* scale, const float* base,
                             float* xo, float* posto, float* combo) {
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
  ops().hc_pre(p);
}

void CudaModel::Impl::hc_post(const float* aa, const float* rr, int64_t n, float* hh) {
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
  ops().hc_post(p);
}

// ---- MoE: routing on the device, routed experts per (token, expert) pair, shared expert, and
// a combine in ascending expert order (the CPU's accumulation order).
void CudaModel::Impl::moe(const DMoE& m, const float* xx, const int32_t* tokens, int64_t n, float* y) {
  const int64_t D = cfg.hidden_size, E = cfg.n_routed_experts, I = cfg.moe_intermediate_size;
  const int K = cfg.num_experts_per_tok;
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
  ops().moe_gate(g);

  const float* up_in = xx;
  if (m.up_act_quant) {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(xq.get(), xx, sizeof(float) * n * D, cudaMemcpyDeviceToDevice, stream));
    kernels::ActQuantFp8Params q;
    q.x = xq.get();
    q.rows = n;
    q.cols = D;
    q.block = 128;
    ops().act_quant_fp8(q);
    up_in = xq.get();
  }
  const int64_t pairs = n * K;
  cuda_model::moe_pairs_up(up_in, eids.get(), ew.get(), pairs, K, m.w1_all, m.w3_all, I, D,
                           static_cast<float>(cfg.swiglu_limit), gact.get(), stream);
  const float* down_in = gact.get();
  if (m.down_act_quant) {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(gq.get(), gact.get(), sizeof(float) * pairs * I, cudaMemcpyDeviceToDevice, stream));
    kernels::ActQuantFp8Params q;
    q.x = gq.get();
    q.rows = pairs;
    q.cols = I;
    q.block = 128;
    ops().act_quant_fp8(q);
    down_in = gq.get();
  }
  cuda_model::moe_pairs_down(down_in, eids.get(), pairs, m.w2_all, I, D, pair_out.get(), stream);

  linear(m.sh_w1, xx, n, sh_g.get());
  linear(m.sh_w3, xx, n, sh_u.get());
  kernels::SwigluParams sw;
  sw.gate = sh_g.get();
  sw.up = sh_u.get();
  sw.out = sh_g.get();
  sw.rows = n;
  sw.cols = m.sh_w1.w.n;
  sw.limit = static_cast<float>(cfg.swiglu_limit);
  sw.round_bf16 = true;
  ops().swiglu(sw);
  linear(m.sh_w2, sh_g.get(), n, sh_out.get());
  cuda_model::moe_combine(pair_out.get(), eids.get(), sh_out.get(), n, K, D, y, stream);
}

void CudaModel::Impl::q_and_kv(const DAttn& at, const float* xx, int64_t n) {
  const int64_t H = cfg.num_attention_heads, hd = cfg.head_dim, ql = cfg.q_lora_rank;
  linear(at.wq_a, xx, n, qr.get());
  norm_rows(qr.get(), n, ql, at.q_norm);
  linear(at.wq_b, qr.get(), n, q.get());
  kernels::RmsNormParams hn;
  hn.x = q.get();
  hn.y = q.get();
  hn.rows = n * H;
  hn.dim = hd;
  hn.eps = static_cast<float>(cfg.rms_norm_eps);
  hn.mode = kernels::RmsNormMode::kBf16Chain;
  ops().rms_norm(hn);
  linear(at.wkv, xx, n, kv.get());
  norm_rows(kv.get(), n, hd, at.kv_norm);
}

void CudaModel::Impl::output_proj(const DAttn& at, float* oo, int64_t n, float* y) {
  const int64_t H = cfg.num_attention_heads, hd = cfg.head_dim, G = cfg.o_groups, R = cfg.o_lora_rank;
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
  ops().gemm(p);
  linear(at.wo_b, u.get(), n, y);
}

void CudaModel::Impl::run_compressor(const DComp& cw, int64_t ring_off, int ring, float* rows_buf, int64_t pool_off,
                                     const float* xx, int64_t n) {
  const int64_t d = cw.head_dim, C = (cw.overlap ? 2 : 1) * d;
  linear(cw.wkv, xx, n, tmp_kv.get(), false);
  linear(cw.wgate, xx, n, tmp_gate.get(), false);
  cuda_model::comp_rows_build(tmp_kv.get(), tmp_gate.get(), cw.ape, meta, n, C, cw.ratio, rows_buf, stream);
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
  cuda_model::compress_entries(ca, meta, n, entry.get(), entry_pos.get(), flag.get(), stream);
  norm_rows(entry.get(), n, d, cw.norm);
  rope_rows(rope_comp.get(), entry.get(), entry_pos.get(), n, 1, d, false);
  int64_t rec_bytes;
  if (cw.rotate) {
    kernels::HadamardParams hp;
    hp.x = entry.get();
    hp.rows = n;
    hp.n = d;
    hp.ldx = d;
    hp.round_bf16 = true;
    ops().hadamard(hp);
    cuda_model::index_key_quantize(entry.get(), n, lay.key, entry_rec.get(), stream);
    rec_bytes = lay.key.bytes;
  } else {
    cuda_model::kv_quantize(entry.get(), n, d, lay.rec, entry_rec.get(), stream);
    rec_bytes = lay.rec.bytes;
  }
  cuda_model::store_entries(entry_rec.get(), rec_bytes, flag.get(), entry_pos.get(), meta, n, cw.ratio, pool.get(),
                            lay.block_bytes, pool_off, stream);
}

void CudaModel::Impl::attention_target(int layer, const StepBatch& batch, int64_t n, float* y) {
  const cuda_model::DBlock& b = w.layers[layer];
  const DAttn& at = b.attn;
  const cuda_model::LayerState& L = lay.layers[layer];
  const int64_t H = cfg.num_attention_heads, hd = cfg.head_dim;
  const int ratio = b.ratio;
  const float* rope = ratio ? rope_comp.get() : rope_swa.get();

  q_and_kv(at, x.get(), n);
  rope_rows(rope, q.get(), meta.positions, n, H, hd, false);
  rope_rows(rope, kv.get(), meta.positions, n, 1, hd, false);
  cuda_model::kv_quantize(kv.get(), n, hd, lay.rec, kv_rec.get(), stream);

  if (ratio) run_compressor(at.comp, L.comp_off, lay.comp_ring[layer], comp_rows.get(), L.pool_main, x.get(), n);
  if (at.has_indexer)
    run_compressor(at.icomp, L.icomp_off, lay.icomp_ring[layer], icomp_rows.get(), L.pool_idx, x.get(), n);

  // Visible compressed entries bound the indexer's columns and the attention's key list: from the
  // step's context bound (exact when eager, its power-of-two bucket when replaying a graph).
  const int64_t max_vis4 = step.end_bound / 4;
  (void)batch;

  const int64_t IH = cfg.index_n_heads, ihd = cfg.index_head_dim, TK = cfg.index_topk;
  const bool csa = ratio == 4 && at.has_indexer;
  if (at.has_indexer) {
    linear(at.idx_wq_b, qr.get(), n, iq.get());
    rope_rows(rope_comp.get(), iq.get(), meta.positions, n, IH, ihd, false);
    kernels::HadamardParams hp;
    hp.x = iq.get();
    hp.rows = n * IH;
    hp.n = ihd;
    hp.ldx = ihd;
    hp.round_bf16 = true;
    ops().hadamard(hp);
    kernels::Fp4ActQuantParams fq;
    fq.x = iq.get();
    fq.rows = n * IH;
    fq.cols = ihd;
    fq.ldx = ihd;
    fq.block = 32;
    ops().fp4_act_quant(fq);
    linear(at.idx_wproj, x.get(), n, iw.get());
    const float wscale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(ihd)) / std::sqrt(static_cast<double>(IH)));
    cuda_model::scale_round(iw.get(), n * IH, wscale, stream);
  }
  if (csa && max_vis4 > 0) {
    const int64_t ncols = max_vis4;
    TANDEM_CHECK(ncols <= max_entries);
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(score_rows, (score_rows * max_entries) / ncols));
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t rows = std::min(chunk, n - r0);
      cuda_model::StepMeta mc = meta;
      mc.tokens += r0;
      mc.positions += r0;
      mc.row_seq += r0;
      cuda_model::indexer_scores_paged(iq.get() + r0 * IH * ihd, iw.get() + r0 * IH, mc, rows, static_cast<int>(IH),
                                       static_cast<int>(ihd), pool.get(), lay.block_bytes, L.pool_idx, lay.key,
                                       idx_scores.get(), ncols, visible.get() + r0, stream);
      kernels::TopkParams tk;
      tk.scores = idx_scores.get();
      tk.n_valid = visible.get() + r0;
      tk.rows = rows;
      tk.n = ncols;
      tk.lds = ncols;
      tk.k = TK;
      tk.out = topk.get() + r0 * TK;
      tk.ldo = TK;
      ops().topk(tk);
    }
  }

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
  if (csa && max_vis4 == 0) aa.topk_k = 0;
  cuda_model::attention(aa, meta, n, stream);
  rope_rows(rope, o.get(), meta.positions, n, H, hd, true);
  output_proj(at, o.get(), n, y);

  // Commit this step's rows into the slot rings (after every read of the old rows).
  cuda_model::ring_commit(kv_rec.get(), lay.rec.bytes, meta, n, slot_state.get(), lay.slot_bytes, L.win_off,
                          lay.win_ring, stream);
  if (ratio)
    cuda_model::ring_commit(reinterpret_cast<const uint8_t*>(comp_rows.get()),
                            static_cast<int64_t>(sizeof(float)) * 2 * lay.comp_chans[layer], meta, n, slot_state.get(),
                            lay.slot_bytes, L.comp_off, lay.comp_ring[layer], stream);
  if (at.has_indexer)
    cuda_model::ring_commit(reinterpret_cast<const uint8_t*>(icomp_rows.get()),
                            static_cast<int64_t>(sizeof(float)) * 2 * lay.icomp_chans[layer], meta, n,
                            slot_state.get(), lay.slot_bytes, L.icomp_off, lay.icomp_ring[layer], stream);
}

void CudaModel::Impl::block_forward(int layer, const StepBatch& batch, int64_t n) {
  const cuda_model::DBlock& b = w.layers[layer];
  const int64_t D = cfg.hidden_size;
  hc_pre(h.get(), n, b.hc_attn_fn, b.hc_attn_scale, b.hc_attn_base, x.get(), post.get(), comb.get());
  norm_rows(x.get(), n, D, b.attn_norm);
  attention_target(layer, batch, n, a.get());
  hc_post(a.get(), h.get(), n, h.get());  // the op reads every residual stream before writing
  hc_pre(h.get(), n, b.hc_ffn_fn, b.hc_ffn_scale, b.hc_ffn_base, x.get(), post.get(), comb.get());
  norm_rows(x.get(), n, D, b.ffn_norm);
  moe(b.ffn, x.get(), meta.tokens, n, a.get());
  hc_post(a.get(), h.get(), n, h.get());  // the op reads every residual stream before writing
}

void CudaModel::Impl::head_logits(const float* hin, int64_t n, const cuda_model::DWeights& ww, const float* hc_fn,
                                  const float* hc_scale, const float* hc_base, const float* norm, float* y_out,
                                  float* logits_out) {
  const int64_t D = cfg.hidden_size;
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
  ops().hc_head(p);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(yn.get(), y_out, sizeof(float) * n * D, cudaMemcpyDeviceToDevice, stream));
  norm_rows(yn.get(), n, D, norm);
  linear(ww.head, yn.get(), n, logits_out, false);
}

}  // namespace tandem
