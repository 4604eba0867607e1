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
// The step's two passes: layer_passes.h; its pieces and their limits: layer_pieces.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/layer_compare.h"
#include "cuda/layer_passes.h"
#include "cuda/layer_pieces.h"
#include "cuda/layer_subject.h"
#include "cuda/tc_emulation.h"
#include "kernels/ops.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_model_testing.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"

namespace tandem::layer_harness {
// (mt, Report, Residual, Selection: declared by layer_passes.h)
using testing::table_for;
using testing::tokens;

// One step of the script: the CPU's own run and its instruction-set spread run, the device's
// teacher-forced pass (and the GEMV model's, on a tensor-core step), the CPU's
// tensor-core-emulated run of a tensor-core step, then every piece (compare_pass).
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
  restore_cpu_state(s, pre.slots, pre.pool);

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
  // A tensor-core step: the CPU once more from the same inputs and state, with the GEMMs the device
  // ran on the tensor cores computed as they accumulate (layer_compare.h).
  std::unique_ptr<TcPass> tc;
  if (g.tc) {
    tc = std::make_unique<TcPass>();
    {
      const tc_emulation::Scope emulated({tc_emulation::Mode::kEmulate});
      cpu_pass(s, b, rows, &cpu, tc->cpu);
    }
    if (::testing::Test::HasFatalFailure()) return;
    int64_t ignored = 0;
    tc->slots.resize(static_cast<size_t>(s.opt.max_slots));
    for (int k = 0; k < s.opt.max_slots; ++k) tc->slots[k] = encode_slot(s, tc->cpu.slots[k], &ignored);
    tc->pool = encode_pool(s, tc->cpu.pool, &ignored);
  }
  restore_cpu_state(s, cpu.slots, cpu.pool);
  mt::cpu_end_step(*s.cpu, b);

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

  // ---- every piece: the device (on a tensor-core step also against the tensor-core-emulated
  // spread), then the GEMV model's own pass of a tensor-core step with the CPU-derived limits ----
  compare_pass(s, spec, tables, g.tc ? at + " [tensor cores]" : at, rows, cpu, spr, g, tc.get(),
               with_gemv ? &gv : nullptr, up_slots, up_pool, p_slots, p_pool);
  if (with_gemv)
    compare_pass(s, spec, tables, at + " [gemv path]", rows, cpu, spr, gv, nullptr, nullptr, up_slots, up_pool, p_slots,
                 p_pool);
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
  std::vector<float> ctx_c(cc.begin(), cc.end());
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kBaseline);
  s.cpu->draft_reset(spare);
  const Status ist = s.cpu->draft_insert_context(spare, 0, taps);
  auto cb = mt::cpu_draft_context(*s.cpu, spare);
  std::vector<float> ctx_p(cb.begin(), cb.end());
  kernels::cpu::set_gemm_isa(kernels::cpu::Isa::kAuto);
  ASSERT_TRUE(ist.ok()) << ist.to_string();
  s.dev->reset(slot);
  ASSERT_TRUE(s.dev->draft_insert_context(slot, 0, taps).ok());
  std::vector<uint8_t> g_ctx, gv_ctx;
  s.dev->read_draft_context(slot, g_ctx);
  // P rows of taps take the tensor cores on the CUDA model (more than tc_min_rows): the CPU inserts
  // them once more with the tensor cores' accumulation emulated (layer_compare.h), and the GEMV
  // model inserts the same taps, its context compared with the CPU's too.
  const bool tc_insert = s.dev->tc_min_rows() >= 0 && P > s.dev->tc_min_rows();
  const bool with_gemv = tc_insert && s.gemv;
  std::vector<float> ctx_t;
  if (tc_insert) {
    Status tst;
    {
      const tc_emulation::Scope emulated({tc_emulation::Mode::kEmulate});
      s.cpu->draft_reset(spare);
      tst = s.cpu->draft_insert_context(spare, 0, taps);
    }
    ASSERT_TRUE(tst.ok()) << tst.to_string();
    auto ct = mt::cpu_draft_context(*s.cpu, spare);
    ctx_t.assign(ct.begin(), ct.end());
  }
  if (with_gemv) {
    s.gemv->reset(slot);
    ASSERT_TRUE(s.gemv->draft_insert_context(slot, 0, taps).ok());
    s.gemv->read_draft_context(slot, gv_ctx);
  }
  // The CPU's context rings hold position p at row p % W, the device's at row p % R (the CUDA
  // model's W + max_rollback rows): the CPU's rows of positions [lo, P) in the device's layout,
  // which the teacher-forced drafts below (anchors P and P - kBack) read. A ring of W rows aliases
  // those positions as the CPU's does; a longer one must hold them all.
  constexpr int64_t kBack = 7;
  const int64_t R = s.dev->draft_ring_rows(), lo = std::max<int64_t>(0, P - kBack - W);
  ASSERT_TRUE(R == W || R >= W + kBack) << "ring of " << R << " rows, window " << W;
  if (s.gemv) {
    ASSERT_EQ(s.gemv->draft_ring_rows(), R);
  }
  auto to_ring = [&](std::vector<float>& ctx) {
    if (ctx.empty()) return;
    std::vector<float> g(static_cast<size_t>(c.num_draft_stages * R * hd), 0.0f);
    for (int st = 0; st < c.num_draft_stages; ++st)
      for (int64_t p = lo; p < P; ++p)
        std::copy_n(ctx.data() + (st * W + p % W) * hd, hd, g.data() + (st * R + p % R) * hd);
    ctx.swap(g);
  };
  to_ring(ctx_c);
  to_ring(ctx_p);
  to_ring(ctx_t);
  int64_t inexact = 0, ignored = 0;
  std::vector<uint8_t> enc_c, enc_p, enc_t;
  encode_kv(s, ctx_c.data(), c.num_draft_stages * R, enc_c, &inexact);
  encode_kv(s, ctx_p.data(), c.num_draft_stages * R, enc_p, &ignored);
  if (tc_insert) encode_kv(s, ctx_t.data(), c.num_draft_stages * R, enc_t, &ignored);
  for (int st = 0; st < c.num_draft_stages; ++st) {
    RecordSet set;
    for (int64_t p = std::max<int64_t>(0, P - W); p < P; ++p) {
      const int64_t i = st * R + p % R;
      set.offs.push_back(i * s.lay.rec.bytes);
      set.cpu.push_back(ctx_c.data() + i * hd);
    }
    const std::string name = " | S" + std::to_string(st) + " | context-insert";
    const layer_compare::RecordDiff spread = diff_records(set, enc_p, false, s);
    layer_compare::TcRecords tr;
    layer_compare::RecordDiff gd;
    if (tc_insert) tr.spread = diff_records(set, enc_t, false, s);
    if (with_gemv) {
      gd = diff_records(set, g_ctx, false, s, &gv_ctx);
      tr.gpu = &gd;
    }
    layer_compare::check_records(s.rep, at + (tc_insert ? " [tensor cores]" : "") + name,
                                 diff_records(set, g_ctx, false, s), spread, tc_insert ? &tr : nullptr);
    if (with_gemv)
      layer_compare::check_records(s.rep, at + " [gemv path]" + name, diff_records(set, gv_ctx, false, s), spread);
  }
  // Teacher-forced stages: the device reads the CPU's context.
  s.dev->write_draft_context(slot, enc_c);
  s.rep.line(at + " | context upload: records not decoding to the CPU's values " + std::to_string(inexact) + " (limit 0)",
             inexact == 0);
  std::vector<DraftRequest> reqs = {{slot, toks[P], P}, {slot, toks[P - kBack], P - kBack}};
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
  // The worst residual per layer kind, piece and path, into the test's JSON (--gtest_output) too.
  const std::string by_kind = s.rep.by_kind_text();
  std::printf("[cuda-layer] %s by kind: %s\n", s.name.c_str(), by_kind.c_str());
  std::string key = "residuals " + s.name;
  for (char& c : key)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  ::testing::Test::RecordProperty(key, by_kind);
}

inline void check_subject(const Subject& s) {
  std::string list;
  for (const auto& f : s.rep.failures) list += "\n  " + f;
  EXPECT_EQ(s.rep.failed, 0) << s.name << ": pieces over their limits:" << list;
}

}  // namespace tandem::layer_harness
