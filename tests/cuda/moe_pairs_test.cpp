// The routed experts as the forward runs them (src/model/cuda/moe.cu: one (token, expert) pair per
// block, every expert of a layer in one array) against the CPU forward's experts (kernels::cpu::gemm
// of each expert's w1 / w3 / w2 rows with the reference's act_quant on x, swiglu with the routing
// weight, then the scatter-add over experts in ascending id and the bf16 sum with the shared expert):
// MXFP4 experts at the model's shape (dim 4096, inter 2048) and a smaller one, FP8 experts.
//  * moe_pairs_up / moe_pairs_down: a dot of FP8-quantized activations with FP4 / FP8 weights has
//    products of at most 8 significant bits; where the block scales keep every partial sum an fp32
//    value (sum_bound == 0) the dot is exact in any order and the bf16 output must be the rounding
//    of the exact value; elsewhere the dot is within gamma(depth) * sum |terms| (the kernel: a
//    lane's chain of k/32 FMAs and a 5-level shuffle tree; the CPU gemm: k/4 lanes' chains and a
//    horizontal sum of its L vector lanes), the bf16 value of the dot lies between the roundings of
//    the interval's ends, and the SwiGLU output (expf: 2 ulp, then 4 roundings) must be correctly
//    rounded for a value of silu(g) * u * weight over those ranges (a single value when the dots
//    are exact or far from a bf16 midpoint, which is almost every element).
//  * moe_combine: bit for bit (the CPU's additions in the CPU's order).
//  * tensor parallelism (two ranks, 8 experts each): a rank's up/down rows equal the unsharded
//    kernels' bit for bit for the pairs of its experts and are zeros for the others'; its routed-only
//    combine is the CPU's fp32 partial sum over its experts, and moe_add_shared of the rank-order
//    sum is the CPU's bf16(moe_y + shared) after its all-reduce, bit for bit.
#include <cstdio>

#include "cuda/model_kernel_util.h"
#include "model/cuda/moe.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::MoeAddSharedArgs;
using cuda_model::MoeCombineArgs;
using cuda_model::MoePairsDownArgs;
using cuda_model::MoePairsUpArgs;

struct HostWeight {
  WeightFormat format;
  int64_t n, k;
  std::vector<uint8_t> data, scale;
  WeightRef ref(const void* d, const uint8_t* s) const {
    WeightRef w;
    w.format = format;
    w.data = d;
    w.scale = s;
    w.n = n;
    w.k = k;
    return w;
  }
  WeightRef host() const { return ref(data.data(), scale.data()); }
  float at(int64_t r, int64_t c) const {  // exact dequantized element
    if (format == WeightFormat::kMxfp4)
      return num::e2m1_to_f32(num::fp4_get(data.data() + r * (k / 2), static_cast<size_t>(c))) *
             num::e8m0_to_f32(scale[r * (k / 32) + c / 32]);
    return num::e4m3_to_f32(data[r * k + c]) * num::e8m0_to_f32(scale[(r / 128) * ((k + 127) / 128) + c / 128]);
  }
};

HostWeight make_weight(WeightFormat f, int64_t n, int64_t k, uint64_t seed) {
  HostWeight w{f, n, k, {}, {}};
  if (f == WeightFormat::kMxfp4) {
    w.data.resize(static_cast<size_t>(n * k / 2));
    for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = static_cast<uint8_t>(mix64(seed * 131 + i) >> 17);
    w.scale.resize(static_cast<size_t>(n * (k / 32)));
    for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(118 + mix64(seed + 7 * i) % 5);
  } else {
    w.data.resize(static_cast<size_t>(n * k));
    for (size_t i = 0; i < w.data.size(); ++i) {
      uint8_t b = static_cast<uint8_t>(mix64(seed * 977 + i) >> 21);
      if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes in a checkpoint
      w.data[i] = b;
    }
    w.scale.resize(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)));
    for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(116 + mix64(seed + 5 * i) % 4);
  }
  return w;
}

// act_quant_fp8(x, 128) of rows [rows, k] (the reference's quantization before an FP8/FP4 GEMM).
std::vector<float> quantized(std::vector<float> x, int64_t rows, int64_t k) {
  ActQuantFp8Params q;
  q.x = x.data();
  q.rows = rows;
  q.cols = k;
  q.block = 128;
  cpu::act_quant_fp8(q);
  return x;
}

// The CPU forward's linear() of x [m, k] with one expert's rows (act_quant on a private copy, bf16 out).
std::vector<float> cpu_linear(const HostWeight& w, int64_t row0, int64_t rows, const float* x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * rows));
  GemmParams p;
  p.x = x;
  p.w = w.host().rows(row0, rows);
  p.y = y.data();
  p.m = m;
  p.n = rows;
  p.k = w.k;
  p.round_bf16 = true;
  p.quantize_x_block = 128;
  cpu::gemm(p);
  return y;
}

// The values an fp32 evaluation of one SwiGLU output can come from: g and u, the bf16 roundings of
// their dots, lie between the roundings of the dots' error intervals' ends.
struct Cand {
  float g_lo, g_hi, u_lo, u_hi;
  static Cand of(double g, double bg, double u, double bu) {
    const auto [g_lo, g_hi] = bf16_range(g - bg, g + bg);
    const auto [u_lo, u_hi] = bf16_range(u - bu, u + bu);
    return {g_lo, g_hi, u_lo, u_hi};
  }
  // Range of silu(min(g, limit)) * clamp(u, +-limit) * w over those values (w > 0): silu is
  // decreasing below its minimum at g* and increasing above it.
  void y_range(float limit, float w, double* lo, double* hi) const {
    auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
    const double a = std::min<double>(g_lo, limit), b = std::min<double>(g_hi, limit), gstar = -1.2784645427610738;
    double s_lo = std::min(silu(a), silu(b)), s_hi = std::max(silu(a), silu(b));
    if (a < gstar && gstar < b) s_lo = silu(gstar);
    const double ua = std::clamp<double>(u_lo, -limit, limit), ub = std::clamp<double>(u_hi, -limit, limit);
    const double c[4] = {s_lo * ua, s_lo * ub, s_hi * ua, s_hi * ub};
    *lo = *std::min_element(c, c + 4) * w;
    *hi = *std::max_element(c, c + 4) * w;
  }
};

// Exact dot of x[0..k) with weight row r, and the bound of an fp32 evaluation through `depth`.
double dot_ref(const HostWeight& w, int64_t r, const float* x, double depth, double* bound) {
  std::vector<double> t(static_cast<size_t>(w.k));
  double s = 0;
  for (int64_t c = 0; c < w.k; ++c) s += (t[c] = static_cast<double>(x[c]) * w.at(r, c));
  *bound = sum_bound(t.data(), w.k, depth);
  return s;
}

struct MoeCase {
  WeightFormat f;
  int64_t dim, inter, tokens;
  int experts, topk;
};

TEST(CudaMoePairs, UpAndDownMatchCpu) {
  const MoeCase cases[] = {
      {WeightFormat::kMxfp4, 4096, 2048, 1, 8, 6},  // decode at the model's shape
      {WeightFormat::kMxfp4, 1024, 512, 5, 16, 6},
      {WeightFormat::kFp8Block, 512, 256, 3, 4, 2},
  };
  const float limit = 10.0f;
  uint64_t seed = 3;
  for (const MoeCase& c : cases) {
    const int64_t pairs = c.tokens * c.topk, D = c.dim, I = c.inter;
    SCOPED_TRACE(::testing::Message() << (c.f == WeightFormat::kMxfp4 ? "mxfp4" : "fp8") << " dim " << D << " inter "
                                      << I << " pairs " << pairs);
    const HostWeight w1 = make_weight(c.f, c.experts * I, D, seed), w3 = make_weight(c.f, c.experts * I, D, seed + 1),
                     w2 = make_weight(c.f, c.experts * D, I, seed + 2);
    const std::vector<float> x = randn(static_cast<size_t>(c.tokens * D), seed + 3, 1.0f, true);
    const std::vector<float> xq = quantized(x, c.tokens, D);
    std::vector<int32_t> eid(static_cast<size_t>(pairs));
    for (int64_t t = 0; t < c.tokens; ++t)  // distinct experts per token, as the gate picks them
      for (int k = 0; k < c.topk; ++k) eid[t * c.topk + k] = static_cast<int32_t>((t * 5 + k * 3 + seed) % c.experts);
    const std::vector<float> rw = randu(static_cast<size_t>(pairs), seed + 4, 0.05f, 1.5f);
    seed += 10;

    // ---- up: the CPU (gemm w1, gemm w3, swiglu with the routing weight) and the range check ----
    const double gpu_depth = D / 32.0 + 6, cpu_depth = cpu_gemm_depth(D), act_slack = 1.25 * (kExpRel + 4 * kU);
    std::vector<float> cpu_up(static_cast<size_t>(pairs * I));
    std::vector<Cand> gpu_cand(static_cast<size_t>(pairs * I)), cpu_cand(static_cast<size_t>(pairs * I));
    int64_t inexact = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t t = i / c.topk, e = eid[i];
      std::vector<float> g = cpu_linear(w1, e * I, I, x.data() + t * D, 1);
      const std::vector<float> u = cpu_linear(w3, e * I, I, x.data() + t * D, 1);
      SwigluParams sw;
      sw.gate = g.data();
      sw.up = u.data();
      sw.row_weight = &rw[i];
      sw.out = g.data();
      sw.rows = 1;
      sw.cols = I;
      sw.limit = limit;
      sw.round_bf16 = true;
      cpu::swiglu(sw);
      std::copy(g.begin(), g.end(), cpu_up.begin() + i * I);
      for (int64_t n = 0; n < I; ++n) {
        double bg, bu;
        const double ge = dot_ref(w1, e * I + n, xq.data() + t * D, gpu_depth, &bg);
        const double ue = dot_ref(w3, e * I + n, xq.data() + t * D, gpu_depth, &bu);
        inexact += (bg > 0) + (bu > 0);
        gpu_cand[i * I + n] = Cand::of(ge, bg, ue, bu);
        const double cg = bg > 0 ? bg / gamma_n(gpu_depth) * gamma_n(cpu_depth) : 0;
        const double cu = bu > 0 ? bu / gamma_n(gpu_depth) * gamma_n(cpu_depth) : 0;
        cpu_cand[i * I + n] = Cand::of(ge, cg, ue, cu);
      }
    }
    // First element outside the range its dots allow (or success).
    auto check_up = [&](const std::vector<float>& got, const std::vector<Cand>& cand) {
      for (int64_t j = 0; j < pairs * I; ++j) {
        double lo, hi;
        cand[j].y_range(limit, rw[j / I], &lo, &hi);
        const double slack = act_slack * std::max(std::fabs(lo), std::fabs(hi));
        const bool ok = representable(got[j], Stored::kBf16) && got[j] >= lo - slack - 0.5 * ulp_of(lo, Stored::kBf16) &&
                        got[j] <= hi + slack + 0.5 * ulp_of(hi, Stored::kBf16);
        if (!ok)
          return ::testing::AssertionFailure()
                 << "pair " << j / I << " column " << j % I << ": got " << got[j] << ", want bf16 of [" << lo << ", "
                 << hi << "] (" << std::min(std::fabs(got[j] - lo), std::fabs(got[j] - hi)) / ulp_of(lo, Stored::kBf16)
                 << " bf16 ulps off; dots g in [" << cand[j].g_lo << ", " << cand[j].g_hi << "], u in ["
                 << cand[j].u_lo << ", " << cand[j].u_hi << "])";
      }
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(check_up(cpu_up, cpu_cand)) << "the CPU's experts (gemm + swiglu)";
    std::printf("[cuda moe_pairs_up] %s dim %lld: %lld of %lld dots not exact in fp32 (checked with their bound)\n",
                c.f == WeightFormat::kMxfp4 ? "mxfp4" : "fp8", static_cast<long long>(D), static_cast<long long>(inexact),
                static_cast<long long>(2 * pairs * I));

    // ---- down: the CPU's linear(w2) of the expert's activations (act_quant'ed as the forward does) ----
    const std::vector<float> gact = cpu_up;  // the input of down: any bf16 activations; use the CPU's
    const std::vector<float> gq = quantized(gact, pairs, I);
    std::vector<float> cpu_down(static_cast<size_t>(pairs * D));
    std::vector<double> ref_down(cpu_down.size()), gpu_bd(cpu_down.size()), cpu_bd(cpu_down.size());
    for (int64_t i = 0; i < pairs; ++i) {
      const std::vector<float> y = cpu_linear(w2, eid[i] * D, D, gact.data() + i * I, 1);
      std::copy(y.begin(), y.end(), cpu_down.begin() + i * D);
      for (int64_t n = 0; n < D; ++n) {
        double b;
        ref_down[i * D + n] = dot_ref(w2, eid[i] * D + n, gq.data() + i * I, I / 32.0 + 6, &b);
        gpu_bd[i * D + n] = b;
        cpu_bd[i * D + n] = b > 0 ? b / gamma_n(I / 32.0 + 6) * gamma_n(cpu_gemm_depth(I)) : 0;
      }
    }
    EXPECT_TRUE(correctly_rounded(cpu_down.data(), ref_down.data(), ref_down.size(), Stored::kBf16, 0.0, cpu_bd.data()))
        << "the CPU's w2";
    if (!have_gpu()) continue;

    DeviceBuffer<uint8_t> d1 = to_dev(w1.data), s1 = to_dev(w1.scale), d3 = to_dev(w3.data), s3 = to_dev(w3.scale),
                          d2 = to_dev(w2.data), s2 = to_dev(w2.scale);
    DeviceBuffer<float> dxq = to_dev(xq), dw = to_dev(rw), dgq = to_dev(gq);
    DeviceBuffer<int32_t> deid = to_dev(eid);
    auto dgact = poisoned<float>(cpu_up.size());
    auto dout = poisoned<float>(cpu_down.size());
    cuda_model::moe_pairs_up(MoePairsUpArgs{dxq.get(), deid.get(), dw.get(), pairs, c.topk, w1.ref(d1.get(), s1.get()),
                                            w3.ref(d3.get(), s3.get()), I, D, limit, dgact.get()},
                             kStream);
    cuda_model::moe_pairs_down(
        MoePairsDownArgs{dgq.get(), deid.get(), pairs, w2.ref(d2.get(), s2.get()), I, D, dout.get()}, kStream);
    const std::vector<float> got_up = to_host(dgact), got_down = to_host(dout);
    EXPECT_TRUE(check_up(got_up, gpu_cand)) << "moe_pairs_up";
    EXPECT_TRUE(correctly_rounded(got_down.data(), ref_down.data(), ref_down.size(), Stored::kBf16, 0.0, gpu_bd.data()))
        << "moe_pairs_down";
    size_t same_up = 0, same_down = 0;
    for (size_t j = 0; j < got_up.size(); ++j) same_up += num::f32_bits(got_up[j]) == num::f32_bits(cpu_up[j]);
    for (size_t j = 0; j < got_down.size(); ++j) same_down += num::f32_bits(got_down[j]) == num::f32_bits(cpu_down[j]);
    std::printf("[cuda moe_pairs] up %zu of %zu, down %zu of %zu outputs bit-equal to the CPU's\n", same_up,
                got_up.size(), same_down, got_down.size());
    if (D == 4096) {
      const MoePairsUpArgs ua{dxq.get(), deid.get(), dw.get(), pairs, c.topk, w1.ref(d1.get(), s1.get()),
                              w3.ref(d3.get(), s3.get()), I, D, limit, dgact.get()};
      const MoePairsDownArgs da{dgq.get(), deid.get(), pairs, w2.ref(d2.get(), s2.get()), I, D, dout.get()};
      std::printf("[cuda perf] moe_pairs mxfp4 decode (%lld pairs, 4096 -> 2048 -> 4096): up %.1f us, down %.1f us\n",
                  static_cast<long long>(pairs), median_us([&] { cuda_model::moe_pairs_up(ua, kStream); }),
                  median_us([&] { cuda_model::moe_pairs_down(da, kStream); }));
    }
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaMoePairs, CombineMatchesCpuBitForBit) {
  uint64_t seed = 60;
  for (auto [tokens, topk, experts, dim] : {std::tuple<int64_t, int, int, int64_t>{1, 6, 256, 4096}, {7, 6, 16, 4096},
                                            {300, 6, 256, 64}, {5, 2, 3, 33}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " top " << topk << " dim " << dim);
    const int64_t pairs = tokens * topk;
    std::vector<int32_t> eid(static_cast<size_t>(pairs));
    for (int64_t t = 0; t < tokens; ++t)
      for (int k = 0; k < topk; ++k) {
        int32_t e = static_cast<int32_t>(mix64(seed + t * 131 + k) % experts);
        while (std::find(eid.begin() + t * topk, eid.begin() + t * topk + k, e) != eid.begin() + t * topk + k)
          e = (e + 1) % experts;
        eid[t * topk + k] = e;
      }
    const std::vector<float> pair_out = randn(static_cast<size_t>(pairs * dim), seed + 1, 0.5f, true);
    const std::vector<float> shared = randn(static_cast<size_t>(tokens * dim), seed + 2, 0.5f, true);
    seed += 10;
    // The CPU forward's order: moe_y = 0; for each expert in ascending id, scatter-add its rows
    // (kernels::cpu::rows_copy, tokens ascending); y = bf16(moe_y + shared).
    std::vector<int32_t> off(static_cast<size_t>(experts + 1)), tok(static_cast<size_t>(pairs)),
        slot(static_cast<size_t>(pairs));
    MoeGroupParams gp;
    gp.expert_ids = eid.data();
    gp.tokens = tokens;
    gp.topk = topk;
    gp.n_experts = experts;
    gp.offsets = off.data();
    gp.token_of = tok.data();
    gp.slot_of = slot.data();
    cpu::moe_group(gp);
    std::vector<float> moe_y(static_cast<size_t>(tokens * dim), 0.0f), ex_out;
    for (int e = 0; e < experts; ++e) {
      const int32_t o0 = off[e], o1 = off[e + 1];
      if (o0 == o1) continue;
      ex_out.assign(static_cast<size_t>((o1 - o0) * dim), 0.0f);
      for (int32_t r = o0; r < o1; ++r)
        std::copy_n(pair_out.begin() + (tok[r] * topk + slot[r]) * dim, dim, ex_out.begin() + (r - o0) * dim);
      RowsCopyParams sc;
      sc.src = ex_out.data();
      sc.dst = moe_y.data();
      sc.rows = tok.data() + o0;
      sc.count = o1 - o0;
      sc.cols = dim;
      cpu::rows_copy(sc);
    }
    std::vector<float> want(moe_y.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = num::round_bf16(moe_y[i] + shared[i]);
    if (!have_gpu()) continue;
    DeviceBuffer<float> dpo = to_dev(pair_out), dsh = to_dev(shared);
    DeviceBuffer<int32_t> deid = to_dev(eid);
    auto dy = poisoned<float>(want.size());
    cuda_model::moe_combine(MoeCombineArgs{dpo.get(), deid.get(), dsh.get(), tokens, topk, dim, dy.get()}, kStream);
    EXPECT_TRUE(same_bits(to_host(dy), want));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaMoePairs, TensorParallelRanksHoldTheirExperts) {
  TANDEM_REQUIRE_GPU();
  const int64_t D = 1024, I = 512, tokens = 5;
  const int experts = 16, topk = 6, ranks = 2, per = experts / ranks;
  const int64_t pairs = tokens * topk;
  const float limit = 10.0f;
  const HostWeight w1 = make_weight(WeightFormat::kMxfp4, experts * I, D, 91),
                   w3 = make_weight(WeightFormat::kMxfp4, experts * I, D, 92),
                   w2 = make_weight(WeightFormat::kMxfp4, experts * D, I, 93);
  const std::vector<float> xq = quantized(randn(static_cast<size_t>(tokens * D), 94, 1.0f, true), tokens, D);
  std::vector<int32_t> eid(static_cast<size_t>(pairs));
  for (int64_t t = 0; t < tokens; ++t)  // distinct per token, both ranks' experts in every token
    for (int k = 0; k < topk; ++k) eid[t * topk + k] = static_cast<int32_t>((t * 3 + k * 5 + 1) % experts);
  const std::vector<float> rw = randu(static_cast<size_t>(pairs), 95, 0.05f, 1.5f);
  const std::vector<float> gq = quantized(randn(static_cast<size_t>(pairs * I), 96, 0.5f, true), pairs, I);
  const std::vector<float> shared = randn(static_cast<size_t>(tokens * D), 97, 0.5f, true);
  DeviceBuffer<uint8_t> d1 = to_dev(w1.data), s1 = to_dev(w1.scale), d3 = to_dev(w3.data), s3 = to_dev(w3.scale),
                        d2 = to_dev(w2.data), s2 = to_dev(w2.scale);
  DeviceBuffer<float> dxq = to_dev(xq), dw = to_dev(rw), dgq = to_dev(gq), dsh = to_dev(shared);
  DeviceBuffer<int32_t> deid = to_dev(eid);
  const WeightRef r1 = w1.ref(d1.get(), s1.get()), r3 = w3.ref(d3.get(), s3.get()), r2 = w2.ref(d2.get(), s2.get());
  // Unsharded: every expert held.
  auto full_up = poisoned<float>(static_cast<size_t>(pairs * I));
  auto full_down = poisoned<float>(static_cast<size_t>(pairs * D));
  cuda_model::moe_pairs_up(MoePairsUpArgs{dxq.get(), deid.get(), dw.get(), pairs, topk, r1, r3, I, D, limit, full_up.get()},
                           kStream);
  cuda_model::moe_pairs_down(MoePairsDownArgs{dgq.get(), deid.get(), pairs, r2, I, D, full_down.get()}, kStream);
  const std::vector<float> up_all = to_host(full_up), down_all = to_host(full_down);

  std::vector<float> reduced(static_cast<size_t>(tokens * D), 0.0f);
  for (int rank = 0; rank < ranks; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << ranks);
    const int b = rank * per;
    auto held = [&](int32_t e) { return e >= b && e < b + per; };
    auto up = poisoned<float>(static_cast<size_t>(pairs * I));
    auto down = poisoned<float>(static_cast<size_t>(pairs * D));
    MoePairsUpArgs ua{dxq.get(), deid.get(), dw.get(), pairs, topk, r1.rows(b * I, per * I), r3.rows(b * I, per * I),
                      I, D, limit, up.get()};
    ua.expert_begin = b;
    ua.expert_count = per;
    cuda_model::moe_pairs_up(ua, kStream);
    MoePairsDownArgs da{dgq.get(), deid.get(), pairs, r2.rows(b * D, per * D), I, D, down.get()};
    da.expert_begin = b;
    da.expert_count = per;
    cuda_model::moe_pairs_down(da, kStream);
    std::vector<float> want_up(up_all.size(), 0.0f), want_down(down_all.size(), 0.0f);
    for (int64_t i = 0; i < pairs; ++i)
      if (held(eid[i])) {
        std::copy_n(up_all.begin() + i * I, I, want_up.begin() + i * I);
        std::copy_n(down_all.begin() + i * D, D, want_down.begin() + i * D);
      }
    EXPECT_TRUE(same_bits(to_host(up), want_up)) << "moe_pairs_up";
    EXPECT_TRUE(same_bits(to_host(down), want_down)) << "moe_pairs_down";

    // Routed-only combine of the unsharded pair outputs: the CPU's moe_y over this rank's experts
    // (zero, then each held expert's row added in ascending id).
    auto dy = poisoned<float>(reduced.size());
    MoeCombineArgs ca{full_down.get(), deid.get(), nullptr, tokens, topk, D, dy.get()};
    ca.expert_begin = b;
    ca.expert_count = per;
    cuda_model::moe_combine(ca, kStream);
    std::vector<float> partial(reduced.size(), 0.0f);
    for (int64_t t = 0; t < tokens; ++t)
      for (int32_t e = b; e < b + per; ++e)
        for (int k = 0; k < topk; ++k)
          if (eid[t * topk + k] == e)
            for (int64_t d = 0; d < D; ++d) partial[t * D + d] += down_all[(t * topk + k) * D + d];
    const std::vector<float> got = to_host(dy);
    EXPECT_TRUE(same_bits(got, partial)) << "moe_combine, routed only";
    for (size_t i = 0; i < reduced.size(); ++i) reduced[i] = rank == 0 ? got[i] : reduced[i] + got[i];  // rank order
  }
  // After the all-reduce: y = bf16(sum + shared), as the CPU.
  DeviceBuffer<float> dred = to_dev(reduced);
  cuda_model::moe_add_shared(MoeAddSharedArgs{dred.get(), dsh.get(), tokens * D}, kStream);
  std::vector<float> want(reduced.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = num::round_bf16(reduced[i] + shared[i]);
  EXPECT_TRUE(same_bits(to_host(dred), want)) << "moe_add_shared";
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
