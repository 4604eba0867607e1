// Prefill rows on the tensor cores: what the forward's linear(), output_proj() and moe() try first
// for steps of more than CudaModelOptions::tc_min_rows rows (default 96), and the scratch and
// cuBLASLt plans it needs, all sized at start-up for the largest step (nothing allocates or plans on
// the step path).
//  * FP8 linears (act_quant): our block-scaled kernel (kernels/cuda/gemm_tc.h; wgmma on sm_90a,
//    mma.sync elsewhere), reading the checkpoint's E8M0 grid as it is;
//  * bf16 linears (wo_a's grouped einsum, compressors, indexer weights, gate, LM head, draft):
//    cuBLASLt bf16 x bf16 -> fp32 on a bf16 copy of the input, exact because every such input
//    already holds bf16 values (norm outputs, the de-rotated attention output, bf16 taps);
//  * routed experts: grouped MXFP4 GEMMs (model/cuda/moe_prefill.h).
// A shape without a path here (a format, an unplanned shape, more rows than planned) returns false
// and the caller keeps the GEMV kernels.
#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

using cuda_model::DLinear;
using kernels::cuda::LtShape;

namespace {

LtShape bf16_shape(const kernels::GemmParams& p) {
  LtShape s;
  s.kind = kernels::cuda::LtKind::kBf16;
  s.n = p.n;
  s.k = p.k;
  s.batch = p.batch;
  s.ldx = p.k * p.batch;  // the bf16 copy: batches side by side
  s.ldy = p.ldy > 0 ? p.ldy : p.n;
  if (p.batch > 1) {
    s.w_batch_rows = p.w_batch_rows;
    s.x_batch_stride = p.k;
    s.y_batch_stride = p.y_batch_stride;
  }
  s.accumulate = p.accumulate;
  return s;
}

// The batched layouts the bf16 copy supports: x batches side by side in each row.
bool bf16_layout_ok(const kernels::GemmParams& p) {
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.k;
  return p.batch == 1 || (p.x_batch_stride == p.k && ldx >= p.batch * p.k);
}

}  // namespace

void CudaModel::Impl::alloc_prefill() {
  const int64_t N = max_rows;
  if (N <= copt.tc_min_rows) return;
  kernels::cuda::tc_init();
  cuda_model::moe_prefill_init();
  const int64_t D = cfg.hidden_size, H = cfg.num_attention_heads, hd = cfg.head_dim, G = cfg.o_groups,
                R = cfg.o_lora_rank;

  std::vector<const DLinear*> lins;
  auto block = [&](const cuda_model::DBlock& b) {
    for (const DLinear* l : {&b.attn.wq_a, &b.attn.wq_b, &b.attn.wkv, &b.attn.wo_b, &b.attn.idx_wq_b,
                             &b.attn.idx_wproj, &b.attn.comp.wkv, &b.attn.comp.wgate, &b.attn.icomp.wkv,
                             &b.attn.icomp.wgate, &b.ffn.gate, &b.ffn.sh_w1, &b.ffn.sh_w2, &b.ffn.sh_w3})
      if (l->w.data) lins.push_back(l);
  };
  for (const auto& b : w.layers) block(b);
  for (const auto& b : w.draft.stages) block(b);
  for (const DLinear* l : {&w.head, &w.draft.main_proj, &w.draft.markov_w2})
    if (l->w.data) lins.push_back(l);

  // FP8 linears: the quantized activations of the widest.
  int64_t max_k8 = 0, max_kb = 0;
  std::vector<LtShape> shapes;
  auto add_shape = [&](const LtShape& s) {
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  };
  for (const DLinear* l : lins) {
    kernels::GemmParams p;
    p.n = l->w.n;
    p.k = l->w.k;
    if (l->w.format == kernels::WeightFormat::kFp8Block && l->act_quant && l->w.k % 128 == 0) {
      max_k8 = std::max(max_k8, l->w.k);
    } else if (l->w.format == kernels::WeightFormat::kBf16 && !l->act_quant) {
      max_kb = std::max(max_kb, l->w.k);
      add_shape(bf16_shape(p));
    }
  }
  // wo_a: the grouped einsum of output_proj (batched bf16).
  for (const auto* bs : {&w.layers, &w.draft.stages})
    for (const auto& b : *bs)
      if (b.attn.wo_a.w.data && b.attn.wo_a.w.format == kernels::WeightFormat::kBf16) {
        kernels::GemmParams p;
        p.n = R;
        p.k = H * hd / G;
        p.ldx = H * hd;
        p.ldy = G * R;
        p.batch = G;
        p.x_batch_stride = p.k;
        p.y_batch_stride = R;
        p.w_batch_rows = R;
        add_shape(bf16_shape(p));
        max_kb = std::max(max_kb, H * hd);
      }
  if (max_k8 > 0) {
    tc_codes.reset(kernels::cuda::TcLinearScratch::codes_bytes(N, max_k8));
    tc_scales.reset(kernels::cuda::TcLinearScratch::scale_floats(N, max_k8));
    tc.codes = tc_codes.get();
    tc.scales = tc_scales.get();
    tc.rows = N;
    tc.max_k = max_k8;
  }
  if (!shapes.empty()) {
    auto created = kernels::cuda::LtGemm::create();
    if (!created.ok()) {
      TLOG_WARN("cuda", "cuBLASLt unavailable ({}): bf16 linears stay on the GEMV kernels", created.status().to_string());
    } else {
      lt = std::move(created).value();
      int planned = 0;
      for (const LtShape& s : shapes) {
        const Status st = lt->prepare(s, N, copt.tc_min_rows + 1);
        if (st.ok()) ++planned;
        else TLOG_WARN("cuda", "bf16 linear n {} k {} batch {}: {}", s.n, s.k, s.batch, st.to_string());
      }
      if (planned > 0) tc_bf16.reset(static_cast<size_t>(N * max_kb));
    }
  }
  // Grouped experts: one scratch for every layer (the same expert shapes throughout).
  int n_local = 0;
  for (const auto* bs : {&w.layers, &w.draft.stages})
    for (const auto& b : *bs)
      if (b.ffn.grouped) {
        if (n_local == 0) n_local = b.ffn.n_local;
        TANDEM_CHECK(n_local == b.ffn.n_local);
      }
  if (n_local > 0) {
    const int K = cfg.num_experts_per_tok;
    const int64_t I = cfg.moe_intermediate_size;
    moe_scratch.reset(cuda_model::moe_prefill_scratch_bytes(N, K, n_local, D, I));
    moe_tc = cuda_model::moe_prefill_scratch(moe_scratch.get(), N, K, n_local, D, I);
  }
}

bool CudaModel::Impl::linear_tc(const DLinear& l, const float* xx, int64_t m, float* y, bool round_out) {
  if (!tc_rows(m)) return false;
  kernels::GemmParams p;
  p.x = xx;
  p.w = l.w;
  p.y = y;
  p.m = m;
  p.n = l.w.n;
  p.k = l.w.k;
  p.round_bf16 = round_out;
  p.quantize_x_block = l.act_quant ? 128 : 0;
  if (l.w.format == kernels::WeightFormat::kFp8Block) {
    if (!kernels::cuda::fp8_linear_supported(p, tc)) return false;
    kernels::cuda::gemm_fp8_linear(p, tc, kernels::cuda::TcBackend::kAuto, stream);
    return true;
  }
  if (l.w.format == kernels::WeightFormat::kBf16 && !l.act_quant) return gemm_bf16_tc(p);
  return false;
}

bool CudaModel::Impl::gemm_bf16_tc(const kernels::GemmParams& p) {
  if (!lt || !tc_rows(p.m) || p.w.format != kernels::WeightFormat::kBf16 || p.quantize_x_block != 0 ||
      !bf16_layout_ok(p))
    return false;
  const LtShape s = bf16_shape(p);
  const int64_t cols = p.batch * p.k;
  if (!lt->ready(s, p.m) || static_cast<size_t>(p.m * cols) > tc_bf16.size()) return false;
  kernels::cuda::f32_to_bf16_rows(p.x, p.ldx > 0 ? p.ldx : p.k, p.m, cols, tc_bf16.get(), cols, stream);
  lt->run(s, p.m, p.w.data, tc_bf16.get(), p.y, nullptr, nullptr, stream);
  if (p.round_bf16) {
    const int64_t ldy = p.ldy > 0 ? p.ldy : p.n;
    const bool packed = p.batch == 1 || (p.y_batch_stride == p.n && ldy == p.batch * p.n);
    for (int64_t b = 0; b < (packed ? 1 : p.batch); ++b) {
      kernels::RoundBf16Params r;
      r.x = p.y + b * p.y_batch_stride;
      r.rows = p.m;
      r.cols = packed ? p.batch * p.n : p.n;
      r.ldx = ldy;
      kernels::cuda::round_bf16(r, stream);
    }
  }
  return true;
}

bool CudaModel::Impl::moe_routed_tc(const cuda_model::DMoE& mo, const float* xx, int64_t n) {
  if (!tc_rows(n) || !mo.grouped || !moe_tc.keys) return false;
  cuda_model::MoePrefillArgs a;
  a.x = xx;
  a.expert_ids = eids.get();
  a.weights = ew.get();
  a.tokens = n;
  a.topk = cfg.num_experts_per_tok;
  a.expert_begin = mo.expert_begin;
  a.n_local = mo.n_local;
  a.w1 = mo.w1_all;
  a.w2 = mo.w2_all;
  a.w3 = mo.w3_all;
  a.dim = cfg.hidden_size;
  a.inter = cfg.moe_intermediate_size;
  a.limit = static_cast<float>(cfg.swiglu_limit);
  a.pair_out = pair_out.get();
  if (!cuda_model::moe_prefill_supported(a, moe_tc)) return false;
  cuda_model::moe_prefill(a, moe_tc, kernels::cuda::TcBackend::kAuto, stream);
  return true;
}

}  // namespace tandem
