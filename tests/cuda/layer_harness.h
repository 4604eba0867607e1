// The teacher-forced layer-by-layer comparison (layer_test.cpp runs it against the CUDA model,
// layer_harness_test.cpp against a stand-in device to test the harness itself): every layer half
// (mHC + attention with its window, compressor and indexer state; mHC + MoE) of the SWA, CSA and
// HCA layers, and every DSpark draft stage, gets the CPU oracle's inputs for it: the residual
// streams entering it and the CPU's state before the step (window rings, compressor rings, paged
// compressed entries and FP4 indexer keys, the draft context), encoded into the device's real
// record bytes by the device model's own encoders. Its outputs are compared with the CPU's: the
// residual streams leaving it, the state it wrote (record by record, every other byte untouched),
// the indexer's top-k and scores, the MoE routing and gate logits, the LM head and the draft heads.
// Errors cannot cascade, so each gap is pinned to one layer and one piece. Limits: layer_compare.h.
// Every piece prints one line starting with `[cuda-layer]`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/layer_compare.h"
#include "cuda/layer_subject.h"
#include "kernels/ops.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_model_testing.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"

namespace tandem::layer_harness {

namespace mt = model_testing;
using layer_compare::Report;
using layer_compare::Residual;
using layer_compare::Selection;
using testing::table_for;
using testing::tokens;

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
// half starts from forced's inputs (the spread run with another GEMM instruction set).
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

// The records a layer of the step wrote and the compressor rows it committed, located in the
// device images and in the CPU's floats.
struct LayerWrites {
  RecordSet win, ent, keys;
  std::vector<int64_t> win_count;  // window records per sequence of the step, in order
  // compressor rows [n, 2 * chans] of the device image g, the CPU and the CPU spread
  std::vector<float> comp_g, comp_c, comp_p, icomp_g, icomp_c, icomp_p;
};

inline LayerWrites layer_writes(const Subject& s, const StepSpec& spec, const std::vector<std::vector<int32_t>>& tables,
                                int l, const CpuPass& cpu, const CpuPass& spr, const DevPass& g,
                                std::vector<std::vector<uint8_t>>& slot_mask, std::vector<uint8_t>& pool_mask) {
  LayerWrites w;
  const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
  const mt::CudaLayerState& gl = s.lay.layers[static_cast<size_t>(l)];
  const int64_t hd = s.hd(), bs = s.opt.block_size, bf = mt::cpu_block_floats(*s.cpu);
  for (const SeqSpec& q : spec.seqs) {
    const std::vector<float>& cs = cpu.slots[q.slot];
    const int64_t first = q.start + std::max<int64_t>(0, q.n - s.lay.win_ring);
    for (int64_t p = first; p < q.start + q.n; ++p) {
      const int64_t i = p % s.lay.win_ring;
      w.win.offs.push_back(gl.win_off + i * s.lay.rec.bytes);
      w.win.cpu.push_back(cs.data() + c.win_off + i * hd);
      mark(slot_mask[q.slot], gl.win_off + i * s.lay.rec.bytes, s.lay.rec.bytes);
    }
    w.win_count.push_back(q.start + q.n - first);
    auto rows_of = [&](int64_t coff, int64_t goff, int ring, int64_t chans, std::vector<float>& gv,
                       std::vector<float>& cv, std::vector<float>& pv) {
      const int64_t wd = 2 * chans;
      for (int64_t p = q.start + std::max<int64_t>(0, q.n - ring); p < q.start + q.n; ++p) {
        const int64_t i = p % ring;
        const float* gr = reinterpret_cast<const float*>(g.slots[q.slot].data() + goff) + i * wd;
        gv.insert(gv.end(), gr, gr + wd);
        cv.insert(cv.end(), cs.begin() + coff + i * wd, cs.begin() + coff + (i + 1) * wd);
        pv.insert(pv.end(), spr.slots[q.slot].begin() + coff + i * wd, spr.slots[q.slot].begin() + coff + (i + 1) * wd);
        mark(slot_mask[q.slot], goff + i * wd * 4, wd * 4);
      }
    };
    if (c.ratio) rows_of(c.comp_off, gl.comp_off, gl.comp_ring, gl.comp_chans, w.comp_g, w.comp_c, w.comp_p);
    if (c.has_indexer) rows_of(c.icomp_off, gl.icomp_off, gl.icomp_ring, gl.icomp_chans, w.icomp_g, w.icomp_c, w.icomp_p);
    if (!c.ratio) continue;
    const auto& table = tables[q.slot];
    for (int64_t p = q.start; p < q.start + q.n; ++p) {
      if ((p + 1) % c.ratio) continue;
      const int64_t pos = p + 1 - c.ratio, blk = table[pos / bs];
      const int64_t i = (pos % bs) / c.ratio;
      w.ent.offs.push_back(blk * s.lay.block_bytes + gl.pool_main + i * s.lay.rec.bytes);
      w.ent.cpu.push_back(cpu.pool.data() + blk * bf + c.pool_main + i * hd);
      mark(pool_mask, w.ent.offs.back(), s.lay.rec.bytes);
      if (c.has_indexer) {
        const int64_t k = (pos % bs) / 4;
        w.keys.offs.push_back(blk * s.lay.block_bytes + gl.pool_idx + k * s.lay.key.bytes);
        w.keys.cpu.push_back(cpu.pool.data() + blk * bf + c.pool_idx + k * s.cfg.index_head_dim);
        mark(pool_mask, w.keys.offs.back(), s.lay.key.bytes);
      }
    }
  }
  return w;
}

// The window records of a pass (they live in the slots' images): compared slot by slot, against
// the CPU's values or (ref) the same records of another pass.
inline layer_compare::RecordDiff window_diff(const Subject& s, const StepSpec& spec, const LayerWrites& w,
                                             const std::vector<std::vector<uint8_t>>& img,
                                             const std::vector<std::vector<uint8_t>>* ref) {
  layer_compare::RecordDiff d;
  size_t i0 = 0;
  for (size_t qi = 0; qi < spec.seqs.size(); ++qi) {
    const SeqSpec& q = spec.seqs[qi];
    const int64_t cnt = w.win_count[qi];
    RecordSet part;
    part.offs.assign(w.win.offs.begin() + i0, w.win.offs.begin() + i0 + cnt);
    part.cpu.assign(w.win.cpu.begin() + i0, w.win.cpu.begin() + i0 + cnt);
    i0 += cnt;
    const auto a = diff_records(part, img[q.slot], false, s, ref ? &(*ref)[q.slot] : nullptr);
    if (a.first >= 0 && d.first < 0) d.first = d.records + a.first;
    d.records += a.records;
    d.differ += a.differ;
    d.max_abs = std::max(d.max_abs, a.max_abs);
  }
  return d;
}

// Rows of the step that read a key the step itself wrote in layer l whose record decodes to other
// values than the CPU's: a window row of their own sequence (where the ring still holds it) or a
// compressed entry completed in the step and visible to them. Their attention legitimately
// differs by that key (the key is judged once, by the window-records or compressed-entries
// piece), so they are left out of the attention half's residual, as rows with a different
// indexer selection are: otherwise one flipped key would count again in every later row.
inline std::vector<uint8_t> rows_reading_differing_keys(const Subject& s, const StepSpec& spec,
                                                        const std::vector<std::vector<int32_t>>& tables, int l,
                                                        const CpuPass& cpu, const DevPass& g, int64_t rows) {
  std::vector<uint8_t> flag(static_cast<size_t>(rows), 0);
  const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
  const mt::CudaLayerState& gl = s.lay.layers[static_cast<size_t>(l)];
  const int64_t hd = s.hd(), bs = s.opt.block_size, bf = mt::cpu_block_floats(*s.cpu);
  const int64_t ring = s.lay.win_ring, window = s.cfg.sliding_window, rb = s.lay.rec.bytes;
  auto differs = [&](const uint8_t* rec, const float* want) {
    for (int64_t e = 0; e < hd; ++e)
      if (!layer_compare::same_value(cuda_model::kv_record_get(rec, s.lay.rec, static_cast<int>(e)), want[e]))
        return true;
    return false;
  };
  int64_t r0 = 0;
  for (const SeqSpec& q : spec.seqs) {
    for (int64_t p = std::max(q.start, q.start + q.n - ring); p < q.start + q.n; ++p) {
      const int64_t i = p % ring;
      if (!differs(g.slots[q.slot].data() + gl.win_off + i * rb, cpu.slots[q.slot].data() + c.win_off + i * hd))
        continue;
      for (int64_t t = p; t < q.start + q.n && t - p < window; ++t) flag[static_cast<size_t>(r0 + t - q.start)] = 1;
    }
    if (c.ratio) {
      for (int64_t p = q.start; p < q.start + q.n; ++p) {
        if ((p + 1) % c.ratio) continue;
        const int64_t pos = p + 1 - c.ratio, blk = tables[q.slot][pos / bs], i = (pos % bs) / c.ratio;
        if (!differs(g.pool.data() + blk * s.lay.block_bytes + gl.pool_main + i * rb,
                     cpu.pool.data() + blk * bf + c.pool_main + i * hd))
          continue;
        for (int64_t t = p; t < q.start + q.n; ++t) flag[static_cast<size_t>(r0 + t - q.start)] = 1;
      }
    }
    r0 += q.n;
  }
  return flag;
}

// Columns of the indexer's score rows (one per compressed entry, the single sequence of the step)
// whose FP4 key the step wrote and pool image `pool` holds decoding to other values than the
// CPU's key: every row's score against that key legitimately differs (the key is judged once, by
// the indexer-keys piece), so those scores are left out of indexer-scores, as rows reading a
// differing key are left out of the attention half.
inline std::vector<uint8_t> differing_key_columns(const Subject& s, const SeqSpec& q,
                                                  const std::vector<std::vector<int32_t>>& tables, int l,
                                                  const CpuPass& cpu, const std::vector<uint8_t>& pool, int64_t cols) {
  std::vector<uint8_t> flag(static_cast<size_t>(cols), 0);
  const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
  if (!c.has_indexer || !c.ratio) return flag;
  const mt::CudaLayerState& gl = s.lay.layers[static_cast<size_t>(l)];
  const int64_t bs = s.opt.block_size, bf = mt::cpu_block_floats(*s.cpu), kd = s.cfg.index_head_dim;
  for (int64_t p = q.start; p < q.start + q.n; ++p) {
    if ((p + 1) % c.ratio) continue;
    const int64_t pos = p + 1 - c.ratio, blk = tables[q.slot][pos / bs], k = (pos % bs) / c.ratio;
    const int64_t col = pos / c.ratio;
    if (col >= cols) continue;
    const uint8_t* rec = pool.data() + blk * s.lay.block_bytes + gl.pool_idx + k * s.lay.key.bytes;
    const float* want = cpu.pool.data() + blk * bf + c.pool_idx + k * kd;
    for (int64_t e = 0; e < s.lay.key.dim; ++e)
      if (!layer_compare::same_value(cuda_model::index_key_get(rec, s.lay.key, static_cast<int>(e)), want[e])) {
        flag[static_cast<size_t>(col)] = 1;
        break;
      }
  }
  return flag;
}

// Every piece of pass g against the CPU (tag prefix `at`). ref != null: g ran on the tensor
// cores and ref is the GEMV model's pass of the same step: each piece's limit is also at least
// kSpreadFactor times the spread between the two (layer_compare::gpu_spread_limit).
inline void compare_pass(Subject& s, const StepSpec& spec, const std::vector<std::vector<int32_t>>& tables,
                         const std::string& at, int64_t rows, const CpuPass& cpu, const CpuPass& spr,
                         const DevPass& g, const DevPass* ref, const std::vector<std::vector<uint8_t>>& up_slots,
                         const std::vector<uint8_t>& up_pool, const std::vector<std::vector<uint8_t>>& p_slots,
                         const std::vector<uint8_t>& p_pool) {
  const int L = s.cfg.num_hidden_layers;
  const int64_t HD = s.HD(), V = s.cfg.vocab_size, E = s.cfg.n_routed_experts;
  const bool single = spec.seqs.size() == 1;
  std::vector<std::vector<uint8_t>> slot_mask(static_cast<size_t>(s.opt.max_slots));
  for (auto& m : slot_mask) m.assign(static_cast<size_t>(s.lay.slot_bytes), 0);
  std::vector<uint8_t> pool_mask(g.pool.size(), 0);

  // ---- the CPU's own spread of every half first: the largest of each kind is a floor for all ----
  std::vector<Selection> spr_idx(static_cast<size_t>(L)), spr_route(static_cast<size_t>(L));
  std::vector<Residual> spr_attn(static_cast<size_t>(L)), spr_ffn(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    std::vector<uint8_t> skip(static_cast<size_t>(rows), 0);
    if (single && !cpu.idx_topk[l].empty()) {
      spr_idx[l] = indexer_selection(s, spec.seqs[0], spr.idx_topk[l], spr.idx_scores[l], cpu.idx_topk[l],
                                     cpu.idx_scores[l]);
      skip = spr_idx[l].row_differs;
    }
    spr_attn[l] = layer_compare::residual(spr.mid[l].data(), cpu.mid[l].data(), rows, HD, &skip);
    spr_route[l] = routing_selection(s, rows, mt::cpu_gate_bias(*s.cpu, l), spr.experts[l], spr.gate[l],
                                     cpu.experts[l], cpu.gate[l]);
    spr_ffn[l] = layer_compare::residual(spr.out[l].data(), cpu.out[l].data(), rows, HD, &spr_route[l].row_differs);
  }
  const layer_compare::Spread attn_floor = layer_compare::worst_spread(spr_attn);
  const layer_compare::Spread ffn_floor = layer_compare::worst_spread(spr_ffn);
  // The GPU's tc-vs-GEMV spread of a piece (null without ref).
  Residual gsp;
  auto gpu_rows = [&](const float* a, const float* b, int64_t n, int64_t w,
                      const std::vector<uint8_t>* skip = nullptr) -> const Residual* {
    if (!ref) return nullptr;
    gsp = layer_compare::residual(a, b, n, w, skip);
    return &gsp;
  };
  layer_compare::RecordDiff grec;
  auto gpu_records = [&](const layer_compare::RecordDiff& d) -> const layer_compare::RecordDiff* {
    if (!ref) return nullptr;
    grec = d;
    return &grec;
  };

  // ---- per layer ----
  for (int l = 0; l < L; ++l) {
    const std::string tag = at + " | L" + std::to_string(l) + " " + layer_kind(s, l);
    const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
    const mt::CudaLayerState& gl = s.lay.layers[static_cast<size_t>(l)];
    // Attention half: the indexer's selection first (rows where it legitimately differs are left
    // out of the residual), its scores, then the residual streams.
    std::vector<uint8_t> skip_attn(static_cast<size_t>(rows), 0);
    if (single && !cpu.idx_topk[l].empty()) {
      const SeqSpec& q = spec.seqs[0];
      const Selection sel = indexer_selection(s, q, g.topk[l], g.scores[l], cpu.idx_topk[l], cpu.idx_scores[l]);
      layer_compare::check_selection(s.rep, tag + " | indexer-topk", sel, spr_idx[l]);
      skip_attn = sel.row_differs;
      const int64_t cols = (q.start + q.n) / 4;
      if (g.have_scores[l]) {
        // Scores against a key of the step that differs (on this pass or on ref) take the CPU's value.
        std::vector<uint8_t> kcol = differing_key_columns(s, q, tables, l, cpu, g.pool, cols);
        if (ref) {
          const std::vector<uint8_t> rcol = differing_key_columns(s, q, tables, l, cpu, ref->pool, cols);
          for (int64_t j = 0; j < cols; ++j) kcol[j] |= rcol[j];
        }
        int64_t n_cols = 0;
        for (uint8_t f : kcol) n_cols += f;
        std::vector<float> gsc = g.scores[l], rsc = ref && ref->have_scores[l] ? ref->scores[l] : std::vector<float>();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < cols; ++j)
            if (kcol[j]) {
              gsc[r * cols + j] = cpu.idx_scores[l][r * cols + j];
              if (!rsc.empty()) rsc[r * cols + j] = cpu.idx_scores[l][r * cols + j];
            }
        // A row's query is an FP4 record too (block 32 after the Hadamard): where one of its values
        // sat next to a rounding boundary, every score of the row moves by up to one FP4 step of
        // that value. Such rows (over the row limit) are left out and counted as records are:
        // at most kRecordDifferFrac of the rows (a wrong scale or weight moves every row). Measured on
        // an H200 (run3): one such row in a 131-row step, at max rel 0.18 (built-in, bf16 KV), 0.065
        // and 0.029 (small preset, built-in nvfp4), 5 of 5, 15 of 17 and 41 of 48 visible scores moved.
        const Residual sp = layer_compare::residual(spr.idx_scores[l].data(), cpu.idx_scores[l].data(), rows, cols);
        const layer_compare::RowLimit row_lim = layer_compare::bf16_row_limit(sp);
        const Residual* gs0 = !rsc.empty() ? gpu_rows(gsc.data(), rsc.data(), rows, cols) : nullptr;
        const layer_compare::RowLimit lim = gs0 ? layer_compare::gpu_spread_limit(row_lim, *gs0) : row_lim;
        std::vector<uint8_t> qflip(static_cast<size_t>(rows), 0);
        int64_t n_q = 0, n_q_spread = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const Residual one = layer_compare::residual(gsc.data() + r * cols, cpu.idx_scores[l].data() + r * cols, 1, cols);
          const Residual one_sp =
              layer_compare::residual(spr.idx_scores[l].data() + r * cols, cpu.idx_scores[l].data() + r * cols, 1, cols);
          if (one.max_rel > lim.max_rel) qflip[static_cast<size_t>(r)] = 1, ++n_q;
          if (one_sp.max_rel > row_lim.max_rel) ++n_q_spread;
        }
        const int64_t q_lim = layer_compare::record_total_limit(rows, n_q_spread);
        const Residual r = layer_compare::residual(gsc.data(), cpu.idx_scores[l].data(), rows, cols, &qflip);
        const Residual* gs = !rsc.empty() ? gpu_rows(gsc.data(), rsc.data(), rows, cols, &qflip) : nullptr;
        std::string note;
        if (n_cols) note += " (" + std::to_string(n_cols) + " columns of a differing key of the step left out)";
        if (n_q)
          note += " (" + std::to_string(n_q) + " rows with a differing FP4 query left out, limit " + std::to_string(q_lim) + ")";
        layer_compare::check_rows(s.rep, tag + " | indexer-scores" + note, r, sp, row_lim, gs);
        if (n_q > q_lim)
          s.rep.line(tag + " | indexer-scores: " + std::to_string(n_q) + " rows over the row limit, more than " +
                         std::to_string(q_lim) + " FP4 query flips",
                     false);
      } else {
        s.rep.line(tag + " | indexer-scores: not comparable (the step's rows took several indexer chunks)", true);
      }
    }
    {
      // On a step of one path (no ref), rows that read a differing key of the step are left out too.
      std::string keys_note;
      if (!ref) {
        const std::vector<uint8_t> flipped = rows_reading_differing_keys(s, spec, tables, l, cpu, g, rows);
        int64_t n_left = 0;
        for (int64_t r = 0; r < rows; ++r)
          if (flipped[r] && !skip_attn[r]) {
            skip_attn[r] = 1;
            ++n_left;
          }
        if (n_left) keys_note = " (" + std::to_string(n_left) + " rows reading a differing key of the step left out)";
      }
      const Residual r = layer_compare::residual(g.mid[l].data(), cpu.mid[l].data(), rows, HD, &skip_attn);
      layer_compare::check_rows(s.rep, tag + " | attn-half" + keys_note, r, spr_attn[l],
                                layer_compare::bf16_row_limit(spr_attn[l], attn_floor),
                                gpu_rows(g.mid[l].data(), ref ? ref->mid[l].data() : nullptr, rows, HD, &skip_attn));
    }
    // FFN half: routing (explained rows left out), gate logits, residual streams.
    const std::vector<float> bias = mt::cpu_gate_bias(*s.cpu, l);
    const Selection rsel = routing_selection(s, rows, bias, g.experts[l], g.gate[l], cpu.experts[l], cpu.gate[l]);
    layer_compare::check_selection(s.rep, tag + " | moe-routing", rsel, spr_route[l]);
    {
      const Residual r = layer_compare::residual(g.gate[l].data(), cpu.gate[l].data(), rows, E);
      const Residual sp = layer_compare::residual(spr.gate[l].data(), cpu.gate[l].data(), rows, E);
      layer_compare::check_rows(s.rep, tag + " | gate-logits", r, sp, layer_compare::fp32_row_limit(sp),
                                gpu_rows(g.gate[l].data(), ref ? ref->gate[l].data() : nullptr, rows, E));
    }
    {
      const Residual r = layer_compare::residual(g.out[l].data(), cpu.out[l].data(), rows, HD, &rsel.row_differs);
      layer_compare::check_rows(
          s.rep, tag + " | ffn-half", r, spr_ffn[l], layer_compare::bf16_row_limit(spr_ffn[l], ffn_floor),
          gpu_rows(g.out[l].data(), ref ? ref->out[l].data() : nullptr, rows, HD, &rsel.row_differs));
    }

    // State the layer wrote: the window records of the step's positions, the compressor rows, the
    // entries and indexer keys completed in the step.
    const LayerWrites w = layer_writes(s, spec, tables, l, cpu, spr, g, slot_mask, pool_mask);
    layer_compare::check_records(s.rep, tag + " | window-records", window_diff(s, spec, w, g.slots, nullptr),
                                 window_diff(s, spec, w, p_slots, nullptr),
                                 ref ? gpu_records(window_diff(s, spec, w, g.slots, &ref->slots)) : nullptr);
    // The same writes on the GEMV model's pass (a tensor-core step): its compressor rows.
    LayerWrites rw;
    if (ref) {
      std::vector<std::vector<uint8_t>> mask_ignored(static_cast<size_t>(s.opt.max_slots),
                                                     std::vector<uint8_t>(static_cast<size_t>(s.lay.slot_bytes), 0));
      std::vector<uint8_t> pool_ignored(g.pool.size(), 0);
      rw = layer_writes(s, spec, tables, l, cpu, spr, *ref, mask_ignored, pool_ignored);
    }
    // A compressor's committed rows [n, 2 * chans] (fp32) and the records it completed in the step.
    auto compressor_pieces = [&](const char* rows_name, const char* recs_name, int64_t chans,
                                 const std::vector<float>& gv, const std::vector<float>& cv,
                                 const std::vector<float>& pv, const std::vector<float>& rv, const RecordSet& recs,
                                 bool index_key) {
      const int64_t wd = 2 * chans, n = static_cast<int64_t>(cv.size()) / wd;
      const Residual r = layer_compare::residual(gv.data(), cv.data(), n, wd);
      const Residual sp = layer_compare::residual(pv.data(), cv.data(), n, wd);
      const Residual* gs = ref ? gpu_rows(gv.data(), rv.data(), n, wd) : nullptr;
      layer_compare::check_rows(s.rep, tag + " | " + rows_name, r, sp, layer_compare::fp32_row_limit(sp), gs);
      if (!recs.offs.empty())
        layer_compare::check_records(s.rep, tag + " | " + recs_name, diff_records(recs, g.pool, index_key, s),
                                     diff_records(recs, p_pool, index_key, s),
                                     ref ? gpu_records(diff_records(recs, g.pool, index_key, s, &ref->pool)) : nullptr);
    };
    if (c.ratio)
      compressor_pieces("compressor-rows", "compressed-entries", gl.comp_chans, w.comp_g, w.comp_c, w.comp_p,
                        rw.comp_g, w.ent, false);
    if (c.has_indexer)
      compressor_pieces("indexer-compressor-rows", "indexer-keys", gl.icomp_chans, w.icomp_g, w.icomp_c, w.icomp_p,
                        rw.icomp_g, w.keys, true);
  }
  // Nothing else of the state moved.
  {
    int64_t differ = 0, first = -1;
    std::string where;
    for (int k = 0; k < s.opt.max_slots; ++k) {
      int64_t f = -1;
      const int64_t d = untouched_differ(g.slots[k], up_slots[k], slot_mask[k], &f);
      if (d && where.empty()) where = "slot " + std::to_string(k) + " byte " + std::to_string(f);
      differ += d;
    }
    const int64_t dp = untouched_differ(g.pool, up_pool, pool_mask, &first);
    if (dp && where.empty()) where = "pool byte " + std::to_string(first);
    differ += dp;
    s.rep.line(at + " | untouched state: bytes changed outside the step's records " + std::to_string(differ) +
                   (where.empty() ? "" : " (first: " + where + ")") + " (limit 0)",
               differ == 0);
  }
  // The LM head from the CPU's last residual streams, and its greedy choice.
  {
    const Residual r = layer_compare::residual(g.logits.data(), cpu.logits.data(), rows, V);
    const Residual sp = layer_compare::residual(spr.logits.data(), cpu.logits.data(), rows, V);
    layer_compare::check_rows(s.rep, at + " | head | logits", r, sp, layer_compare::fp32_row_limit(sp),
                              gpu_rows(g.logits.data(), ref ? ref->logits.data() : nullptr, rows, V));
    auto top1 = [&](const std::vector<float>& lg) {
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      for (int64_t t = 0; t < rows; ++t)
        ids[t] = static_cast<int32_t>(std::max_element(lg.begin() + t * V, lg.begin() + (t + 1) * V) - (lg.begin() + t * V));
      return ids;
    };
    const auto gi = top1(g.logits), ci = top1(cpu.logits), pi = top1(spr.logits);
    auto logit_scores = [&](const std::vector<float>& dev) {
      return [&, dev_ptr = &dev](int64_t t, std::vector<double>& cs, std::vector<double>& ds) {
        cs.assign(cpu.logits.begin() + t * V, cpu.logits.begin() + (t + 1) * V);
        ds.assign(dev_ptr->begin() + t * V, dev_ptr->begin() + (t + 1) * V);
      };
    };
    const Selection sel = layer_compare::compare_selection(gi.data(), ci.data(), rows, 1, [](int64_t) { return 1; },
                                                           logit_scores(g.logits));
    const Selection ssel = layer_compare::compare_selection(pi.data(), ci.data(), rows, 1, [](int64_t) { return 1; },
                                                            logit_scores(spr.logits));
    layer_compare::check_selection(s.rep, at + " | head | top-1", sel, ssel);
  }
}

inline void run_step(Subject& s, const StepSpec& spec, const std::vector<std::vector<int32_t>>& toks,
                     const std::vector<std::vector<int32_t>>& tables) {
  int64_t rows = 0;
  StepBatch b;
  for (const SeqSpec& q : spec.seqs) {
    b.seqs.push_back({q.slot, q.start, std::span<const int32_t>(toks[q.slot].data() + q.start, q.n), tables[q.slot],
                      LogitsMode::kNone, false});
    rows += q.n;
  }
  const std::string at = s.name + " | " + spec.name;

  // ---- the CPU: its own run, then the spread run from the same inputs and state ----
  CpuPass pre;
  pre.slots.assign(s.opt.max_slots, {});
  for (int k = 0; k < s.opt.max_slots; ++k) {
    auto sp = mt::cpu_slot_floats(*s.cpu, k);
    pre.slots[k].assign(sp.begin(), sp.end());
  }
  {
    auto pp = mt::cpu_pool_floats(*s.cpu);
    pre.pool.assign(pp.begin(), pp.end());
  }
  CpuPass cpu, spr;
  cpu_pass(s, b, rows, nullptr, cpu);
  if (::testing::Test::HasFatalFailure()) return;
  restore_cpu_state(s, pre.slots, pre.pool);
  const bool have_isa = kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kBaseline);
  cpu_pass(s, b, rows, &cpu, spr);
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kAuto);
  if (::testing::Test::HasFatalFailure()) return;
  if (!have_isa) std::printf("[cuda-layer] %s: no baseline GEMM ISA: spreads are zero\n", at.c_str());
  restore_cpu_state(s, cpu.slots, cpu.pool);
  mt::cpu_end_step(*s.cpu, b);

  // ---- the device: the CPU's state before the step, encoded ----
  int64_t inexact = 0;
  std::vector<std::vector<uint8_t>> up_slots(static_cast<size_t>(s.opt.max_slots));
  for (int k = 0; k < s.opt.max_slots; ++k) up_slots[k] = encode_slot(s, pre.slots[k], &inexact);
  const std::vector<uint8_t> up_pool = encode_pool(s, pre.pool, &inexact);
  s.rep.line(at + " | state upload: records not decoding to the CPU's values " + std::to_string(inexact) + " (limit 0)",
             inexact == 0);
  DevPass g;
  dev_pass(s, *s.dev, spec, b, rows, cpu, up_slots, up_pool, g);
  if (::testing::Test::HasFatalFailure()) return;
  // A tensor-core step also runs on the GEMV model (same inputs and state).
  DevPass gv;
  const bool with_gemv = g.tc && s.gemv;
  if (with_gemv) {
    dev_pass(s, *s.gemv, spec, b, rows, cpu, up_slots, up_pool, gv);
    if (::testing::Test::HasFatalFailure()) return;
    if (gv.tc) ADD_FAILURE() << at << ": the GEMV model ran the step on the tensor cores";
  }

  // ---- the CPU's state after the step (its own run and the spread run) in the device's bytes ----
  int64_t inexact_post = 0, ignored = 0;
  std::vector<std::vector<uint8_t>> p_slots(static_cast<size_t>(s.opt.max_slots));
  for (int k = 0; k < s.opt.max_slots; ++k) {
    encode_slot(s, cpu.slots[k], &inexact_post);
    p_slots[k] = encode_slot(s, spr.slots[k], &ignored);
  }
  encode_pool(s, cpu.pool, &inexact_post);
  const std::vector<uint8_t> p_pool = encode_pool(s, spr.pool, &ignored);
  s.rep.line(at + " | reference state after the step: records not decoding to the CPU's values " +
                 std::to_string(inexact_post) + " (limit 0)",
             inexact_post == 0);

  // ---- every piece: the device (on a tensor-core step with the GPU's spread rule), then the GEMV
  // model's own pass of a tensor-core step with the CPU-derived limits ----
  compare_pass(s, spec, tables, g.tc ? at + " [tensor cores]" : at, rows, cpu, spr, g, with_gemv ? &gv : nullptr,
               up_slots, up_pool, p_slots, p_pool);
  if (with_gemv)
    compare_pass(s, spec, tables, at + " [gemv path]", rows, cpu, spr, gv, nullptr, up_slots, up_pool, p_slots, p_pool);
}

// ---- the DSpark draft: context insertion, each stage's halves, the heads ----

inline void run_draft(Subject& s) {
  if (!s.cpu->has_draft() || !s.dev->has_draft()) return;
  const ModelConfig& c = s.cfg;
  const int slot = 2, spare = 3;
  const int64_t P = 150, V = c.vocab_size, W = c.sliding_window, hd = s.hd(), HD = s.HD(), E = c.n_routed_experts;
  const int64_t td = s.cpu->tap_dim();
  auto toks = tokens(static_cast<int>(P + 1), 21);
  for (auto& t : toks) t = static_cast<int32_t>(t % V);
  const std::string at = s.name + " | draft";
  // The CPU's taps over [0, P).
  s.cpu->reset(slot);
  auto table = table_for(slot);
  StepBatch b;
  b.seqs.push_back({slot, 0, std::span<const int32_t>(toks.data(), P), table, LogitsMode::kNone, true});
  StepOutput out;
  ASSERT_TRUE(s.cpu->forward(b, out).ok());
  std::vector<float> taps(out.taps.begin(), out.taps.begin() + P * td);

  // Context insertion from the same taps on both (and on the CPU with the baseline GEMM ISA).
  s.cpu->draft_reset(slot);
  ASSERT_TRUE(s.cpu->draft_insert_context(slot, 0, taps).ok());
  auto cc = mt::cpu_draft_context(*s.cpu, slot);
  const std::vector<float> ctx_c(cc.begin(), cc.end());
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kBaseline);
  s.cpu->draft_reset(spare);
  const Status ist = s.cpu->draft_insert_context(spare, 0, taps);
  auto cb = mt::cpu_draft_context(*s.cpu, spare);
  const std::vector<float> ctx_p(cb.begin(), cb.end());
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kAuto);
  ASSERT_TRUE(ist.ok()) << ist.to_string();
  s.dev->reset(slot);
  ASSERT_TRUE(s.dev->draft_insert_context(slot, 0, taps).ok());
  std::vector<uint8_t> g_ctx, gv_ctx;
  s.dev->read_draft_context(slot, g_ctx);
  // P rows of taps take the tensor cores on the CUDA model (more than tc_min_rows): the GEMV model
  // inserts the same taps, and its context is compared with the CPU's too.
  const bool tc_insert = s.gemv && s.dev->tc_min_rows() >= 0 && P > s.dev->tc_min_rows();
  if (tc_insert) {
    s.gemv->reset(slot);
    ASSERT_TRUE(s.gemv->draft_insert_context(slot, 0, taps).ok());
    s.gemv->read_draft_context(slot, gv_ctx);
  }
  int64_t inexact = 0, ignored = 0;
  std::vector<uint8_t> enc_c, enc_p;
  encode_kv(s, ctx_c.data(), c.num_draft_stages * W, enc_c, &inexact);
  encode_kv(s, ctx_p.data(), c.num_draft_stages * W, enc_p, &ignored);
  for (int st = 0; st < c.num_draft_stages; ++st) {
    RecordSet set;
    for (int64_t p = std::max<int64_t>(0, P - W); p < P; ++p) {
      const int64_t i = st * W + p % W;
      set.offs.push_back(i * s.lay.rec.bytes);
      set.cpu.push_back(ctx_c.data() + i * hd);
    }
    const std::string name = " | S" + std::to_string(st) + " | context-insert";
    const layer_compare::RecordDiff spread = diff_records(set, enc_p, false, s);
    const layer_compare::RecordDiff gpu = tc_insert ? diff_records(set, g_ctx, false, s, &gv_ctx) : spread;
    layer_compare::check_records(s.rep, at + (tc_insert ? " [tensor cores]" : "") + name,
                                 diff_records(set, g_ctx, false, s), spread, tc_insert ? &gpu : nullptr);
    if (tc_insert)
      layer_compare::check_records(s.rep, at + " [gemv path]" + name, diff_records(set, gv_ctx, false, s), spread);
  }
  // Teacher-forced stages: the device reads the CPU's context.
  s.dev->write_draft_context(slot, enc_c);
  s.rep.line(at + " | context upload: records not decoding to the CPU's values " + std::to_string(inexact) + " (limit 0)",
             inexact == 0);
  std::vector<DraftRequest> reqs = {{slot, toks[P], P}, {slot, toks[P - 7], P - 7}};
  std::vector<CudaModel::DraftQueryDev> dq;
  for (const auto& r : reqs) dq.push_back({r.slot, r.anchor_token, r.anchor_pos, 0.0, 0});
  const int64_t B = static_cast<int64_t>(reqs.size());
  int64_t K = 0;
  std::vector<float> h;
  ASSERT_TRUE(mt::cpu_draft_begin(*s.cpu, reqs, h, &K).ok());
  ASSERT_EQ(K, s.dev->draft_tokens());
  const int64_t N = B * K;
  const int S = c.num_draft_stages;
  std::vector<std::vector<float>> in(S), mid(S), hout(S), gate(S), pmid(S), pout(S), pgate(S);
  std::vector<std::vector<int32_t>> ex(S), pex(S);
  for (int st = 0; st < S; ++st) {
    in[st] = h;
    mt::cpu_draft_stage_attention(*s.cpu, st, reqs, K, h.data());
    mid[st] = h;
    mt::cpu_draft_stage_ffn(*s.cpu, st, N, h.data());
    hout[st] = h;
    mt::cpu_last_routing(*s.cpu, N, gate[st], ex[st]);
  }
  std::vector<DraftResult> cres, pres, gres;
  ASSERT_TRUE(mt::cpu_draft_finish(*s.cpu, reqs, K, hout[S - 1].data(), cres).ok());
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kBaseline);
  for (int st = 0; st < S; ++st) {
    std::vector<float> x = in[st];
    mt::cpu_draft_stage_attention(*s.cpu, st, reqs, K, x.data());
    pmid[st] = x;
    x = mid[st];
    mt::cpu_draft_stage_ffn(*s.cpu, st, N, x.data());
    pout[st] = x;
    mt::cpu_last_routing(*s.cpu, N, pgate[st], pex[st]);
  }
  const Status pst = mt::cpu_draft_finish(*s.cpu, reqs, K, hout[S - 1].data(), pres);
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kAuto);
  ASSERT_TRUE(pst.ok());

  // The CPU's spread of every stage half first: the largest of each kind is a floor for all.
  std::vector<Selection> spr_route(static_cast<size_t>(S));
  std::vector<Residual> spr_attn(static_cast<size_t>(S)), spr_ffn(static_cast<size_t>(S));
  for (int st = 0; st < S; ++st) {
    spr_attn[st] = layer_compare::residual(pmid[st].data(), mid[st].data(), N, HD);
    spr_route[st] = routing_selection(s, N, mt::cpu_gate_bias(*s.cpu, st, /*draft=*/true), pex[st], pgate[st], ex[st],
                                      gate[st]);
    spr_ffn[st] = layer_compare::residual(pout[st].data(), hout[st].data(), N, HD, &spr_route[st].row_differs);
  }
  const layer_compare::Spread attn_floor = layer_compare::worst_spread(spr_attn);
  const layer_compare::Spread ffn_floor = layer_compare::worst_spread(spr_ffn);

  ASSERT_TRUE(s.dev->draft_begin(dq).ok());
  for (int st = 0; st < S; ++st) {
    const std::string tag = at + " | S" + std::to_string(st);
    std::vector<float> gm(static_cast<size_t>(N * HD)), go(static_cast<size_t>(N * HD)), gg;
    std::vector<int32_t> ge;
    s.dev->set_h(in[st].data(), N);
    s.dev->draft_stage_attention(st, B);
    s.dev->get_h(gm.data(), N);
    s.dev->set_h(mid[st].data(), N);
    s.dev->draft_stage_ffn(st, B);
    s.dev->get_h(go.data(), N);
    s.dev->last_routing(N, gg, ge);
    {
      const Residual r = layer_compare::residual(gm.data(), mid[st].data(), N, HD);
      layer_compare::check_rows(s.rep, tag + " | attn-half", r, spr_attn[st],
                                layer_compare::bf16_row_limit(spr_attn[st], attn_floor));
    }
    const std::vector<float> bias = mt::cpu_gate_bias(*s.cpu, st, /*draft=*/true);
    const Selection rsel = routing_selection(s, N, bias, ge, gg, ex[st], gate[st]);
    layer_compare::check_selection(s.rep, tag + " | moe-routing", rsel, spr_route[st]);
    {
      const Residual r = layer_compare::residual(gg.data(), gate[st].data(), N, E);
      const Residual sp = layer_compare::residual(pgate[st].data(), gate[st].data(), N, E);
      layer_compare::check_rows(s.rep, tag + " | gate-logits", r, sp, layer_compare::fp32_row_limit(sp));
    }
    {
      const Residual r = layer_compare::residual(go.data(), hout[st].data(), N, HD, &rsel.row_differs);
      layer_compare::check_rows(s.rep, tag + " | ffn-half", r, spr_ffn[st],
                                layer_compare::bf16_row_limit(spr_ffn[st], ffn_floor));
    }
  }
  // Heads from the CPU's last stage output: the Markov-corrected logits and confidences of every
  // position whose earlier drafted tokens agree (position 0 always), and the greedy tokens.
  s.dev->set_h(hout[S - 1].data(), N);
  s.dev->draft_finish(B, gres);
  ASSERT_EQ(gres.size(), static_cast<size_t>(B));
  std::vector<float> zg, zc, zp, cg, ccf, cp;
  std::vector<int32_t> tg, tc, tp;
  std::string agree;
  for (int64_t r = 0; r < B; ++r) {
    int64_t same = 0;
    while (same < K && gres[r].tokens[same] == cres[r].tokens[same]) ++same;
    int64_t psame = 0;
    while (psame < K && pres[r].tokens[psame] == cres[r].tokens[psame]) ++psame;
    agree += (agree.empty() ? "" : ", ") + std::to_string(same) + "/" + std::to_string(K);
    // Position i is conditioned on tokens 0..i-1: comparable while those agree on both sides.
    const int64_t upto = std::min<int64_t>(K, std::min(same, psame) + 1);
    for (int64_t i = 0; i < upto; ++i) {
      zg.insert(zg.end(), gres[r].logits.begin() + i * V, gres[r].logits.begin() + (i + 1) * V);
      zc.insert(zc.end(), cres[r].logits.begin() + i * V, cres[r].logits.begin() + (i + 1) * V);
      zp.insert(zp.end(), pres[r].logits.begin() + i * V, pres[r].logits.begin() + (i + 1) * V);
      cg.push_back(gres[r].confidence[i]);
      ccf.push_back(cres[r].confidence[i]);
      cp.push_back(pres[r].confidence[i]);
      tg.push_back(gres[r].tokens[i]);
      tc.push_back(cres[r].tokens[i]);
      tp.push_back(pres[r].tokens[i]);
    }
  }
  const int64_t rows = static_cast<int64_t>(tc.size());
  {
    const Residual r = layer_compare::residual(zg.data(), zc.data(), rows, V);
    const Residual sp = layer_compare::residual(zp.data(), zc.data(), rows, V);
    layer_compare::check_rows(s.rep, at + " | heads | markov-logits (comparable positions)", r, sp,
                              layer_compare::fp32_row_limit(sp));
  }
  {
    // The confidences as one row (relative to the largest |confidence|).
    const Residual r = layer_compare::residual(cg.data(), ccf.data(), 1, rows);
    const Residual sp = layer_compare::residual(cp.data(), ccf.data(), 1, rows);
    layer_compare::check_rows(s.rep, at + " | heads | confidence", r, sp, layer_compare::fp32_row_limit(sp));
  }
  {
    auto scores = [&](const std::vector<float>& dev) {
      return [&, d = &dev](int64_t t, std::vector<double>& cs, std::vector<double>& ds) {
        cs.assign(zc.begin() + t * V, zc.begin() + (t + 1) * V);
        ds.assign(d->begin() + t * V, d->begin() + (t + 1) * V);
      };
    };
    const Selection sel = layer_compare::compare_selection(tg.data(), tc.data(), rows, 1, [](int64_t) { return 1; },
                                                           scores(zg));
    const Selection ssel = layer_compare::compare_selection(tp.data(), tc.data(), rows, 1, [](int64_t) { return 1; },
                                                            scores(zp));
    layer_compare::check_selection(s.rep, at + " | heads | greedy tokens (leading tokens agree: " + agree + ")", sel,
                                   ssel);
  }
}

// ---- a whole case ----

// The whole script on one subject; failures are collected in s.rep (check_subject turns them into a
// test failure). quick: the first two steps only, no draft (the harness's own fault tests).
inline void run_subject(Subject& s, bool quick = false) {
  const int64_t V = s.cfg.vocab_size;
  std::vector<std::vector<int32_t>> toks = {tokens(300, 11), tokens(64, 12), {}, {}};
  for (auto& tl : toks)
    for (auto& t : tl) t = static_cast<int32_t>(t % V);
  std::vector<std::vector<int32_t>> tables = {table_for(0), table_for(1), table_for(2), table_for(3)};
  for (int k = 0; k < s.opt.max_slots; ++k) {
    s.cpu->reset(k);
    s.dev->reset(k);
  }
  // Two prefill chunks (the second reads the first's rings and entries and crosses the pool block
  // at 256 and the second HCA entry at 255), a decode step, a verify step of 6, and a batch of a
  // decode and a prefill in another slot.
  std::vector<StepSpec> script = {
      {"prefill 0+131", {{0, 0, 131}}},
      {"prefill 131+131", {{0, 131, 131}}},
      {"decode 262", {{0, 262, 1}}},
      {"verify 263+6", {{0, 263, 6}}},
      {"batch: decode 269 + slot 1 prefill 0+40", {{0, 269, 1}, {1, 0, 40}}},
  };
  if (quick) script.resize(2);
  for (const StepSpec& spec : script) {
    run_step(s, spec, toks, tables);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (!quick) run_draft(s);
  if (::testing::Test::HasFatalFailure()) return;
  layer_compare::check_record_totals(s.rep, s.name);
  std::printf("[cuda-layer] %s summary: %d pieces compared, %d over their limits; largest max-rel %.3g at %s\n",
              s.name.c_str(), s.rep.pieces, s.rep.failed, s.rep.worst_rel, s.rep.worst_piece.c_str());
}

inline void check_subject(const Subject& s) {
  std::string list;
  for (const auto& f : s.rep.failures) list += "\n  " + f;
  EXPECT_EQ(s.rep.failed, 0) << s.name << ": pieces over their limits:" << list;
}

}  // namespace tandem::layer_harness
