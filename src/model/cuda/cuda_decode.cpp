// The decode-size dispatch of the CUDA forward (decode_path.h): linear() projections, q/kv, the
// grouped output projection and the MoE go to the tensor-core decode kernels (kernels/cuda/
// decode_gemm.h, moe_decode.h) when the weights allow, else to the generic ops. Each dec_* returns
// false without launching anything when it does not apply, and the caller takes its generic path;
// the choice depends on formats and shapes and on the step (Impl::tc_rows: a sequence of more than
// tc_min_rows tokens, or more rows than the decode MoE holds), so below those sizes a row's
// arithmetic does not depend on what else shares its step. Under tensor
// parallelism the shapes are the rank's (its heads, output groups and experts), and the row-parallel
// outputs (wo_b, the routed experts) leave fp32 partial sums for the all-reduce as the generic path
// does (wo_b(), moe_reduce_shared() in cuda_forward.cpp).
#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_gemm.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

namespace kc = kernels::cuda;
using cuda_model::DAttn;
using cuda_model::DLinear;
using cuda_model::DMoE;
using kernels::WeightFormat;

int64_t CudaModel::Impl::dec_allocate(bool measure) {
  dec.enabled = copt.decode_kernels;
  if (!dec.enabled) return 0;
  const ModelConfig& c = cfg;
  int64_t max_k = c.hidden_size;
  auto lk = [&](const DLinear& l) {
    if (l.act_quant) max_k = std::max(max_k, l.w.k);
  };
  auto block_k = [&](const cuda_model::DBlock& b) {
    for (const auto* l : {&b.attn.wq_a, &b.attn.wq_b, &b.attn.wkv, &b.attn.wo_a, &b.attn.wo_b, &b.attn.idx_wq_b,
                          &b.attn.idx_wproj, &b.attn.comp.wkv, &b.attn.comp.wgate, &b.attn.icomp.wkv,
                          &b.attn.icomp.wgate, &b.ffn.gate, &b.ffn.sh_w1, &b.ffn.sh_w2, &b.ffn.sh_w3})
      lk(*l);
  };
  for (const auto& b : w.layers) block_k(b);
  for (const auto& b : w.draft.stages) block_k(b);
  lk(w.head);
  lk(w.draft.main_proj);
  lk(w.draft.markov_w2);
  max_k = (max_k + 127) / 128 * 128;
  dec.max_rows = max_rows;
  dec.max_k = std::min(max_k, kc::kMaxPackDim);
  dec.moe_dims.dim = c.hidden_size;
  dec.moe_dims.inter = c.moe_intermediate_size;
  dec.moe_dims.n_experts = static_cast<int>(c.n_routed_experts);
  dec.moe_dims.topk = c.num_experts_per_tok;
  dec.moe_max_tokens = std::min<int64_t>(max_rows, cuda_model::kMoeDecodeMaxTokens);
  dec.moe_dims.max_tokens = dec.moe_max_tokens;
  const size_t codes = static_cast<size_t>(dec.max_rows * dec.max_k);
  const size_t scales = static_cast<size_t>(dec.max_rows * (dec.max_k / 128));
  const size_t moe = cuda_model::moe_decode_bytes(dec.moe_dims);
  if (measure) {  // the bytes of the three buffers, in cudaMalloc's 512-byte granules
    auto g = [](size_t b) { return static_cast<int64_t>((std::max<size_t>(b, 1) + 511) / 512 * 512); };
    return g(codes) + g(scales) + g(moe);
  }
  dec.codes.reset(codes);
  dec.scales.reset(scales);
  dec.moe_mem.reset(moe);
  dec.moe = cuda_model::moe_decode_carve(dec.moe_dims, dec.moe_mem.get());
  cuda_model::moe_decode_init(dec.moe_dims, dec.moe, stream);  // its arrival counters start at zero
  return 0;
}

// x [m, k] (fp32, bf16 values) -> act_quant codes/scales in dec.codes/dec.scales (row stride k);
// with norm_weight, x is rms-normalized first (exactly norm_rows) into `normed` (may be x). The
// callers have checked k % 128 == 0, k <= dec.max_k and m <= dec.max_rows.
void CudaModel::Impl::dec_pack(const float* x, int64_t m, int64_t k, const float* norm_weight, float* normed) {
  TANDEM_CHECK(k % 128 == 0 && k <= dec.max_k && m <= dec.max_rows);
  kc::DecodeActPackArgs p;
  p.x = x;
  p.rows = m;
  p.dim = k;
  p.norm_weight = norm_weight;
  p.eps = static_cast<float>(cfg.rms_norm_eps);
  p.y = normed;
  p.codes = dec.codes.get();
  p.scales = dec.scales.get();
  kc::decode_act_pack(p, stream);
  dec.packed_x = nullptr;
}

bool CudaModel::Impl::dec_packs(int64_t rows, int64_t dim) const {
  return dec.enabled && rows > 0 && dim % 128 == 0 && dim <= dec.max_k && rows <= dec.max_rows;
}

void CudaModel::Impl::dec_norm_rows(float* xx, int64_t rows, int64_t dim, const float* weight) {
  if (!dec_packs(rows, dim)) {
    dec.packed_x = nullptr;
    norm_rows(xx, rows, dim, weight);
    return;
  }
  dec_pack(xx, rows, dim, weight, xx);  // bit for bit norm_rows' output, plus the codes
  dec.packed_x = xx;
  dec.packed_rows = rows;
  dec.packed_dim = dim;
}

// The layer halves' hc_pre + dec_norm_rows as one kernel: the same x, post, comb and codes.
bool CudaModel::Impl::dec_hc_pre_norm(const kernels::HcPreParams& p, const float* weight) {
  if (!dec_packs(p.tokens, p.dim)) return false;
  kc::HcPrePackArgs k;
  k.norm_weight = weight;
  k.eps = static_cast<float>(cfg.rms_norm_eps);
  k.codes = dec.codes.get();
  k.scales = dec.scales.get();
  // The Sinkhorn on the side branch: only hc_post reads comb, a sub-block later.
  const kc::HcCombSide side{side_stream, comb_fork, comb_join};
  if (copt.hc_comb_side) k.comb_side = &side;
  kc::hc_pre_pack(p, k, stream);
  comb_pending = copt.hc_comb_side;
  dec.packed_x = p.x;
  dec.packed_rows = p.tokens;
  dec.packed_dim = p.dim;
  return true;
}

// Codes of x [n, k] in dec.codes: reuses dec_norm_rows' or dec_hc_pre_norm's when they are x's,
// else packs.
void CudaModel::Impl::dec_codes_of(const float* xx, int64_t n, int64_t k) {
  const bool ready = dec.packed_x == xx && dec.packed_rows == n;
  dec.packed_x = nullptr;
  if (!ready) dec_pack(xx, n, k);
}

// One projection. FP8 weights with act_quant run on the packed codes (the pack replaces the GEMM
// op's own quantization); bf16 weights on the fp32 rows, which hold bf16 values at every call site
// (normed activations, the Markov rows).
bool CudaModel::Impl::dec_linear(const DLinear& l, const float* x, int64_t m, float* y, bool round_out, int64_t ldy) {
  if (!dec.enabled || m == 0 || m > dec.max_rows) return false;
  // Computed by a grouped launch (dec_q_and_kv, dec_x_projections)?
  if (dec.take_done(&l, x, y, m, round_out, ldy)) return true;
  const bool codes = l.w.format == WeightFormat::kFp8Block && l.act_quant;
  const bool bf16 = l.w.format == WeightFormat::kBf16 && !l.act_quant;
  if (!codes) dec.packed_x = nullptr;  // only the next FP8 consumer of x may use its codes
  if (!(codes || bf16) || !kc::decode_gemm_supports(l.w, codes)) return false;
  if (codes && l.w.k > dec.max_k) return false;
  kc::DecodeGemmArgs a;
  if (codes) {
    dec_codes_of(x, m, l.w.k);
    a.x_codes = dec.codes.get();
    a.x_scales = dec.scales.get();
  } else {
    if (reinterpret_cast<uintptr_t>(x) % 16) return false;
    a.x = x;
  }
  a.ldx = l.w.k;
  a.m = m;
  a.k = l.w.k;
  a.num_segments = 1;
  a.seg[0].w = l.w;
  a.seg[0].y = y;
  a.seg[0].ldy = ldy;
  a.seg[0].round_bf16 = round_out;
  kc::decode_gemm(a, stream);
  return true;
}

// wq_a and wkv in one launch on x's codes; q_norm fused with the quantization of qr; wq_b (with the
// indexer's idx_wq_b). The rows are left unnormalized for q_and_kv's norm_rope.
bool CudaModel::Impl::dec_q_and_kv(const DAttn& at, const float* xx, int64_t n) {
  // Steps with a long sequence are the tensor-core path's (linear() tries it first).
  if (!dec.enabled || n == 0 || n > dec.max_rows || tc_rows(n)) return false;
  const int64_t ql = cfg.q_lora_rank, D = cfg.hidden_size;
  auto fp8 = [&](const DLinear& l) {
    return l.w.format == WeightFormat::kFp8Block && l.act_quant && kc::decode_gemm_supports(l.w, true) &&
           l.w.k <= dec.max_k;
  };
  if (!fp8(at.wq_a) || !fp8(at.wkv) || !fp8(at.wq_b) || at.wq_a.w.k != D || at.wkv.w.k != D || ql % 128 ||
      at.wq_b.w.k != ql)
    return false;
  dec_codes_of(xx, n, D);
  kc::DecodeGemmArgs a;
  a.x_codes = dec.codes.get();
  a.x_scales = dec.scales.get();
  a.ldx = D;
  a.m = n;
  a.k = D;
  a.num_segments = 2;
  a.seg[0].w = at.wq_a.w;
  a.seg[0].y = qr.get();
  a.seg[0].round_bf16 = true;
  a.seg[1].w = at.wkv.w;
  a.seg[1].y = kv.get();
  a.seg[1].round_bf16 = true;
  kc::decode_gemm(a, stream);
  dec_pack(qr.get(), n, ql, at.q_norm, qr.get());  // norm_rows(qr, q_norm) and its codes in one kernel
  kc::DecodeGemmArgs b;
  b.x_codes = dec.codes.get();
  b.x_scales = dec.scales.get();
  b.ldx = ql;
  b.m = n;
  b.k = ql;
  b.num_segments = 1;
  b.seg[0].w = at.wq_b.w;
  b.seg[0].y = q.get();
  b.seg[0].round_bf16 = true;
  // The indexer's query projection reads the same normed qr: one launch, and attention_target's
  // linear(idx_wq_b, qr -> iq) later finds it done.
  if (at.has_indexer && fp8(at.idx_wq_b) && at.idx_wq_b.w.k == ql) {
    b.num_segments = 2;
    b.seg[1].w = at.idx_wq_b.w;
    b.seg[1].y = iq.get();
    b.seg[1].round_bf16 = true;
    dec.add_done(&at.idx_wq_b, qr.get(), iq.get(), n, true);
  }
  kc::decode_gemm(b, stream);
  return true;  // q_and_kv normalizes q and kv (norm_rope)
}

// The bf16 projections of the attention's normed input x that the layer makes after q/kv: the
// compressor's wkv and wgate, the indexer compressor's, and the indexer's weights_proj, as the
// segments of one launch (each segment's bits are those of its launch alone: decode_gemm_units
// depends on the weight only). Their linear() calls then find them done.
bool CudaModel::Impl::dec_x_projections(const DAttn& at, int ratio, const float* xx, int64_t n, float* comp_kv,
                                        float* comp_gate, float* icomp_kv, float* icomp_gate, bool launch) {
  if (!dec.enabled || n == 0 || n > dec.max_rows || tc_rows(n) || reinterpret_cast<uintptr_t>(xx) % 16) return false;
  const int64_t D = cfg.hidden_size;
  // (projection, output, rounded to bf16): as the linear() calls of run_compressor (fp32 rows) and
  // attention_target (weights_proj, rounded).
  struct Seg {
    const DLinear* l;
    float* y;
    bool round;
  };
  Seg segs[5];
  int ns = 0;
  if (ratio) {
    segs[ns++] = {&at.comp.wkv, comp_kv, false};
    segs[ns++] = {&at.comp.wgate, comp_gate, false};
  }
  if (at.has_indexer) {
    segs[ns++] = {&at.icomp.wkv, icomp_kv, false};
    segs[ns++] = {&at.icomp.wgate, icomp_gate, false};
    segs[ns++] = {&at.idx_wproj, iw.get(), true};
  }
  if (ns < 2) return false;
  kc::DecodeGemmArgs a;
  a.x = xx;
  a.ldx = D;
  a.m = n;
  a.k = D;
  for (int i = 0; i < ns; ++i) {
    const DLinear* l = segs[i].l;
    if (l->w.format != WeightFormat::kBf16 || l->act_quant || l->w.k != D || !kc::decode_gemm_supports(l->w, false))
      return false;  // the linear() calls take their own paths
    kc::DecodeSegment& sg = a.seg[a.num_segments++];
    sg.w = l->w;
    sg.y = segs[i].y;
    sg.round_bf16 = segs[i].round;
  }
  if (!launch) return true;
  dec.packed_x = nullptr;  // as dec_linear for a bf16 weight: x's codes are not reused past here
  kc::decode_gemm(a, stream);
  for (int i = 0; i < ns; ++i) dec.add_done(segs[i].l, xx, segs[i].y, n, segs[i].round);
  return true;
}

// wo_a's groups (this rank's) as the segments of one launch (bf16 activations), then wo_b().
bool CudaModel::Impl::dec_output_proj(const DAttn& at, const float* oo, int64_t n, float* y) {
  if (!dec.enabled || n == 0 || n > dec.max_rows || tc_rows(n)) return false;
  const int64_t H = at.n_heads, hd = cfg.head_dim, G = at.n_groups, R = cfg.o_lora_rank;
  const int64_t gin = H * hd / G;
  const kernels::WeightRef& wa = at.wo_a.w;
  if (at.wo_a.act_quant || G > kc::kMaxDecodeSegments || wa.k != gin || wa.n < G * R ||
      !kc::decode_gemm_supports(wa, false) || (wa.format == WeightFormat::kFp8Block && R % 128) || gin % 4 ||
      reinterpret_cast<uintptr_t>(oo) % 16)
    return false;
  kc::DecodeGemmArgs a;
  a.x = oo;
  a.ldx = H * hd;
  a.m = n;
  a.k = gin;
  a.num_segments = static_cast<int>(G);
  for (int64_t g = 0; g < G; ++g) {
    a.seg[g].w = wa.rows(g * R, R);
    a.seg[g].y = u.get() + g * R;
    a.seg[g].ldy = G * R;
    a.seg[g].x_col0 = g * gin;
    a.seg[g].round_bf16 = true;
  }
  kc::decode_gemm(a, stream);
  wo_b(at, n, y);
  return true;
}

// The MoE sub-block in three kernels after the quantization of x (moe_decode.h). Its routing, shared
// expert and combine are fused with the experts: a step profile counts them all as routed experts.
bool CudaModel::Impl::dec_moe(const DMoE& m, const float* xx, const int32_t* tokens, int64_t n, float* y,
                              int layer) {
  if (!dec.enabled || n == 0 || n > dec.moe_max_tokens || !m.up_act_quant || !m.down_act_quant) return false;
  if (tc_rows(n) && m.grouped) return false;  // prefill steps: experts grouped on the tensor cores
  const int64_t D = cfg.hidden_size, I = cfg.moe_intermediate_size;
  if (D > dec.max_k || !m.sh_w1.w.data || !m.sh_w1.act_quant || !m.sh_w2.act_quant) return false;
  cuda_model::MoeDecodeArgs a;
  a.dims = dec.moe_dims;
  a.tokens = n;
  a.x = xx;
  a.x_codes = dec.codes.get();
  a.x_scales = dec.scales.get();
  a.token_ids = tokens;
  a.gate = m.gate.w;
  a.bias = m.hash ? nullptr : m.bias;
  a.tid2eid = m.hash ? m.tid2eid : nullptr;
  a.route_scale = static_cast<float>(cfg.routed_scaling_factor);
  a.w1 = m.w1_all;
  a.w3 = m.w3_all;
  a.w2 = m.w2_all;
  // This rank's experts (every routed expert on one rank); other ranks' pairs are skipped.
  a.expert_begin = m.expert_begin;
  a.expert_count = m.n_local;
  TANDEM_CHECK(static_cast<int64_t>(m.n_local) * I == m.w1_all.n);
  a.sh_w1 = m.sh_w1.w;
  a.sh_w3 = m.sh_w3.w;
  a.sh_w2 = m.sh_w2.w;
  a.swiglu_limit = static_cast<float>(cfg.swiglu_limit);
  a.buf = dec.moe;
  a.y = y;
  a.routed_only = tp();  // the fp32 routed sum; the shared expert's rows stay in buf.shared_out
  if (moe_timeline && layer == moe_timeline_layer) a.timeline = moe_timeline;
  if (!cuda_model::moe_decode_supports(a)) return false;
  dec_codes_of(xx, n, D);
  section(CudaModel::OpClass::kRoutedExperts);
  cuda_model::moe_decode(a, stream);
  if (recording_routes && layer >= 0)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(route_rec.get() + static_cast<int64_t>(layer) * max_rows * a.dims.topk,
                                      dec.moe.expert_ids, sizeof(int32_t) * n * a.dims.topk,
                                      cudaMemcpyDeviceToDevice, stream));
  if (tp()) moe_reduce_shared(y, dec.moe.shared_out, n);
  return true;
}

}  // namespace tandem
