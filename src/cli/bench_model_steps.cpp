// bench-model's measurements (bench_model.h): step shapes (one eager step for the routing and the
// collective count, graph replays for the latency distribution, a CUPTI trace of one replay for the
// op classes), long-context decode, chunked prefill estimated from timed chunks, the sampler, and
// the device allocations of a 16-sequence load.
#ifdef TANDEM_HAVE_CUDA_RUNNER

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "cli/bench_model.h"
#include "cli/bench_timeline.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/sample_rows.h"
#include "kernels/cuda/timeline.cuh"

namespace tandem::bench_model {
namespace {

// Sequences 0..B-1 at a context: their block tables and the tokens of the next steps.
struct Seqs {
  std::vector<std::vector<int32_t>> tables, toks;
};

Status setup(Bench& b, int B, int64_t ctx, Seqs& s) {
  const int bps = b.blocks_for(ctx);
  s.tables.assign(B, {});
  s.toks.assign(B, {});
  for (int i = 0; i < B; ++i) {
    for (int k = 0; k < bps; ++k) s.tables[i].push_back(i * bps + k);
    TANDEM_RETURN_IF_ERROR(b.model->fill_synthetic_context(i, ctx, s.tables[i], b.a.seed * 1000003 + i));
    s.toks[i].resize(64);
    for (auto& t : s.toks[i]) t = b.token();
  }
  return Status();
}

StepBatch batch_of(Bench& b, const Seqs& s, int B, int n) {
  StepBatch sb;
  for (int i = 0; i < B; ++i)
    sb.seqs.push_back({i, b.model->slot_length(i), std::span<const int32_t>(s.toks[i].data(), static_cast<size_t>(n)),
                       s.tables[i], n == 1 ? LogitsMode::kLast : LogitsMode::kAll, false});
  return sb;
}

Status rollback_all(Bench& b, int B, int n) {
  for (int i = 0; i < B; ++i) TANDEM_RETURN_IF_ERROR(b.model->rollback(i, b.model->slot_length(i) - n));
  return Status();
}

nlohmann::json stats(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  auto q = [&](double f) { return v[std::min(v.size() - 1, static_cast<size_t>(f * (v.size() - 1) + 0.5))]; };
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  return {{"median", q(0.5)}, {"p10", q(0.1)}, {"p90", q(0.9)}, {"min", v.front()}, {"max", v.back()},
          {"mean", mean}, {"replays", v.size()}};
}

// Finite logits (and their spread) after the replays: the synthetic activations stayed sane.
nlohmann::json logit_check(const StepOutput& out, int64_t V) {
  const int64_t rows = out.num_logits_rows;
  int64_t nonfinite = 0;
  double sum = 0, sq = 0, mx = 0;
  for (int64_t i = 0; i < rows * V; ++i) {
    const float x = out.logits[i];
    if (!std::isfinite(x)) {
      ++nonfinite;
      continue;
    }
    sum += x;
    sq += static_cast<double>(x) * x;
    mx = std::max(mx, static_cast<double>(std::fabs(x)));
  }
  const double n = std::max<double>(1, static_cast<double>(rows * V - nonfinite));
  return {{"rows", rows}, {"nonfinite", nonfinite}, {"std", std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n)))},
          {"max_abs", mx}};
}

int reps_for(const Bench& b, double one_step_s) {
  const double r = b.a.shape_seconds / std::max(one_step_s, 1e-5);
  return static_cast<int>(std::clamp<double>(r, 3, b.a.reps));
}

// The report row of one profiled shape.
nlohmann::json row(Bench& b, const char* kind, const StepShape& shape, int64_t rows, int64_t collectives,
                   const CudaModel::StepProfile& prof, const std::vector<int32_t>& routing,
                   const std::vector<kernels::cuda::ActivityRecord>& recs, const std::string& trace_error) {
  const double med = prof.graph_us, comm = static_cast<double>(collectives) * b.a.collective_us;
  nlohmann::json r = {{"kind", kind}, {"batch", shape.batch}, {"tokens_per_seq", shape.tokens},
                      {"context", shape.context}, {"rows", rows}, {"kernels", prof.kernels}, {"copies", prof.copies},
                      {"collectives", collectives}, {"graph_us", stats(prof.graph_samples_us)},
                      {"eager_us_median", prof.eager_us}, {"comm_us", comm}, {"step_us_with_comm", med + comm}};
  for (const auto& p : kCollectivePaths) r["step_us_with_comm_by_path"][p.name] = med + collectives * p.us;
  r["distinct_experts"] = distinct_experts(b, routing, rows);
  const nlohmann::json bytes = step_bytes(b, shape, routing, rows);
  r["bytes_read"] = bytes;
  const double total = bytes.value("total", 0.0);
  r["bandwidth_fraction"] = b.copy_bw > 0 && med > 0 ? total / (med * 1e-6) / b.copy_bw : 0.0;
  r["classes"] = class_breakdown(b, prof, recs, bytes, med);
  if (!trace_error.empty()) r["classes"]["error"] = trace_error;
  std::printf("%-7s %5d %6d %8lld %7d %6d %5lld %10.1f %9.1f-%-9.1f %9.1f %8.3f %6.1f%%\n", kind, shape.batch,
              shape.tokens, static_cast<long long>(shape.context), prof.kernels, prof.copies,
              static_cast<long long>(collectives), med, r["graph_us"].value("p10", 0.0), r["graph_us"].value("p90", 0.0),
              med + comm, total / 1e9, 100.0 * r["bandwidth_fraction"].get<double>());
  return r;
}

void header(const char* what) {
  std::printf("\n%s\n%-7s %5s %6s %8s %7s %6s %5s %10s %19s %9s %8s %7s\n", what, "step", "batch", "tok", "context",
              "kernels", "copies", "coll", "graph us", "p10-p90 us", "+comm us", "GB read", "of bw");
}

// Each kernel's cost to the step: the replay with all its nodes removed against the whole one,
// largest first; the per-node share and what the kernels not listed (none removed) leave.
nlohmann::json ablation(const CudaModel::StepProfile& prof) {
  std::vector<const CudaModel::StepProfile::Ablation*> v;
  for (const auto& a : prof.ablation) v.push_back(&a);
  std::sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->saved_us > y->saved_us; });
  nlohmann::json rows = nlohmann::json::array();
  double sum = 0;
  std::printf("  ablation (graph %.1f us): kernel, nodes, step without them, saved, per node\n", prof.graph_us);
  for (const auto* a : v) {
    const double saved = a->saved_us;
    sum += saved;
    rows.push_back({{"kernel", a->kernel}, {"nodes", a->nodes}, {"graph_us_without", a->graph_us}, {"saved_us", saved},
                    {"per_node_us", saved / std::max(1, a->nodes)}});
    std::printf("  %-90.90s %5d %9.1f %8.1f %6.2f\n", a->kernel.c_str(), a->nodes, a->graph_us, saved,
                saved / std::max(1, a->nodes));
  }
  return {{"graph_us", prof.graph_us}, {"sum_saved_us", sum}, {"kernels", rows},
          {"note", "each kernel's nodes removed from the captured step (neighbours joined by the removed node's "
                   "outgoing edge; at a fork or join, each predecessor to each successor); saved_us: the median of (whole - without) over alternating replays, its cost to "
                   "the step, overlap included; the sum of the savings against graph_us shows how much the kernels "
                   "overlap. A kernel whose outputs steer later kernels through state shared by every layer is "
                   "measured with that state frozen: without the MoE gate + routing, every layer's experts run on "
                   "the last layer's routing (dec.moe is one buffer set), so its saving includes whatever routed "
                   "work that routing adds or removes"}};
}

// One layer's decode MoE inside the captured step `sb`: its three kernels' per-CTA phase marks
// (bench_timeline.h), from one graph replay with the instrument set, times in us
// from the gate kernel's dependency release. The same kernels alone: bench-kernels --only moe.
Result<nlohmann::json> moe_timeline(Bench& b, const StepBatch& sb, const StepShape& shape, int layer) {
  namespace timeline = kernels::cuda::timeline;
  const auto& kernels = bench_timeline::moe_kernels();
  const size_t words = kernels.size() * timeline::kCtas * timeline::kSlots;
  kernels::cuda::DeviceBuffer<uint64_t> buf(words);
  // The records of one replay (the hook's, after the timing): each CTA's marks, a different CTA
  // routing in each replay, so earlier replays' are cleared first.
  CudaModel::ReplayHook hook = [&](const std::function<void()>& replay) {
    TANDEM_CUDA_CHECK(cudaMemset(buf.get(), 0, words * sizeof(uint64_t)));
    replay();
  };
  b.model->set_moe_timeline(buf.get(), layer);
  auto prof = b.model->profile_step(sb, 5, nullptr, hook, 1);
  b.model->set_moe_timeline(nullptr, -1);
  TANDEM_RETURN_IF_ERROR(prof.status());
  TANDEM_RETURN_IF_ERROR(rollback_all(b, shape.batch, shape.tokens));
  std::vector<uint64_t> h(words);
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  nlohmann::json r = bench_timeline::report(h, kernels, "layer " + std::to_string(layer) + " inside the step", 1);
  r["layer"] = layer;
  r["step_graph_us"] = prof->graph_us;
  return r;
}

// Graph replays + a CUPTI trace of one replay for `sb`; the routing and collectives of one eager step.
// `ablate`: also each kernel's cost to the step, from replays with its nodes removed (`ablation`).
Result<nlohmann::json> measure_target(Bench& b, const char* kind, const StepBatch& sb, const StepShape& shape,
                                      bool ablate = false) {
  int64_t rows = 0;
  for (const SeqStep& q : sb.seqs) rows += static_cast<int64_t>(q.tokens.size());
  if (b.comm) b.comm->reset_counts();
  const auto t0 = Clock::now();
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> routing, b.model->routing_of_step(sb));
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t collectives = b.comm ? b.comm->counts().total() : 0;
  TANDEM_RETURN_IF_ERROR(rollback_all(b, shape.batch, shape.tokens));
  const int reps = reps_for(b, one);
  std::vector<kernels::cuda::ActivityRecord> recs;
  std::string trace_error;
  CudaModel::ReplayHook hook;
  if (b.cupti) hook = [&](const std::function<void()>& replay) { recs = b.cupti->record(replay, &trace_error); };
  StepOutput out;
  TANDEM_ASSIGN_OR_RETURN(CudaModel::StepProfile prof,
                          b.model->profile_step(sb, reps, &out, hook, std::min(reps, 3), ablate));
  TANDEM_RETURN_IF_ERROR(rollback_all(b, shape.batch, shape.tokens));
  nlohmann::json r = row(b, kind, shape, rows, collectives, prof, routing, recs, trace_error);
  r["logits"] = logit_check(out, b.cfg.vocab_size);
  if (ablate) r["ablation"] = ablation(prof);
  return r;
}

Result<nlohmann::json> measure_draft(Bench& b, int B, int64_t ctx, const Seqs& s) {
  std::vector<CudaModel::DraftQueryDev> qs;
  for (int i = 0; i < B; ++i) qs.push_back({i, s.toks[i][0], ctx, 0.0, 0});
  if (b.comm) b.comm->reset_counts();
  const auto t0 = Clock::now();
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> routing, b.model->routing_of_draft(qs));
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t collectives = b.comm ? b.comm->counts().total() : 0;
  const int reps = reps_for(b, one);
  std::vector<kernels::cuda::ActivityRecord> recs;
  std::string trace_error;
  CudaModel::ReplayHook hook;
  if (b.cupti) hook = [&](const std::function<void()>& replay) { recs = b.cupti->record(replay, &trace_error); };
  const bool ablate = b.a.ablate && B == 1;
  TANDEM_ASSIGN_OR_RETURN(CudaModel::StepProfile prof,
                          b.model->profile_draft(qs, reps, hook, std::min(reps, 3), ablate));
  StepShape shape;
  shape.batch = B;
  shape.tokens = b.model->draft_tokens();
  shape.context = ctx;
  shape.draft = true;
  nlohmann::json r = row(b, "draft", shape, static_cast<int64_t>(B) * shape.tokens, collectives, prof, routing, recs,
                         trace_error);
  if (ablate) r["ablation"] = ablation(prof);
  return r;
}

double class_us(const nlohmann::json& r, const char* name) {
  const auto& c = r["classes"];
  if (!c.contains("by_class") || !c["by_class"].contains(name)) return 0;
  return c["by_class"][name].value("kernel_us", 0.0);
}

}  // namespace

Status run_step_sweep(Bench& b) {
  header(("Steps at context " + std::to_string(b.a.context) + " (graph replays; +comm adds collectives x " +
          std::to_string(b.a.collective_us) + " us)")
             .c_str());
  for (int B : b.a.batches) {
    if (b.over_budget()) {
      b.j["skipped"].push_back("steps batch " + std::to_string(B));
      continue;
    }
    Seqs s;
    TANDEM_RETURN_IF_ERROR(setup(b, B, b.a.context, s));
    for (int n : {1, b.a.verify_tokens}) {
      if (n == b.a.verify_tokens && n == 1) continue;
      StepShape shape;
      shape.batch = B;
      shape.tokens = n;
      shape.context = b.a.context;
      TANDEM_ASSIGN_OR_RETURN(nlohmann::json r, measure_target(b, n == 1 ? "decode" : "verify", batch_of(b, s, B, n),
                                                               shape, b.a.ablate && B == 1 && n == 1));
      const double med = r["graph_us"].value("median", -1.0);
      const double bytes = r["bytes_read"].value("total", -1.0);
      if (B == 1 && n == 1 && b.a.moe_timeline_layer != -1) {
        const int layer = b.a.moe_timeline_layer == -2 ? b.cfg.num_hidden_layers / 2 : b.a.moe_timeline_layer;
        if (layer >= 0 && layer < b.cfg.num_hidden_layers) {
          TANDEM_ASSIGN_OR_RETURN(r["moe_timeline"], moe_timeline(b, batch_of(b, s, B, n), shape, layer));
        }
      }
      if (B == 1 && n == 1) {
        b.decode_b1_us = med;
        b.decode_b1_bytes = bytes;
        b.kernels_b1 = r["kernels"].get<int>();
        b.class_fraction_1row = r["classes"].value("by_class", nlohmann::json::object());
        const double moe = class_us(r, "routed_experts") + class_us(r, "shared_experts") + class_us(r, "router");
        if (moe > 0) b.moe_layer_b1_us = moe / b.cfg.num_hidden_layers;
      }
      if (B == 16 && n == 1) b.decode_b16_us = med, b.decode_b16_bytes = bytes;
      if (B == 1 && n > 1) b.verify_b1_us = med, b.verify_b1_bytes = bytes;
      if (B == 8 && n > 1) b.verify_b8_us = med, b.verify_b8_bytes = bytes;
      if (B * n == 48) b.class_fraction_48rows = r["classes"].value("by_class", nlohmann::json::object());
      b.j["steps"].push_back(std::move(r));
    }
    if (b.model->has_draft()) {
      TANDEM_ASSIGN_OR_RETURN(nlohmann::json r, measure_draft(b, B, b.a.context, s));
      if (B == 1) b.draft_b1_us = r["graph_us"].value("median", -1.0), b.draft_b1_bytes = r["bytes_read"].value("total", -1.0);
      b.j["steps"].push_back(std::move(r));
    }
  }
  return Status();
}

Status run_long_context(Bench& b) {
  header("Decode at long context (batch 1; KV, compressor and indexer state filled synthetically)");
  for (size_t i = 0; i < b.a.long_contexts.size(); ++i) {
    if (b.over_budget()) break;
    const int64_t ctx = b.a.long_contexts[i];
    Seqs s;
    TANDEM_RETURN_IF_ERROR(setup(b, 1, ctx, s));
    StepShape shape;
    shape.context = ctx;
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json r, measure_target(b, "decode", batch_of(b, s, 1, 1), shape));
    if (i < 3) b.ctx_us[i] = r["graph_us"].value("median", -1.0);
    b.j["long_context"].push_back(std::move(r));
  }
  return Status();
}

namespace {

// Time to prefill `P` tokens in chunks of `C`: chunks timed at `samples` offsets over a
// synthetically filled context, per-token time interpolated between them and summed over every
// chunk (today's kernels make a full-size prompt too slow to run whole in a benchmark).
// A chunk's C tokens and a block table for P positions (blocks 0, 1, ...).
struct ChunkInput {
  std::vector<int32_t> toks, table;
};
ChunkInput chunk_input(Bench& b, int C, int64_t P) {
  ChunkInput in;
  in.toks.resize(static_cast<size_t>(C));
  for (auto& t : in.toks) t = b.token();
  in.table.resize(static_cast<size_t>(b.blocks_for(P)));
  for (size_t k = 0; k < in.table.size(); ++k) in.table[k] = static_cast<int32_t>(k);
  return in;
}

Result<nlohmann::json> estimate_prefill(Bench& b, int64_t P, int C) {
  const int64_t chunks = (P + C - 1) / C;
  const int S = static_cast<int>(std::min<int64_t>(b.a.prefill_samples, chunks));
  const ChunkInput in = chunk_input(b, C, P);
  const std::vector<int32_t>& toks = in.toks;
  const std::vector<int32_t>& table = in.table;
  std::vector<int64_t> offs;
  std::vector<double> per_token_s;
  nlohmann::json samples = nlohmann::json::array();
  for (int i = 0; i < S; ++i) {
    const int64_t k = S == 1 ? 0 : static_cast<int64_t>(std::llround(static_cast<double>(i) * (chunks - 1) / (S - 1)));
    const int64_t off = k * C, n = std::min<int64_t>(C, P - off);
    TANDEM_RETURN_IF_ERROR(b.model->fill_synthetic_context(0, off, table, b.a.seed + 77 + i));
    StepBatch sb;
    sb.seqs.push_back({0, off, std::span<const int32_t>(toks.data(), static_cast<size_t>(n)), table, LogitsMode::kLast,
                       false});
    const auto t0 = Clock::now();
    TANDEM_RETURN_IF_ERROR(b.model->forward(sb, nullptr, true));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    offs.push_back(off);
    per_token_s.push_back(dt / static_cast<double>(n));
    samples.push_back({{"offset", off}, {"tokens", n}, {"ms", dt * 1e3}});
  }
  double total = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * C, n = std::min<int64_t>(C, P - off);
    size_t i = 0;
    while (i + 1 < offs.size() && offs[i + 1] < off) ++i;
    double t = per_token_s[i];
    if (i + 1 < offs.size() && offs[i + 1] > offs[i]) {
      const double f = std::clamp(static_cast<double>(off - offs[i]) / static_cast<double>(offs[i + 1] - offs[i]), 0.0, 1.0);
      t = per_token_s[i] + f * (per_token_s[i + 1] - per_token_s[i]);
    }
    total += t * static_cast<double>(n);
  }
  std::printf("prefill %8lld tokens in %d-token chunks: %8.2f s estimated (%8.0f tok/s) from %d timed chunks\n",
              static_cast<long long>(P), C, total, P / total, S);
  return nlohmann::json{{"prompt_tokens", P}, {"chunk", C}, {"chunks", chunks}, {"samples", samples},
                        {"estimated_s", total}, {"tokens_per_s", P / total},
                        {"method", "estimated: chunks timed (wall, eager) at sampled offsets over a synthetically "
                                   "filled context; per-token time interpolated linearly between samples and summed over "
                                   "every chunk"}};
}

// Where a prefill chunk's time goes: one chunk of `C` tokens at offset `off` (a synthetically filled
// context before it) recorded with CUPTI (eager launches, so each kernel's time is its own), kernels
// grouped by name, the largest first.
nlohmann::json prefill_kernel_split(Bench& b, int C, int64_t off) {
  if (!b.cupti) return {{"available", false}, {"reason", b.cupti_status}};
  const ChunkInput in = chunk_input(b, C, off + C);
  if (!b.model->fill_synthetic_context(0, off, in.table, b.a.seed + 99).ok()) return {{"available", false}};
  StepBatch sb;
  sb.seqs.push_back(
      {0, off, std::span<const int32_t>(in.toks.data(), in.toks.size()), in.table, LogitsMode::kLast, false});
  std::string why;
  Status st;
  const auto t0 = Clock::now();
  const std::vector<kernels::cuda::ActivityRecord> recs = b.cupti->record([&] { st = b.model->forward(sb, nullptr, true); }, &why);
  const double wall_ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
  if (!st.ok() || recs.empty()) return {{"available", false}, {"reason", st.ok() ? why : st.to_string()}};
  std::map<std::string, std::pair<int, double>> names;
  double kernel_ms = 0, copy_ms = 0;
  for (const auto& r : recs) {
    const double ms = static_cast<double>(r.end_ns - r.start_ns) * 1e-6;
    (r.kernel ? kernel_ms : copy_ms) += ms;
    auto& n = names[r.kernel ? r.name.substr(0, 160) : r.name];
    ++n.first;
    n.second += ms;
  }
  const double span_ms = static_cast<double>(recs.back().end_ns - recs.front().start_ns) * 1e-6;
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [n, v] : names) top.push_back({v.second, n});
  std::sort(top.rbegin(), top.rend());
  std::printf("prefill chunk of %d tokens at offset %lld (CUPTI, eager): wall %.1f ms, span %.1f ms, kernels %.1f ms in "
              "%zu launches, copies %.1f ms\n",
              C, static_cast<long long>(off), wall_ms, span_ms, kernel_ms, recs.size(), copy_ms);
  nlohmann::json out = {{"available", true}, {"chunk", C}, {"offset", off}, {"wall_ms", wall_ms}, {"span_ms", span_ms},
                        {"kernel_ms", kernel_ms}, {"copy_ms", copy_ms}, {"records", recs.size()}};
  for (size_t i = 0; i < std::min<size_t>(top.size(), 20); ++i) {
    const auto& [ms, n] = top[i];
    std::printf("  %9.2f ms %5d x  %s\n", ms, names[n].first, n.c_str());
    out["top_kernels"].push_back({{"name", n}, {"ms", ms}, {"count", names[n].first}});
  }
  return out;
}

}  // namespace

Status run_prefill(Bench& b) {
  std::printf("\nChunked prefill (estimated from timed chunks)\n");
  {
    // Warm-up: every kernel of a prefill chunk launched once.
    Seqs s;
    TANDEM_RETURN_IF_ERROR(setup(b, 1, 0, s));
    StepBatch sb;
    sb.seqs.push_back({0, 0, std::span<const int32_t>(s.toks[0].data(), 16), s.tables[0], LogitsMode::kLast, false});
    TANDEM_RETURN_IF_ERROR(b.model->forward(sb, nullptr, true));
  }
  for (int64_t P : b.a.prefill) {
    if (b.over_budget()) break;
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json r, estimate_prefill(b, P, b.a.prefill_chunk));
    if (P == 8192) b.prefill_8k_tok_s = r["tokens_per_s"].get<double>();
    b.j["prefill"].push_back(std::move(r));
    if (!b.j.contains("prefill_chunk_kernels")) b.j["prefill_chunk_kernels"] = prefill_kernel_split(b, b.a.prefill_chunk, 0);
  }
  // The same split at long offsets (where the indexer's and the attention's work grows with the
  // context): by default the last chunk of the longest --prefill prompt.
  for (int64_t off : b.a.trace_offsets) {
    if (b.over_budget() || off <= 0) continue;
    b.j["prefill_chunk_kernels_at"].push_back(prefill_kernel_split(b, b.a.prefill_chunk, off));
  }
  for (int64_t P : b.a.ttft) {
    if (b.over_budget()) break;
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json r, estimate_prefill(b, P, b.a.ttft_chunk));
    if (P == 163840) b.ttft_160k_s = r["estimated_s"].get<double>();
    if (P == b.cfg.max_position_embeddings || P == 1048576) b.ttft_1m_s = r["estimated_s"].get<double>();
    b.j["time_to_first_token"].push_back(std::move(r));
  }
  return Status();
}

Status run_allocations_under_load(Bench& b) {
  const int B = 16, n = b.a.verify_tokens;
  const int64_t ctx = std::min<int64_t>(b.a.context, 4096);
  Seqs s;
  TANDEM_RETURN_IF_ERROR(setup(b, B, ctx, s));
  std::vector<CudaModel::DraftQueryDev> qs;
  for (int i = 0; i < B; ++i) qs.push_back({i, s.toks[i][0], ctx, 0.0, 0});
  std::vector<DraftResult> res;
  std::vector<SampleRow> rows(B);
  std::vector<SampleRowResult> out(B);
  for (int i = 0; i < B; ++i) {
    rows[i].logits_row = i;
    rows[i].temperature = 0.0;
    rows[i].position = ctx + 1;
  }
  auto round = [&]() -> Status {
    for (int step = 0; step < 3; ++step)
      TANDEM_RETURN_IF_ERROR(b.model->forward(batch_of(b, s, B, 1), nullptr, true));
    TANDEM_RETURN_IF_ERROR(b.model->sample(rows, {}, {}, {}, 0, out));
    TANDEM_RETURN_IF_ERROR(b.model->forward(batch_of(b, s, B, n), nullptr, true));
    TANDEM_RETURN_IF_ERROR(rollback_all(b, B, n));
    TANDEM_RETURN_IF_ERROR(rollback_all(b, B, 3));
    if (b.model->has_draft()) TANDEM_RETURN_IF_ERROR(b.model->draft_propose(qs, false, res));
    return Status();
  };
  TANDEM_RETURN_IF_ERROR(round());  // warm: every op workspace used once
  const auto before = kernels::cuda::alloc_stats();
  TANDEM_RETURN_IF_ERROR(round());
  TANDEM_RETURN_IF_ERROR(round());
  const auto after = kernels::cuda::alloc_stats();
  const int64_t count = after.count - before.count;
  std::printf("\ndevice allocations under a %d-sequence load (decode, verify, sampling, draft; after warm-up): %lld\n", B,
              static_cast<long long>(count));
  b.j["allocations_under_load"] = {{"sequences", B}, {"context", ctx}, {"allocations", count},
                                   {"bytes", after.bytes - before.bytes},
                                   {"work", "2 rounds of 3 decode steps, sampling, a verify step and a draft"}};
  return Status();
}

Status run_sampler(Bench& b) {
  // The sampling op at the model's vocabulary on random logits: 8 sequences x 6 verify rows,
  // greedy and top-p, time per launch (device timer, median) two ways: one eager launch between two
  // events (launch latency included), and a launch inside a CUDA graph of kGraphCalls launches
  // (replay time / kGraphCalls), as it runs in serving: the last node of the step's graph. The
  // issue's targets read the latter.
  const int64_t V = b.cfg.vocab_size;
  constexpr int kRows = 48;
  std::vector<float> hl(static_cast<size_t>(kRows) * V);
  for (auto& v : hl) v = static_cast<float>(static_cast<int>(b.token() % 2000) - 1000) / 100.0f;
  kernels::cuda::DeviceBuffer<float> dl(hl.size());
  kernels::cuda::DeviceBuffer<SampleRow> drows(kRows);
  kernels::cuda::DeviceBuffer<SampleRowResult> dres(kRows);
  kernels::cuda::DeviceBuffer<uint8_t> scratch(kernels::cuda::sample_rows_scratch_bytes(kRows, V));
  TANDEM_CUDA_CHECK(cudaMemcpy(dl.get(), hl.data(), hl.size() * sizeof(float), cudaMemcpyHostToDevice));
  SampleInputs in;
  in.logits = dl.get();
  in.vocab = V;
  cudaEvent_t e0, e1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("\n");
  for (bool greedy : {true, false}) {
    std::vector<SampleRow> rows(kRows);
    for (int r = 0; r < kRows; ++r) {
      rows[r].logits_row = r;
      rows[r].draft = r % 6 < 5 ? b.token() : -1;
      rows[r].temperature = greedy ? 0.0 : 0.8;
      rows[r].top_p = greedy ? 1.0 : 0.9;
      rows[r].seed = static_cast<uint64_t>(r);
      rows[r].position = r;
    }
    TANDEM_CUDA_CHECK(cudaMemcpy(drows.get(), rows.data(), sizeof(SampleRow) * kRows, cudaMemcpyHostToDevice));
    std::vector<double> us;
    for (int r = 0; r < 21; ++r) {
      TANDEM_CUDA_CHECK(cudaEventRecord(e0, nullptr));
      kernels::cuda::sample_rows_device({in, drows.get(), kRows, scratch.get(), dres.get()}, nullptr);
      TANDEM_CUDA_CHECK(cudaEventRecord(e1, nullptr));
      TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r > 0) us.push_back(ms * 1000.0);
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    // The same launch kGraphCalls times in one graph (each launch rewrites the same results).
    constexpr int kGraphCalls = 20;
    cudaStream_t gs;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    cudaGraph_t g;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kGraphCalls; ++i)
      kernels::cuda::sample_rows_device({in, drows.get(), kRows, scratch.get(), dres.get()}, gs);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(gs, &g));
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<double> gus;
    for (int r = 0; r < 11; ++r) {
      const double us = kernels::cuda::graph_launch_us(ge, gs, e0, e1);
      if (r > 0) gus.push_back(us / kGraphCalls);
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
    TANDEM_CUDA_CHECK(cudaStreamDestroy(gs));
    std::sort(gus.begin(), gus.end());
    const double gmed = gus[gus.size() / 2];
    (greedy ? b.sample_greedy_us : b.sample_top_p_us) = gmed;
    std::printf("sampler %-6s %d rows x %lld vocabulary: %.1f us a launch in a graph of %d (one eager launch: %.1f us), median\n",
                greedy ? "greedy" : "top-p", kRows, static_cast<long long>(V), gmed, kGraphCalls, med);
    b.j["sampler"].push_back({{"mode", greedy ? "greedy" : "top_p"}, {"rows", kRows}, {"vocab", V},
                              {"graph_us_per_launch_median", gmed}, {"graph_calls", kGraphCalls},
                              {"eager_launch_us_median", med}});
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  return Status();
}

Status run_snapshots(Bench& b) {
  // Prefix-cache snapshots as the CUDA runner keeps them: device to device into a pool allocated
  // at start-up (save at a block boundary, load on a hit), against the host round trip the runner
  // used before (export_slot_state / import_slot_state: copies to and from a host buffer, a
  // synchronize each). Wall time of the call and a synchronize of the model's stream, median.
  CudaModel& m = *b.model;
  const int s0 = 0, s1 = 1;  // the model has at least 16 slots (bench_model.cpp)
  TANDEM_RETURN_IF_ERROR(m.allocate_snapshots(2));
  const size_t bytes = m.slot_state_bytes();
  auto time_us = [&](const std::function<Status()>& f, double& out) -> Status {
    std::vector<double> us;
    for (int r = 0; r < 11; ++r) {
      m.synchronize();
      const auto t0 = Clock::now();
      TANDEM_RETURN_IF_ERROR(f());
      m.synchronize();
      const double wall = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (r > 0) us.push_back(wall);
    }
    std::sort(us.begin(), us.end());
    out = us[us.size() / 2];
    return Status();
  };
  double save_us = -1, load_us = -1, host_us = -1;
  Status st = time_us([&] { return m.save_snapshot(s0, 0); }, save_us);
  if (st.ok()) st = time_us([&] { return m.load_snapshot(s1, 0); }, load_us);
  std::vector<uint8_t> host(bytes);
  if (st.ok())
    st = time_us([&]() -> Status {
      TANDEM_RETURN_IF_ERROR(m.export_slot_state(s0, host));
      return m.import_slot_state(s1, host);
    }, host_us);
  const Status freed = m.allocate_snapshots(0);
  TANDEM_RETURN_IF_ERROR(st);
  TANDEM_RETURN_IF_ERROR(freed);
  b.snapshot_save_us = save_us;
  b.snapshot_load_us = load_us;
  b.snapshot_host_us = host_us;
  b.snapshot_bytes = static_cast<int64_t>(bytes);
  std::printf("\nprefix-cache snapshot of one slot: %.2f MiB; on the device: save %.1f us, load %.1f us (%.0f GB/s "
              "each way); through host memory (before): %.0f us for export + import\n",
              bytes / 1048576.0, save_us, load_us, save_us > 0 ? bytes / save_us / 1e3 : 0.0, host_us);
  b.j["snapshots"] = {{"bytes_per_slot", bytes},
                      {"device_save_us", save_us},
                      {"device_load_us", load_us},
                      {"host_export_import_us", host_us},
                      {"note", "wall time of the call plus a stream synchronize, median of 10; the engine's "
                               "save/load are not synchronized (stream-ordered with the step)"}};
  return Status();
}

}  // namespace tandem::bench_model

#endif  // TANDEM_HAVE_CUDA_RUNNER
