// Tiny checkpoint writer (see tiny_checkpoint.h): presets, deterministic well-conditioned weight
// init, official quantized formats, official file set.
#include "io/tiny_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/numeric.h"
#include "io/catalog.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// ---- deterministic random numbers ------------------------------------------------------------
// splitmix64, seeded per tensor from (seed, tensor name): every tensor's values depend only on
// those two, never on generation order or on the C++ library (no std::*_distribution).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

class Rng {
 public:
  Rng(uint64_t seed, const std::string& name) : state_(seed * 0xD1B54A32D192ED03ull ^ fnv1a64(name)) {
    splitmix64(state_);
  }
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [-1, 1) on a 2^-23 grid (exact in float).
  float sym() { return static_cast<float>(next() >> 40) * (1.0f / 8388608.0f) - 1.0f; }
  // Zero-mean, standard deviation `std` (uniform, so no outliers: good for conditioning).
  float gauss_like(float std) { return sym() * std * 1.7320508f; }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// ---- weight init -----------------------------------------------------------------------------
// Well-conditioned on purpose (spec errata 9: on random weights the official reference disagrees
// with itself, prefill vs decode, because rounding flips routes and selections). Choices:
//  - embed: std 1; head: std 1/sqrt(D) (logits ~ unit scale).
//  - norm weights: 1 +- 0.1.
//  - generic linears (FP8 and BF16): std 1/sqrt(in), keeping activations at unit scale; the
//    residual-branch outputs are smaller: attn wo_b std 0.2/sqrt(in), expert/shared w2 std
//    0.2/sqrt(in), so one layer moves the residual stream by a fraction of its size.
//  - SwiGLU inputs: w1/w3 std 1/sqrt(D) on unit-RMS normed input gives |g|,|u| ~ 1, far below the
//    swiglu_limit clamp (10) and uniform weights have no outliers.
//  - router: gate.weight std 0.1/sqrt(D), so sqrtsoftplus scores sit in ~0.83 +- 0.03; gate.bias
//    is a random permutation of 1.0, 0.75, 0.5, ... (step 0.25 >> score spread), so the bias alone
//    decides top-k with wide margins (each layer picks its own experts). Hash layers: tid2eid rows
//    of distinct random experts.
//  - mHC: *_fn std 0.5/sqrt(hc*D) (mixing logits ~0.5 before scale), *_scale 0.5 +- 0.1,
//    *_base 0 +- 0.1 for pre/post (pre ~ 0.5, post ~ 1) and comb base +1 on the diagonal, so the
//    Sinkhorn matrix is a mild, well-conditioned mix; hc_head the same.
//  - attn_sink: uniform in [-0.5, 0.5] (moderate vs unit-scale scores).
//  - compressor ape: +-0.1; compressor/indexer projections std 1/sqrt(D); indexer weights_proj
//    std 1/sqrt(D) so head weights differ clearly.
//  - DSpark: markov_w1/w2 std 0.15 (Markov correction ~0.1-0.2 logits, a correction not a
//    takeover), confidence proj std 1/sqrt(in).
std::vector<float> init_values(const ParamSpec& p, const ModelConfig& c, Rng& rng) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  const float in = p.shape.size() >= 2 ? static_cast<float>(p.shape[1]) : 1.0f;
  auto fill = [&](float std) {
    for (auto& x : v) x = rng.gauss_like(std);
  };
  switch (p.role) {
    case ParamRole::kEmbed: fill(1.0f); break;
    case ParamRole::kHead: fill(1.0f / std::sqrt(in)); break;
    case ParamRole::kNorm:
      for (auto& x : v) x = 1.0f + 0.1f * rng.sym();
      break;
    case ParamRole::kHcFn: fill(0.5f / std::sqrt(in)); break;
    case ParamRole::kHcScale:
      for (auto& x : v) x = 0.5f + 0.1f * rng.sym();
      break;
    case ParamRole::kHcBase: {
      const int hc = c.hc_mult;
      for (size_t i = 0; i < v.size(); ++i) {
        float base = 0.0f;
        if (static_cast<int64_t>(v.size()) == c.hc_mix_dim() && static_cast<int>(i) >= 2 * hc) {
          const int k = static_cast<int>(i) - 2 * hc;  // comb entry [k / hc][k % hc]
          if (k / hc == k % hc) base = 1.0f;
        }
        v[i] = base + 0.1f * rng.sym();
      }
      break;
    }
    case ParamRole::kAttnSink:
      for (auto& x : v) x = 0.5f * rng.sym();
      break;
    case ParamRole::kCompressorApe:
      for (auto& x : v) x = 0.1f * rng.sym();
      break;
    case ParamRole::kGateWeight: fill(0.1f / std::sqrt(in)); break;
    case ParamRole::kGateBias: {
      std::vector<int> perm(v.size());
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
      for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
      for (size_t r = 0; r < perm.size(); ++r) v[perm[r]] = 1.0f - 0.25f * static_cast<float>(r);
      break;
    }
    case ParamRole::kAttnOut:
    case ParamRole::kExpertW2:
    case ParamRole::kSharedW2: fill(0.2f / std::sqrt(in)); break;
    case ParamRole::kMarkov: fill(0.15f); break;
    case ParamRole::kTid2Eid: break;  // integer table, see tid2eid_values
    case ParamRole::kLinear:
    case ParamRole::kExpertW13:
    case ParamRole::kSharedW13:
    case ParamRole::kConfidence: fill(1.0f / std::sqrt(in)); break;
  }
  return v;
}

// tid2eid [vocab, topk]: each row a set of distinct experts (partial Fisher-Yates).
std::vector<int64_t> tid2eid_values(const ParamSpec& p, const ModelConfig& c, Rng& rng) {
  const int64_t rows = p.shape[0], k = p.shape[1];
  std::vector<int64_t> out(static_cast<size_t>(rows * k));
  std::vector<int64_t> experts(static_cast<size_t>(c.n_routed_experts));
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t e = 0; e < experts.size(); ++e) experts[e] = static_cast<int64_t>(e);
    for (int64_t j = 0; j < k; ++j) {
      size_t pick = static_cast<size_t>(j) + rng.below(experts.size() - static_cast<size_t>(j));
      std::swap(experts[static_cast<size_t>(j)], experts[pick]);
      out[static_cast<size_t>(r * k + j)] = experts[static_cast<size_t>(j)];
    }
  }
  return out;
}

template <typename T>
std::vector<uint8_t> raw_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());  // little-endian host
  return b;
}

// Encodes one parameter into its stored tensors (same names/shapes as expand_param).
Result<std::vector<TensorData>> encode_param(const ParamSpec& p, const ModelConfig& c,
                                             uint64_t seed) {
  Rng rng(seed, p.name);
  std::vector<TensorSpec> specs = expand_param(p, c);
  std::vector<TensorData> out(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    out[i].name = specs[i].name;
    out[i].dtype = specs[i].dtype;
    out[i].shape = specs[i].shape;
  }
  if (p.storage == Storage::kI64) {
    out[0].bytes = raw_bytes(tid2eid_values(p, c, rng));
    return out;
  }
  std::vector<float> v = init_values(p, c, rng);
  switch (p.storage) {
    case Storage::kBF16: {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = num::f32_to_bf16(v[i]);
      out[0].bytes = raw_bytes(h);
      break;
    }
    case Storage::kF32: out[0].bytes = raw_bytes(v); break;
    case Storage::kFP8Block: {
      if (c.weight_block_n != c.weight_block_k) {
        return make_error(StatusCode::kUnimplemented, "{}: non-square FP8 weight blocks", p.name);
      }
      num::Fp8BlockWeight q = num::quantize_fp8_block(v.data(), p.shape[0], p.shape[1],
                                                      static_cast<size_t>(c.weight_block_n));
      out[0].bytes = std::move(q.data);
      out[1].bytes = std::move(q.scale);
      break;
    }
    case Storage::kFP4: {
      num::Mxfp4Weight q = num::quantize_mxfp4(v.data(), p.shape[0], p.shape[1]);
      out[0].bytes = std::move(q.data);
      out[1].bytes = std::move(q.scale);
      break;
    }
    case Storage::kI64: break;
  }
  for (const auto& t : out) {
    uint64_t want = dtype_size(t.dtype);
    for (int64_t d : t.shape) want *= static_cast<uint64_t>(d);
    if (want != t.bytes.size()) {
      return make_error(StatusCode::kInternal, "{}: encoded {} bytes, catalog says {}", t.name,
                        t.bytes.size(), want);
    }
  }
  return out;
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return make_error(StatusCode::kFailedPrecondition, "{}: write failed", path.string());
  return Status::ok_status();
}

std::string generation_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["_from_model_config"] = true;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["do_sample"] = true;
  j["temperature"] = 1.0;
  j["top_p"] = 1.0;
  j["transformers_version"] = "4.46.3";
  return j.dump(2) + "\n";
}

std::string tokenizer_config_json() {
  auto tok = [](const char* content) {
    nlohmann::ordered_json t;
    t["__type"] = "AddedToken";
    t["content"] = content;
    t["lstrip"] = false;
    t["normalized"] = true;
    t["rstrip"] = false;
    t["single_word"] = false;
    return t;
  };
  nlohmann::ordered_json j;
  j["add_bos_token"] = false;
  j["add_eos_token"] = false;
  j["bos_token"] = tok("<｜begin▁of▁sentence｜>");
  j["clean_up_tokenization_spaces"] = false;
  j["eos_token"] = tok("<｜end▁of▁sentence｜>");
  j["legacy"] = true;
  j["model_max_length"] = 1048576;
  j["pad_token"] = tok("<｜end▁of▁sentence｜>");
  j["sp_model_kwargs"] = nlohmann::ordered_json::object();
  j["unk_token"] = nullptr;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  return j.dump(2) + "\n";
}

}  // namespace

const std::vector<std::string>& tiny_preset_names() {
  static const std::vector<std::string> names = {"default", "small", "preview", "tp8", "long"};
  return names;
}

Result<TinyVocab> tiny_vocab_from_tokenizer_json(const std::string& tokenizer_json) {
  nlohmann::json j = nlohmann::json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tokenizer.json: not valid JSON");
  TinyVocab v;
  int64_t max_id = -1;
  auto model = j.find("model");
  if (model == j.end() || !model->is_object() || !model->contains("vocab") ||
      !(*model)["vocab"].is_object()) {
    return invalid_argument("tokenizer.json: missing model.vocab");
  }
  for (const auto& [tok, id] : (*model)["vocab"].items()) {
    if (!id.is_number_integer()) return invalid_argument("tokenizer.json: vocab id of '{}' is not an integer", tok);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  bool have_bos = false, have_eos = false;
  auto added = j.find("added_tokens");
  if (added != j.end() && added->is_array()) {
    for (const auto& t : *added) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        return invalid_argument("tokenizer.json: malformed added_tokens entry");
      }
      const int64_t id = t["id"].get<int64_t>();
      const std::string& content = t["content"].get_ref<const std::string&>();
      max_id = std::max(max_id, id);
      if (content == "<｜place▁holder▁no▁799｜>") v.noise_token_id = id;
      if (content == "<｜begin▁of▁sentence｜>") v.bos_token_id = id, have_bos = true;
      if (content == "<｜end▁of▁sentence｜>") v.eos_token_id = id, have_eos = true;
    }
  }
  if (!have_bos || !have_eos) {
    return invalid_argument("tokenizer.json: no <｜begin▁of▁sentence｜>/<｜end▁of▁sentence｜> added tokens");
  }
  v.vocab_size = max_id + 1;
  return v;
}

Result<ModelConfig> tiny_preset_config(const std::string& preset, const TinyVocab& vocab) {
  ModelConfig c;  // defaults: the official values (rope, yarn, eps, routing, quantization)
  c.vocab_size = vocab.vocab_size;
  c.bos_token_id = vocab.bos_token_id;
  c.eos_token_id = vocab.eos_token_id;
  c.num_key_value_heads = 1;
  c.head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.sliding_window = 128;
  c.hc_mult = 4;
  c.index_head_dim = 128;
  c.n_shared_experts = 1;
  c.num_nextn_predict_layers = 1;  // as the official files write it (stale for DSpark)
  c.expert_dtype = "fp4";
  if (preset == "default" || preset == "preview" || preset == "long") {
    c.hidden_size = 256;
    c.num_hidden_layers = 6;
    c.compress_ratios = {0, 4, 128, 4, 128, 4};
    c.num_hash_layers = 2;
    c.num_attention_heads = 4;
    c.q_lora_rank = 128;
    c.o_groups = 2;
    c.o_lora_rank = 128;
    c.index_n_heads = 4;
    c.index_topk = 16;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 128;
    c.dspark_target_layer_ids = {3, 4, 5};
    c.dspark_markov_rank = 32;
    if (preset == "long") {
      // Long-context tests: sliding-window and HCA (ratio 128) layers only. A CSA layer's
      // lightning indexer scores n/4 entries per token (quadratic: a 64K prompt costs minutes
      // on one core); HCA attends n/128 entries.
      c.compress_ratios = {0, 128, 0, 128, 0, 128};
    }
  } else if (preset == "small") {
    c.hidden_size = 384;
    c.num_hidden_layers = 8;
    c.compress_ratios = {0, 4, 128, 4, 4, 128, 0, 4};
    c.num_hash_layers = 3;
    c.num_attention_heads = 6;
    c.q_lora_rank = 256;
    c.o_groups = 3;
    c.o_lora_rank = 128;
    c.index_n_heads = 8;
    c.index_topk = 32;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 3;
    c.moe_intermediate_size = 256;
    c.dspark_target_layer_ids = {5, 6, 7};
    c.dspark_markov_rank = 64;
  } else if (preset == "tp8") {
    // Shardable over 1, 2, 4 and 8 ranks as the reference shards (heads, o_groups, index heads
    // and experts divisible by 8; each rank's wo_b input a whole 128-wide activation block).
    c.hidden_size = 256;
    c.num_hidden_layers = 4;
    c.compress_ratios = {0, 4, 128, 4};
    c.num_hash_layers = 1;
    c.num_attention_heads = 8;
    c.q_lora_rank = 128;
    c.o_groups = 8;
    c.o_lora_rank = 128;
    c.index_n_heads = 8;
    c.index_topk = 16;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 128;
    c.dspark_target_layer_ids = {1, 2, 3};
    c.dspark_markov_rank = 32;
  } else {
    return invalid_argument("unknown preset '{}' (default, small, preview, tp8)", preset);
  }
  if (preset == "preview") {
    c.compress_ratios.push_back(0);  // one classic MTP stage
    c.draft_kind = DraftKind::kMtp;
    c.num_draft_stages = 1;
    c.has_expert_dtype_key = false;  // as in the preview config
    c.dspark_target_layer_ids.clear();
    c.dspark_markov_rank = 0;
  } else {
    if (vocab.noise_token_id < 0) {
      return invalid_argument("tokenizer.json has no DSpark noise token <｜place▁holder▁no▁799｜>");
    }
    for (int s = 0; s < 3; ++s) c.compress_ratios.push_back(0);
    c.draft_kind = DraftKind::kDSpark;
    c.num_draft_stages = 3;
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = vocab.noise_token_id;
  }
  // Round-trip through the parser: the preset must be a valid config.json.
  auto parsed = parse_model_config(model_config_to_json(c));
  if (!parsed.ok()) return parsed.status().with_context("preset " + preset);
  return parsed;
}

Status write_tiny_checkpoint(const std::string& out_dir, const TinyCheckpointOptions& options,
                             const std::string& tokenizer_json) {
  TANDEM_ASSIGN_OR_RETURN(TinyVocab vocab, tiny_vocab_from_tokenizer_json(tokenizer_json));
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, tiny_preset_config(options.preset, vocab));
  TANDEM_ASSIGN_OR_RETURN(Catalog catalog, build_catalog(config));
  if (config.weight_block_n != 128 || config.weight_block_k != 128) {
    return make_error(StatusCode::kUnimplemented, "make-tiny writes 128x128 FP8 blocks only");
  }
  std::vector<TensorData> tensors;
  tensors.reserve(catalog.tensors.size());
  for (const ParamSpec& p : catalog.params) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<TensorData> enc, encode_param(p, config, options.seed));
    for (auto& t : enc) tensors.push_back(std::move(t));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    return make_error(StatusCode::kFailedPrecondition, "{}: cannot create: {}", out_dir, ec.message());
  }
  // Stale files from an earlier run with a different shard count would confuse `check`.
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("model-", 0) == 0 && it->path().extension() == ".safetensors") {
      stale.push_back(it->path());
    }
  }
  for (const auto& p : stale) fs::remove(p, ec);
  const fs::path dir(out_dir);
  TANDEM_RETURN_IF_ERROR(write_text(dir / "config.json", model_config_to_json(config)));
  TANDEM_RETURN_IF_ERROR(write_text(dir / "generation_config.json", generation_config_json(config)));
  TANDEM_RETURN_IF_ERROR(write_text(dir / "tokenizer.json", tokenizer_json));
  TANDEM_RETURN_IF_ERROR(write_text(dir / "tokenizer_config.json", tokenizer_config_json()));
  // The official repos also ship inference/config.json (the reference's ModelArgs names), which
  // the official generate.py loads; golden tooling runs the reference from it.
  fs::create_directories(dir / "inference", ec);
  TANDEM_RETURN_IF_ERROR(
      write_text(dir / "inference" / "config.json", model_config_to_inference_json(config)));
  TANDEM_RETURN_IF_ERROR(write_sharded_checkpoint(out_dir, tensors, options.num_shards));
  std::vector<std::string> files = {"config.json", "generation_config.json", "tokenizer.json",
                                    "tokenizer_config.json", "inference/config.json",
                                    "model.safetensors.index.json"};
  for (int s = 0; s < options.num_shards; ++s) {
    files.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, options.num_shards));
  }
  if (!options.revision.empty()) {
    TANDEM_RETURN_IF_ERROR(write_text(dir / "REVISION", options.revision + "\n"));
    files.push_back("REVISION");
  }
  if (options.write_manifest) {
    std::string manifest;
    for (const auto& f : files) {
      TANDEM_ASSIGN_OR_RETURN(std::string hex, sha256_file_hex((dir / f).string()));
      manifest += hex + "  " + f + "\n";
    }
    TANDEM_RETURN_IF_ERROR(write_text(dir / "SHA256SUMS", manifest));
  }
  return Status::ok_status();
}

}  // namespace tandem
