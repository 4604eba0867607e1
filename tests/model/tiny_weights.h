// Test helper: a tiny DeepSeek-V4 (+ DSpark) config and well-conditioned random weights in the
// official storage formats (FP8 128x128 blocks, MXFP4 experts, BF16, F32, I64), built in memory
// from the io catalog, so model tests need no checkpoint on disk.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "io/catalog.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace tandem::testing {

inline ModelConfig tiny_config(bool dspark = true) {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 4;
  c.head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 128;
  c.o_lora_rank = 128;
  c.o_groups = 2;
  c.sliding_window = 128;
  c.compress_ratios = {0, 4, 128, 4, 128, 4};
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 16;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 128;
  c.num_hash_layers = 2;
  if (dspark) {
    c.compress_ratios.insert(c.compress_ratios.end(), {0, 0, 0});
    c.draft_kind = DraftKind::kDSpark;
    c.num_draft_stages = 3;
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = 500;
    c.dspark_target_layer_ids = {3, 4, 5};
    c.dspark_markov_rank = 32;
  }
  return c;
}

struct TinyRng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }  // [0,1)
  float normal() {
    float u1 = uniform() + 1e-7f, u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

// Owns tensors and the views pointing into them.
struct TinyWeights {
  std::vector<TensorData> data;
  std::vector<TensorView> views;
  std::vector<const TensorView*> ptrs() const {
    std::vector<const TensorView*> r;
    for (const auto& v : views) r.push_back(&v);
    return r;
  }
  void make_views() {
    views.clear();
    for (const auto& t : data) {
      TensorView v;
      v.name = t.name;
      v.dtype = t.dtype;
      v.shape = t.shape;
      v.data = t.bytes.data();
      v.nbytes = t.bytes.size();
      views.push_back(v);
    }
  }
  TensorData* find(const std::string& name) {
    for (auto& t : data)
      if (t.name == name) return &t;
    return nullptr;
  }
};

inline TinyWeights tiny_weights(const ModelConfig& c, uint64_t seed = 1) {
  TinyWeights tw;
  auto cat = build_catalog(c);
  if (!cat.ok()) return tw;
  TinyRng rng{seed};
  for (const ParamSpec& p : cat->params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    std::vector<float> v(numel);
    const int64_t in = p.shape.size() > 1 ? p.shape.back() : 1;
    const float std_in = 1.0f / std::sqrt(static_cast<float>(in));
    switch (p.role) {
      case ParamRole::kEmbed: for (auto& x : v) x = rng.normal(); break;
      case ParamRole::kHead: for (auto& x : v) x = rng.normal() * std_in; break;
      case ParamRole::kNorm: for (auto& x : v) x = 1.0f + 0.1f * rng.normal(); break;
      case ParamRole::kHcFn: for (auto& x : v) x = 0.02f * rng.normal(); break;
      case ParamRole::kHcBase:
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.2f * rng.normal();
        if (v.size() > static_cast<size_t>(2 * c.hc_mult))  // comb: favour the identity
          for (int j = 0; j < c.hc_mult; ++j) v[2 * c.hc_mult + j * c.hc_mult + j] += 2.0f;
        break;
      case ParamRole::kHcScale: for (auto& x : v) x = 0.5f + 0.1f * rng.uniform(); break;
      case ParamRole::kAttnSink: for (auto& x : v) x = 0.5f * rng.normal(); break;
      case ParamRole::kCompressorApe: for (auto& x : v) x = 0.3f * rng.normal(); break;
      case ParamRole::kGateWeight: for (auto& x : v) x = rng.normal() * std_in; break;
      case ParamRole::kGateBias:
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3f * rng.normal();
        break;
      case ParamRole::kTid2Eid: break;
      case ParamRole::kAttnOut:
      case ParamRole::kExpertW2:
      case ParamRole::kSharedW2: for (auto& x : v) x = 0.3f * rng.normal() * std_in; break;
      case ParamRole::kMarkov: for (auto& x : v) x = 0.2f * rng.normal(); break;
      default: for (auto& x : v) x = rng.normal() * std_in; break;
    }
    TensorData t;
    t.name = p.name;
    t.shape = p.shape;
    switch (p.storage) {
      case Storage::kBF16: {
        t.dtype = DType::kBF16;
        t.bytes.resize(numel * 2);
        for (int64_t i = 0; i < numel; ++i) {
          uint16_t h = num::f32_to_bf16(v[i]);
          std::memcpy(&t.bytes[2 * i], &h, 2);
        }
        tw.data.push_back(std::move(t));
        break;
      }
      case Storage::kF32: {
        t.dtype = DType::kF32;
        t.bytes.resize(numel * 4);
        std::memcpy(t.bytes.data(), v.data(), numel * 4);
        tw.data.push_back(std::move(t));
        break;
      }
      case Storage::kI64: {
        t.dtype = DType::kI64;
        t.bytes.resize(numel * 8);
        const int64_t k = p.shape[1], E = c.n_routed_experts;
        for (int64_t r = 0; r < p.shape[0]; ++r) {
          int64_t start = static_cast<int64_t>(rng.next() % E);
          for (int64_t j = 0; j < k; ++j) {
            int64_t e = (start + j) % E;
            std::memcpy(&t.bytes[8 * (r * k + j)], &e, 8);
          }
        }
        tw.data.push_back(std::move(t));
        break;
      }
      case Storage::kFP8Block: {
        auto q = num::quantize_fp8_block(v.data(), p.shape[0], p.shape[1]);
        t.dtype = DType::kF8E4M3;
        t.bytes = std::move(q.data);
        TensorData s;
        s.name = p.scale_name();
        s.dtype = DType::kF8E8M0;
        s.shape = {(p.shape[0] + 127) / 128, (p.shape[1] + 127) / 128};
        s.bytes = std::move(q.scale);
        tw.data.push_back(std::move(t));
        tw.data.push_back(std::move(s));
        break;
      }
      case Storage::kFP4: {
        auto q = num::quantize_mxfp4(v.data(), p.shape[0], p.shape[1]);
        t.dtype = DType::kI8;
        t.shape = {p.shape[0], p.shape[1] / 2};
        t.bytes = std::move(q.data);
        TensorData s;
        s.name = p.scale_name();
        s.dtype = DType::kF8E8M0;
        s.shape = {p.shape[0], p.shape[1] / 32};
        s.bytes = std::move(q.scale);
        tw.data.push_back(std::move(t));
        tw.data.push_back(std::move(s));
        break;
      }
    }
  }
  tw.make_views();
  return tw;
}

}  // namespace tandem::testing
