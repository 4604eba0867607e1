// DsV4Model::Impl: weights, per-slot state layout, compressed-KV pool and scratch, shared by the
// target forward (forward.cpp), the DSpark draft (dspark.cpp) and the state API (model.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/math.h"
#include "kernels/cpu/sampling.h"
#include "model/model.h"
#include "model/weights.h"

namespace tandem {

struct DsV4Model::Impl {
  ModelConfig cfg;
  ModelOptions opt;
  LoadReport report;
  std::unique_ptr<Checkpoint> ckpt;  // load(): the mmapped files the weights point into
  model::Weights w;                   // views into ckpt (load) or the caller's tensors (from_tensors)
  model::RopeTable rope_swa;    // ratio-0 layers and draft stages: rope_theta, no YaRN
  model::RopeTable rope_comp;   // compressed layers (and their compressor / indexer)

  // ---- per-slot fixed state, one float array per slot ----
  struct CompLayout {
    int64_t off = 0;      // float offset of the row ring in the slot state
    int64_t ring = 0;     // rows (positions) in the ring: 2*ratio + max_rollback
    int64_t chans = 0;    // coff * head_dim; a row is [kv (chans), score+ape (chans)]
  };
  struct LayerLayout {
    int64_t win_off = 0;  // window ring [win_ring, head_dim]
    CompLayout comp, icomp;
    int64_t pool_main = 0;  // float offset inside a pool block: entries [bs/ratio, head_dim]
    int64_t pool_idx = 0;   // indexer keys [bs/4, index_head_dim]
  };
  std::vector<LayerLayout> layout;
  int64_t win_ring = 0;        // sliding_window + max_rollback
  int64_t slot_floats = 0;
  std::vector<float> slot_state;      // [max_slots, slot_floats]
  std::vector<int64_t> slot_len;      // [max_slots]
  int64_t block_floats = 0;
  std::vector<float> pool;            // [num_blocks, block_floats]

  // ---- DSpark context windows: [max_slots, stages, sliding_window, head_dim] ----
  std::vector<float> draft_ctx;
  // Context rows inserted but not yet projected into draft_ctx: [max_slots, kPendingRows, tap_dim]
  // taps for positions pending_start.. (draft_insert_context; flushed before use or export).
  static constexpr int64_t kPendingRows = 16;
  std::vector<float> draft_pending;
  std::vector<int64_t> pending_start, pending_n;
  void flush_draft_context(int slot);
  void project_draft_context(int slot, int64_t start_pos, const float* taps_rows, int64_t n);

  // ---- scratch (grown on first use, then reused) ----
  struct Scratch {
    std::vector<float> h, res, x, post, comb, a, tmp, tmp2, q, qr, kv, comp_rows, icomp_rows, iq, iw, o, u;
    std::vector<float> keys_score, entry, gate_scores, ex_in, ex_g, ex_u, ex_out, moe_y;
    std::vector<int32_t> sel, ex_tok, ex_slot, moe_idx, moe_order, step_tokens;
    std::vector<int64_t> step_rows;
    std::vector<float> head_in;
    std::vector<int64_t> positions;
    std::vector<float> mixes, moe_w, moe_sc, moe_biased, ex_w, head_y;
    std::vector<float> idx_scores, pool_rows, ikeys;
    std::vector<int32_t> visible, topk_idx;
    std::vector<const float*> key_ptrs;
  } s;
  // DSpark draft buffers, apart from `s` because the draft calls the layer pieces that use `s`.
  struct DraftScratch {
    std::vector<int32_t> ids;
    std::vector<float> h, res, x, a, post, comb, qr, q, kv, o, y, yn, base, bias, feat, e_row;
    std::vector<float> mh, main_x, ctx_kv;
    std::vector<const float*> keys;
    std::unique_ptr<RowSampler> sampler;  // the host sampler draws sampled drafts
  } ds;

  int threads() const { return opt.num_threads; }
  float* slot_ptr(int slot) { return slot_state.data() + static_cast<int64_t>(slot) * slot_floats; }
  const float* slot_ptr(int slot) const { return slot_state.data() + static_cast<int64_t>(slot) * slot_floats; }

  // Sets layout, win_ring, slot_floats, block_floats from cfg/opt (no weights needed).
  void plan_state();
  Status init_state();
  Status validate_step(const StepBatch& batch) const;

  // ---- shared layer pieces (forward.cpp) ----
  // y[m, out] = x W^T with the reference's activation quantisation; round_out: bf16 result.
  void linear(const model::LinearW& l, const float* x, int64_t m, float* y, bool round_out = true);
  void gemm(const kernels::WeightRef& w, const float* x, int64_t m, float* y, bool round_out, bool act_quant);
  kernels::Ops& ops() { return kernels::cpu_ops(); }
  // In-place row ops (bf16-rounded results, as the reference stores these tensors).
  void norm_rows(float* x, int64_t rows, int64_t dim, const std::vector<float>& weight);
  // RoPE on the last rt.rope_dim dims of each head; token t at position pos0 + t * pos_step.
  void rope_rows(const model::RopeTable& rt, float* x, int64_t tokens, int64_t heads, int64_t head_stride,
                 int64_t pos0, int64_t pos_step, bool inverse);
  void fp8_nope(float* x, int64_t rows, int64_t dim, int64_t nope);  // act_quant(x[..., :nope], 64)
  // The round trip of cached KV values on x[..., :nope] for opt.kv_dtype (fp8: fp8_nope; bf16:
  // none; nvfp4: num::round_nvfp4 per row).
  void kv_nope(float* x, int64_t rows, int64_t dim, int64_t nope);
  void fp4_rows(float* x, int64_t rows, int64_t dim);                 // fp4_act_quant(x, 32)
  void hadamard_rows(float* x, int64_t rows, int64_t dim);            // rotate_activation
  // Applies opt.num_threads to the (process-wide) CPU op thread count; called at every entry point.
  void use_threads() { kernels::cpu::set_num_threads(opt.num_threads); }
  model::HcShape hc_shape() const {
    return {cfg.hc_mult, cfg.hidden_size, static_cast<float>(cfg.rms_norm_eps), static_cast<float>(cfg.hc_eps),
            cfg.hc_sinkhorn_iters};
  }
  void hc_pre(const float* h, int64_t n, const std::vector<float>& fn, const std::vector<float>& scale,
              const std::vector<float>& base, float* x, float* post, float* comb);
  void hc_post(const float* a, const float* res, const float* post, const float* comb, int64_t n, float* h);
  void hc_head(const float* h, int64_t n, const std::vector<float>& fn, const std::vector<float>& scale,
               const std::vector<float>& base, float* y);
  void moe(const model::MoEW& m, const float* x, const int32_t* tokens, int64_t n, float* y);
  // Attention of `heads` query heads over `keys` (pointers to head_dim rows) with the per-head sink;
  // o rounded to bf16.
  void attend(const float* q, int64_t heads, const std::vector<const float*>& keys, const std::vector<float>& sink,
              float* o);
  void output_proj(const model::AttentionW& a, float* o, int64_t n, float* y);
  void q_and_kv(const model::AttentionW& a, const model::RopeTable& rope, const float* x, int64_t n,
                int64_t start_pos, float* qr, float* q, float* kv, bool apply_rope = true);
  // One layer for every sequence of a step: the row-wise parts (mHC, norms, MoE) over all rows of
  // all sequences at once, attention (with its compressor and indexer) per sequence. rows[i] is the
  // first row of batch.seqs[i] in h; s.step_tokens holds every row's token id.
  void block_forward_step(int layer, const StepBatch& batch, const int64_t* rows, int64_t total, float* h);
  // The two halves of a layer (block_forward_step runs both; the layer-by-layer test hooks of
  // model_testing.h run them apart): mHC + attention (with its compressor / indexer state), and
  // mHC + MoE (s.step_tokens holds every row's token id).
  void attention_half(int layer, const StepBatch& batch, const int64_t* rows, int64_t total, float* h);
  void ffn_half(int layer, int64_t total, float* h);
  // forward()'s prologue after validation: each sequence's first row (s.step_rows), every row's
  // token (s.step_tokens) and its embedding copied into the hc residual streams of s.h; returns
  // the step's rows. end_step advances the slot lengths.
  int64_t begin_step(const StepBatch& batch);
  void end_step(const StepBatch& batch);
  void attention_target(int layer, int slot, const float* x, int64_t n, int64_t start_pos,
                        const int32_t* block_table, float* y);
  void logits_rows(const float* h, int64_t n, float* out);

  // ---- DSpark draft pieces (dspark.cpp): draft_propose = draft_begin, per stage
  // draft_stage_attention + draft_stage_ffn over ds.h, then draft_finish ----
  // Validates the requests, flushes their pending context, sizes ds and embeds every request's
  // block [anchor, noise x (K-1)] into ds.h; *k_out = K.
  Status draft_begin(std::span<const DraftRequest> requests, int64_t num_tokens, int64_t* k_out);
  void draft_stage_attention(int stage, std::span<const DraftRequest> requests, int64_t K, float* h);
  void draft_stage_ffn(int stage, int64_t rows, float* h);
  // hc_head, the shared LM head, the Markov correction and the confidence head over h [B*K, hc*D].
  Status draft_finish(std::span<const DraftRequest> requests, const DraftSampling& sampling, int64_t K,
                      const float* h, std::vector<DraftResult>& results);

  // ---- tensor parallelism (opt.tp_size > 1; with one rank none of this runs) ----
  bool tp() const { return opt.tp_size > 1; }
  // The first collective failure since the last take_comm_status(); later collectives are skipped
  // (the model's state is then undefined: the caller drops the whole group).
  Status comm_status;
  Status take_comm_status() { return std::exchange(comm_status, Status()); }
  void all_reduce(float* x, int64_t n);
  // Row-parallel output: x holds this rank's partial sums; all-reduce, then round to bf16.
  void all_reduce_bf16(float* x, int64_t n);
  // h row t (stride floats apart) = embedding of tokens[t], its first hidden_size floats.
  void embed_rows(const int32_t* tokens, int64_t n, float* h, int64_t stride);
  // out[n, vocab] = y W_head^T (fp32): each rank its vocabulary rows, then gathered.
  void head_gemm(const float* y, int64_t n, float* out);
  std::vector<float> tp_local, tp_gather;
};

}  // namespace tandem
