// One step of the layer-by-layer comparison (layer_harness.h) on each side: the CPU oracle's pass
// through every layer half (its own run, or a spread run from the same inputs), the device's
// teacher-forced pass from the CPU's inputs and state, and the selections (indexer top-k, MoE
// routing) judged against the CPU's scores.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/layer_compare.h"
#include "cuda/layer_subject.h"
#include "model/model.h"
#include "model/model_testing.h"

namespace tandem::layer_harness {

namespace mt = model_testing;
using layer_compare::Report;
using layer_compare::Residual;
using layer_compare::Selection;

// ---- one step on both backends ----

struct SeqSpec {
  int slot;
  int64_t start, n;
};
struct StepSpec {
  std::string name;
  std::vector<SeqSpec> seqs;
};

// Everything the CPU computes for one step, layer half by layer half.
struct CpuPass {
  std::vector<std::vector<float>> in, mid, out;           // per layer [rows, hc * hidden]
  std::vector<std::vector<float>> idx_scores, gate;       // per layer (CSA single-sequence steps / every layer)
  std::vector<std::vector<int32_t>> idx_topk, experts;
  std::vector<float> logits;                              // LM head on the last layer's output
  std::vector<std::vector<float>> slots;                  // state after the step, every slot
  std::vector<float> pool;
};

inline bool is_csa(const Subject& s, int l) { return mt::cpu_layer_state(*s.cpu, l).has_indexer; }

// forced == nullptr: the CPU's own run (each half takes the previous half's output); else every
// half starts from forced's inputs (the spread runs: another GEMM instruction set, or the tensor
// cores' accumulation emulated).
inline void cpu_pass(Subject& s, const StepBatch& b, int64_t rows, const CpuPass* forced, CpuPass& out) {
  const int L = s.cfg.num_hidden_layers;
  const bool single = b.seqs.size() == 1;
  std::vector<float> h;
  Status st = mt::cpu_begin_step(*s.cpu, b, h);
  ASSERT_TRUE(st.ok()) << st.to_string();
  out.in.assign(L, {});
  out.mid.assign(L, {});
  out.out.assign(L, {});
  out.idx_scores.assign(L, {});
  out.idx_topk.assign(L, {});
  out.gate.assign(L, {});
  out.experts.assign(L, {});
  for (int l = 0; l < L; ++l) {
    if (forced) h = forced->in[l];
    out.in[l] = h;
    mt::cpu_attention_half(*s.cpu, l, b, h.data());
    out.mid[l] = h;
    if (single && is_csa(s, l)) {
      const int64_t cols = (b.seqs[0].start_pos + rows) / 4;
      if (cols > 0) mt::cpu_last_indexer(*s.cpu, rows, cols, out.idx_scores[l], out.idx_topk[l]);
    }
    if (forced) h = forced->mid[l];
    mt::cpu_ffn_half(*s.cpu, l, b, h.data());
    out.out[l] = h;
    mt::cpu_last_routing(*s.cpu, rows, out.gate[l], out.experts[l]);
  }
  const std::vector<float>& last = forced ? forced->out[L - 1] : out.out[L - 1];
  mt::cpu_logits(*s.cpu, last.data(), rows, out.logits);
  out.slots.assign(s.opt.max_slots, {});
  for (int k = 0; k < s.opt.max_slots; ++k) {
    auto sp = mt::cpu_slot_floats(*s.cpu, k);
    out.slots[k].assign(sp.begin(), sp.end());
  }
  auto pp = mt::cpu_pool_floats(*s.cpu);
  out.pool.assign(pp.begin(), pp.end());
}

inline void restore_cpu_state(Subject& s, const std::vector<std::vector<float>>& slots, const std::vector<float>& pool) {
  for (int k = 0; k < s.opt.max_slots; ++k) {
    auto sp = mt::cpu_slot_floats(*s.cpu, k);
    std::copy(slots[k].begin(), slots[k].end(), sp.begin());
  }
  auto pp = mt::cpu_pool_floats(*s.cpu);
  std::copy(pool.begin(), pool.end(), pp.begin());
}

// sqrt(softplus(z)) + bias: the gate's selection score (kernels/ops.h MoeGateParams), in double.
inline void selection_scores(const float* logits, const std::vector<float>& bias, int64_t E, std::vector<double>& out) {
  out.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double z = logits[e];
    out[e] = std::sqrt(z > 20.0 ? z : std::log1p(std::exp(z))) + bias[e];
  }
}

inline Selection routing_selection(const Subject& s, int64_t rows, const std::vector<float>& bias,
                            const std::vector<int32_t>& got_ids, const std::vector<float>& got_logits,
                            const std::vector<int32_t>& want_ids, const std::vector<float>& want_logits) {
  const int64_t E = s.cfg.n_routed_experts, K = s.cfg.num_experts_per_tok;
  return layer_compare::compare_selection(
      got_ids.data(), want_ids.data(), rows, K, [K](int64_t) { return K; },
      [&](int64_t r, std::vector<double>& cs, std::vector<double>& ds) {
        if (bias.empty()) {  // hash routing: the token's table row, nothing to explain a difference
          cs.assign(static_cast<size_t>(E), 0.0);
          ds.clear();
          return;
        }
        selection_scores(want_logits.data() + r * E, bias, E, cs);
        selection_scores(got_logits.data() + r * E, bias, E, ds);
      });
}

inline Selection indexer_selection(const Subject& s, const SeqSpec& q, const std::vector<int32_t>& got_topk,
                            const std::vector<float>& got_scores, const std::vector<int32_t>& want_topk,
                            const std::vector<float>& want_scores) {
  const int64_t TK = s.cfg.index_topk, cols = (q.start + q.n) / 4;
  auto vis = [&](int64_t r) { return std::min<int64_t>((q.start + r + 1) / 4, cols); };
  return layer_compare::compare_selection(
      got_topk.data(), want_topk.data(), q.n, TK, [&](int64_t r) { return std::min<int64_t>(TK, vis(r)); },
      [&](int64_t r, std::vector<double>& cs, std::vector<double>& ds) {
        const int64_t v = vis(r);
        cs.assign(want_scores.begin() + r * cols, want_scores.begin() + r * cols + v);
        if (got_scores.empty())
          ds.clear();
        else
          ds.assign(got_scores.begin() + r * cols, got_scores.begin() + r * cols + v);
      });
}

// Everything a device gives back for one step run from the CPU's inputs and state.
struct DevPass {
  bool tc = false;  // the step's GEMMs took the tensor cores
  std::vector<std::vector<float>> mid, out, scores, gate;
  std::vector<std::vector<int32_t>> topk, experts;
  std::vector<uint8_t> have_scores;
  std::vector<float> logits;
  std::vector<std::vector<uint8_t>> slots;
  std::vector<uint8_t> pool;
};

// One step on `dev`, teacher-forced: the CPU's state before the step (up_slots, up_pool), each
// half from the CPU's input to it.
inline void dev_pass(Subject& s, Device& dev, const StepSpec& spec, const StepBatch& b, int64_t rows,
                     const CpuPass& cpu, const std::vector<std::vector<uint8_t>>& up_slots,
                     const std::vector<uint8_t>& up_pool, DevPass& g) {
  const int L = s.cfg.num_hidden_layers;
  const int64_t HD = s.HD();
  const bool single = spec.seqs.size() == 1;
  for (int k = 0; k < s.opt.max_slots; ++k) dev.write_slot(k, up_slots[k]);
  dev.write_pool(up_pool);
  for (const SeqSpec& q : spec.seqs) dev.set_slot_length(q.slot, q.start);
  Status st = dev.begin_step(b);
  ASSERT_TRUE(st.ok()) << st.to_string();
  g.tc = dev.tensor_core_step();
  g.mid.assign(L, {});
  g.out.assign(L, {});
  g.scores.assign(L, {});
  g.gate.assign(L, {});
  g.topk.assign(L, {});
  g.experts.assign(L, {});
  g.have_scores.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    g.mid[l].resize(static_cast<size_t>(rows * HD));
    g.out[l].resize(static_cast<size_t>(rows * HD));
    dev.set_h(cpu.in[l].data(), rows);
    dev.attention_half(l, b);
    dev.get_h(g.mid[l].data(), rows);
    if (single && !cpu.idx_topk[l].empty())
      g.have_scores[l] = dev.last_indexer(rows, (spec.seqs[0].start + rows) / 4, g.scores[l], g.topk[l]);
    dev.set_h(cpu.mid[l].data(), rows);
    dev.ffn_half(l, b);
    dev.get_h(g.out[l].data(), rows);
    dev.last_routing(rows, g.gate[l], g.experts[l]);
  }
  dev.end_step();
  dev.logits(cpu.out[L - 1].data(), rows, g.logits);
  g.slots.assign(static_cast<size_t>(s.opt.max_slots), {});
  for (int k = 0; k < s.opt.max_slots; ++k) dev.read_slot(k, g.slots[k]);
  dev.read_pool(g.pool);
}

}  // namespace tandem::layer_harness
