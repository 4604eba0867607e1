// The synthetic-weight builder (synthetic_weights.h). It walks the model structure as the upload
// of a checkpoint does (cuda_weights.cpp) and the loader binds it (model/weights.cpp), but every
// tensor comes from the rank's plan (shape and stored dtype) and is generated in place; each
// catalog name it generates is ticked off, and a held tensor left over is an error, so the walk
// provably covers the whole catalog slice.
#include "model/cuda/synthetic_weights.h"

#include <cmath>
#include <set>

#include "common/check.h"
#include "model/cuda/synthetic_fill.h"

namespace tandem::cuda_model {
namespace {

using kernels::WeightFormat;
using synth::Fill;
using synth::FillArgs;

class Builder {
 public:
  Builder(const ModelConfig& c, const model::ShardPlan& plan, uint8_t* base, uint64_t seed, cudaStream_t s)
      : c_(c), plan_(plan), base_(base), seed_(seed), s_(s) {}

  Status status() const { return status_; }
  size_t used() const { return used_; }
  const std::set<std::string>& made() const { return made_; }

  DWeights all() {
    DWeights d;
    const model::TensorSlice* e = held("embed.weight");
    if (!e) return d;
    d.vocab_begin = e->kind == model::SliceKind::kRows ? e->begin : 0;
    d.vocab_end = d.vocab_begin + e->local.shape[0];
    d.embed = lin("embed", 1.0f);
    if (c_.tie_word_embeddings) {
      d.head = d.embed;
    } else {
      d.head = lin("head");
    }
    d.norm = vec("norm.weight", 1.0f, 0.02f);
    d.hc_head_fn = vec("hc_head_fn", 0.0f, hc_fn_std());
    d.hc_head_base = vec("hc_head_base", 0.0f, 0.5f);
    d.hc_head_scale = vec("hc_head_scale", 1.0f, 0.1f);
    for (int l = 0; l < c_.num_hidden_layers; ++l)
      d.layers.push_back(block("layers." + std::to_string(l) + ".", c_.compress_ratios[l], c_.is_hash_layer(l)));
    const model::TensorSlice* draft = plan_.find("mtp.0.attn_norm.weight");
    d.has_draft = c_.has_dspark() && draft && draft->held();
    if (d.has_draft) {
      DDraft& g = d.draft;
      for (int s = 0; s < c_.num_draft_stages; ++s) g.stages.push_back(block("mtp." + std::to_string(s) + ".", 0, false));
      g.main_proj = lin("mtp.0.main_proj");
      g.main_norm = vec("mtp.0.main_norm.weight", 1.0f, 0.02f);
      const std::string last = "mtp." + std::to_string(c_.num_draft_stages - 1) + ".";
      g.norm = vec(last + "norm.weight", 1.0f, 0.02f);
      g.hc_head_fn = vec(last + "hc_head_fn", 0.0f, hc_fn_std());
      g.hc_head_base = vec(last + "hc_head_base", 0.0f, 0.5f);
      g.hc_head_scale = vec(last + "hc_head_scale", 1.0f, 0.1f);
      g.markov_w1 = lin(last + "markov_head.markov_w1", 1.0f);
      g.markov_w2 = lin(last + "markov_head.markov_w2");
      g.confidence = vec(last + "confidence_head.proj.weight", 0.0f,
                         1.0f / std::sqrt(static_cast<float>(c_.hidden_size + c_.dspark_markov_rank)));
    }
    return d;
  }

 private:
  float hc_fn_std() const { return 1.0f / std::sqrt(static_cast<float>(c_.hc_dim())); }

  void fail(Status st) {
    if (status_.ok()) status_ = std::move(st);
  }
  const model::TensorSlice* held(const std::string& name) {
    const model::TensorSlice* t = plan_.find(name);
    if (!t || !t->held()) {
      fail(make_error(StatusCode::kInternal, "synthetic weights: {} is not a tensor this rank holds", name));
      return nullptr;
    }
    made_.insert(name);
    return t;
  }
  void* alloc(size_t bytes) {
    const size_t off = (used_ + 255) / 256 * 256;
    used_ = off + bytes;
    return base_ ? base_ + off : nullptr;
  }
  uint64_t seed_of(const std::string& name) const { return synth::hash(seed_, synth::name_seed(name.c_str())); }
  void gen(void* out, int64_t n, FillArgs a) {
    if (!base_ || n == 0) return;
    a.out = out;
    a.n = n;
    synth::fill(a, s_);
  }
  // The E8M0 byte of a power-of-two scale that turns codes of std `code_std` into values of std
  // `stdev` (rounded up; the fill's random bit halves half of the blocks).
  static int scale_byte(float stdev, float code_std) {
    return 127 + static_cast<int>(std::ceil(std::log2(static_cast<double>(stdev) / code_std)));
  }

  // The linear `<prefix>.weight` (+ `.scale`) in its stored format. stdev_abs > 0: that std,
  // else 1/sqrt(fan-in of the whole tensor), so a row-parallel slice sums to unit size over ranks.
  DLinear lin(const std::string& prefix, float stdev_abs = 0.0f) {
    DLinear d;
    const model::TensorSlice* t = held(prefix + ".weight");
    if (!t) return d;
    const bool fp4 = t->local.dtype == DType::kI8;
    const int64_t out = t->local.shape[0], in = t->local.shape[1] * (fp4 ? 2 : 1);
    const int64_t fan = t->tensor->shape[1] * (fp4 ? 2 : 1);
    const float stdev = stdev_abs > 0 ? stdev_abs : 1.0f / std::sqrt(static_cast<float>(fan));
    const uint64_t sd = seed_of(prefix);
    d.out = out;
    d.in = in;
    d.w.n = out;
    d.w.k = in;
    FillArgs a;
    a.seed = sd;
    switch (t->local.dtype) {
      case DType::kF8E4M3:
      case DType::kI8: {
        const model::TensorSlice* sc = held(prefix + ".scale");
        if (!sc) return d;
        d.w.format = fp4 ? WeightFormat::kMxfp4 : WeightFormat::kFp8Block;
        d.act_quant = true;
        const int64_t data_bytes = fp4 ? out * in / 2 : out * in;
        void* data = alloc(static_cast<size_t>(data_bytes));
        a.kind = fp4 ? Fill::kFp4 : Fill::kFp8;
        gen(data, data_bytes, a);
        int64_t ns = 1;
        for (int64_t x : sc->local.shape) ns *= x;
        void* scale = alloc(static_cast<size_t>(ns));
        FillArgs sa;
        sa.seed = sd + 1;
        sa.kind = Fill::kE8M0;
        sa.e8m0 = scale_byte(stdev, fp4 ? 2.0f : 16.0f);
        gen(scale, ns, sa);
        d.w.data = data;
        d.w.scale = static_cast<const uint8_t*>(scale);
        break;
      }
      case DType::kBF16: {
        d.w.format = WeightFormat::kBf16;
        void* data = alloc(static_cast<size_t>(out * in * 2));
        a.kind = Fill::kBf16;
        a.stdev = stdev;
        gen(data, out * in, a);
        d.w.data = data;
        break;
      }
      default: {
        d.w.format = WeightFormat::kF32;
        void* data = alloc(static_cast<size_t>(out * in * 4));
        a.kind = Fill::kF32Exact;
        a.stdev = stdev;
        gen(data, out * in, a);
        d.w.data = data;
        break;
      }
    }
    return d;
  }

  // A vector (norm, mHC, sink, ape, bias, confidence) as fp32, bf16-exact where the file stores bf16.
  const float* vec(const std::string& name, float mean, float stdev) {
    const model::TensorSlice* t = held(name);
    if (!t) return nullptr;
    int64_t n = 1;
    for (int64_t x : t->local.shape) n *= x;
    void* out = alloc(static_cast<size_t>(n * 4));
    FillArgs a;
    a.seed = seed_of(name);
    a.kind = t->local.dtype == DType::kBF16 ? Fill::kF32 : Fill::kF32Exact;
    a.mean = mean;
    a.stdev = stdev;
    gen(out, n, a);
    return static_cast<const float*>(out);
  }

  // This rank's routed experts' `which` matrix (w1 / w2 / w3) concatenated by rows: one fill over
  // all of them (every expert distinct: the index runs over the whole array).
  kernels::WeightRef experts(const std::string& p, const char* which, int64_t eb, int64_t ee, bool& act_quant) {
    kernels::WeightRef r;
    const auto name = [&](int64_t e, const char* what) {
      return p + "ffn.experts." + std::to_string(e) + "." + which + "." + what;
    };
    const model::TensorSlice* t = held(name(eb, "weight"));
    if (!t) return r;
    const bool fp4 = t->local.dtype == DType::kI8, fp8 = t->local.dtype == DType::kF8E4M3;
    const int64_t out = t->local.shape[0], in = t->local.shape[1] * (fp4 ? 2 : 1), E = ee - eb;
    if (fp8 && out % 128) {
      fail(invalid_argument("{}: FP8 expert with {} rows (the CUDA runner needs multiples of 128)", name(eb, "weight"), out));
      return r;
    }
    for (int64_t e = eb; e < ee; ++e) {
      held(name(e, "weight"));
      if (fp4 || fp8) held(name(e, "scale"));
    }
    act_quant = fp4 || fp8;
    r.n = out * E;
    r.k = in;
    const float stdev = 1.0f / std::sqrt(static_cast<float>(in));
    FillArgs a;
    a.seed = seed_of(p + "ffn.experts." + which);
    if (fp4 || fp8) {
      r.format = fp4 ? WeightFormat::kMxfp4 : WeightFormat::kFp8Block;
      const int64_t data_bytes = E * (fp4 ? out * in / 2 : out * in);
      void* data = alloc(static_cast<size_t>(data_bytes));
      a.kind = fp4 ? Fill::kFp4 : Fill::kFp8;
      gen(data, data_bytes, a);
      const int64_t ns = E * (fp4 ? out * (in / 32) : (out / 128) * ((in + 127) / 128));
      void* scale = alloc(static_cast<size_t>(ns));
      FillArgs sa;
      sa.seed = a.seed + 1;
      sa.kind = Fill::kE8M0;
      sa.e8m0 = scale_byte(stdev, fp4 ? 2.0f : 16.0f);
      gen(scale, ns, sa);
      r.data = data;
      r.scale = static_cast<const uint8_t*>(scale);
    } else {
      r.format = WeightFormat::kBf16;
      void* data = alloc(static_cast<size_t>(E * out * in * 2));
      a.kind = Fill::kBf16;
      a.stdev = stdev;
      gen(data, E * out * in, a);
      r.data = data;
    }
    return r;
  }

  DComp comp(const std::string& p, int ratio, int head_dim, bool rotate) {
    DComp d;
    d.ratio = ratio;
    d.head_dim = head_dim;
    d.overlap = ratio == 4;
    d.rotate = rotate;
    d.wkv = lin(p + ".wkv");
    d.wgate = lin(p + ".wgate");
    d.wkv.act_quant = d.wgate.act_quant = false;  // fp32 GEMMs in the reference
    d.ape = vec(p + ".ape", 0.0f, 0.1f);
    d.norm = vec(p + ".norm.weight", 1.0f, 0.02f);
    return d;
  }

  DBlock block(const std::string& p, int ratio, bool hash) {
    const int n = plan_.shard.size, r = plan_.shard.rank;
    DBlock d;
    d.ratio = ratio;
    d.attn_norm = vec(p + "attn_norm.weight", 1.0f, 0.02f);
    d.ffn_norm = vec(p + "ffn_norm.weight", 1.0f, 0.02f);
    d.hc_attn_fn = vec(p + "hc_attn_fn", 0.0f, hc_fn_std());
    d.hc_attn_base = vec(p + "hc_attn_base", 0.0f, 0.5f);
    d.hc_attn_scale = vec(p + "hc_attn_scale", 1.0f, 0.1f);
    d.hc_ffn_fn = vec(p + "hc_ffn_fn", 0.0f, hc_fn_std());
    d.hc_ffn_base = vec(p + "hc_ffn_base", 0.0f, 0.5f);
    d.hc_ffn_scale = vec(p + "hc_ffn_scale", 1.0f, 0.1f);
    DAttn& a = d.attn;
    a.n_heads = c_.num_attention_heads / n;
    a.n_groups = c_.o_groups / n;
    a.attn_sink = vec(p + "attn.attn_sink", 0.0f, 1.0f);
    a.wq_a = lin(p + "attn.wq_a");
    a.q_norm = vec(p + "attn.q_norm.weight", 1.0f, 0.02f);
    a.wq_b = lin(p + "attn.wq_b");
    a.wkv = lin(p + "attn.wkv");
    a.kv_norm = vec(p + "attn.kv_norm.weight", 1.0f, 0.02f);
    a.wo_a = lin(p + "attn.wo_a");
    a.wo_a.act_quant = false;  // a bf16 grouped einsum in the reference (FP8 exponents in range: kept as stored)
    a.wo_b = lin(p + "attn.wo_b");
    if (ratio != 0) {
      a.has_compressor = true;
      a.comp = comp(p + "attn.compressor", ratio, c_.head_dim, false);
      if (ratio == 4) {
        a.has_indexer = true;
        a.n_idx_heads = c_.index_n_heads / n;
        a.idx_wq_b = lin(p + "attn.indexer.wq_b");
        a.idx_wproj = lin(p + "attn.indexer.weights_proj");
        a.idx_wproj.act_quant = false;
        a.icomp = comp(p + "attn.indexer.compressor", 4, c_.index_head_dim, true);
      }
    }
    DMoE& m = d.ffn;
    m.hash = hash;
    m.gate = lin(p + "ffn.gate");
    m.gate.act_quant = false;  // fp32 GEMM in the reference
    if (hash) {
      const std::string name = p + "ffn.gate.tid2eid";
      const model::TensorSlice* t = held(name);
      if (t) {
        const int64_t rows = t->local.shape[0], k = t->local.shape[1];
        void* ids = alloc(static_cast<size_t>(rows * k * 4));
        FillArgs ia;
        ia.seed = seed_of(name);
        ia.kind = Fill::kExpertIds;
        ia.cols = k;
        ia.modulo = c_.n_routed_experts;
        gen(ids, rows * k, ia);
        m.tid2eid = static_cast<const int32_t*>(ids);
      }
    } else {
      m.bias = vec(p + "ffn.gate.bias", 0.0f, 0.01f);
    }
    const int64_t per = c_.n_routed_experts / n;
    m.expert_begin = static_cast<int>(r * per);
    m.n_local = static_cast<int>(per);
    bool aq1 = false, aq2 = false, aq3 = false;
    m.w1_all = experts(p, "w1", m.expert_begin, m.expert_begin + per, aq1);
    m.w2_all = experts(p, "w2", m.expert_begin, m.expert_begin + per, aq2);
    m.w3_all = experts(p, "w3", m.expert_begin, m.expert_begin + per, aq3);
    m.up_act_quant = aq1;
    m.down_act_quant = aq2;
    // The grouped prefill path (moe_prefill.h) as a checkpoint's MXFP4 experts take it: the fill's
    // E8M0 scales span one binade (Fill::kE8M0), well inside the 11 mxfp4_blocks_fit_e4m3 allows.
    m.grouped = aq1 && aq2 && aq3 && m.w1_all.format == WeightFormat::kMxfp4 &&
                m.w2_all.format == WeightFormat::kMxfp4 && m.w3_all.format == WeightFormat::kMxfp4 &&
                c_.hidden_size % 128 == 0 && c_.moe_intermediate_size % 128 == 0;
    m.sh_w1 = lin(p + "ffn.shared_experts.w1");
    m.sh_w2 = lin(p + "ffn.shared_experts.w2");
    m.sh_w3 = lin(p + "ffn.shared_experts.w3");
    return d;
  }

  const ModelConfig& c_;
  const model::ShardPlan& plan_;
  uint8_t* base_;
  uint64_t seed_;
  cudaStream_t s_;
  size_t used_ = 0;
  std::set<std::string> made_;
  Status status_;
};

}  // namespace

Result<SyntheticBuild> build_synthetic_weights(const ModelConfig& config, const model::ShardPlan& plan, uint8_t* arena,
                                               uint64_t seed, cudaStream_t stream) {
  Builder b(config, plan, arena, seed, stream);
  SyntheticBuild out;
  out.w = b.all();
  TANDEM_RETURN_IF_ERROR(b.status());
  // Every tensor of this rank's catalog slice generated, nothing else.
  for (const model::TensorSlice& t : plan.slices) {
    if (t.held() && !b.made().count(t.tensor->name))
      return make_error(StatusCode::kInternal, "synthetic weights: catalog tensor {} was not generated", t.tensor->name);
  }
  out.tensors = static_cast<int64_t>(b.made().size());
  if (out.tensors != plan.held_tensors)
    return make_error(StatusCode::kInternal, "synthetic weights: {} tensors generated, the plan holds {}", out.tensors,
                      plan.held_tensors);
  for (const std::string& n : b.made()) out.target_tensors += n.rfind("mtp.", 0) != 0;
  out.arena_bytes = static_cast<int64_t>(b.used());
  return out;
}

}  // namespace tandem::cuda_model
