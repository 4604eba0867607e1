// Loads and validates DeepSeek-V4 weights for the CPU forward (see weights.h).
#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "common/check.h"
#include "common/numeric.h"
#include "io/safetensors.h"

namespace tandem::model {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// A range of rows or columns of a weight (count < 0: all).
struct Slice {
  int64_t begin = 0, count = -1;
  bool all() const { return count < 0; }
};

// Exact fp32 values of w[r0 + i, c0 + j] (a slice that cuts the stored format's scale blocks).
void slice_to_f32(LinearW& l, const kernels::WeightRef& full, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  using kernels::WeightFormat;
  l.owned_data.resize(static_cast<size_t>(nr * nc) * sizeof(float));
  float* dst = reinterpret_cast<float*>(l.owned_data.data());
  std::vector<float> row;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    switch (full.format) {
      case WeightFormat::kF32:
        std::memcpy(dst + i * nc, static_cast<const float*>(full.data) + r * full.k + c0, sizeof(float) * nc);
        break;
      case WeightFormat::kBf16:
        for (int64_t j = 0; j < nc; ++j) {
          uint16_t h;
          std::memcpy(&h, static_cast<const uint16_t*>(full.data) + r * full.k + c0 + j, 2);
          dst[i * nc + j] = num::bf16_to_f32(h);
        }
        break;
      case WeightFormat::kFp8Block: {
        const int64_t sld = full.scale_ld > 0 ? full.scale_ld : (full.k + 127) / 128;
        row = num::dequantize_fp8_block(static_cast<const uint8_t*>(full.data) + r * full.k,
                                        full.scale + (r / 128) * sld, 1, full.k, 128);
        std::memcpy(dst + i * nc, row.data() + c0, sizeof(float) * nc);
        break;
      }
      case WeightFormat::kMxfp4:
        row = num::dequantize_mxfp4(static_cast<const uint8_t*>(full.data) + r * (full.k / 2),
                                    full.scale + r * (full.k / 32), 1, full.k);
        std::memcpy(dst + i * nc, row.data() + c0, sizeof(float) * nc);
        break;
    }
  }
  l.w = {WeightFormat::kF32, l.owned_data.data(), nullptr, nr, nc, 0};
}

// Binds rows [rows) x columns [cols) of `full` to l: a view where the format allows (row slices on
// the scale grid), a copy in the stored format for column slices on the grid, exact fp32 otherwise.
void bind_slice(LinearW& l, const kernels::WeightRef& full, Slice rows, Slice cols) {
  using kernels::WeightFormat;
  const int64_t r0 = rows.all() ? 0 : rows.begin, nr = rows.all() ? full.n : rows.count;
  const int64_t c0 = cols.all() ? 0 : cols.begin, nc = cols.all() ? full.k : cols.count;
  l.out = nr;
  l.in = nc;
  if (nc == full.k) {
    if (full.format != WeightFormat::kFp8Block || r0 % kernels::kFp8WeightBlock == 0) {
      l.w = full.rows(r0, nr);
      return;
    }
    slice_to_f32(l, full, r0, nr, c0, nc);
    return;
  }
  switch (full.format) {
    case WeightFormat::kF32:
    case WeightFormat::kBf16: {
      const size_t es = full.format == WeightFormat::kF32 ? 4 : 2;
      l.owned_data.resize(static_cast<size_t>(nr * nc) * es);
      for (int64_t i = 0; i < nr; ++i)
        std::memcpy(l.owned_data.data() + i * nc * es,
                    static_cast<const uint8_t*>(full.data) + ((r0 + i) * full.k + c0) * es, nc * es);
      l.w = {full.format, l.owned_data.data(), nullptr, nr, nc, 0};
      return;
    }
    case WeightFormat::kFp8Block: {
      if (r0 % 128 || c0 % 128 || nc % 128) break;
      const int64_t sld = full.scale_ld > 0 ? full.scale_ld : (full.k + 127) / 128;
      const int64_t sr = (nr + 127) / 128, sc = nc / 128;
      l.owned_data.resize(static_cast<size_t>(nr * nc));
      l.owned_scale.resize(static_cast<size_t>(sr * sc));
      for (int64_t i = 0; i < nr; ++i)
        std::memcpy(l.owned_data.data() + i * nc, static_cast<const uint8_t*>(full.data) + (r0 + i) * full.k + c0, nc);
      for (int64_t i = 0; i < sr; ++i)
        std::memcpy(l.owned_scale.data() + i * sc, full.scale + (r0 / 128 + i) * sld + c0 / 128, sc);
      l.w = {WeightFormat::kFp8Block, l.owned_data.data(), l.owned_scale.data(), nr, nc, 0};
      return;
    }
    case WeightFormat::kMxfp4: {
      if (c0 % 32 || nc % 32) break;
      l.owned_data.resize(static_cast<size_t>(nr * nc / 2));
      l.owned_scale.resize(static_cast<size_t>(nr * nc / 32));
      for (int64_t i = 0; i < nr; ++i) {
        std::memcpy(l.owned_data.data() + i * nc / 2, static_cast<const uint8_t*>(full.data) + (r0 + i) * (full.k / 2) + c0 / 2,
                    nc / 2);
        std::memcpy(l.owned_scale.data() + i * nc / 32, full.scale + (r0 + i) * (full.k / 32) + c0 / 32, nc / 32);
      }
      l.w = {WeightFormat::kMxfp4, l.owned_data.data(), l.owned_scale.data(), nr, nc, 0};
      return;
    }
  }
  slice_to_f32(l, full, r0, nr, c0, nc);
}

class Loader {
 public:
  Loader(const std::vector<const TensorView*>& tensors, LoadCounts& counts) : counts_(counts) {
    for (const TensorView* t : tensors) by_name_[t->name] = t;
  }

  Status status() const { return status_; }

  // Float vector (BF16 or F32 in the file).
  // rows: a slice of the first dimension (attn_sink's heads).
  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape, Slice rows = {}) {
    std::vector<float> all = vec_all(name, std::move(shape));
    if (rows.all() || all.empty()) return all;
    const size_t per = all.size() / static_cast<size_t>(peek(name)->shape[0]);
    return std::vector<float>(all.begin() + rows.begin * per, all.begin() + (rows.begin + rows.count) * per);
  }

  std::vector<float> vec_all(const std::string& name, std::vector<int64_t> shape) {
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

  // A linear `<prefix>.weight` [out, in] bound in its stored format: FP8 (+ .scale 128x128 E8M0),
  // MXFP4 as I8 [out, in/2] (+ .scale [out, in/32]) or BF16/F32 (no scale). dense_only: the
  // reference reads it as a bf16/fp32 tensor (embedding, Markov head), so FP8/FP4 is refused.
  // rows / cols: this rank's slice (tensor parallelism); the file's shape is checked whole.
  LinearW linear(const std::string& prefix, int64_t out, int64_t in, bool dense_only = false, Slice rows = {},
                 Slice cols = {}) {
    LinearW l = linear_all(prefix, out, in, dense_only);
    if ((rows.all() && cols.all()) || !l.w.data) return l;
    const kernels::WeightRef full = l.w;
    bind_slice(l, full, rows, cols);
    return l;
  }

  // A tensor another rank binds: marked as seen (not unexpected), not counted as loaded here.
  void other_rank(const std::string& prefix) {
    for (const std::string& n : {prefix + ".weight", prefix + ".scale"})
      if (peek(n) && taken_.insert(n).second) counts_.other_ranks++;
  }

  LinearW linear_all(const std::string& prefix, int64_t out, int64_t in, bool dense_only) {
    LinearW l;
    l.out = out;
    l.in = in;
    const std::string wname = prefix + ".weight";
    const TensorView* t = peek(wname);
    if (!t) {
      missing(wname);
      return l;
    }
    if (t->dtype == DType::kF8E4M3 && !dense_only) {
      const TensorView* w = take(wname, {out, in});
      const TensorView* s = take(prefix + ".scale", {(out + 127) / 128, (in + 127) / 128});
      if (!w || !s) return l;
      if (s->dtype != DType::kF8E8M0) {
        fail(invalid_argument("tensor {}.scale: dtype {} where F8_E8M0 was expected", prefix, dtype_name(s->dtype)));
        return l;
      }
      l.w = {kernels::WeightFormat::kFp8Block, w->data, s->data, out, in, 0};
      l.act_quant = true;
    } else if (t->dtype == DType::kI8 && !dense_only) {
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
      l.w = {kernels::WeightFormat::kMxfp4, w->data, s->data, out, in, 0};
      l.act_quant = true;
    } else {
      const TensorView* w = take(wname, {out, in});
      if (!w) return l;
      if (w->dtype == DType::kBF16) {
        l.w = {kernels::WeightFormat::kBf16, w->data, nullptr, out, in, 0};
      } else if (w->dtype == DType::kF32) {
        l.w = {kernels::WeightFormat::kF32, w->data, nullptr, out, in, 0};
      } else {
        fail(invalid_argument("tensor {}: dtype {} where BF16 or F32 was expected", wname, dtype_name(w->dtype)));
      }
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

// wo_a: the reference dequantizes it to a bf16 tensor and runs a grouped bf16 einsum (no activation
// quantization), group g using rows [g*R, (g+1)*R). FP8 stays as stored when every dequantized value
// is a bf16 value (E8M0 exponent in [-124, 119]: e4m3 values are multiples of 2^-9 below 2^9) and the
// groups start on 128-row scale blocks; BF16 stays as stored; anything else becomes a bf16 copy.
void bf16_grouped(LinearW& l, int64_t group_rows) {
  using kernels::WeightFormat;
  if (!l.w.data || l.w.format == WeightFormat::kBf16) return;
  if (l.w.format == WeightFormat::kFp8Block && group_rows % kernels::kFp8WeightBlock == 0) {
    const size_t ns = static_cast<size_t>(((l.out + 127) / 128) * ((l.in + 127) / 128));
    bool exact = true;
    for (size_t i = 0; i < ns && exact; ++i) exact = (l.w.scale[i] >= 3 && l.w.scale[i] <= 246) || l.w.scale[i] == 255;
    if (exact) return;
  }
  std::vector<float> f;
  switch (l.w.format) {
    case WeightFormat::kFp8Block:
      f = num::dequantize_fp8_block(static_cast<const uint8_t*>(l.w.data), l.w.scale, l.out, l.in, 128);
      break;
    case WeightFormat::kMxfp4:
      f = num::dequantize_mxfp4(static_cast<const uint8_t*>(l.w.data), l.w.scale, l.out, l.in);
      break;
    default:
      f.resize(static_cast<size_t>(l.out * l.in));
      std::memcpy(f.data(), l.w.data, f.size() * 4);
      break;
  }
  l.owned.resize(f.size());
  for (size_t i = 0; i < f.size(); ++i) l.owned[i] = num::f32_to_bf16(f[i]);
  l.w = {WeightFormat::kBf16, l.owned.data(), nullptr, l.out, l.in, 0};
}

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
                const Shard& sh, BlockW& b) {
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
  // This rank's heads and output groups (validate_shard guarantees they divide).
  a.n_local_heads = H / sh.size;
  a.n_local_groups = c.o_groups / sh.size;
  const Slice heads{sh.rank * a.n_local_heads, a.n_local_heads};
  const int64_t R = c.o_lora_rank;
  a.attn_sink = ld.vec(p + "attn.attn_sink", {H}, heads);
  a.wq_a = ld.linear(p + "attn.wq_a", c.q_lora_rank, D);
  a.q_norm = ld.vec(p + "attn.q_norm.weight", {c.q_lora_rank});
  a.wq_b = ld.linear(p + "attn.wq_b", H * hd, c.q_lora_rank, false, {heads.begin * hd, heads.count * hd});
  a.wkv = ld.linear(p + "attn.wkv", hd, D);
  a.kv_norm = ld.vec(p + "attn.kv_norm.weight", {hd});
  a.wo_a = ld.linear(p + "attn.wo_a", static_cast<int64_t>(c.o_groups) * R, H * hd / c.o_groups, false,
                     {sh.rank * a.n_local_groups * R, a.n_local_groups * R});
  a.wo_a.act_quant = false;  // bf16 einsum in the reference
  bf16_grouped(a.wo_a, R);
  a.wo_b = ld.linear(p + "attn.wo_b", D, static_cast<int64_t>(c.o_groups) * R, false, {},
                     {sh.rank * a.n_local_groups * R, a.n_local_groups * R});
  if (ratio != 0) {
    a.has_compressor = true;
    load_compressor(ld, p + "attn.compressor", c, ratio, static_cast<int>(hd), false, a.compressor);
    if (ratio == 4) {
      a.has_indexer = true;
      IndexerW& ix = a.indexer;
      ix.n_local_heads = c.index_n_heads / sh.size;
      const Slice ih{sh.rank * ix.n_local_heads, ix.n_local_heads};
      ix.wq_b = ld.linear(p + "attn.indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim,
                          c.q_lora_rank, false, {ih.begin * c.index_head_dim, ih.count * c.index_head_dim});
      ix.weights_proj = ld.linear(p + "attn.indexer.weights_proj", c.index_n_heads, D, false, ih);
      ix.weights_proj.act_quant = false;
      load_compressor(ld, p + "attn.indexer.compressor", c, 4, c.index_head_dim, true, ix.compressor);
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
  m.expert_begin = sh.rank * (E / sh.size);
  m.expert_end = m.expert_begin + E / sh.size;
  m.experts.resize(m.expert_end - m.expert_begin);
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "ffn.experts." + std::to_string(e);
    if (e < m.expert_begin || e >= m.expert_end) {
      for (const char* w : {".w1", ".w2", ".w3"}) ld.other_rank(ep + w);
      continue;
    }
    ExpertW& x = m.experts[e - m.expert_begin];
    x.w1 = ld.linear(ep + ".w1", I, D);
    x.w2 = ld.linear(ep + ".w2", D, I);
    x.w3 = ld.linear(ep + ".w3", I, D);
  }
  m.shared.w1 = ld.linear(p + "ffn.shared_experts.w1", I, D);
  m.shared.w2 = ld.linear(p + "ffn.shared_experts.w2", D, I);
  m.shared.w3 = ld.linear(p + "ffn.shared_experts.w3", I, D);
}

}  // namespace

void LinearW::row(int64_t r, float* dst) const {
  TANDEM_CHECK(r >= 0 && r < out);
  if (w.format == kernels::WeightFormat::kF32) {
    std::memcpy(dst, static_cast<const float*>(w.data) + r * in, sizeof(float) * in);
    return;
  }
  TANDEM_CHECK(w.format == kernels::WeightFormat::kBf16);
  const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * in;
  for (int64_t i = 0; i < in; ++i) {
    uint16_t h;
    std::memcpy(&h, src + i, 2);
    dst[i] = num::bf16_to_f32(h);
  }
}

namespace {
size_t vec_bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }
size_t block_bytes(const BlockW& b) {
  auto lin = [](const LinearW& l) { return l.bytes(); };
  auto comp = [&](const CompressorW& c) { return lin(c.wkv) + lin(c.wgate) + vec_bytes(c.ape) + vec_bytes(c.norm); };
  size_t n = vec_bytes(b.attn_norm) + vec_bytes(b.ffn_norm) + vec_bytes(b.hc_attn_fn) + vec_bytes(b.hc_attn_base) +
             vec_bytes(b.hc_attn_scale) + vec_bytes(b.hc_ffn_fn) + vec_bytes(b.hc_ffn_base) + vec_bytes(b.hc_ffn_scale);
  const AttentionW& a = b.attn;
  n += lin(a.wq_a) + lin(a.wq_b) + lin(a.wkv) + lin(a.wo_a) + lin(a.wo_b) + vec_bytes(a.q_norm) + vec_bytes(a.kv_norm) +
       vec_bytes(a.attn_sink);
  if (a.has_compressor) n += comp(a.compressor);
  if (a.has_indexer) n += lin(a.indexer.wq_b) + lin(a.indexer.weights_proj) + comp(a.indexer.compressor);
  const MoEW& m = b.ffn;
  n += lin(m.gate) + vec_bytes(m.bias) + m.tid2eid.size() * sizeof(int32_t);
  for (const ExpertW& e : m.experts) n += lin(e.w1) + lin(e.w2) + lin(e.w3);
  n += lin(m.shared.w1) + lin(m.shared.w2) + lin(m.shared.w3);
  return n;
}
}  // namespace

size_t weight_bytes(const Weights& w) {
  size_t n = w.embed.bytes() + vec_bytes(w.norm) + vec_bytes(w.hc_head_fn) + vec_bytes(w.hc_head_base) +
             vec_bytes(w.hc_head_scale);
  if (w.head.w.data != w.embed.w.data) n += w.head.bytes();
  for (const BlockW& b : w.layers) n += block_bytes(b);
  if (w.has_draft) {
    const DraftW& d = w.draft;
    for (const BlockW& b : d.stages) n += block_bytes(b);
    n += d.main_proj.bytes() + vec_bytes(d.main_norm) + vec_bytes(d.norm) + vec_bytes(d.hc_head_fn) +
         vec_bytes(d.hc_head_base) + vec_bytes(d.hc_head_scale) + d.markov_w1.bytes() + d.markov_w2.bytes() +
         vec_bytes(d.confidence);
  }
  return n;
}

Status validate_config(const ModelConfig& c) {
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

Status validate_shard(const ModelConfig& c, const Shard& sh) {
  const int n = sh.size;
  if (n < 1 || sh.rank < 0 || sh.rank >= n) return invalid_argument("tensor parallel rank {} of {} is invalid", sh.rank, n);
  if (n == 1) return Status();
  auto divides = [&](int64_t v, const char* field) -> Status {
    if (v % n) return invalid_argument("--tensor-parallel-size {}: config {} = {} is not divisible by it", n, field, v);
    return Status();
  };
  TANDEM_RETURN_IF_ERROR(divides(c.num_attention_heads, "num_attention_heads"));
  TANDEM_RETURN_IF_ERROR(divides(c.o_groups, "o_groups"));
  TANDEM_RETURN_IF_ERROR(divides(c.index_n_heads, "index_n_heads"));
  TANDEM_RETURN_IF_ERROR(divides(c.n_routed_experts, "n_routed_experts"));
  if ((static_cast<int64_t>(c.o_groups) / n * c.o_lora_rank) % 128)
    return invalid_argument("--tensor-parallel-size {}: each rank's share of o_groups * o_lora_rank ({}) must be a "
                            "multiple of 128 (the activation blocks of wo_b)", n,
                            static_cast<int64_t>(c.o_groups) / n * c.o_lora_rank);
  if (c.vocab_size < n) return invalid_argument("--tensor-parallel-size {}: vocab_size {} is smaller", n, c.vocab_size);
  return Status();
}

Result<Weights> load_weights(const ModelConfig& c, const std::vector<const TensorView*>& tensors, bool load_draft,
                             LoadCounts& counts, const Shard& shard) {
  TANDEM_RETURN_IF_ERROR(validate_config(c));
  TANDEM_RETURN_IF_ERROR(validate_shard(c, shard));
  counts = LoadCounts();
  Loader ld(tensors, counts);
  Weights w;
  w.shard = shard;
  const int64_t V = c.vocab_size, D = c.hidden_size;
  const int64_t part = (V + shard.size - 1) / shard.size;
  w.vocab_begin = std::min<int64_t>(V, shard.rank * part);
  w.vocab_end = std::min<int64_t>(V, w.vocab_begin + part);
  const Slice vocab{w.vocab_begin, w.vocab_end - w.vocab_begin};
  w.embed = ld.linear("embed", V, D, true, shard.size > 1 ? vocab : Slice{});
  if (c.tie_word_embeddings) {
    w.head.out = w.embed.out;
    w.head.in = D;
    w.head.w = w.embed.w;
  } else {
    w.head = ld.linear("head", V, D, true, shard.size > 1 ? vocab : Slice{});
  }
  w.norm = ld.vec("norm.weight", {D});
  w.hc_head_fn = ld.vec("hc_head_fn", {c.hc_mult, c.hc_dim()});
  w.hc_head_base = ld.vec("hc_head_base", {c.hc_mult});
  w.hc_head_scale = ld.vec("hc_head_scale", {1});
  w.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers && ld.status().ok(); ++l)
    load_block(ld, "layers." + std::to_string(l) + ".", c, l, c.compress_ratios[l], c.is_hash_layer(l), shard,
               w.layers[l]);
  if (c.has_dspark() && load_draft) {
    w.has_draft = true;
    DraftW& d = w.draft;
    d.stages.resize(c.num_draft_stages);
    for (int s = 0; s < c.num_draft_stages && ld.status().ok(); ++s)
      load_block(ld, "mtp." + std::to_string(s) + ".", c, c.num_hidden_layers + s, 0, false, shard, d.stages[s]);
    const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
    d.main_proj = ld.linear("mtp.0.main_proj", D, D * nt);
    d.main_norm = ld.vec("mtp.0.main_norm.weight", {D});
    const std::string last = "mtp." + std::to_string(c.num_draft_stages - 1) + ".";
    d.norm = ld.vec(last + "norm.weight", {D});
    d.hc_head_fn = ld.vec(last + "hc_head_fn", {c.hc_mult, c.hc_dim()});
    d.hc_head_base = ld.vec(last + "hc_head_base", {c.hc_mult});
    d.hc_head_scale = ld.vec(last + "hc_head_scale", {1});
    d.markov_w1 = ld.linear(last + "markov_head.markov_w1", V, c.dspark_markov_rank, true);
    d.markov_w2 = ld.linear(last + "markov_head.markov_w2", V, c.dspark_markov_rank, true);
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
