// Uploads the bound checkpoint weights (model::Weights, views into the mapped shards) to the device
// once, as stored: one arena allocation, every matrix keeping its format and scales, the small
// vectors as fp32. Each layer's routed experts (this rank's, under tensor parallelism: the bound
// Weights hold only the rank's slices) are concatenated by rows so one kernel can address any of
// them (moe.h, moe_pairs_*; moe_decode.h, moe_prefill.h). Two passes over the same walk: measure,
// then copy.
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/check.h"
#include "model/cuda/cuda_impl.h"
#include "model/cuda/moe_prefill.h"
#include "model/weights.h"

namespace tandem::cuda_model {

namespace {

class Arena {
 public:
  explicit Arena(uint8_t* base) : base_(base) {}
  size_t used() const { return used_; }
  bool measuring() const { return base_ == nullptr; }

  // Copies `bytes` from host `src` into the arena; returns the device address (null while measuring).
  void* put(const void* src, size_t bytes) {
    const size_t off = align(used_);
    used_ = off + bytes;
    if (!base_ || bytes == 0) return base_ ? base_ + off : nullptr;
    TANDEM_CUDA_CHECK(cudaMemcpy(base_ + off, src, bytes, cudaMemcpyHostToDevice));
    return base_ + off;
  }
  // Concatenation of several host regions (each `bytes[i]`), contiguous on the device.
  void* put_concat(const std::vector<const void*>& srcs, const std::vector<size_t>& bytes) {
    const size_t off = align(used_);
    size_t total = 0;
    for (size_t b : bytes) total += b;
    used_ = off + total;
    if (!base_) return nullptr;
    size_t at = off;
    for (size_t i = 0; i < srcs.size(); ++i) {
      if (bytes[i]) TANDEM_CUDA_CHECK(cudaMemcpy(base_ + at, srcs[i], bytes[i], cudaMemcpyHostToDevice));
      at += bytes[i];
    }
    return base_ + off;
  }

 private:
  static size_t align(size_t x) { return (x + 255) / 256 * 256; }
  uint8_t* base_;
  size_t used_ = 0;
};

size_t data_bytes(const kernels::WeightRef& w) {
  switch (w.format) {
    case kernels::WeightFormat::kF32: return static_cast<size_t>(w.n * w.k * 4);
    case kernels::WeightFormat::kBf16: return static_cast<size_t>(w.n * w.k * 2);
    case kernels::WeightFormat::kFp8Block: return static_cast<size_t>(w.n * w.k);
    case kernels::WeightFormat::kMxfp4: return static_cast<size_t>(w.n * w.k / 2);
  }
  return 0;
}
size_t scale_bytes(const kernels::WeightRef& w) {
  switch (w.format) {
    case kernels::WeightFormat::kFp8Block: {
      const int64_t sld = w.scale_ld ? w.scale_ld : (w.k + 127) / 128;
      return static_cast<size_t>(((w.n + 127) / 128) * sld);
    }
    case kernels::WeightFormat::kMxfp4: return static_cast<size_t>(w.n * (w.k / 32));
    default: return 0;
  }
}

// The grouped prefill path (moe_prefill.h) runs MXFP4 experts with act_quant inputs whose every
// 128-wide K block fits e4m3 after one power of two (checked on the host copy of every expert's
// scales, while uploading; the measuring pass skips it).
bool grouped_ok(const model::MoEW& m, bool aq1, bool aq2, bool aq3) {
  if (m.experts.empty() || !aq1 || !aq2 || !aq3) return false;
  for (const model::ExpertW& e : m.experts)
    for (const model::LinearW* l : {&e.w1, &e.w2, &e.w3}) {
      if (l->w.format != kernels::WeightFormat::kMxfp4 || l->w.k % 128 || l->w.n % 128 || !l->w.scale) return false;
      if (!mxfp4_blocks_fit_e4m3(l->w.scale, l->w.n, l->w.k)) return false;
    }
  return true;
}

struct Uploader {
  Arena& ar;

  DLinear lin(const model::LinearW& l) {
    DLinear d;
    d.out = l.out;
    d.in = l.in;
    d.act_quant = l.act_quant;
    d.w = l.w;
    d.w.data = ar.put(l.w.data, data_bytes(l.w));
    d.w.scale = l.w.scale ? static_cast<const uint8_t*>(ar.put(l.w.scale, scale_bytes(l.w))) : nullptr;
    return d;
  }
  const float* vec(const std::vector<float>& v) {
    return static_cast<const float*>(ar.put(v.data(), v.size() * sizeof(float)));
  }
  DComp comp(const model::CompressorW& c) {
    DComp d;
    d.ratio = c.ratio;
    d.head_dim = c.head_dim;
    d.overlap = c.overlap;
    d.rotate = c.rotate;
    d.wkv = lin(c.wkv);
    d.wgate = lin(c.wgate);
    d.ape = vec(c.ape);
    d.norm = vec(c.norm);
    return d;
  }
  // All experts' `which` matrix (0 = w1, 1 = w2, 2 = w3) as one WeightRef of E * rows rows.
  kernels::WeightRef experts(const std::vector<model::ExpertW>& ex, int which, bool& act_quant) {
    auto pick = [&](const model::ExpertW& e) -> const model::LinearW& { return which == 0 ? e.w1 : which == 1 ? e.w2 : e.w3; };
    const model::LinearW& first = pick(ex.front());
    act_quant = first.act_quant;
    std::vector<const void*> data, scale;
    std::vector<size_t> dbytes, sbytes;
    for (const model::ExpertW& e : ex) {
      const model::LinearW& l = pick(e);
      data.push_back(l.w.data);
      dbytes.push_back(data_bytes(l.w));
      scale.push_back(l.w.scale);
      sbytes.push_back(scale_bytes(l.w));
    }
    kernels::WeightRef r = first.w;
    r.n = first.w.n * static_cast<int64_t>(ex.size());
    r.data = ar.put_concat(data, dbytes);
    r.scale = first.w.scale ? static_cast<const uint8_t*>(ar.put_concat(scale, sbytes)) : nullptr;
    return r;
  }
  DBlock block(const model::BlockW& b) {
    DBlock d;
    d.ratio = b.compress_ratio;
    d.attn_norm = vec(b.attn_norm);
    d.ffn_norm = vec(b.ffn_norm);
    d.hc_attn_fn = vec(b.hc_attn_fn);
    d.hc_attn_base = vec(b.hc_attn_base);
    d.hc_attn_scale = vec(b.hc_attn_scale);
    d.hc_ffn_fn = vec(b.hc_ffn_fn);
    d.hc_ffn_base = vec(b.hc_ffn_base);
    d.hc_ffn_scale = vec(b.hc_ffn_scale);
    const model::AttentionW& a = b.attn;
    DAttn& da = d.attn;
    da.n_heads = a.n_local_heads;
    da.n_groups = a.n_local_groups;
    da.n_idx_heads = a.has_indexer ? a.indexer.n_local_heads : 0;
    da.wq_a = lin(a.wq_a);
    da.wq_b = lin(a.wq_b);
    da.wkv = lin(a.wkv);
    da.wo_a = lin(a.wo_a);
    da.wo_b = lin(a.wo_b);
    da.q_norm = vec(a.q_norm);
    da.kv_norm = vec(a.kv_norm);
    da.attn_sink = vec(a.attn_sink);
    da.has_compressor = a.has_compressor;
    da.has_indexer = a.has_indexer;
    if (a.has_compressor) da.comp = comp(a.compressor);
    if (a.has_indexer) {
      da.idx_wq_b = lin(a.indexer.wq_b);
      da.idx_wproj = lin(a.indexer.weights_proj);
      da.icomp = comp(a.indexer.compressor);
    }
    const model::MoEW& m = b.ffn;
    DMoE& dm = d.ffn;
    dm.hash = m.hash;
    dm.gate = lin(m.gate);
    if (!m.hash) dm.bias = vec(m.bias);
    if (m.hash)
      dm.tid2eid = static_cast<const int32_t*>(ar.put(m.tid2eid.data(), m.tid2eid.size() * sizeof(int32_t)));
    bool aq1 = false, aq2 = false, aq3 = false;
    dm.w1_all = experts(m.experts, 0, aq1);
    dm.w2_all = experts(m.experts, 1, aq2);
    dm.w3_all = experts(m.experts, 2, aq3);
    dm.up_act_quant = aq1;
    dm.down_act_quant = aq2;
    dm.expert_begin = static_cast<int>(m.expert_begin);
    dm.n_local = static_cast<int>(m.experts.size());
    dm.grouped = !ar.measuring() && grouped_ok(m, aq1, aq2, aq3);
    dm.sh_w1 = lin(m.shared.w1);
    dm.sh_w2 = lin(m.shared.w2);
    dm.sh_w3 = lin(m.shared.w3);
    return d;
  }
  DWeights all(const model::Weights& w) {
    DWeights d;
    d.vocab_begin = w.vocab_begin;
    d.vocab_end = w.vocab_end;
    d.embed = lin(w.embed);
    if (w.head.w.data == w.embed.w.data) {
      d.head = d.embed;
      d.head.out = w.head.out;
      d.head.in = w.head.in;
    } else {
      d.head = lin(w.head);
    }
    d.norm = vec(w.norm);
    d.hc_head_fn = vec(w.hc_head_fn);
    d.hc_head_base = vec(w.hc_head_base);
    d.hc_head_scale = vec(w.hc_head_scale);
    for (const model::BlockW& b : w.layers) d.layers.push_back(block(b));
    d.has_draft = w.has_draft;
    if (w.has_draft) {
      for (const model::BlockW& b : w.draft.stages) d.draft.stages.push_back(block(b));
      d.draft.main_proj = lin(w.draft.main_proj);
      d.draft.main_norm = vec(w.draft.main_norm);
      d.draft.norm = vec(w.draft.norm);
      d.draft.hc_head_fn = vec(w.draft.hc_head_fn);
      d.draft.hc_head_base = vec(w.draft.hc_head_base);
      d.draft.hc_head_scale = vec(w.draft.hc_head_scale);
      d.draft.markov_w1 = lin(w.draft.markov_w1);
      d.draft.markov_w2 = lin(w.draft.markov_w2);
      d.draft.confidence = vec(w.draft.confidence);
    }
    return d;
  }
};

}  // namespace

// Experts of one layer must share a format and shape, and an FP8 expert's rows must fill whole
// 128-row scale blocks, so the concatenation is itself a valid stored weight.
Status check_uploadable(const model::Weights& w) {
  auto check_moe = [](const model::MoEW& m, const std::string& where) -> Status {
    if (m.experts.empty()) return invalid_argument("{}: no routed experts", where);
    for (int which = 0; which < 3; ++which) {
      for (const model::ExpertW& e : m.experts) {
        const model::LinearW& l = which == 0 ? e.w1 : which == 1 ? e.w2 : e.w3;
        const model::LinearW& f = which == 0 ? m.experts[0].w1 : which == 1 ? m.experts[0].w2 : m.experts[0].w3;
        if (l.w.format != f.w.format || l.w.n != f.w.n || l.w.k != f.w.k || l.act_quant != f.act_quant)
          return invalid_argument("{}: routed experts differ in format or shape", where);
        if (l.w.format == kernels::WeightFormat::kFp8Block && l.w.n % 128)
          return invalid_argument("{}: FP8 expert with {} rows (the CUDA runner needs multiples of 128)", where, l.w.n);
      }
    }
    return Status();
  };
  for (size_t l = 0; l < w.layers.size(); ++l)
    TANDEM_RETURN_IF_ERROR(check_moe(w.layers[l].ffn, "layer " + std::to_string(l)));
  if (w.has_draft)
    for (size_t s = 0; s < w.draft.stages.size(); ++s)
      TANDEM_RETURN_IF_ERROR(check_moe(w.draft.stages[s].ffn, "draft stage " + std::to_string(s)));
  return Status();
}

size_t upload_bytes(const model::Weights& w) {
  Arena measure(nullptr);
  Uploader up{measure};
  up.all(w);
  return measure.used();
}

DWeights upload_weights(const model::Weights& w, uint8_t* arena_base) {
  Arena ar(arena_base);
  Uploader up{ar};
  return up.all(w);
}

}  // namespace tandem::cuda_model
