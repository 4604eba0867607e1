// config.json <-> ModelConfig. Parsing never throws: the JSON is parsed in non-throwing mode and
// every field is type-checked before use, so a bad file becomes an InvalidArgument naming the key.
#include "io/model_config.h"

#include <cmath>
#include <limits>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

using json = nlohmann::json;

// Field readers: absent optional keys leave the default; a present key of the wrong type is an
// error. `key` is the dotted path used in messages ("rope_scaling.factor").
class Fields {
 public:
  Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string path(const char* key) const { return prefix_ + key; }

  Status missing(const char* key) const {
    return invalid_argument("config.json: missing required key '{}'", path(key));
  }

  template <typename Int>
  Status get_int(const char* key, Int* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    int64_t x = 0;
    if (v->is_number_integer()) {
      x = v->get<int64_t>();
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return invalid_argument("config.json: key '{}': integer out of range", path(key));
      }
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
               v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15) {
      x = static_cast<int64_t>(v->get<double>());
    } else {
      return invalid_argument("config.json: key '{}': expected an integer, got {}", path(key),
                              v->dump());
    }
    if (x < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
        x > static_cast<int64_t>(std::numeric_limits<Int>::max())) {
      return invalid_argument("config.json: key '{}': integer {} out of range", path(key), x);
    }
    *out = static_cast<Int>(x);
    return Status::ok_status();
  }

  Status get_double(const char* key, double* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return invalid_argument("config.json: key '{}': expected a number, got {}", path(key),
                              v->dump());
    }
    *out = v->get<double>();
    return Status::ok_status();
  }

  Status get_string(const char* key, std::string* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_string()) {
      return invalid_argument("config.json: key '{}': expected a string, got {}", path(key),
                              v->dump());
    }
    *out = v->get<std::string>();
    return Status::ok_status();
  }

  Status get_bool(const char* key, bool* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_boolean()) {
      return invalid_argument("config.json: key '{}': expected true/false, got {}", path(key),
                              v->dump());
    }
    *out = v->get<bool>();
    return Status::ok_status();
  }

  Status get_int_list(const char* key, std::vector<int>* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_array()) {
      return invalid_argument("config.json: key '{}': expected a list of integers", path(key));
    }
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX ||
          (e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX)) {
        return invalid_argument("config.json: key '{}[{}]': expected an integer, got {}", path(key),
                                i, e.dump());
      }
      out->push_back(static_cast<int>(e.get<int64_t>()));
    }
    return Status::ok_status();
  }

 private:
  const json& obj_;
  std::string prefix_;
};

#define TRY(expr) TANDEM_RETURN_IF_ERROR(expr)

Status require(bool cond, const char* key, const std::string& what) {
  if (cond) return Status::ok_status();
  return invalid_argument("config.json: key '{}': {}", key, what);
}

// Sanity bounds far above any real V4 model (43 layers, 256 experts, vocab 129,280): they keep
// shape products far from overflow and stop a hostile config from making a giant catalog.
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int kMaxLayers = 512;
constexpr int kMaxExperts = 4096;
constexpr int kMaxDraftStages = 16;

Status bounded(int64_t v, int64_t limit, const char* key) {
  if (v <= limit) return Status::ok_status();
  return invalid_argument("config.json: key '{}': {} exceeds the sanity bound {}", key, v, limit);
}

Status validate(const ModelConfig& c) {
  TRY(bounded(c.vocab_size, kMaxVocab, "vocab_size"));
  TRY(bounded(c.hidden_size, kMaxDim, "hidden_size"));
  TRY(bounded(c.num_hidden_layers, kMaxLayers, "num_hidden_layers"));
  TRY(bounded(c.num_attention_heads, 4096, "num_attention_heads"));
  TRY(bounded(c.head_dim, 8192, "head_dim"));
  TRY(bounded(c.q_lora_rank, kMaxDim, "q_lora_rank"));
  TRY(bounded(c.o_lora_rank, kMaxDim, "o_lora_rank"));
  TRY(bounded(c.o_groups, 4096, "o_groups"));
  TRY(bounded(c.index_n_heads, 4096, "index_n_heads"));
  TRY(bounded(c.index_head_dim, 8192, "index_head_dim"));
  TRY(bounded(c.n_routed_experts, kMaxExperts, "n_routed_experts"));
  TRY(bounded(c.n_shared_experts, 64, "n_shared_experts"));
  TRY(bounded(c.moe_intermediate_size, kMaxDim, "moe_intermediate_size"));
  TRY(bounded(c.hc_mult, 64, "hc_mult"));
  TRY(bounded(c.dspark_markov_rank, kMaxDim, "dspark_markov_rank"));
  TRY(bounded(c.num_draft_stages, kMaxDraftStages, "compress_ratios"));
  TRY(bounded(static_cast<int64_t>(c.dspark_target_layer_ids.size()), kMaxLayers,
              "dspark_target_layer_ids"));
  TRY(require(c.model_type == "deepseek_v4", "model_type",
              fmt::format("unsupported model_type '{}' (expected deepseek_v4)", c.model_type)));
  bool arch_ok = false;
  for (const auto& a : c.architectures) arch_ok |= (a == "DeepseekV4ForCausalLM");
  TRY(require(arch_ok, "architectures", "must contain DeepseekV4ForCausalLM"));
  TRY(require(c.vocab_size > 0, "vocab_size", "must be positive"));
  TRY(require(c.hidden_size > 0, "hidden_size", "must be positive"));
  TRY(require(c.num_hidden_layers > 0, "num_hidden_layers", "must be positive"));
  TRY(require(c.num_attention_heads > 0, "num_attention_heads", "must be positive"));
  TRY(require(c.num_key_value_heads == 1, "num_key_value_heads",
              "must be 1 (one shared latent KV)"));
  TRY(require(c.head_dim > 0, "head_dim", "must be positive"));
  TRY(require(c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
              "must be positive and even"));
  TRY(require(c.head_dim > c.qk_rope_head_dim, "head_dim",
              fmt::format("{} must exceed qk_rope_head_dim {}", c.head_dim, c.qk_rope_head_dim)));
  TRY(require(c.q_lora_rank > 0, "q_lora_rank", "must be positive"));
  TRY(require(c.o_lora_rank > 0, "o_lora_rank", "must be positive"));
  TRY(require(c.o_groups > 0, "o_groups", "must be positive"));
  TRY(require(c.num_attention_heads % c.o_groups == 0, "o_groups",
              fmt::format("num_attention_heads {} is not a multiple of o_groups {}",
                          c.num_attention_heads, c.o_groups)));
  TRY(require(c.sliding_window > 0, "sliding_window", "must be positive"));
  TRY(require(c.index_n_heads > 0, "index_n_heads", "must be positive"));
  TRY(require(c.index_head_dim > c.qk_rope_head_dim, "index_head_dim",
              fmt::format("{} must exceed qk_rope_head_dim {}", c.index_head_dim,
                          c.qk_rope_head_dim)));
  TRY(require(c.index_topk > 0, "index_topk", "must be positive"));
  TRY(require(c.n_routed_experts > 0, "n_routed_experts", "must be positive"));
  TRY(require(c.n_shared_experts >= 0, "n_shared_experts", "must not be negative"));
  TRY(require(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts,
              "num_experts_per_tok",
              fmt::format("{} must be in [1, n_routed_experts = {}]", c.num_experts_per_tok,
                          c.n_routed_experts)));
  TRY(require(c.moe_intermediate_size > 0, "moe_intermediate_size", "must be positive"));
  TRY(require(c.num_hash_layers >= 0 && c.num_hash_layers <= c.num_hidden_layers,
              "num_hash_layers",
              fmt::format("{} must be in [0, num_hidden_layers = {}]", c.num_hash_layers,
                          c.num_hidden_layers)));
  TRY(require(c.scoring_func == "sqrtsoftplus" || c.scoring_func == "softmax" ||
                  c.scoring_func == "sigmoid",
              "scoring_func", fmt::format("unsupported '{}'", c.scoring_func)));
  TRY(require(c.routed_scaling_factor > 0, "routed_scaling_factor", "must be positive"));
  TRY(require(c.swiglu_limit >= 0, "swiglu_limit", "must not be negative"));
  TRY(require(c.hc_mult > 0, "hc_mult", "must be positive"));
  TRY(require(c.hc_sinkhorn_iters > 0, "hc_sinkhorn_iters", "must be positive"));
  TRY(require(c.hc_eps > 0, "hc_eps", "must be positive"));
  TRY(require(c.rms_norm_eps > 0, "rms_norm_eps", "must be positive"));
  TRY(require(c.rope_theta > 0, "rope_theta", "must be positive"));
  TRY(require(c.compress_rope_theta > 0, "compress_rope_theta", "must be positive"));
  TRY(require(c.max_position_embeddings > 0, "max_position_embeddings", "must be positive"));
  if (!c.rope_scaling_type.empty()) {
    TRY(require(c.rope_scaling_type == "yarn", "rope_scaling.type",
                fmt::format("unsupported '{}' (only yarn)", c.rope_scaling_type)));
    TRY(require(c.rope_factor > 0, "rope_scaling.factor", "must be positive"));
    TRY(require(c.rope_original_max_position > 0, "rope_scaling.original_max_position_embeddings",
                "must be positive"));
    TRY(require(c.rope_beta_fast > 0 && c.rope_beta_slow > 0, "rope_scaling.beta_fast",
                "beta_fast and beta_slow must be positive"));
  }
  TRY(require(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size, "bos_token_id",
              "must be a token id below vocab_size"));
  TRY(require(c.eos_token_id >= 0 && c.eos_token_id < c.vocab_size, "eos_token_id",
              "must be a token id below vocab_size"));
  // compress_ratios: one per main layer, then one (0) per draft stage.
  TRY(require(static_cast<int>(c.compress_ratios.size()) >= c.num_hidden_layers, "compress_ratios",
              fmt::format("has {} entries, fewer than num_hidden_layers = {}",
                          c.compress_ratios.size(), c.num_hidden_layers)));
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128) {
      return invalid_argument("config.json: key 'compress_ratios[{}]': {} is not one of 0, 4, 128",
                              i, r);
    }
    if (static_cast<int>(i) >= c.num_hidden_layers && r != 0) {
      return invalid_argument(
          "config.json: key 'compress_ratios[{}]': draft stage entries must be 0, got {}", i, r);
    }
  }
  if (!c.quant_method.empty()) {
    TRY(require(c.quant_method == "fp8", "quantization_config.quant_method",
                fmt::format("unsupported '{}' (only fp8)", c.quant_method)));
    TRY(require(c.quant_fmt == "e4m3", "quantization_config.fmt",
                fmt::format("unsupported '{}' (only e4m3)", c.quant_fmt)));
    TRY(require(c.quant_scale_fmt == "ue8m0", "quantization_config.scale_fmt",
                fmt::format("unsupported '{}' (only ue8m0)", c.quant_scale_fmt)));
    TRY(require(c.weight_block_n > 0 && c.weight_block_k > 0,
                "quantization_config.weight_block_size", "must be two positive integers"));
  }
  TRY(require(c.expert_dtype == "fp4" || c.expert_dtype == "fp8" || c.expert_dtype == "bf16",
              "expert_dtype", fmt::format("unsupported '{}' (fp4, fp8 or bf16)", c.expert_dtype)));
  if (c.expert_dtype == "fp4") {
    TRY(require(c.hidden_size % 32 == 0 && c.moe_intermediate_size % 32 == 0, "expert_dtype",
                "fp4 experts need hidden_size and moe_intermediate_size divisible by 32"));
  }
  if (c.expert_dtype == "fp8") {
    TRY(require(!c.quant_method.empty(), "expert_dtype",
                "fp8 experts need a quantization_config (block size)"));
  }
  if (c.draft_kind == DraftKind::kDSpark) {
    TRY(require(c.num_draft_stages >= 1, "compress_ratios",
                "dspark_* keys present but no draft stage entries after the main layers"));
    TRY(require(c.dspark_block_size >= 1, "dspark_block_size", "must be positive"));
    TRY(require(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < c.vocab_size,
                "dspark_noise_token_id", fmt::format("{} is not a token id below vocab_size {}",
                                                     c.dspark_noise_token_id, c.vocab_size)));
    TRY(require(c.dspark_markov_rank > 0, "dspark_markov_rank", "must be positive"));
    TRY(require(!c.dspark_target_layer_ids.empty(), "dspark_target_layer_ids", "must not be empty"));
    std::set<int> seen;
    for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i) {
      int l = c.dspark_target_layer_ids[i];
      if (l < 0 || l >= c.num_hidden_layers || !seen.insert(l).second) {
        return invalid_argument(
            "config.json: key 'dspark_target_layer_ids[{}]': {} is not a distinct layer in [0, {})",
            i, l, c.num_hidden_layers);
      }
    }
  }
  return Status::ok_status();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("config.json: not valid JSON");
  if (!j.is_object()) return invalid_argument("config.json: top level is not a JSON object");
  ModelConfig c;
  Fields f(j, "");
  TRY(f.get_string("model_type", &c.model_type, true));
  if (const json* a = f.find("architectures")) {
    if (!a->is_array()) return invalid_argument("config.json: key 'architectures': expected a list");
    c.architectures.clear();
    for (const auto& e : *a) {
      if (!e.is_string()) {
        return invalid_argument("config.json: key 'architectures': expected a list of strings");
      }
      c.architectures.push_back(e.get<std::string>());
    }
  }
  TRY(f.get_int("vocab_size", &c.vocab_size, true));
  TRY(f.get_int("hidden_size", &c.hidden_size, true));
  TRY(f.get_int("num_hidden_layers", &c.num_hidden_layers, true));
  TRY(f.get_int("num_attention_heads", &c.num_attention_heads, true));
  TRY(f.get_int("num_key_value_heads", &c.num_key_value_heads, false));
  TRY(f.get_int("head_dim", &c.head_dim, true));
  TRY(f.get_int("qk_rope_head_dim", &c.qk_rope_head_dim, true));
  TRY(f.get_int("q_lora_rank", &c.q_lora_rank, true));
  TRY(f.get_int("o_lora_rank", &c.o_lora_rank, true));
  TRY(f.get_int("o_groups", &c.o_groups, true));
  TRY(f.get_int("sliding_window", &c.sliding_window, true));
  TRY(f.get_int_list("compress_ratios", &c.compress_ratios, true));
  TRY(f.get_double("rope_theta", &c.rope_theta, false));
  TRY(f.get_double("compress_rope_theta", &c.compress_rope_theta, false));
  if (const json* rs = f.find("rope_scaling")) {
    if (!rs->is_object()) return invalid_argument("config.json: key 'rope_scaling': expected an object");
    Fields r(*rs, "rope_scaling.");
    c.rope_scaling_type.clear();
    // HF writes "type"; newer transformers versions write "rope_type".
    TRY(r.get_string("type", &c.rope_scaling_type, false));
    if (c.rope_scaling_type.empty()) TRY(r.get_string("rope_type", &c.rope_scaling_type, true));
    TRY(r.get_double("factor", &c.rope_factor, true));
    TRY(r.get_int("original_max_position_embeddings", &c.rope_original_max_position, true));
    TRY(r.get_double("beta_fast", &c.rope_beta_fast, false));
    TRY(r.get_double("beta_slow", &c.rope_beta_slow, false));
  } else {
    c.rope_scaling_type.clear();
  }
  TRY(f.get_int("max_position_embeddings", &c.max_position_embeddings, false));
  TRY(f.get_int("index_n_heads", &c.index_n_heads, true));
  TRY(f.get_int("index_head_dim", &c.index_head_dim, true));
  TRY(f.get_int("index_topk", &c.index_topk, true));
  TRY(f.get_int("n_routed_experts", &c.n_routed_experts, true));
  TRY(f.get_int("n_shared_experts", &c.n_shared_experts, false));
  TRY(f.get_int("num_experts_per_tok", &c.num_experts_per_tok, true));
  TRY(f.get_int("moe_intermediate_size", &c.moe_intermediate_size, true));
  TRY(f.get_int("num_hash_layers", &c.num_hash_layers, false));
  TRY(f.get_string("scoring_func", &c.scoring_func, false));
  TRY(f.get_string("topk_method", &c.topk_method, false));
  TRY(f.get_bool("norm_topk_prob", &c.norm_topk_prob, false));
  TRY(f.get_double("routed_scaling_factor", &c.routed_scaling_factor, false));
  TRY(f.get_double("swiglu_limit", &c.swiglu_limit, false));
  TRY(f.get_int("hc_mult", &c.hc_mult, true));
  TRY(f.get_int("hc_sinkhorn_iters", &c.hc_sinkhorn_iters, false));
  TRY(f.get_double("hc_eps", &c.hc_eps, false));
  TRY(f.get_double("rms_norm_eps", &c.rms_norm_eps, false));
  TRY(f.get_int("bos_token_id", &c.bos_token_id, false));
  TRY(f.get_int("eos_token_id", &c.eos_token_id, false));
  TRY(f.get_bool("tie_word_embeddings", &c.tie_word_embeddings, false));
  TRY(f.get_int("num_nextn_predict_layers", &c.num_nextn_predict_layers, false));
  TRY(f.get_string("hidden_act", &c.hidden_act, false));
  TRY(f.get_string("torch_dtype", &c.torch_dtype, false));
  TRY(f.get_string("transformers_version", &c.transformers_version, false));
  TRY(f.get_double("initializer_range", &c.initializer_range, false));
  TRY(f.get_double("attention_dropout", &c.attention_dropout, false));
  TRY(f.get_bool("attention_bias", &c.attention_bias, false));
  TRY(f.get_bool("use_cache", &c.use_cache, false));
  TRY(require(c.hidden_act == "silu", "hidden_act", fmt::format("unsupported '{}'", c.hidden_act)));

  if (const json* q = f.find("quantization_config")) {
    if (!q->is_object()) {
      return invalid_argument("config.json: key 'quantization_config': expected an object");
    }
    Fields qf(*q, "quantization_config.");
    TRY(qf.get_string("quant_method", &c.quant_method, true));
    TRY(qf.get_string("fmt", &c.quant_fmt, false));
    TRY(qf.get_string("scale_fmt", &c.quant_scale_fmt, false));
    TRY(qf.get_string("activation_scheme", &c.quant_activation_scheme, false));
    std::vector<int> block;
    TRY(qf.get_int_list("weight_block_size", &block, false));
    if (qf.find("weight_block_size")) {
      if (block.size() != 2) {
        return invalid_argument(
            "config.json: key 'quantization_config.weight_block_size': expected [n, k]");
      }
      c.weight_block_n = block[0];
      c.weight_block_k = block[1];
    }
  } else {
    c.quant_method.clear();
  }
  // Experts are FP4 in every V4 release, whether or not "expert_dtype" is written (the preview
  // omits it). A bf16 checkpoint (no quantization_config) defaults to bf16 experts.
  c.has_expert_dtype_key = f.find("expert_dtype") != nullptr;
  c.expert_dtype = c.quant_method.empty() ? "bf16" : "fp4";
  TRY(f.get_string("expert_dtype", &c.expert_dtype, false));

  // Draft stages: the entries of compress_ratios after the main layers. num_nextn_predict_layers
  // is stale in 0731 (says 1 for 3 DSpark stages), so it is not used.
  c.num_draft_stages = std::max(0, static_cast<int>(c.compress_ratios.size()) - c.num_hidden_layers);
  const char* dspark_keys[] = {"dspark_block_size", "dspark_noise_token_id",
                               "dspark_target_layer_ids", "dspark_markov_rank"};
  int dspark_present = 0;
  for (const char* k : dspark_keys) dspark_present += f.find(k) != nullptr;
  if (dspark_present > 0) {
    for (const char* k : dspark_keys) {
      if (!f.find(k)) {
        return invalid_argument("config.json: key '{}' missing (the other dspark_* keys are set)", k);
      }
    }
    c.draft_kind = DraftKind::kDSpark;
    TRY(f.get_int("dspark_block_size", &c.dspark_block_size, true));
    TRY(f.get_int("dspark_noise_token_id", &c.dspark_noise_token_id, true));
    TRY(f.get_int_list("dspark_target_layer_ids", &c.dspark_target_layer_ids, true));
    TRY(f.get_int("dspark_markov_rank", &c.dspark_markov_rank, true));
  } else {
    c.draft_kind = c.num_draft_stages > 0 ? DraftKind::kMtp : DraftKind::kNone;
  }
  TRY(validate(c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = parse_model_config(ss.str());
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

namespace {
// Integral values are written as JSON integers, as the official files do ("rope_theta": 10000).
json number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) {
    return static_cast<int64_t>(v);
  }
  return v;
}
}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
  // Key order of the official files: the HF-sorted block, then the keys DeepSeek appended.
  nlohmann::ordered_json j;
  j["architectures"] = c.architectures;
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = c.attention_dropout;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["hc_eps"] = c.hc_eps;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = c.hidden_act;
  j["hidden_size"] = c.hidden_size;
  j["index_head_dim"] = c.index_head_dim;
  j["index_n_heads"] = c.index_n_heads;
  j["index_topk"] = c.index_topk;
  j["initializer_range"] = c.initializer_range;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["model_type"] = c.model_type;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_hash_layers"] = c.num_hash_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["q_lora_rank"] = c.q_lora_rank;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  if (!c.quant_method.empty()) {
    nlohmann::ordered_json q;
    q["activation_scheme"] = c.quant_activation_scheme;
    q["fmt"] = c.quant_fmt;
    q["quant_method"] = c.quant_method;
    q["scale_fmt"] = c.quant_scale_fmt;
    q["weight_block_size"] = {c.weight_block_n, c.weight_block_k};
    j["quantization_config"] = q;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (!c.rope_scaling_type.empty()) {
    nlohmann::ordered_json r;
    r["beta_fast"] = number(c.rope_beta_fast);
    r["beta_slow"] = number(c.rope_beta_slow);
    r["factor"] = number(c.rope_factor);
    r["original_max_position_embeddings"] = c.rope_original_max_position;
    r["type"] = c.rope_scaling_type;
    j["rope_scaling"] = r;
  }
  j["rope_theta"] = number(c.rope_theta);
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func;
  j["sliding_window"] = c.sliding_window;
  j["swiglu_limit"] = c.swiglu_limit;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["topk_method"] = c.topk_method;
  j["torch_dtype"] = c.torch_dtype;
  j["transformers_version"] = c.transformers_version;
  j["use_cache"] = c.use_cache;
  j["vocab_size"] = c.vocab_size;
  j["compress_rope_theta"] = number(c.compress_rope_theta);
  j["compress_ratios"] = c.compress_ratios;
  if (c.has_expert_dtype_key) j["expert_dtype"] = c.expert_dtype;
  if (c.draft_kind == DraftKind::kDSpark) {
    j["dspark_block_size"] = c.dspark_block_size;
    j["dspark_noise_token_id"] = c.dspark_noise_token_id;
    j["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
    j["dspark_markov_rank"] = c.dspark_markov_rank;
  }
  return j.dump(2);
}

std::string model_config_to_inference_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["vocab_size"] = c.vocab_size;
  j["dim"] = c.hidden_size;
  j["moe_inter_dim"] = c.moe_intermediate_size;
  j["n_layers"] = c.num_hidden_layers;
  j["n_hash_layers"] = c.num_hash_layers;
  j["n_mtp_layers"] = c.num_draft_stages;
  j["n_heads"] = c.num_attention_heads;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_activated_experts"] = c.num_experts_per_tok;
  j["score_func"] = c.scoring_func;
  j["route_scale"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["q_lora_rank"] = c.q_lora_rank;
  j["head_dim"] = c.head_dim;
  j["rope_head_dim"] = c.qk_rope_head_dim;
  j["norm_eps"] = c.rms_norm_eps;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["window_size"] = c.sliding_window;
  j["original_seq_len"] = c.rope_original_max_position;
  j["rope_theta"] = number(c.rope_theta);
  j["rope_factor"] = number(c.rope_factor);
  j["beta_fast"] = number(c.rope_beta_fast);
  j["beta_slow"] = number(c.rope_beta_slow);
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["dtype"] = c.quant_method.empty() ? "bf16" : "fp8";
  j["scale_fmt"] = c.quant_scale_fmt;
  if (c.expert_dtype != "bf16") j["expert_dtype"] = c.expert_dtype;
  j["compress_rope_theta"] = number(c.compress_rope_theta);
  j["compress_ratios"] = c.compress_ratios;
  if (c.draft_kind == DraftKind::kDSpark) {
    j["dspark_block_size"] = c.dspark_block_size;
    j["dspark_noise_token_id"] = c.dspark_noise_token_id;
    j["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
    j["dspark_markov_rank"] = c.dspark_markov_rank;
  }
  return j.dump(2) + "\n";
}

}  // namespace tandem
