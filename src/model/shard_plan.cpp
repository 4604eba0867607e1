// The per-rank tensor plan (shard_plan.h): the loader's slicing rules (weights.cpp) restated on
// catalog names, so they hold for a checkpoint that is never read (synthetic weights, planning).
#include "model/shard_plan.h"

#include <algorithm>

namespace tandem::model {
namespace {

// "layers.3.attn.wq_b.weight" -> ("layers.3.", "attn.wq_b.weight"); globals have an empty prefix.
std::pair<std::string, std::string> split_block(const std::string& name) {
  for (const char* head : {"layers.", "mtp."}) {
    if (name.rfind(head, 0) != 0) continue;
    const size_t dot = name.find('.', std::string(head).size());
    if (dot == std::string::npos) break;
    return {name.substr(0, dot + 1), name.substr(dot + 1)};
  }
  return {"", name};
}

// The routed expert id of "ffn.experts.<e>.<w>.weight", or -1.
int64_t expert_id(const std::string& local) {
  const std::string head = "ffn.experts.";
  if (local.rfind(head, 0) != 0) return -1;
  const size_t dot = local.find('.', head.size());
  if (dot == std::string::npos) return -1;
  return std::stoll(local.substr(head.size(), dot - head.size()));
}

}  // namespace

std::pair<int64_t, int64_t> vocab_range(int64_t V, const Shard& sh) {
  const int64_t part = (V + sh.size - 1) / sh.size;
  const int64_t begin = std::min<int64_t>(V, sh.rank * part);
  return {begin, std::min<int64_t>(V, begin + part)};
}

const TensorSlice* ShardPlan::find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &slices[it->second];
}

Result<ShardPlan> plan_shard(const ModelConfig& c, const Catalog& catalog, const Shard& sh, bool load_draft) {
  TANDEM_RETURN_IF_ERROR(validate_shard(c, sh));
  ShardPlan plan;
  plan.shard = sh;
  plan.slices.reserve(catalog.tensors.size());
  const int n = sh.size;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, R = c.o_lora_rank;
  const int64_t Hl = H / n, Gl = c.o_groups / n, IHl = c.index_n_heads / n, El = c.n_routed_experts / n;
  const auto [vb, ve] = vocab_range(c.vocab_size, sh);
  const bool draft = c.has_dspark() && load_draft;
  size_t at = 0;  // position of the param's first stored tensor in catalog.tensors
  for (const ParamSpec& p : catalog.params) {
    const std::vector<TensorSpec> whole = expand_param(p, c);
    const auto [prefix, local] = split_block(p.name);
    SliceKind kind = SliceKind::kWhole;
    int64_t begin = 0, count = 0;
    bool partitioned = false;
    auto slice = [&](SliceKind k, int64_t b, int64_t cnt) {
      kind = k;
      begin = b;
      count = cnt;
      partitioned = true;
    };
    auto rows = [&](int64_t b, int64_t cnt) { slice(SliceKind::kRows, b, cnt); };
    if (prefix.rfind("mtp.", 0) == 0 && !draft) {
      kind = SliceKind::kSkipped;
    } else if (n > 1) {
      const int64_t e = expert_id(local);
      if (e >= 0) {
        partitioned = true;
        if (e < sh.rank * El || e >= (sh.rank + 1) * El) kind = SliceKind::kOtherRank;
      } else if (local == "attn.attn_sink") {
        rows(sh.rank * Hl, Hl);
      } else if (local == "attn.wq_b.weight") {
        rows(sh.rank * Hl * hd, Hl * hd);
      } else if (local == "attn.wo_a.weight") {
        rows(sh.rank * Gl * R, Gl * R);
      } else if (local == "attn.wo_b.weight") {
        slice(SliceKind::kCols, sh.rank * Gl * R, Gl * R);
      } else if (local == "attn.indexer.wq_b.weight") {
        rows(sh.rank * IHl * c.index_head_dim, IHl * c.index_head_dim);
      } else if (local == "attn.indexer.weights_proj.weight") {
        rows(sh.rank * IHl, IHl);
      } else if (prefix.empty() && (local == "embed.weight" || local == "head.weight")) {
        rows(vb, ve - vb);
      }
    }
    ParamSpec lp = p;
    if (kind == SliceKind::kRows) lp.shape[0] = count;
    if (kind == SliceKind::kCols) lp.shape[1] = count;
    const std::vector<TensorSpec> mine = expand_param(lp, c);
    for (size_t i = 0; i < whole.size(); ++i) {
      TensorSlice s;
      s.tensor = &catalog.tensors[at + i];
      s.kind = kind;
      s.begin = begin;
      s.count = count;
      s.local = mine[i];
      s.partitioned = partitioned;
      plan.index[s.tensor->name] = plan.slices.size();
      if (s.held()) {
        plan.held_tensors++;
        plan.held_bytes += s.bytes();
        (partitioned ? plan.sharded_bytes : plan.replicated_bytes) += s.bytes();
      } else if (kind == SliceKind::kOtherRank) {
        plan.other_rank_tensors++;
      } else {
        plan.skipped_tensors++;
      }
      plan.slices.push_back(std::move(s));
    }
    at += whole.size();
  }
  return plan;
}

}  // namespace tandem::model
