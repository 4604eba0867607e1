// Prefill rows on the tensor cores: what the forward's linear(), output_proj() and moe() try first
// for steps of more than CudaModelOptions::tc_min_rows rows (default 96), and the scratch it needs,
// all sized at start-up for the largest step (nothing allocates on the step path). Every path here
// computes a row from that row alone with one fixed arithmetic (kernels/cuda/gemm_tc.h), so a row's
// result never depends on the other rows of the step.
//  * FP8 linears (act_quant): our block-scaled kernel (warp-specialized TMA kernels on sm_90,
//    mma.sync elsewhere), reading the checkpoint's E8M0 grid as it is;
//  * bf16 linears (wo_a's grouped einsum, compressors, indexer weights, gate, LM head, draft): our
//    bf16 x bf16 -> fp32 kernel on a bf16 copy of the input, exact because every such input already
//    holds bf16 values (norm outputs, the de-rotated attention output, bf16 taps). wo_a stored as
//    FP8 (exact in bf16: model/weights.cpp) gets a bf16 device copy at start-up for this path;
//  * routed experts: grouped MXFP4 GEMMs (model/cuda/moe_prefill.h).
// A shape without a path here (a format, a layout, more rows than the scratch) returns false and
// the caller keeps the GEMV kernels.
#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

using cuda_model::DLinear;

int64_t CudaModel::Impl::alloc_prefill(bool measure) {
  const int64_t N = max_rows;
  if (N <= copt.tc_min_rows) return 0;
  if (!measure) {
    kernels::cuda::tc_init();
    cuda_model::moe_prefill_init();
  }
  const int64_t D = cfg.hidden_size, hd = cfg.head_dim;
  int64_t bytes = 0;  // measure: what the buffers below would take (cudaMalloc's 512-byte granules)
  auto add = [&](size_t b) { bytes += static_cast<int64_t>((b + 511) / 512 * 512); };

  // A weight the model has (measuring, the shapes are set but nothing is uploaded yet).
  auto present = [&](const kernels::WeightRef& r) { return r.data != nullptr || (measure && r.n > 0); };
  std::vector<const DLinear*> lins;
  auto block = [&](const cuda_model::DBlock& b) {
    for (const DLinear* l : {&b.attn.wq_a, &b.attn.wq_b, &b.attn.wkv, &b.attn.wo_b, &b.attn.idx_wq_b,
                             &b.attn.idx_wproj, &b.attn.comp.wkv, &b.attn.comp.wgate, &b.attn.icomp.wkv,
                             &b.attn.icomp.wgate, &b.ffn.gate, &b.ffn.sh_w1, &b.ffn.sh_w2, &b.ffn.sh_w3})
      if (present(l->w)) lins.push_back(l);
  };
  for (const auto& b : w.layers) block(b);
  for (const auto& b : w.draft.stages) block(b);
  for (const DLinear* l : {&w.head, &w.draft.main_proj, &w.draft.markov_w2})
    if (present(l->w)) lins.push_back(l);

  // FP8 linears: the quantized activations of the widest; bf16 linears: the bf16 copy of the widest.
  int64_t max_k8 = 0, max_kb = 0;
  for (const DLinear* l : lins) {
    if (l->w.format == kernels::WeightFormat::kFp8Block && l->act_quant && l->w.k % 128 == 0)
      max_k8 = std::max(max_k8, l->w.k);
    else if (l->w.format == kernels::WeightFormat::kBf16 && !l->act_quant)
      max_kb = std::max(max_kb, l->w.k);
  }
  // wo_a: the grouped einsum of output_proj (batched bf16 over this rank's H * hd columns). Stored as
  // FP8 (exact in bf16), it gets a bf16 copy for the tensor cores.
  for (const auto* bs : {&w.layers, &w.draft.stages})
    for (const auto& b : *bs) {
      const kernels::WeightRef& wa = b.attn.wo_a.w;
      if (!present(wa)) continue;
      if (wa.format == kernels::WeightFormat::kFp8Block) {
        if (measure) {
          add(static_cast<size_t>(wa.n * wa.k) * sizeof(uint16_t));
        } else if (!tc_bf16_weights.count(wa.data)) {
          Buf<uint16_t> copy(static_cast<size_t>(wa.n * wa.k));
          kernels::cuda::fp8_block_to_bf16(wa, copy.get(), stream);
          kernels::WeightRef r;
          r.format = kernels::WeightFormat::kBf16;
          r.data = copy.get();
          r.n = wa.n;
          r.k = wa.k;
          tc_bf16_weights.emplace(wa.data, r);
          tc_bf16_copies.push_back(std::move(copy));
        }
      }
      if (wa.format == kernels::WeightFormat::kFp8Block || wa.format == kernels::WeightFormat::kBf16)
        max_kb = std::max(max_kb, b.attn.n_heads * hd);
    }
  // Grouped experts: one scratch for every layer (the same expert shapes throughout). Measuring, the
  // weights' scale grids have not been checked (mxfp4_blocks_fit_e4m3): every MXFP4 expert layer
  // counts, an upper bound.
  int n_local = 0;
  for (const auto* bs : {&w.layers, &w.draft.stages})
    for (const auto& b : *bs) {
      const cuda_model::DMoE& f = b.ffn;
      const bool grouped = measure ? f.w1_all.format == kernels::WeightFormat::kMxfp4 && f.up_act_quant &&
                                         f.down_act_quant && f.n_local > 0
                                   : f.grouped;
      if (grouped) {
        if (n_local == 0) n_local = f.n_local;
        TANDEM_CHECK(n_local == f.n_local);
      }
    }
  const int K = cfg.num_experts_per_tok;
  const int64_t I = cfg.moe_intermediate_size;
  if (measure) {
    if (max_k8 > 0) {
      add(kernels::cuda::TcLinearScratch::codes_bytes(N, max_k8));
      add(kernels::cuda::TcLinearScratch::scale_floats(N, max_k8) * sizeof(float));
    }
    if (max_kb > 0) add(static_cast<size_t>(N * max_kb) * sizeof(uint16_t));
    if (n_local > 0) add(cuda_model::moe_prefill_scratch_bytes(N, K, n_local, D, I));
    return bytes;
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (max_k8 > 0) {
    tc_codes.reset(kernels::cuda::TcLinearScratch::codes_bytes(N, max_k8));
    tc_scales.reset(kernels::cuda::TcLinearScratch::scale_floats(N, max_k8));
    tc.codes = tc_codes.get();
    tc.scales = tc_scales.get();
    tc.max_k = max_k8;
  }
  if (max_kb > 0) {
    tc_bf16.reset(static_cast<size_t>(N * max_kb));
    tc.xb = tc_bf16.get();
    tc.bf16_cols = max_kb;
  }
  tc.rows = N;
  if (n_local > 0) {
    moe_scratch.reset(cuda_model::moe_prefill_scratch_bytes(N, K, n_local, D, I));
    moe_tc = cuda_model::moe_prefill_scratch(moe_scratch.get(), N, K, n_local, D, I);
  }
  return 0;
}

bool CudaModel::Impl::linear_tc(const DLinear& l, const float* xx, int64_t m, float* y, bool round_out, int64_t ldy) {
  if (!tc_rows(m)) return false;
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
  if (l.w.format == kernels::WeightFormat::kFp8Block) {
    if (!kernels::cuda::fp8_linear_supported(p, tc)) return false;
    if (dec.packed_x == xx && dec.packed_rows == m && dec.packed_dim == p.k) {
      // x's codes from its norm (hc_pre_pack / dec_norm_rows): the same act_quant, so no quantization.
      kernels::cuda::gemm_fp8_linear_packed(p, dec.codes.get(), dec.scales.get(), tc, kernels::cuda::TcBackend::kAuto,
                                            stream);
      tc_codes_of = {};  // the scratch's scales are x's now, its codes not
      return true;
    }
    const TcHeld held{xx, m, p.k, p.k};  // x's rows are dense (p.ldx unset)
    const bool ready = tc_share_src != nullptr && xx == tc_share_src && tc_codes_of == held;
    kernels::cuda::gemm_fp8_linear(p, tc, kernels::cuda::TcBackend::kAuto, stream, ready);
    tc_codes_of = tc_share_src ? held : TcHeld{};
    return true;
  }
  if (l.w.format == kernels::WeightFormat::kBf16 && !l.act_quant) return gemm_bf16_tc(p);
  return false;
}

bool CudaModel::Impl::gemm_bf16_tc(const kernels::GemmParams& p) {
  if (!tc_rows(p.m)) return false;
  kernels::GemmParams q = p;
  if (q.w.format == kernels::WeightFormat::kFp8Block && q.quantize_x_block == 0) {
    const auto it = tc_bf16_weights.find(q.w.data);  // wo_a's bf16 copy
    if (it == tc_bf16_weights.end()) return false;
    q.w = it->second;
  }
  if (!kernels::cuda::bf16_linear_supported(q, tc)) return false;
  const TcHeld held{q.x, q.m, q.batch * q.k, q.ldx > 0 ? q.ldx : q.k};
  const bool ready = tc_share_src != nullptr && q.x == tc_share_src && tc_xb_of == held;
  kernels::cuda::gemm_bf16_linear(q, tc, kernels::cuda::TcBackend::kAuto, stream, ready);
  tc_xb_of = tc_share_src ? held : TcHeld{};
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
