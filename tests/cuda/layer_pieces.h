// Every piece of one step of the layer-by-layer comparison (layer_harness.h): where each layer's
// writes live in the device images and the CPU's floats, the rows and columns a differing key of
// the step legitimately moves, and compare_pass, which checks every piece of a device pass against
// the CPU with the limits of layer_compare.h (on a tensor-core step also those of the CPU's
// tensor-core-emulated run).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/layer_compare.h"
#include "cuda/layer_passes.h"
#include "cuda/layer_subject.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_model_testing.h"
#include "model/model_testing.h"

namespace tandem::layer_harness {
// (mt, Report, Residual, Selection: declared by layer_passes.h)

// The records a layer of the step wrote and the compressor rows it committed, located in the
// device images and in the CPU's floats.
struct LayerWrites {
  RecordSet win, ent, keys;
  std::vector<int64_t> win_count;  // window records per sequence of the step, in order
  // compressor rows [n, 2 * chans] of the device image g, the CPU, the CPU spread and (a
  // tensor-core step) the CPU's tensor-core-emulated run
  std::vector<float> comp_g, comp_c, comp_p, comp_t, icomp_g, icomp_c, icomp_p, icomp_t;
};

inline LayerWrites layer_writes(const Subject& s, const StepSpec& spec, const std::vector<std::vector<int32_t>>& tables,
                                int l, const CpuPass& cpu, const CpuPass& spr, const CpuPass* tce, const DevPass& g,
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
                       std::vector<float>& cv, std::vector<float>& pv, std::vector<float>& tv) {
      const int64_t wd = 2 * chans;
      for (int64_t p = q.start + std::max<int64_t>(0, q.n - ring); p < q.start + q.n; ++p) {
        const int64_t i = p % ring;
        const float* gr = reinterpret_cast<const float*>(g.slots[q.slot].data() + goff) + i * wd;
        gv.insert(gv.end(), gr, gr + wd);
        cv.insert(cv.end(), cs.begin() + coff + i * wd, cs.begin() + coff + (i + 1) * wd);
        pv.insert(pv.end(), spr.slots[q.slot].begin() + coff + i * wd, spr.slots[q.slot].begin() + coff + (i + 1) * wd);
        if (tce)
          tv.insert(tv.end(), tce->slots[q.slot].begin() + coff + i * wd, tce->slots[q.slot].begin() + coff + (i + 1) * wd);
        mark(slot_mask[q.slot], goff + i * wd * 4, wd * 4);
      }
    };
    if (c.ratio) rows_of(c.comp_off, gl.comp_off, gl.comp_ring, gl.comp_chans, w.comp_g, w.comp_c, w.comp_p, w.comp_t);
    if (c.has_indexer)
      rows_of(c.icomp_off, gl.icomp_off, gl.icomp_ring, gl.icomp_chans, w.icomp_g, w.icomp_c, w.icomp_p, w.icomp_t);
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

// The CPU's tensor-core-emulated run of a tensor-core step (layer_compare.h): its floats and its
// state after the step in the device's bytes.
struct TcPass {
  CpuPass cpu;
  std::vector<std::vector<uint8_t>> slots;
  std::vector<uint8_t> pool;
};

// Every piece of pass g against the CPU (tag prefix `at`). tc != null: g ran on the tensor cores;
// each piece's limit is also derived from the CPU's tensor-core-emulated run tc (layer_compare.h),
// and ref, when given, is the GEMV model's pass of the same step, whose distance to g is printed.
inline void compare_pass(Subject& s, const StepSpec& spec, const std::vector<std::vector<int32_t>>& tables,
                         const std::string& at, int64_t rows, const CpuPass& cpu, const CpuPass& spr,
                         const DevPass& g, const TcPass* tc, const DevPass* ref,
                         const std::vector<std::vector<uint8_t>>& up_slots, const std::vector<uint8_t>& up_pool,
                         const std::vector<std::vector<uint8_t>>& p_slots, const std::vector<uint8_t>& p_pool) {
  const int L = s.cfg.num_hidden_layers;
  const int64_t HD = s.HD(), V = s.cfg.vocab_size, E = s.cfg.n_routed_experts;
  const bool single = spec.seqs.size() == 1;
  if (!tc) ref = nullptr;
  std::vector<std::vector<uint8_t>> slot_mask(static_cast<size_t>(s.opt.max_slots));
  for (auto& m : slot_mask) m.assign(static_cast<size_t>(s.lay.slot_bytes), 0);
  std::vector<uint8_t> pool_mask(g.pool.size(), 0);

  // ---- the CPU's own spreads of every half first (the ISA switch, and on a tensor-core step the
  // emulated tensor cores): the largest of each kind is a floor for all ----
  struct Halves {
    std::vector<Selection> idx, route;
    std::vector<Residual> attn, ffn;
    layer_compare::Spread attn_floor, ffn_floor;
  };
  auto halves = [&](const CpuPass& p) {
    Halves h;
    h.idx.resize(static_cast<size_t>(L));
    h.route.resize(static_cast<size_t>(L));
    h.attn.resize(static_cast<size_t>(L));
    h.ffn.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
      std::vector<uint8_t> skip(static_cast<size_t>(rows), 0);
      if (single && !cpu.idx_topk[l].empty()) {
        h.idx[l] = indexer_selection(s, spec.seqs[0], p.idx_topk[l], p.idx_scores[l], cpu.idx_topk[l], cpu.idx_scores[l]);
        skip = h.idx[l].row_differs;
      }
      h.attn[l] = layer_compare::residual(p.mid[l].data(), cpu.mid[l].data(), rows, HD, &skip);
      h.route[l] = routing_selection(s, rows, mt::cpu_gate_bias(*s.cpu, l), p.experts[l], p.gate[l], cpu.experts[l],
                                     cpu.gate[l]);
      h.ffn[l] = layer_compare::residual(p.out[l].data(), cpu.out[l].data(), rows, HD, &h.route[l].row_differs);
    }
    h.attn_floor = layer_compare::worst_spread(h.attn);
    h.ffn_floor = layer_compare::worst_spread(h.ffn);
    return h;
  };
  const Halves sp = halves(spr);
  const Halves tp = tc ? halves(tc->cpu) : Halves{};
  // A piece's tensor-core side (null on a step of one path): the emulated run's spread, the limit
  // derived from it, and the GPU's tc-vs-GEMV spread when ref is given (a, b: g's and ref's rows
  // [n, w], skip as for the piece).
  layer_compare::TcRows trows;
  Residual gsp;
  auto tc_side = [&](const Residual& spread, const layer_compare::RowLimit& lim, const float* a, const float* b,
                     int64_t n, int64_t w, const std::vector<uint8_t>* skip) -> const layer_compare::TcRows* {
    trows.spread = spread;
    trows.lim = lim;
    trows.gpu = nullptr;
    if (ref && b) {
      gsp = layer_compare::residual(a, b, n, w, skip);
      trows.gpu = &gsp;
    }
    return &trows;
  };
  // The same for fp32 rows [n, w]: the emulated run's rows t against the CPU's want.
  auto fp32_side = [&](const float* t, const float* want, int64_t n, int64_t w, const float* a,
                       const float* b) -> const layer_compare::TcRows* {
    if (!tc) return nullptr;
    const Residual r = layer_compare::residual(t, want, n, w);
    return tc_side(r, layer_compare::fp32_row_limit(r), a, b, n, w, nullptr);
  };
  layer_compare::TcRecords trec;
  layer_compare::RecordDiff grec;
  auto tc_records = [&](const layer_compare::RecordDiff& spread,
                        const std::function<layer_compare::RecordDiff()>& gpu) -> const layer_compare::TcRecords* {
    if (!tc) return nullptr;
    trec.spread = spread;
    trec.gpu = nullptr;
    if (ref) {
      grec = gpu();
      trec.gpu = &grec;
    }
    return &trec;
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
      layer_compare::check_selection(s.rep, tag + " | indexer-topk", sel, sp.idx[l]);
      skip_attn = sel.row_differs;
      const int64_t cols = (q.start + q.n) / 4;
      if (g.have_scores[l]) {
        // Scores against a key of the step that differs (on this pass, the tensor-core-emulated run
        // or ref) take the CPU's value.
        std::vector<uint8_t> kcol = differing_key_columns(s, q, tables, l, cpu, g.pool, cols);
        for (const std::vector<uint8_t>* pool : {tc ? &tc->pool : nullptr, ref ? &ref->pool : nullptr}) {
          if (!pool) continue;
          const std::vector<uint8_t> more = differing_key_columns(s, q, tables, l, cpu, *pool, cols);
          for (int64_t j = 0; j < cols; ++j) kcol[j] |= more[j];
        }
        int64_t n_cols = 0;
        for (uint8_t f : kcol) n_cols += f;
        auto with_cpu_columns = [&](std::vector<float> v) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j)
              if (kcol[j]) v[r * cols + j] = cpu.idx_scores[l][r * cols + j];
          return v;
        };
        const std::vector<float> gsc = with_cpu_columns(g.scores[l]);
        const std::vector<float> rsc = ref && ref->have_scores[l] ? with_cpu_columns(ref->scores[l]) : std::vector<float>();
        const std::vector<float> tsc = tc ? with_cpu_columns(tc->cpu.idx_scores[l]) : std::vector<float>();
        const float* want = cpu.idx_scores[l].data();
        // A row's query is an FP4 record too (block 32 after the Hadamard): where one of its values
        // sat next to a rounding boundary, every score of the row moves by up to one FP4 step of
        // that value. Such rows (over the row limit) are left out and counted as records are:
        // at most kRecordDifferFrac of the rows, or twice as many as a spread run has (a wrong
        // scale or weight moves every row). Measured on an H200 (run3): one such row in a 131-row
        // step, at max rel 0.18 (built-in, bf16 KV), 0.065 and 0.029 (small preset, built-in
        // nvfp4), 5 of 5, 15 of 17 and 41 of 48 visible scores moved. On a tensor-core step the
        // queries come from a tensor-core GEMM and flip far more often (the emulated run: a
        // quarter of the rows of the tiny model's 131-row steps): the emulated run's rows over the
        // same row limit are counted the same way, and the rest of its rows give the tensor-core
        // limit of the remaining rows' mean and differing elements.
        auto rows_over = [&](const float* v, double lim, std::vector<uint8_t>* flag) {
          int64_t n = 0;
          for (int64_t r = 0; r < rows; ++r)
            if (layer_compare::residual(v + r * cols, want + r * cols, 1, cols).max_rel > lim) {
              ++n;
              if (flag) (*flag)[static_cast<size_t>(r)] = 1;
            }
          return n;
        };
        const Residual spi = layer_compare::residual(spr.idx_scores[l].data(), want, rows, cols);
        const layer_compare::RowLimit row_lim = layer_compare::bf16_row_limit(spi);
        int64_t n_q_spread = rows_over(spr.idx_scores[l].data(), row_lim.max_rel, nullptr);
        layer_compare::TcRows ti;
        Residual gi;
        int64_t n_q_tc = 0;
        if (tc) {
          std::vector<uint8_t> tflip(static_cast<size_t>(rows), 0);
          n_q_tc = rows_over(tsc.data(), row_lim.max_rel, &tflip);
          n_q_spread = std::max(n_q_spread, n_q_tc);
          ti.spread = layer_compare::residual(tsc.data(), want, rows, cols, &tflip);
          ti.lim = layer_compare::bf16_row_limit(ti.spread);
        }
        std::vector<uint8_t> qflip(static_cast<size_t>(rows), 0);
        const int64_t n_q = rows_over(gsc.data(), row_lim.max_rel, &qflip);
        const int64_t q_lim = layer_compare::record_total_limit(rows, n_q_spread);
        const Residual r = layer_compare::residual(gsc.data(), want, rows, cols, &qflip);
        if (tc && !rsc.empty()) {
          gi = layer_compare::residual(gsc.data(), rsc.data(), rows, cols, &qflip);
          ti.gpu = &gi;
        }
        std::string note;
        if (n_cols) note += " (" + std::to_string(n_cols) + " columns of a differing key of the step left out)";
        if (n_q || tc)
          note += " (" + std::to_string(n_q) + " rows with a differing FP4 query left out, limit " + std::to_string(q_lim) +
                  (tc ? "; the tc-emulated run has " + std::to_string(n_q_tc) : std::string()) + ")";
        layer_compare::check_rows(s.rep, tag + " | indexer-scores" + note, r, spi, row_lim, tc ? &ti : nullptr);
        if (n_q > q_lim)
          s.rep.line(tag + " | indexer-scores: " + std::to_string(n_q) + " rows over the row limit, more than " +
                         std::to_string(q_lim) + " FP4 query flips",
                     false);
      } else {
        s.rep.line(tag + " | indexer-scores: not comparable (the step's rows took several indexer chunks)", true);
      }
    }
    {
      // On a step of one path, rows that read a differing key of the step are left out too (on a
      // tensor-core step the emulated run reads its own keys as the device does: its spread has them).
      std::string keys_note;
      if (!tc) {
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
      layer_compare::check_rows(
          s.rep, tag + " | attn-half" + keys_note, r, sp.attn[l], layer_compare::bf16_row_limit(sp.attn[l], sp.attn_floor),
          tc ? tc_side(tp.attn[l], layer_compare::bf16_row_limit(tp.attn[l], tp.attn_floor), g.mid[l].data(),
                       ref ? ref->mid[l].data() : nullptr, rows, HD, &skip_attn)
             : nullptr);
    }
    // FFN half: routing (explained rows left out), gate logits, residual streams.
    const std::vector<float> bias = mt::cpu_gate_bias(*s.cpu, l);
    const Selection rsel = routing_selection(s, rows, bias, g.experts[l], g.gate[l], cpu.experts[l], cpu.gate[l]);
    layer_compare::check_selection(s.rep, tag + " | moe-routing", rsel, sp.route[l]);
    {
      const Residual r = layer_compare::residual(g.gate[l].data(), cpu.gate[l].data(), rows, E);
      const Residual spg = layer_compare::residual(spr.gate[l].data(), cpu.gate[l].data(), rows, E);
      layer_compare::check_rows(s.rep, tag + " | gate-logits", r, spg, layer_compare::fp32_row_limit(spg),
                                fp32_side(tc ? tc->cpu.gate[l].data() : nullptr, cpu.gate[l].data(), rows, E,
                                          g.gate[l].data(), ref ? ref->gate[l].data() : nullptr));
    }
    {
      const Residual r = layer_compare::residual(g.out[l].data(), cpu.out[l].data(), rows, HD, &rsel.row_differs);
      layer_compare::check_rows(
          s.rep, tag + " | ffn-half", r, sp.ffn[l], layer_compare::bf16_row_limit(sp.ffn[l], sp.ffn_floor),
          tc ? tc_side(tp.ffn[l], layer_compare::bf16_row_limit(tp.ffn[l], tp.ffn_floor), g.out[l].data(),
                       ref ? ref->out[l].data() : nullptr, rows, HD, &rsel.row_differs)
             : nullptr);
    }

    // State the layer wrote: the window records of the step's positions, the compressor rows, the
    // entries and indexer keys completed in the step.
    const LayerWrites w = layer_writes(s, spec, tables, l, cpu, spr, tc ? &tc->cpu : nullptr, g, slot_mask, pool_mask);
    layer_compare::check_records(
        s.rep, tag + " | window-records", window_diff(s, spec, w, g.slots, nullptr),
        window_diff(s, spec, w, p_slots, nullptr),
        tc ? tc_records(window_diff(s, spec, w, tc->slots, nullptr),
                        [&] { return window_diff(s, spec, w, g.slots, &ref->slots); })
           : nullptr);
    // The same writes on the GEMV model's pass (a tensor-core step): its compressor rows.
    LayerWrites rw;
    if (ref) {
      std::vector<std::vector<uint8_t>> mask_ignored(static_cast<size_t>(s.opt.max_slots),
                                                     std::vector<uint8_t>(static_cast<size_t>(s.lay.slot_bytes), 0));
      std::vector<uint8_t> pool_ignored(g.pool.size(), 0);
      rw = layer_writes(s, spec, tables, l, cpu, spr, nullptr, *ref, mask_ignored, pool_ignored);
    }
    // A compressor's committed rows [n, 2 * chans] (fp32) and the records it completed in the step.
    auto compressor_pieces = [&](const char* rows_name, const char* recs_name, int64_t chans,
                                 const std::vector<float>& gv, const std::vector<float>& cv,
                                 const std::vector<float>& pv, const std::vector<float>& tv,
                                 const std::vector<float>& rv, const RecordSet& recs, bool index_key) {
      const int64_t wd = 2 * chans, n = static_cast<int64_t>(cv.size()) / wd;
      const Residual r = layer_compare::residual(gv.data(), cv.data(), n, wd);
      const Residual spc = layer_compare::residual(pv.data(), cv.data(), n, wd);
      layer_compare::check_rows(s.rep, tag + " | " + rows_name, r, spc, layer_compare::fp32_row_limit(spc),
                                fp32_side(tv.data(), cv.data(), n, wd, gv.data(), rv.data()));
      if (!recs.offs.empty())
        layer_compare::check_records(
            s.rep, tag + " | " + recs_name, diff_records(recs, g.pool, index_key, s),
            diff_records(recs, p_pool, index_key, s),
            tc ? tc_records(diff_records(recs, tc->pool, index_key, s),
                            [&] { return diff_records(recs, g.pool, index_key, s, &ref->pool); })
               : nullptr);
    };
    if (c.ratio)
      compressor_pieces("compressor-rows", "compressed-entries", gl.comp_chans, w.comp_g, w.comp_c, w.comp_p, w.comp_t,
                        rw.comp_g, w.ent, false);
    if (c.has_indexer)
      compressor_pieces("indexer-compressor-rows", "indexer-keys", gl.icomp_chans, w.icomp_g, w.icomp_c, w.icomp_p,
                        w.icomp_t, rw.icomp_g, w.keys, true);
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
    const Residual spl = layer_compare::residual(spr.logits.data(), cpu.logits.data(), rows, V);
    layer_compare::check_rows(s.rep, at + " | head | logits", r, spl, layer_compare::fp32_row_limit(spl),
                              fp32_side(tc ? tc->cpu.logits.data() : nullptr, cpu.logits.data(), rows, V,
                                        g.logits.data(), ref ? ref->logits.data() : nullptr));
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

}  // namespace tandem::layer_harness
