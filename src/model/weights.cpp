// Loads and validates DeepSeek-V4 weights for the CPU forward (see weights.h).
#include "model/weights.h"

#include <cstring>
#include <map>
#include <set>

#include "common/numeric.h"
#include "io/safetensors.h"

namespace tandem::model {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

class Loader {
 public:
  Loader(const std::vector<const TensorView*>& tensors, LoadCounts& counts) : counts_(counts) {
    for (const TensorView* t : tensors) by_name_[t->name] = t;
  }

  Status status() const { return status_; }

  // Float vector (BF16 or F32 in the file).
  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape) {
    const TensorView* t = take(name, shape);
    if (!t) return {};
    std::vector<float> out(t->numel());
    if (t->dtype == DType::kF32) {
      std::memcpy(out.data(), t->data, out.size() * 4);
    } else if (t->dtype == DType::kBF16) {
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        out[i] = num::bf16_to_f32(h);
      }
    } else {
      fail(invalid_argument("tensor {}: dtype {} where BF16 or F32 was expected", name, dtype_name(t->dtype)));
      return {};
    }
    return out;
  }

  std::vector<int32_t> ids(const std::string& name, std::vector<int64_t> shape, int64_t limit) {
    const TensorView* t = take(name, shape);
    if (!t) return {};
    std::vector<int32_t> out(t->numel());
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      if (t->dtype == DType::kI64) {
        std::memcpy(&v, t->data + 8 * i, 8);
      } else if (t->dtype == DType::kI32) {
        int32_t v32;
        std::memcpy(&v32, t->data + 4 * i, 4);
        v = v32;
      } else {
        fail(invalid_argument("tensor {}: dtype {} where I64 was expected", name, dtype_name(t->dtype)));
        return {};
      }
      if (v < 0 || v >= limit) {
        fail(invalid_argument("tensor {}: element {} = {} outside [0, {})", name, i, v, limit));
        return {};
      }
      out[i] = static_cast<int32_t>(v);
    }
    return out;
  }

  // A linear `<prefix>.weight` [out, in]: FP8 (+ .scale 128x128 E8M0), MXFP4 as I8 [out, in/2]
  // (+ .scale [out, in/32]) or BF16/F32 (no scale).
  LinearW linear(const std::string& prefix, int64_t out, int64_t in) {
    LinearW l;
    l.out = out;
    l.in = in;
    const std::string wname = prefix + ".weight";
    const TensorView* t = peek(wname);
    if (!t) {
      missing(wname);
      return l;
    }
    if (t->dtype == DType::kF8E4M3) {
      const TensorView* w = take(wname, {out, in});
      const TensorView* s = take(prefix + ".scale", {(out + 127) / 128, (in + 127) / 128});
      if (!w || !s) return l;
      if (s->dtype != DType::kF8E8M0) {
        fail(invalid_argument("tensor {}.scale: dtype {} where F8_E8M0 was expected", prefix, dtype_name(s->dtype)));
        return l;
      }
      l.w = num::dequantize_fp8_block(w->data, s->data, out, in, 128);
      l.act_quant = true;
    } else if (t->dtype == DType::kI8) {
      if (in % 32 != 0) {
        fail(invalid_argument("tensor {}: FP4 weight needs in % 32 == 0 (in = {})", wname, in));
        return l;
      }
      const TensorView* w = take(wname, {out, in / 2});
      const TensorView* s = take(prefix + ".scale", {out, in / 32});
      if (!w || !s) return l;
      if (s->dtype != DType::kF8E8M0) {
        fail(invalid_argument("tensor {}.scale: dtype {} where F8_E8M0 was expected", prefix, dtype_name(s->dtype)));
        return l;
      }
      l.w = num::dequantize_mxfp4(w->data, s->data, out, in);
      l.act_quant = true;
    } else {
      l.w = vec(wname, {out, in});
    }
    return l;
  }

  // Names of tensors never taken.
  std::vector<std::string> leftovers() const {
    std::vector<std::string> r;
    for (const auto& [name, t] : by_name_)
      if (!taken_.count(name)) r.push_back(name);
    return r;
  }

 private:
  static bool is_draft(const std::string& name) { return name.rfind("mtp.", 0) == 0; }

  const TensorView* peek(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

  const TensorView* take(const std::string& name, const std::vector<int64_t>& shape) {
    (is_draft(name) ? counts_.draft_expected : counts_.target_expected)++;
    const TensorView* t = peek(name);
    if (!t) {
      missing(name);
      return nullptr;
    }
    if (t->shape != shape) {
      fail(invalid_argument("tensor {}: shape {} where {} was expected", name, shape_str(t->shape), shape_str(shape)));
      return nullptr;
    }
    taken_.insert(name);
    (is_draft(name) ? counts_.draft_loaded : counts_.target_loaded)++;
    return t;
  }

  void missing(const std::string& name) { fail(not_found("tensor {} is missing from the checkpoint", name)); }
  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

  LoadCounts& counts_;
  std::map<std::string, const TensorView*> by_name_;
  std::set<std::string> taken_;
  Status status_;
};

void load_compressor(Loader& ld, const std::string& p, const ModelConfig& c, int ratio, int head_dim, bool rotate,
                     CompressorW& out) {
  out.ratio = ratio;
  out.head_dim = head_dim;
  out.overlap = ratio == 4;
  out.rotate = rotate;
  const int64_t coff = out.overlap ? 2 : 1;
  out.ape = ld.vec(p + ".ape", {ratio, coff * head_dim});
  out.wkv = ld.linear(p + ".wkv", coff * head_dim, c.hidden_size);
  out.wgate = ld.linear(p + ".wgate", coff * head_dim, c.hidden_size);
  out.wkv.act_quant = out.wgate.act_quant = false;  // computed in fp32 by the reference
  out.norm = ld.vec(p + ".norm.weight", {head_dim});
}

void load_block(Loader& ld, const std::string& p, const ModelConfig& c, int layer_id, int ratio, bool hash,
                BlockW& b) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t mix = c.hc_mix_dim(), hcd = c.hc_dim();
  b.layer_id = layer_id;
  b.compress_ratio = ratio;
  b.attn_norm = ld.vec(p + "attn_norm.weight", {D});
  b.ffn_norm = ld.vec(p + "ffn_norm.weight", {D});
  b.hc_attn_fn = ld.vec(p + "hc_attn_fn", {mix, hcd});
  b.hc_attn_base = ld.vec(p + "hc_attn_base", {mix});
  b.hc_attn_scale = ld.vec(p + "hc_attn_scale", {3});
  b.hc_ffn_fn = ld.vec(p + "hc_ffn_fn", {mix, hcd});
  b.hc_ffn_base = ld.vec(p + "hc_ffn_base", {mix});
  b.hc_ffn_scale = ld.vec(p + "hc_ffn_scale", {3});
  AttentionW& a = b.attn;
  a.attn_sink = ld.vec(p + "attn.attn_sink", {H});
  a.wq_a = ld.linear(p + "attn.wq_a", c.q_lora_rank, D);
  a.q_norm = ld.vec(p + "attn.q_norm.weight", {c.q_lora_rank});
  a.wq_b = ld.linear(p + "attn.wq_b", H * hd, c.q_lora_rank);
  a.wkv = ld.linear(p + "attn.wkv", hd, D);
  a.kv_norm = ld.vec(p + "attn.kv_norm.weight", {hd});
  a.wo_a = ld.linear(p + "attn.wo_a", static_cast<int64_t>(c.o_groups) * c.o_lora_rank, H * hd / c.o_groups);
  a.wo_a.act_quant = false;  // bf16 einsum in the reference
  for (float& v : a.wo_a.w) v = num::round_bf16(v);
  a.wo_b = ld.linear(p + "attn.wo_b", D, static_cast<int64_t>(c.o_groups) * c.o_lora_rank);
  if (ratio != 0) {
    a.has_compressor = true;
    load_compressor(ld, p + "attn.compressor", c, ratio, static_cast<int>(hd), false, a.compressor);
    if (ratio == 4) {
      a.has_indexer = true;
      a.indexer.wq_b = ld.linear(p + "attn.indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim,
                                 c.q_lora_rank);
      a.indexer.weights_proj = ld.linear(p + "attn.indexer.weights_proj", c.index_n_heads, D);
      a.indexer.weights_proj.act_quant = false;
      load_compressor(ld, p + "attn.indexer.compressor", c, 4, c.index_head_dim, true, a.indexer.compressor);
    }
  }
  MoEW& m = b.ffn;
  m.hash = hash;
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
  m.gate = ld.linear(p + "ffn.gate", E, D);
  m.gate.act_quant = false;  // fp32 GEMM in the reference
  if (hash)
    m.tid2eid = ld.ids(p + "ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, E);
  else
    m.bias = ld.vec(p + "ffn.gate.bias", {E});
  m.experts.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "ffn.experts." + std::to_string(e);
    m.experts[e].w1 = ld.linear(ep + ".w1", I, D);
    m.experts[e].w2 = ld.linear(ep + ".w2", D, I);
    m.experts[e].w3 = ld.linear(ep + ".w3", I, D);
  }
  m.shared.w1 = ld.linear(p + "ffn.shared_experts.w1", I, D);
  m.shared.w2 = ld.linear(p + "ffn.shared_experts.w2", D, I);
  m.shared.w3 = ld.linear(p + "ffn.shared_experts.w3", I, D);
}

}  // namespace

Status validate_config_for_cpu(const ModelConfig& c) {
  const int nl = c.num_hidden_layers;
  if (nl <= 0) return invalid_argument("config: num_hidden_layers must be > 0");
  if (static_cast<int>(c.compress_ratios.size()) < nl)
    return invalid_argument("config: compress_ratios has {} entries, fewer than num_hidden_layers {}",
                            c.compress_ratios.size(), nl);
  for (int l = 0; l < static_cast<int>(c.compress_ratios.size()); ++l) {
    const int r = c.compress_ratios[l];
    if (r != 0 && r != 4 && r != 128)
      return invalid_argument("config: compress_ratios[{}] = {} (supported: 0, 4, 128)", l, r);
  }
  if (c.hc_mult <= 0 || c.hc_sinkhorn_iters <= 0) return invalid_argument("config: hc_mult/hc_sinkhorn_iters must be > 0");
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim >= c.head_dim || c.qk_rope_head_dim % 2)
    return invalid_argument("config: qk_rope_head_dim {} invalid for head_dim {}", c.qk_rope_head_dim, c.head_dim);
  if ((c.head_dim - c.qk_rope_head_dim) % 64)
    return invalid_argument("config: head_dim - qk_rope_head_dim must be a multiple of 64 (FP8 KV blocks)");
  if (c.num_attention_heads % c.o_groups)
    return invalid_argument("config: num_attention_heads {} not divisible by o_groups {}", c.num_attention_heads, c.o_groups);
  if (c.index_head_dim & (c.index_head_dim - 1))
    return invalid_argument("config: index_head_dim {} must be a power of two (Hadamard)", c.index_head_dim);
  if (c.index_head_dim <= c.qk_rope_head_dim || c.index_head_dim % 32)
    return invalid_argument("config: index_head_dim {} invalid", c.index_head_dim);
  if (c.num_experts_per_tok > c.n_routed_experts || c.num_experts_per_tok <= 0)
    return invalid_argument("config: num_experts_per_tok {} invalid for {} experts", c.num_experts_per_tok,
                            c.n_routed_experts);
  if (c.n_shared_experts != 1) return invalid_argument("config: n_shared_experts must be 1");
  if (c.sliding_window <= 0) return invalid_argument("config: sliding_window must be > 0");
  if (c.vocab_size <= 0 || c.hidden_size <= 0) return invalid_argument("config: vocab_size/hidden_size must be > 0");
  if (c.has_dspark()) {
    if (c.dspark_block_size <= 0) return invalid_argument("config: dspark_block_size must be > 0");
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size)
      return invalid_argument("config: dspark_noise_token_id {} outside the vocabulary", c.dspark_noise_token_id);
    if (c.dspark_target_layer_ids.empty()) return invalid_argument("config: dspark_target_layer_ids is empty");
    for (int id : c.dspark_target_layer_ids)
      if (id < 0 || id >= nl) return invalid_argument("config: dspark_target_layer_ids entry {} out of range", id);
    if (c.num_draft_stages <= 0) return invalid_argument("config: DSpark needs num_draft_stages > 0");
    if (static_cast<int>(c.compress_ratios.size()) < nl + c.num_draft_stages)
      return invalid_argument("config: compress_ratios lacks the {} draft stage entries", c.num_draft_stages);
    for (int s = 0; s < c.num_draft_stages; ++s)
      if (c.compress_ratios[nl + s] != 0)
        return invalid_argument("config: draft stage {} must have compress ratio 0", s);
    if (c.dspark_markov_rank <= 0) return invalid_argument("config: dspark_markov_rank must be > 0");
  }
  return Status();
}

Result<Weights> load_weights(const ModelConfig& c, const std::vector<const TensorView*>& tensors, bool load_draft,
                             LoadCounts& counts) {
  TANDEM_RETURN_IF_ERROR(validate_config_for_cpu(c));
  counts = LoadCounts();
  Loader ld(tensors, counts);
  Weights w;
  const int64_t V = c.vocab_size, D = c.hidden_size;
  w.embed = ld.vec("embed.weight", {V, D});
  w.head = c.tie_word_embeddings ? w.embed : ld.vec("head.weight", {V, D});
  w.norm = ld.vec("norm.weight", {D});
  w.hc_head_fn = ld.vec("hc_head_fn", {c.hc_mult, c.hc_dim()});
  w.hc_head_base = ld.vec("hc_head_base", {c.hc_mult});
  w.hc_head_scale = ld.vec("hc_head_scale", {1});
  w.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers && ld.status().ok(); ++l)
    load_block(ld, "layers." + std::to_string(l) + ".", c, l, c.compress_ratios[l], c.is_hash_layer(l), w.layers[l]);
  if (c.has_dspark() && load_draft) {
    w.has_draft = true;
    DraftW& d = w.draft;
    d.stages.resize(c.num_draft_stages);
    for (int s = 0; s < c.num_draft_stages && ld.status().ok(); ++s)
      load_block(ld, "mtp." + std::to_string(s) + ".", c, c.num_hidden_layers + s, 0, false, d.stages[s]);
    const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
    d.main_proj = ld.linear("mtp.0.main_proj", D, D * nt);
    d.main_norm = ld.vec("mtp.0.main_norm.weight", {D});
    const std::string last = "mtp." + std::to_string(c.num_draft_stages - 1) + ".";
    d.norm = ld.vec(last + "norm.weight", {D});
    d.hc_head_fn = ld.vec(last + "hc_head_fn", {c.hc_mult, c.hc_dim()});
    d.hc_head_base = ld.vec(last + "hc_head_base", {c.hc_mult});
    d.hc_head_scale = ld.vec(last + "hc_head_scale", {1});
    d.markov_w1 = ld.vec(last + "markov_head.markov_w1.weight", {V, c.dspark_markov_rank});
    d.markov_w2 = ld.vec(last + "markov_head.markov_w2.weight", {V, c.dspark_markov_rank});
    d.confidence = ld.vec(last + "confidence_head.proj.weight", {1, D + c.dspark_markov_rank});
  }
  TANDEM_RETURN_IF_ERROR(ld.status());
  for (const std::string& name : ld.leftovers()) {
    const bool draft_tensor = name.rfind("mtp.", 0) == 0;
    // Draft tensors the caller chose not to load (or a preview MTP stage, which this CPU path does
    // not run) are skipped and counted; anything else is an unexpected tensor.
    if (draft_tensor && !(c.has_dspark() && load_draft)) {
      counts.skipped++;
      continue;
    }
    return invalid_argument("unexpected tensor {} in the checkpoint (not in the catalog for this config)", name);
  }
  return w;
}

}  // namespace tandem::model
