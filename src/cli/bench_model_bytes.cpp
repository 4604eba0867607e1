// bench-model's accounting (bench_model.h): the bytes one step reads by op class (this rank's
// weights actually touched, from the per-rank tensor plan and the step's routing, plus the KV
// records, indexer keys and draft context the sequences read), the op-class split of a traced graph
// replay against those bytes and the measured copy bandwidth, the distinct experts per layer, and
// the targets of the performance issues with the measured values.
#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "cli/bench_model.h"
#include "model/cuda/cuda_impl.h"

namespace tandem::bench_model {
namespace {

using nlohmann::json;

bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// The op class (CudaModel::op_class_name) whose launches read a tensor; "" = not read by the step
// kind (the target step reads layers.* and the globals, the draft reads mtp.* and the LM head).
std::string class_of(const std::string& name, bool draft) {
  std::string local = name;
  const bool mtp = starts(name, "mtp."), layer = starts(name, "layers.");
  if (mtp || layer) {
    const size_t dot = name.find('.', name.find('.') + 1);
    local = name.substr(dot + 1);
  }
  if (mtp != draft && (mtp || layer)) return "";
  if (!mtp && !layer) {
    if (local == "embed.weight") return "embedding";
    if (local == "head.weight") return "lm_head";
    return draft ? "" : "lm_head";  // the target's final norm and hc_head (the draft has its own)
  }
  if (starts(local, "main_proj") || starts(local, "main_norm")) return "";  // draft context insertion
  if (starts(local, "markov_head") || starts(local, "confidence_head") || local == "norm.weight" ||
      starts(local, "hc_head_"))
    return "lm_head";
  if (starts(local, "attn_norm") || starts(local, "ffn_norm") || starts(local, "hc_attn_") || starts(local, "hc_ffn_"))
    return "mhc_and_norms";
  if (local == "attn.attn_sink") return "attention";
  if (starts(local, "attn.compressor.") || starts(local, "attn.indexer.compressor.")) return "compressor";
  if (starts(local, "attn.indexer.")) return "indexer_and_topk";
  if (starts(local, "attn.")) return "dense_projections";
  if (starts(local, "ffn.gate")) return "router";
  if (starts(local, "ffn.shared_experts.")) return "shared_experts";
  if (starts(local, "ffn.experts.")) return "routed_experts";
  return "other";
}

// Device bytes of a held tensor: vectors are fp32 on the device, expert tables int32.
double device_bytes(const model::TensorSlice& t) {
  double n = 1;
  for (int64_t d : t.local.shape) n *= static_cast<double>(d);
  const std::string& name = t.tensor->name;
  if (t.local.dtype == DType::kI64) return n * 4;
  if (t.local.dtype == DType::kBF16 && (t.local.shape.size() == 1 || name.find("confidence_head") != std::string::npos))
    return n * 4;
  return static_cast<double>(t.bytes());
}

}  // namespace

json distinct_experts(const Bench& b, const std::vector<int32_t>& routing, int64_t rows) {
  const int64_t K = b.cfg.num_experts_per_tok;
  if (rows == 0 || routing.empty()) return nullptr;
  const int64_t layers = static_cast<int64_t>(routing.size()) / (rows * K);
  const int64_t per = b.cfg.n_routed_experts / b.a.tp_size, lo = b.a.rank * per, hi = lo + per;
  json global = json::array(), local = json::array();
  double gsum = 0, lsum = 0;
  for (int64_t l = 0; l < layers; ++l) {
    std::set<int32_t> g, m;
    for (int64_t i = 0; i < rows * K; ++i) {
      const int32_t e = routing[l * rows * K + i];
      g.insert(e);
      if (e >= lo && e < hi) m.insert(e);
    }
    global.push_back(g.size());
    local.push_back(m.size());
    gsum += static_cast<double>(g.size());
    lsum += static_cast<double>(m.size());
  }
  return {{"per_layer", global}, {"per_layer_this_rank", local}, {"mean_per_layer", gsum / layers},
          {"mean_per_layer_this_rank", lsum / layers}, {"per_step", gsum}, {"per_step_this_rank", lsum},
          {"pairs_per_layer", rows * K}};
}

json step_bytes(const Bench& b, const StepShape& s, const std::vector<int32_t>& routing, int64_t rows) {
  const ModelConfig& c = b.cfg;
  const int64_t K = c.num_experts_per_tok, D = c.hidden_size;
  std::map<std::string, double> by;
  // This rank's experts touched per layer (target layers, or draft stages after them).
  const int64_t per = c.n_routed_experts / b.a.tp_size, lo = b.a.rank * per, hi = lo + per;
  std::map<std::string, std::set<int32_t>> touched;  // block prefix -> expert ids
  const int64_t blocks = rows > 0 ? static_cast<int64_t>(routing.size()) / (rows * K) : 0;
  for (int64_t l = 0; l < blocks; ++l) {
    const std::string prefix = s.draft ? "mtp." + std::to_string(l) + "." : "layers." + std::to_string(l) + ".";
    auto& set = touched[prefix];
    for (int64_t i = 0; i < rows * K; ++i) {
      const int32_t e = routing[l * rows * K + i];
      if (e >= lo && e < hi) set.insert(e);
    }
  }
  double weights = 0;
  for (const model::TensorSlice& t : b.plan.slices) {
    if (!t.held()) continue;
    const std::string& name = t.tensor->name;
    const std::string cls = class_of(name, s.draft);
    if (cls.empty()) continue;
    double bytes = device_bytes(t);
    if (cls == "routed_experts") {
      const size_t e0 = name.find("ffn.experts.") + 12;
      const int32_t e = static_cast<int32_t>(std::stoi(name.substr(e0, name.find('.', e0) - e0)));
      const std::string prefix = name.substr(0, name.find("ffn.experts."));
      auto it = touched.find(prefix);
      if (it == touched.end() || !it->second.count(e)) continue;
    } else if (cls == "embedding") {
      bytes = static_cast<double>(rows) * D * 2;  // the rows looked up
    } else if (name.find("tid2eid") != std::string::npos) {
      bytes = static_cast<double>(rows) * K * 4;
    } else if (name.find("markov_w1") != std::string::npos) {
      bytes = static_cast<double>(rows) * c.dspark_markov_rank * 2;
    }
    by[cls] += bytes;
    weights += bytes;
  }
  // KV state each sequence reads (unique records; this step's own rows come from scratch).
  ModelOptions o;
  auto kv = parse_kv_dtype(b.a.kv_dtype);
  o.kv_dtype = kv.ok() ? *kv : KvDtype::kFp8;
  const auto lay = cuda_model::plan_layout(c, o, false);
  const int64_t W = c.sliding_window, end = s.context + s.tokens;
  double kvb = 0;
  auto add = [&](const char* cls, double bytes) {
    by[cls] += bytes * s.batch;
    kvb += bytes * s.batch;
  };
  if (s.draft) {
    add("attention", static_cast<double>(c.num_draft_stages) * std::min<int64_t>(W, s.context) * lay.rec.bytes);
  } else {
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const int r = c.compress_ratios[l];
      add("attention", static_cast<double>(std::min<int64_t>(W, s.context)) * lay.rec.bytes);
      if (r == 4) {
        add("attention", static_cast<double>(std::min<int64_t>(c.index_topk, end / 4)) * lay.rec.bytes);
        add("indexer_and_topk", static_cast<double>(end / 4) * lay.key.bytes);
      } else if (r) {
        add("attention", static_cast<double>(end / r) * lay.rec.bytes);
      }
    }
  }
  json cls = json::object();
  double total = 0;
  for (const auto& [k, v] : by) {
    cls[k] = v;
    total += v;
  }
  return {{"total", total}, {"weights", weights}, {"kv_state", kvb}, {"by_class", cls},
          {"note", "unique bytes: this rank's weights the step reads (routed experts: the distinct experts routed "
                   "to this rank), the KV records / indexer keys each sequence reads at its context"}};
}

json class_breakdown(const Bench& b, const CudaModel::StepProfile& prof,
                     const std::vector<kernels::cuda::ActivityRecord>& recs, const json& bytes, double step_us) {
  if (recs.empty()) return {{"available", false}, {"reason", b.cupti ? std::string("no CUPTI records") : b.cupti_status}};
  std::vector<const kernels::cuda::ActivityRecord*> ks, cs;
  for (const auto& r : recs) (r.kernel ? ks : cs).push_back(&r);
  auto cls_at = [&](int idx, bool kernel) {
    std::string c = "unmarked";
    for (const CudaModel::ClassMark& m : prof.marks) {
      if ((kernel ? m.kernel_index : m.copy_index) > idx) break;
      c = CudaModel::op_class_name(m.cls);
    }
    return c;
  };
  struct Acc {
    int kernels = 0, copies = 0;
    double kernel_us = 0, copy_us = 0, critical_us = 0;
  };
  struct Name {
    int count = 0;
    double us = 0, critical_us = 0;
  };
  // A record's share of the critical path: how far it moves the latest end seen so far (records in
  // start order). With programmatic dependent launch a kernel starts before its predecessor ends and
  // waits, so its own duration overstates it; the shares sum to the span.
  std::map<const kernels::cuda::ActivityRecord*, double> critical;
  uint64_t latest = recs.empty() ? 0 : recs.front().start_ns;
  for (const auto& r : recs) {
    critical[&r] = r.end_ns > latest ? static_cast<double>(r.end_ns - latest) * 1e-3 : 0.0;
    latest = std::max(latest, r.end_ns);
  }
  std::map<std::string, Acc> by;
  std::map<std::string, Name> names;
  double kernel_us = 0, copy_us = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    const double us = static_cast<double>(ks[i]->end_ns - ks[i]->start_ns) * 1e-3;
    Acc& a = by[cls_at(static_cast<int>(i), true)];
    ++a.kernels;
    a.kernel_us += us;
    a.critical_us += critical[ks[i]];
    kernel_us += us;
    Name& n = names[ks[i]->name.substr(0, 120)];
    ++n.count;
    n.us += us;
    n.critical_us += critical[ks[i]];
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    const double us = static_cast<double>(cs[i]->end_ns - cs[i]->start_ns) * 1e-3;
    Acc& a = by[cls_at(static_cast<int>(i), false)];
    ++a.copies;
    a.copy_us += us;
    a.critical_us += critical[cs[i]];
    copy_us += us;
  }
  const double span_us = static_cast<double>(recs.back().end_ns - recs.front().start_ns) * 1e-3;
  json out = {{"available", true},
              {"kernel_records", ks.size()},
              {"copy_records", cs.size()},
              {"mapping_exact", static_cast<int>(ks.size()) == prof.kernels && static_cast<int>(cs.size()) == prof.copies},
              {"kernel_us", kernel_us},
              {"copy_us", copy_us},
              {"span_us", span_us},
              {"gap_us", span_us - kernel_us - copy_us},
              {"kernel_fraction_of_span", span_us > 0 ? kernel_us / span_us : 0.0},
              {"step_us", step_us}};
  const json& cb = bytes.value("by_class", json::object());
  for (const auto& [name, a] : by) {
    const double byt = cb.value(name, 0.0), us = a.kernel_us + a.copy_us;
    const double rate = us > 0 ? byt / (us * 1e-6) : 0;
    out["by_class"][name] = {{"kernels", a.kernels}, {"kernel_us", a.kernel_us}, {"copies", a.copies},
                             {"copy_us", a.copy_us}, {"critical_us", a.critical_us}, {"bytes", byt}, {"bytes_per_s", rate},
                             {"bandwidth_fraction", b.copy_bw > 0 ? rate / b.copy_bw : 0.0}};
  }
  out["critical_note"] =
      "critical_us: each record's share of the span, how far its end moves the latest end of the records started "
      "before it (a kernel waiting on its predecessor under programmatic dependent launch counts only past that "
      "end); CUPTI's per-launch cost inflates every share against the untraced replay";
  std::vector<std::pair<double, std::string>> top, top_critical;
  for (const auto& [n, v] : names) {
    top.push_back({v.us, n});
    top_critical.push_back({v.critical_us, n});
  }
  std::sort(top.rbegin(), top.rend());
  std::sort(top_critical.rbegin(), top_critical.rend());
  auto entry = [&](const std::string& n) {
    const Name& v = names[n];
    return json{{"name", n}, {"us", v.us}, {"critical_us", v.critical_us}, {"count", v.count}};
  };
  for (size_t i = 0; i < std::min<size_t>(top.size(), 12); ++i) out["top_kernels"].push_back(entry(top[i].second));
  for (size_t i = 0; i < std::min<size_t>(top_critical.size(), 40); ++i)
    out["top_kernels_critical"].push_back(entry(top_critical[i].second));
  return out;
}

json targets(const Bench& b) {
  json t = json::array();
  auto add = [&](int issue, const std::string& what, double limit, double measured, const char* unit, bool lower_better,
                 const std::string& note = "") {
    json r = {{"issue", issue}, {"target", what}, {"limit", limit}, {"unit", unit}};
    if (measured < 0) {
      r["measured"] = nullptr;
      r["met"] = nullptr;
    } else {
      r["measured"] = measured;
      r["met"] = lower_better ? measured <= limit : measured >= limit;
    }
    if (!note.empty()) r["note"] = note;
    t.push_back(std::move(r));
  };
  // The bytes floor of a timed step: its unique bytes at the measured copy bandwidth (a target
  // below it cannot be met by any kernel on this rank's sharding).
  auto floor = [&](double bytes, double per = 1.0) {
    if (bytes <= 0 || b.copy_bw <= 0 || t.empty()) return;
    t.back()["bytes"] = bytes;
    t.back()["floor"] = bytes / b.copy_bw * 1e6 / per;
    t.back()["floor_note"] = per == 1.0 ? "bytes / copy bandwidth, us" : "bytes / copy bandwidth over the batch-1 step's floor";
  };
  const double b1_floor_us = b.decode_b1_bytes > 0 && b.copy_bw > 0 ? b.decode_b1_bytes / b.copy_bw * 1e6 : -1;
  add(23, "batch-1 decode step per rank (collective stand-ins included)", 1800, b.decode_b1_us, "us", true);
  floor(b.decode_b1_bytes);
  add(23, "kernels per batch-1 decode step", 150, b.kernels_b1, "kernels", true);
  add(23, "verify step of 6 tokens / 1-token step at batch 1", 1.3,
      b.verify_b1_us > 0 && b.decode_b1_us > 0 ? b.verify_b1_us / b.decode_b1_us : -1, "x", true);
  floor(b.verify_b1_bytes, b1_floor_us);
  add(23, "batch 8 x 6 tokens / batch-1 1-token step", 2.5,
      b.verify_b8_us > 0 && b.decode_b1_us > 0 ? b.verify_b8_us / b.decode_b1_us : -1, "x", true);
  floor(b.verify_b8_bytes, b1_floor_us);
  add(23, "batch-16 decode step", 3000, b.decode_b16_us, "us", true);
  floor(b.decode_b16_bytes);
  add(23, "DSpark draft step (5 tokens) at batch 1", 250, b.draft_b1_us, "us", true);
  floor(b.draft_b1_bytes);
  add(23, "one MoE layer (router + routed + shared) at batch 1", 20, b.moe_layer_b1_us, "us", true,
      "kernel time of the MoE classes in one traced replay / layers");
  for (const char* cls : {"dense_projections", "routed_experts", "shared_experts", "lm_head", "compressor",
                          "indexer_and_topk", "attention"}) {
    const json& one = b.class_fraction_1row;
    const json& many = b.class_fraction_48rows;
    // The decode path's fused MoE (moe_decode) reads the shared expert inside its routed kernels, so
    // the traced step has no kernel of its own for that class: its bytes and time are routed_experts'.
    const std::string why =
        std::string(cls) == "shared_experts" ? "no separate kernel on the decode path: counted in routed_experts (moe_decode)" : "";
    add(23, std::string(cls) + ": fraction of copy bandwidth at 1 row", 0.8,
        one.contains(cls) ? one[cls].value("bandwidth_fraction", -1.0) : -1, "fraction", false,
        one.contains(cls) ? "" : why);
    add(23, std::string(cls) + ": fraction of copy bandwidth at 48 rows", 0.6,
        many.contains(cls) ? many[cls].value("bandwidth_fraction", -1.0) : -1, "fraction", false,
        many.contains(cls) ? "" : why);
  }
  add(23, "decode at 160K context / at 4K", 1.15, b.ctx_us[1] > 0 && b.ctx_us[0] > 0 ? b.ctx_us[1] / b.ctx_us[0] : -1,
      "x", true);
  add(23, "decode at 1M context / at 4K", 1.5, b.ctx_us[2] > 0 && b.ctx_us[0] > 0 ? b.ctx_us[2] / b.ctx_us[0] : -1, "x",
      true);
  add(23, "sampler inside the step's graph", 1, -1, "bool", false,
      "the serving runner's decode/verify graphs end with the sampling launch (CudaModel::forward_sample; "
      "test_cuda CudaSamplerGraph.*); bench-model's steps do not sample, so `tandem bench` shows its effect");
  const std::string sampler_note =
      "a launch inside a CUDA graph of repeated launches (`sampler[].graph_calls`; as in serving, the step "
      "graph's last node); `sampler` in the JSON also has one eager launch between two events (launch latency "
      "included)";
  add(23, "top-p sampling of 48 rows at the model's vocabulary", 100, b.sample_top_p_us, "us", true, sampler_note);
  add(23, "greedy sampling of 48 rows at the model's vocabulary", 20, b.sample_greedy_us, "us", true, sampler_note);
  add(23, "slot snapshots for prefix caching stay on the device", 1, b.snapshot_save_us > 0 && b.snapshot_load_us > 0,
      "bool", false,
      b.snapshot_save_us > 0
          ? fmt::format("{:.2f} MiB per slot: save {:.1f} us, load {:.1f} us device to device (host round trip: {:.0f} us)",
                        b.snapshot_bytes / 1048576.0, b.snapshot_save_us, b.snapshot_load_us, b.snapshot_host_us)
          : std::string("the snapshot section did not run"));
  add(24, "prefill throughput on 8K prompts", 40000, b.prefill_8k_tok_s, "tokens/s", false,
      "estimated from timed chunks (see prefill[].method)");
  add(24, "time to first token, uncached 160K prompt", 6, b.ttft_160k_s, "s", true, "estimated from timed chunks");
  add(24, "time to first token, uncached 1M prompt (aim)", 60, b.ttft_1m_s, "s", true, "estimated from timed chunks");
  return t;
}

}  // namespace tandem::bench_model

#endif  // TANDEM_HAVE_CUDA_RUNNER
