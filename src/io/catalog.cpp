// Tensor catalog from ModelConfig (spec section 8.3). Checked against the real checkpoints'
// inventories: 0731 = 72,317 tensors / 166,878,536,440 bytes, preview = 69,187 / 159,609,485,896
// (tests/io/catalog_test.cpp).
#include "io/catalog.h"

namespace tandem {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Builder {
 public:
  explicit Builder(const ModelConfig& c) : c_(c) {
    linear_ = c.quant_method.empty() ? Storage::kBF16 : Storage::kFP8Block;
    expert_ = c.expert_dtype == "fp4"   ? Storage::kFP4
              : c.expert_dtype == "fp8" ? Storage::kFP8Block
                                        : Storage::kBF16;
  }

  void add(std::string name, Storage s, ParamRole role, std::vector<int64_t> shape) {
    ParamSpec p;
    p.name = std::move(name);
    p.storage = s;
    p.role = role;
    p.shape = std::move(shape);
    params_.push_back(std::move(p));
  }

  void norm(const std::string& name, int64_t dim) {
    add(name, Storage::kBF16, ParamRole::kNorm, {dim});
  }
  void linear(const std::string& name, int64_t out, int64_t in, ParamRole role = ParamRole::kLinear) {
    add(name, linear_, role, {out, in});
  }
  void hc_head(const std::string& prefix) {
    const int64_t hc = c_.hc_mult;
    add(prefix + "hc_head_fn", Storage::kF32, ParamRole::kHcFn, {hc, hc * c_.hidden_size});
    add(prefix + "hc_head_base", Storage::kF32, ParamRole::kHcBase, {hc});
    add(prefix + "hc_head_scale", Storage::kF32, ParamRole::kHcScale, {1});
  }

  // One transformer block (main layer or draft stage) under `p` ("layers.3." / "mtp.0.").
  void block(const std::string& p, int ratio, bool hash) {
    const int64_t D = c_.hidden_size, H = c_.num_attention_heads, hd = c_.head_dim;
    const int64_t hc = c_.hc_mult, mix = c_.hc_mix_dim();
    norm(p + "attn_norm.weight", D);
    norm(p + "ffn_norm.weight", D);
    for (const char* sub : {"attn", "ffn"}) {
      add(p + "hc_" + sub + "_fn", Storage::kF32, ParamRole::kHcFn, {mix, hc * D});
      add(p + "hc_" + sub + "_base", Storage::kF32, ParamRole::kHcBase, {mix});
      add(p + "hc_" + sub + "_scale", Storage::kF32, ParamRole::kHcScale, {3});
    }
    add(p + "attn.attn_sink", Storage::kF32, ParamRole::kAttnSink, {H});
    linear(p + "attn.wq_a.weight", c_.q_lora_rank, D);
    norm(p + "attn.q_norm.weight", c_.q_lora_rank);
    linear(p + "attn.wq_b.weight", H * hd, c_.q_lora_rank);
    linear(p + "attn.wkv.weight", hd, D);
    norm(p + "attn.kv_norm.weight", hd);
    linear(p + "attn.wo_a.weight", int64_t{c_.o_groups} * c_.o_lora_rank, H * hd / c_.o_groups);
    linear(p + "attn.wo_b.weight", D, int64_t{c_.o_groups} * c_.o_lora_rank, ParamRole::kAttnOut);
    if (ratio != 0) {
      const int64_t cw = (ratio == 4 ? 2 : 1) * hd;  // ratio 4 compresses with overlap
      add(p + "attn.compressor.ape", Storage::kF32, ParamRole::kCompressorApe, {ratio, cw});
      add(p + "attn.compressor.wkv.weight", Storage::kBF16, ParamRole::kLinear, {cw, D});
      add(p + "attn.compressor.wgate.weight", Storage::kBF16, ParamRole::kLinear, {cw, D});
      norm(p + "attn.compressor.norm.weight", hd);
    }
    if (ratio == 4) {
      const int64_t ih = c_.index_n_heads, id = c_.index_head_dim;
      linear(p + "attn.indexer.wq_b.weight", ih * id, c_.q_lora_rank);
      add(p + "attn.indexer.weights_proj.weight", Storage::kBF16, ParamRole::kLinear, {ih, D});
      add(p + "attn.indexer.compressor.ape", Storage::kF32, ParamRole::kCompressorApe, {4, 2 * id});
      add(p + "attn.indexer.compressor.wkv.weight", Storage::kBF16, ParamRole::kLinear, {2 * id, D});
      add(p + "attn.indexer.compressor.wgate.weight", Storage::kBF16, ParamRole::kLinear, {2 * id, D});
      norm(p + "attn.indexer.compressor.norm.weight", id);
    }
    const int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    add(p + "ffn.gate.weight", Storage::kBF16, ParamRole::kGateWeight, {E, D});
    if (hash) {
      add(p + "ffn.gate.tid2eid", Storage::kI64, ParamRole::kTid2Eid,
          {c_.vocab_size, c_.num_experts_per_tok});
    } else {
      add(p + "ffn.gate.bias", Storage::kF32, ParamRole::kGateBias, {E});
    }
    if (c_.n_shared_experts > 0) {
      const int64_t SI = I * c_.n_shared_experts;
      linear(p + "ffn.shared_experts.w1.weight", SI, D, ParamRole::kSharedW13);
      linear(p + "ffn.shared_experts.w2.weight", D, SI, ParamRole::kSharedW2);
      linear(p + "ffn.shared_experts.w3.weight", SI, D, ParamRole::kSharedW13);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
      add(q + "w1.weight", expert_, ParamRole::kExpertW13, {I, D});
      add(q + "w2.weight", expert_, ParamRole::kExpertW2, {D, I});
      add(q + "w3.weight", expert_, ParamRole::kExpertW13, {I, D});
    }
  }

  Result<std::vector<ParamSpec>> build() {
    const int64_t D = c_.hidden_size, V = c_.vocab_size;
    add("embed.weight", Storage::kBF16, ParamRole::kEmbed, {V, D});
    for (int l = 0; l < c_.num_hidden_layers; ++l) {
      block("layers." + std::to_string(l) + ".", c_.compress_ratios[l], c_.is_hash_layer(l));
    }
    for (int s = 0; s < c_.num_draft_stages; ++s) {
      const std::string p = "mtp." + std::to_string(s) + ".";
      block(p, c_.compress_ratios[c_.num_hidden_layers + s], /*hash=*/false);
      if (c_.draft_kind == DraftKind::kDSpark) {
        if (s == 0) {
          linear(p + "main_proj.weight", D,
                 D * static_cast<int64_t>(c_.dspark_target_layer_ids.size()));
          norm(p + "main_norm.weight", D);
        }
        if (s == c_.num_draft_stages - 1) {
          norm(p + "norm.weight", D);
          hc_head(p);
          add(p + "markov_head.markov_w1.weight", Storage::kBF16, ParamRole::kMarkov,
              {V, c_.dspark_markov_rank});
          add(p + "markov_head.markov_w2.weight", Storage::kBF16, ParamRole::kMarkov,
              {V, c_.dspark_markov_rank});
          add(p + "confidence_head.proj.weight", Storage::kBF16, ParamRole::kConfidence,
              {1, D + c_.dspark_markov_rank});
        }
      } else {  // classic MTP (preview)
        linear(p + "e_proj.weight", D, D);
        linear(p + "h_proj.weight", D, D);
        norm(p + "enorm.weight", D);
        norm(p + "hnorm.weight", D);
        norm(p + "norm.weight", D);
        hc_head(p);
      }
    }
    norm("norm.weight", D);
    hc_head("");
    if (!c_.tie_word_embeddings) add("head.weight", Storage::kBF16, ParamRole::kHead, {V, D});

    for (const ParamSpec& p : params_) {
      if (p.storage == Storage::kFP4 && (p.shape[1] % 32 != 0)) {
        return invalid_argument("{}: FP4 storage needs the input dim ({}) divisible by 32", p.name,
                                p.shape[1]);
      }
    }
    return std::move(params_);
  }

 private:
  const ModelConfig& c_;
  Storage linear_, expert_;
  std::vector<ParamSpec> params_;
};

}  // namespace

std::string ParamSpec::scale_name() const {
  const std::string suffix = ".weight";
  if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return name.substr(0, name.size() - suffix.size()) + ".scale";
  }
  return name + ".scale";
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<TensorSpec> expand_param(const ParamSpec& p, const ModelConfig& c) {
  switch (p.storage) {
    case Storage::kBF16: return {{p.name, DType::kBF16, p.shape}};
    case Storage::kF32: return {{p.name, DType::kF32, p.shape}};
    case Storage::kI64: return {{p.name, DType::kI64, p.shape}};
    case Storage::kFP8Block:
      return {{p.name, DType::kF8E4M3, p.shape},
              {p.scale_name(), DType::kF8E8M0,
               {ceil_div(p.shape[0], c.weight_block_n), ceil_div(p.shape[1], c.weight_block_k)}}};
    case Storage::kFP4:
      return {{p.name, DType::kI8, {p.shape[0], p.shape[1] / 2}},
              {p.scale_name(), DType::kF8E8M0, {p.shape[0], p.shape[1] / 32}}};
  }
  return {};
}

Result<Catalog> build_catalog(const ModelConfig& config) {
  Builder b(config);
  TANDEM_ASSIGN_OR_RETURN(std::vector<ParamSpec> params, b.build());
  Catalog cat;
  cat.params = std::move(params);
  for (const ParamSpec& p : cat.params) {
    for (TensorSpec& t : expand_param(p, config)) {
      if (!cat.index.emplace(t.name, cat.tensors.size()).second) {
        return invalid_argument("catalog: duplicate tensor name '{}'", t.name);
      }
      cat.tensors.push_back(std::move(t));
    }
  }
  return cat;
}

const TensorSpec* Catalog::find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

uint64_t Catalog::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

std::map<DType, DTypeCensus> Catalog::census() const {
  std::map<DType, DTypeCensus> out;
  for (const auto& t : tensors) {
    out[t.dtype].tensors += 1;
    out[t.dtype].bytes += t.nbytes();
  }
  return out;
}

std::string with_thousands(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace tandem
