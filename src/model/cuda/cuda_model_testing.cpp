// The device model's test-only entry points (cuda_model_testing.h): thin wrappers over
// CudaModel::Impl's step plan, layer halves, draft pieces and state buffers.
#include "model/cuda/cuda_model_testing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/numeric.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/cuda/cuda_impl.h"

namespace tandem {

struct CudaModelTestAccess {
  static CudaModel::Impl& impl(CudaModel& m) { return *m.impl_; }
  static const CudaModel::Impl& impl(const CudaModel& m) { return *m.impl_; }
};

namespace model_testing {

namespace {
using Impl = CudaModel::Impl;
Impl& im_of(CudaModel& m) { return CudaModelTestAccess::impl(m); }
void to_device(Impl& im, void* dst, const void* src, size_t bytes) {
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, im.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}
void to_host(Impl& im, void* dst, const void* src, size_t bytes) {
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, im.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}
}  // namespace

namespace {
CudaStateLayout to_state_layout(const cuda_model::DeviceLayout& lay, const std::vector<int>& ratio,
                                const std::vector<bool>& indexer) {
  CudaStateLayout l;
  l.rec = lay.rec;
  l.key = lay.key;
  l.win_ring = lay.win_ring;
  l.slot_bytes = lay.slot_bytes;
  l.block_bytes = lay.block_bytes;
  l.draft_slot_bytes = lay.draft_slot_bytes;
  l.draft_ring = lay.draft_ring;
  for (size_t i = 0; i < lay.layers.size(); ++i) {
    const cuda_model::LayerState& L = lay.layers[i];
    CudaLayerState s;
    s.ratio = ratio[i];
    s.has_indexer = indexer[i];
    s.win_off = L.win_off;
    if (s.ratio) {
      s.comp_off = L.comp_off;
      s.comp_ring = lay.comp_ring[i];
      s.comp_chans = lay.comp_chans[i];
      s.pool_main = L.pool_main;
    }
    if (s.has_indexer) {
      s.icomp_off = L.icomp_off;
      s.icomp_ring = lay.icomp_ring[i];
      s.icomp_chans = lay.icomp_chans[i];
      s.pool_idx = L.pool_idx;
    }
    l.layers.push_back(s);
  }
  return l;
}
}  // namespace

CudaStateLayout cuda_state_layout(const CudaModel& m) {
  const Impl& im = CudaModelTestAccess::impl(m);
  std::vector<int> ratio;
  std::vector<bool> indexer;
  for (const auto& b : im.w.layers) {
    ratio.push_back(b.ratio);
    indexer.push_back(b.attn.has_indexer);
  }
  return to_state_layout(im.lay, ratio, indexer);
}

CudaStateLayout cuda_state_layout_for(const ModelConfig& cfg, const ModelOptions& opt, bool has_draft) {
  std::vector<int> ratio(cfg.compress_ratios.begin(), cfg.compress_ratios.begin() + cfg.num_hidden_layers);
  std::vector<bool> indexer;
  for (int r : ratio) indexer.push_back(r == 4);
  return to_state_layout(cuda_model::plan_layout(cfg, opt, has_draft), ratio, indexer);
}

void cuda_read_slot(CudaModel& m, int slot, std::vector<uint8_t>& out) {
  Impl& im = im_of(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots);
  out.resize(static_cast<size_t>(im.lay.slot_bytes));
  to_host(im, out.data(), im.slot_state.get() + slot * im.lay.slot_bytes, out.size());
}

void cuda_write_slot(CudaModel& m, int slot, std::span<const uint8_t> in) {
  Impl& im = im_of(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots);
  TANDEM_CHECK(static_cast<int64_t>(in.size()) == im.lay.slot_bytes);
  to_device(im, im.slot_state.get() + slot * im.lay.slot_bytes, in.data(), in.size());
}

void cuda_read_pool(CudaModel& m, std::vector<uint8_t>& out) {
  Impl& im = im_of(m);
  out.resize(static_cast<size_t>(im.opt.num_blocks * im.lay.block_bytes));
  to_host(im, out.data(), im.pool.get(), out.size());
}

void cuda_write_pool(CudaModel& m, std::span<const uint8_t> in) {
  Impl& im = im_of(m);
  TANDEM_CHECK(static_cast<int64_t>(in.size()) == im.opt.num_blocks * im.lay.block_bytes);
  to_device(im, im.pool.get(), in.data(), in.size());
}

void cuda_read_draft_context(CudaModel& m, int slot, std::vector<uint8_t>& out) {
  Impl& im = im_of(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots && im.lay.draft_slot_bytes > 0);
  out.resize(static_cast<size_t>(im.lay.draft_slot_bytes));
  to_host(im, out.data(), im.draft_ctx.get() + slot * im.lay.draft_slot_bytes, out.size());
}

void cuda_write_draft_context(CudaModel& m, int slot, std::span<const uint8_t> in) {
  Impl& im = im_of(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots && im.lay.draft_slot_bytes > 0);
  TANDEM_CHECK(static_cast<int64_t>(in.size()) == im.lay.draft_slot_bytes);
  to_device(im, im.draft_ctx.get() + slot * im.lay.draft_slot_bytes, in.data(), in.size());
}

void cuda_set_slot_length(CudaModel& m, int slot, int64_t length) {
  Impl& im = CudaModelTestAccess::impl(m);
  TANDEM_CHECK(slot >= 0 && slot < im.opt.max_slots && length >= 0);
  im.slot_len[slot] = length;
}

void cuda_encode_kv(CudaModel& m, const float* rows, int64_t n, std::vector<uint8_t>& out) {
  Impl& im = im_of(m);
  const int64_t hd = im.cfg.head_dim, rb = im.lay.rec.bytes;
  out.assign(static_cast<size_t>(n * rb), 0);
  if (n == 0) return;
  kernels::cuda::DeviceBuffer<float> x(static_cast<size_t>(n * hd));
  kernels::cuda::DeviceBuffer<uint8_t> rec(static_cast<size_t>(n * rb));
  to_device(im, x.get(), rows, sizeof(float) * n * hd);
  cuda_model::kv_quantize({x.get(), n, hd, im.lay.rec, rec.get()}, im.stream);
  to_host(im, out.data(), rec.get(), out.size());
}

void cuda_encode_index_keys(CudaModel& m, const float* rows, int64_t n, std::vector<uint8_t>& out) {
  Impl& im = im_of(m);
  const int64_t dim = im.lay.key.dim, kb = im.lay.key.bytes;
  out.assign(static_cast<size_t>(n * kb), 0);
  if (n == 0) return;
  kernels::cuda::DeviceBuffer<float> x(static_cast<size_t>(n * dim));
  kernels::cuda::DeviceBuffer<uint8_t> rec(static_cast<size_t>(n * kb));
  to_device(im, x.get(), rows, sizeof(float) * n * dim);
  cuda_model::index_key_quantize({x.get(), n, im.lay.key, rec.get()}, im.stream);
  to_host(im, out.data(), rec.get(), out.size());
}

Status cuda_begin_step(CudaModel& m, const StepBatch& batch) {
  Impl& im = im_of(m);
  TANDEM_RETURN_IF_ERROR(im.prepare(batch, nullptr));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(im.plan_dev.get(), im.plan_host, im.step.plan.bytes, cudaMemcpyHostToDevice, im.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
  return Status();
}

bool cuda_step_tensor_cores(CudaModel& m) { return im_of(m).step.tc; }
size_t cuda_step_plan_bytes(CudaModel& m) { return im_of(m).step.plan.bytes; }
int cuda_step_table_width(CudaModel& m) { return im_of(m).step.table_width; }

void cuda_set_h(CudaModel& m, const float* h, int64_t rows) {
  Impl& im = im_of(m);
  const int64_t HD = static_cast<int64_t>(im.cfg.hc_mult) * im.cfg.hidden_size;
  TANDEM_CHECK(rows <= im.max_rows);
  to_device(im, im.h.get(), h, sizeof(float) * rows * HD);
}

void cuda_get_h(CudaModel& m, float* h, int64_t rows) {
  Impl& im = im_of(m);
  const int64_t HD = static_cast<int64_t>(im.cfg.hc_mult) * im.cfg.hidden_size;
  TANDEM_CHECK(rows <= im.max_rows);
  to_host(im, h, im.h.get(), sizeof(float) * rows * HD);
}

void cuda_attention_half(CudaModel& m, int layer, const StepBatch& batch) {
  Impl& im = im_of(m);
  TANDEM_CHECK(im.step.batch == &batch && layer >= 0 && layer < im.cfg.num_hidden_layers);
  im.attention_half(layer, im.step.rows);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void cuda_ffn_half(CudaModel& m, int layer, const StepBatch& batch) {
  Impl& im = im_of(m);
  TANDEM_CHECK(im.step.batch == &batch && layer >= 0 && layer < im.cfg.num_hidden_layers);
  im.ffn_half(layer, im.step.rows);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void cuda_end_step(CudaModel& m) {
  Impl& im = im_of(m);
  im.finish(nullptr, /*synchronize=*/true);
}

void cuda_set_epilogue_launches(CudaModel& m, bool on) { im_of(m).epilogue_launches = on; }

void cuda_logits(CudaModel& m, const float* h, int64_t rows, std::vector<float>& out) {
  Impl& im = im_of(m);
  const int64_t HD = static_cast<int64_t>(im.cfg.hc_mult) * im.cfg.hidden_size, V = im.cfg.vocab_size;
  TANDEM_CHECK(rows <= im.max_logits_rows && rows <= im.max_rows);
  out.assign(static_cast<size_t>(rows * V), 0.0f);
  if (rows == 0) return;
  to_device(im, im.head_in.get(), h, sizeof(float) * rows * HD);
  im.head_logits(im.head_in.get(), rows, im.w, im.w.hc_head_fn, im.w.hc_head_scale, im.w.hc_head_base, im.w.norm,
                 im.head_y.get(), im.logits.get());
  to_host(im, out.data(), im.logits.get(), sizeof(float) * rows * V);
}

bool cuda_last_indexer(CudaModel& m, int64_t rows, int64_t cols, std::vector<float>& scores,
                       std::vector<int32_t>& topk) {
  Impl& im = im_of(m);
  const int64_t TK = im.cfg.index_topk;
  TANDEM_CHECK(rows <= im.max_rows);
  topk.resize(static_cast<size_t>(rows * TK));
  to_host(im, topk.data(), im.topk.get(), sizeof(int32_t) * rows * TK);
  scores.clear();
  // The score buffer holds attention_target's last chunk of rows: comparable when that chunk was
  // the whole step (bf16 bits, row stride lds).
  const auto& li = im.last_indexer;
  TANDEM_CHECK(cols == im.step.end_bound / 4 && li.cols == cols);
  if (cols <= 0 || li.r0 != 0 || li.rows != rows) return false;
  std::vector<uint16_t> bits(static_cast<size_t>(rows * li.lds));
  to_host(im, bits.data(), im.idx_scores.get(), sizeof(uint16_t) * rows * li.lds);
  scores.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) scores[r * cols + c] = num::bf16_to_f32(bits[r * li.lds + c]);
  return true;
}

void cuda_last_routing(CudaModel& m, int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts) {
  Impl& im = im_of(m);
  const int64_t E = im.cfg.n_routed_experts, K = im.cfg.num_experts_per_tok;
  TANDEM_CHECK(rows <= im.max_rows);
  gate_logits.resize(static_cast<size_t>(rows * E));
  experts.resize(static_cast<size_t>(rows * K));
  TANDEM_CHECK(im.last_routing.gate_logits && im.last_routing.expert_ids);  // after an MoE
  to_host(im, gate_logits.data(), im.last_routing.gate_logits, sizeof(float) * rows * E);
  to_host(im, experts.data(), im.last_routing.expert_ids, sizeof(int32_t) * rows * K);
}

Status cuda_draft_begin(CudaModel& m, std::span<const CudaModel::DraftQueryDev> requests) {
  Impl& im = im_of(m);
  if (!im.w.has_draft) return invalid_argument("the model has no DSpark draft");
  const int64_t B = static_cast<int64_t>(requests.size());
  if (B == 0 || B > im.max_draft_requests) return invalid_argument("{} draft requests (1..{})", B, im.max_draft_requests);
  for (const auto& r : requests)
    if (r.slot < 0 || r.slot >= im.opt.max_slots || r.anchor_token < 0 || r.anchor_token >= im.cfg.vocab_size ||
        r.anchor_pos < 1)
      return invalid_argument("bad draft request (slot {}, anchor {} at {})", r.slot, r.anchor_token, r.anchor_pos);
  // The pinned staging layout draft_propose uses: slots | anchors | positions | T | seeds.
  uint8_t* hs = im.draft_host;
  for (int64_t b = 0; b < B; ++b) {
    reinterpret_cast<int32_t*>(hs)[b] = requests[b].slot;
    reinterpret_cast<int32_t*>(hs + 4 * B)[b] = requests[b].anchor_token;
    reinterpret_cast<int64_t*>(hs + 8 * B)[b] = requests[b].anchor_pos;
    reinterpret_cast<double*>(hs + 16 * B)[b] = 0.0;  // greedy
    reinterpret_cast<uint64_t*>(hs + 24 * B)[b] = requests[b].seed;
  }
  im.draft_inputs(B);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
  return Status();
}

void cuda_draft_stage_attention(CudaModel& m, int stage, int64_t requests) {
  Impl& im = im_of(m);
  TANDEM_CHECK(stage >= 0 && stage < im.cfg.num_draft_stages);
  im.draft_stage_attention(stage, requests);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void cuda_draft_stage_ffn(CudaModel& m, int stage, int64_t requests) {
  Impl& im = im_of(m);
  TANDEM_CHECK(stage >= 0 && stage < im.cfg.num_draft_stages);
  im.draft_stage_ffn(stage, requests);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void cuda_draft_finish(CudaModel& m, int64_t requests, std::vector<DraftResult>& results) {
  Impl& im = im_of(m);
  const int64_t B = requests, K = im.draft_k, V = im.cfg.vocab_size;
  im.draft_heads(B, /*want_probs=*/false);
  std::vector<int32_t> tok(static_cast<size_t>(B * K));
  std::vector<float> conf(static_cast<size_t>(B * K));
  to_host(im, tok.data(), im.d_tokens.get(), sizeof(int32_t) * B * K);
  to_host(im, conf.data(), im.d_conf.get(), sizeof(float) * B * K);
  results.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    DraftResult& r = results[b];
    r.tokens.assign(tok.begin() + b * K, tok.begin() + (b + 1) * K);
    r.confidence.assign(conf.begin() + b * K, conf.begin() + (b + 1) * K);
    r.logits.resize(static_cast<size_t>(K * V));
    to_host(im, r.logits.data(), im.d_zlogits.get() + b * K * V, sizeof(float) * K * V);
    r.probs.clear();
  }
}

}  // namespace model_testing
}  // namespace tandem
