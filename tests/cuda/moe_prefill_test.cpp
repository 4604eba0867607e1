// The grouped routed experts of prefill (model/cuda/moe_prefill.h), stage by stage against float64
// references built from the reference's definition, on both tensor-core back ends, for a rank that
// holds all experts and one that holds a slice (tensor parallelism):
//  * the routing sort: sorted slot -> pair exactly the stable order (ascending expert, then pair),
//    offsets per expert;
//  * up: the SwiGLU output a = bf16(silu(bf16(g)) * bf16(u) * w) with g, u within the FP8 bound of
//    their exact sums (tests/cuda/tc_bound.h): a must lie in the interval of SwiGLU over every bf16
//    g, u those bounds allow (plus the fp32 evaluation's error); on mma.sync at most 1% of the
//    outputs may differ from the value computed from round(g64), round(u64);
//  * its act_quant: codes and scales bit-exact with the CPU op applied to a;
//  * down: every local pair's row of pair_out is round(y64) of its quantized a times W2 (or the
//    neighbour within the bound of a midpoint); rows of pairs routed elsewhere stay unwritten;
//  * combine: bit-exact with the ascending-expert fp32 sum plus the shared expert.
// MXFP4 scales span the whole range the e4m3 conversion allows (11 within a K block).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "cuda/tc_bound.h"
#include "kernels/cuda/tma.h"
#include "model/cuda/moe_prefill.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda::TcBackend;

struct HostMxfp4 {
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> data, scale;
  std::vector<double> deq;  // [rows, k] dequantized (exact)
  double val(int64_t r, int64_t c) const { return deq[r * k + c]; }
  void dequantize() {
    deq.resize(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t b = data[r * (k / 2) + c / 2];
        const uint8_t nib = (c & 1) ? (b >> 4) : (b & 0xf);
        deq[r * k + c] = static_cast<double>(num::e2m1_to_f32(nib)) *
                         std::ldexp(1.0, static_cast<int>(scale[r * (k / 32) + c / 32]) - 127);
      }
  }
};
HostMxfp4 make_mxfp4(int64_t rows, int64_t k, uint64_t seed) {
  HostMxfp4 w;
  w.rows = rows;
  w.k = k;
  w.data.resize(static_cast<size_t>(rows * k / 2));
  for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = static_cast<uint8_t>(mix64(seed * 131 + i));
  w.scale.resize(static_cast<size_t>(rows * (k / 32)));
  for (size_t i = 0; i < w.scale.size(); i += 4) {
    // Each K block's four scales within [base, base + 11], the first block of each row spanning all 11.
    const uint64_t r = mix64(seed * 7 + i);
    const int base = 114 + static_cast<int>(r % 4);
    for (int j = 0; j < 4; ++j) w.scale[i + j] = static_cast<uint8_t>(base + (mix64(r + j) % 12));
    if ((i / 4) % (k / 128) == 0) {
      w.scale[i] = static_cast<uint8_t>(base);
      w.scale[i + 3] = static_cast<uint8_t>(base + 11);
    }
  }
  w.dequantize();
  return w;
}

double e4m3v(uint8_t c) { return static_cast<double>(num::e4m3_to_f32(c)); }

float swiglu_ref(float g, float u, float w, float limit) {
  if (limit > 0) {
    u = std::clamp(u, -limit, limit);
    g = std::min(g, limit);
  }
  return num::round_bf16(w * (g / (1.0f + std::exp(-g)) * u));
}
float bf16_step(float x) { return std::ldexp(1.0f, std::ilogb(x == 0 ? 1e-30f : x) - 7); }

// silu(g) = g / (1 + e^-g) over [lo, hi]: decreasing below its minimum at g* = -1.27846..., increasing
// above.
void silu_range(double lo, double hi, double* mn, double* mx) {
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  constexpr double kArgMin = -1.2784645427610738;
  const double a = silu(lo), b = silu(hi);
  *mx = std::max(a, b);
  *mn = lo <= kArgMin && kArgMin <= hi ? silu(kArgMin) : std::min(a, b);
}

// The SwiGLU outputs a = bf16(w * silu(min(g, L)) * clamp(u, +-L)) the kernel may produce when g and
// u are bf16 roundings of values within Bg / Bu of g64 / u64 (every bf16 in [bf16(g64 - Bg),
// bf16(g64 + Bg)]), allowing the fp32 evaluation's error (expf within 2 ulp, four roundings: below
// 2^-20 of the result, plus 1e-30 absolute where e^-g overflows): [lo, hi] in bf16.
void swiglu_interval(double g64, double Bg, double u64, double Bu, double w, double limit, double* lo, double* hi) {
  double gl = bf16_rne(g64 - Bg), gh = bf16_rne(g64 + Bg), ul = bf16_rne(u64 - Bu), uh = bf16_rne(u64 + Bu);
  if (limit > 0) {
    gl = std::min(gl, limit);
    gh = std::min(gh, limit);
    ul = std::clamp(ul, -limit, limit);
    uh = std::clamp(uh, -limit, limit);
  }
  double sl = 0, sh = 0;
  silu_range(gl, gh, &sl, &sh);
  const double c[4] = {sl * ul, sl * uh, sh * ul, sh * uh};
  double fl = *std::min_element(c, c + 4) * w, fh = *std::max_element(c, c + 4) * w;
  const double slack = std::ldexp(std::max(std::fabs(fl), std::fabs(fh)), -20) + 1e-30;
  *lo = bf16_rne(fl - slack);
  *hi = bf16_rne(fh + slack);
}

void run_case(int expert_begin, int n_local, TcBackend be) {
  const int64_t T = 300, D = 256, I = 256;
  const int topk = 6, E = 16;
  const float limit = 10.0f;
  SCOPED_TRACE(::testing::Message() << cuda::tc_backend_name(be) << " experts [" << expert_begin << ", "
                                  << expert_begin + n_local << ") of " << E);
  const int64_t P = T * topk;
  // Routing: distinct experts per token, positive weights.
  std::vector<int32_t> eids(static_cast<size_t>(P));
  std::vector<float> ew(static_cast<size_t>(P));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < topk; ++j) {
      const int pick = j + static_cast<int>(mix64(t * 97 + j) % (E - j));
      std::swap(all[j], all[pick]);
      eids[t * topk + j] = all[j];
      ew[t * topk + j] = 0.1f + 0.5f * static_cast<float>(mix64(t * 13 + j) % 1000) / 1000.0f;
    }
  }
  const std::vector<float> x = randn(static_cast<size_t>(T * D), 5, 1.0f, true);
  const HostMxfp4 w1 = make_mxfp4(n_local * I, D, 11), w3 = make_mxfp4(n_local * I, D, 12),
                  w2 = make_mxfp4(n_local * D, I, 13);
  ASSERT_TRUE(cuda_model::mxfp4_blocks_fit_e4m3(w1.scale.data(), w1.rows, D));
  ASSERT_TRUE(cuda_model::mxfp4_blocks_fit_e4m3(w2.scale.data(), w2.rows, I));

  DeviceBuffer<uint8_t> scratch(cuda_model::moe_prefill_scratch_bytes(T, topk, n_local, D, I));
  const cuda_model::MoePrefillScratch s = cuda_model::moe_prefill_scratch(scratch.get(), T, topk, n_local, D, I);
  DeviceBuffer<float> dx = to_dev(x), dew = to_dev(ew);
  DeviceBuffer<int32_t> deids = to_dev(eids);
  DeviceBuffer<uint8_t> d1 = to_dev(w1.data), s1 = to_dev(w1.scale), d3 = to_dev(w3.data), s3 = to_dev(w3.scale),
                        d2 = to_dev(w2.data), s2 = to_dev(w2.scale);
  auto pair_out = poisoned<float>(static_cast<size_t>(P * D));
  cuda_model::MoePrefillArgs a;
  a.x = dx.get();
  a.expert_ids = deids.get();
  a.weights = dew.get();
  a.tokens = T;
  a.topk = topk;
  a.expert_begin = expert_begin;
  a.n_local = n_local;
  auto wref = [](const DeviceBuffer<uint8_t>& d, const DeviceBuffer<uint8_t>& sc, int64_t n, int64_t k) {
    WeightRef r;
    r.format = WeightFormat::kMxfp4;
    r.data = d.get();
    r.scale = sc.get();
    r.n = n;
    r.k = k;
    return r;
  };
  a.w1 = wref(d1, s1, n_local * I, D);
  a.w3 = wref(d3, s3, n_local * I, D);
  a.w2 = wref(d2, s2, n_local * D, I);
  a.dim = D;
  a.inter = I;
  a.limit = limit;
  a.pair_out = pair_out.get();
  ASSERT_TRUE(cuda_model::moe_prefill_supported(a, s));
  cuda_model::moe_prefill(a, s, be, kStream);
  sync();

  // ---- routing
  std::vector<int32_t> want_order;
  std::vector<int32_t> want_off(n_local + 1, 0);
  for (int e = 0; e < n_local; ++e) {
    want_off[e] = static_cast<int32_t>(want_order.size());
    for (int64_t p = 0; p < P; ++p)
      if (eids[p] == expert_begin + e) want_order.push_back(static_cast<int32_t>(p));
  }
  want_off[n_local] = static_cast<int32_t>(want_order.size());
  const int64_t L = static_cast<int64_t>(want_order.size());
  std::vector<int32_t> got_order(static_cast<size_t>(L)), got_off(n_local + 1);
  TANDEM_CUDA_CHECK(cudaMemcpy(got_order.data(), s.pairs + s.max_pairs(), sizeof(int32_t) * L, cudaMemcpyDeviceToHost));
  TANDEM_CUDA_CHECK(cudaMemcpy(got_off.data(), s.offsets, sizeof(int32_t) * (n_local + 1), cudaMemcpyDeviceToHost));
  ASSERT_TRUE(same_values(got_order, want_order)) << "sorted slots";
  ASSERT_TRUE(same_values(got_off, want_off)) << "expert offsets";
  auto expert_of_slot = [&](int64_t sl) {
    int e = 0;
    while (want_off[e + 1] <= sl) ++e;
    return e;
  };

  // ---- up: a of every local slot against the float64 sums of the CPU's quantized x
  std::vector<float> xq = x;
  ActQuantFp8Params q;
  q.x = xq.data();
  q.rows = T;
  q.cols = D;
  cpu_ops().act_quant_fp8(q);
  std::vector<uint16_t> act_bits(static_cast<size_t>(L * I));
  TANDEM_CUDA_CHECK(cudaMemcpy(act_bits.data(), s.act, sizeof(uint16_t) * L * I, cudaMemcpyDeviceToHost));
  size_t off_step = 0, bad_up = 0, first_bad = act_bits.size();
  for (int64_t sl = 0; sl < L; ++sl) {
    const int64_t p = want_order[sl], t = p / topk;
    const int e = expert_of_slot(sl);
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0, sg = 0, su = 0;
      for (int64_t k = 0; k < D; ++k) {
        const double xv = xq[t * D + k];
        const double pg = xv * w1.val(e * I + i, k), pu = xv * w3.val(e * I + i, k);
        g += pg;
        u += pu;
        sg += std::fabs(pg);
        su += std::fabs(pu);
      }
      const float got = num::bf16_to_f32(act_bits[sl * I + i]);
      // Exact: the value computed from round(g64), round(u64); else within the interval above.
      const float want = swiglu_ref(num::round_bf16(static_cast<float>(g)), num::round_bf16(static_cast<float>(u)),
                                    ew[p], limit);
      if (got != want) ++off_step;
      double lo = 0, hi = 0;
      swiglu_interval(g, fp8_tc_bound(D, sg), u, fp8_tc_bound(D, su), ew[p], limit, &lo, &hi);
      if (!(lo <= got && got <= hi)) {
        if (first_bad == act_bits.size()) {
          first_bad = static_cast<size_t>(sl * I + i);
          std::printf("[moe-prefill] first SwiGLU output outside: slot %lld col %lld got %.9g, interval [%.9g, %.9g], "
                      "g64 %.9g (bound %.3g) u64 %.9g (bound %.3g) w %.6g\n",
                      static_cast<long long>(sl), static_cast<long long>(i), got, lo, hi, g, fp8_tc_bound(D, sg), u,
                      fp8_tc_bound(D, su), ew[p]);
        }
        ++bad_up;
      }
    }
  }
  EXPECT_EQ(bad_up, 0u) << "up/SwiGLU outputs outside the bound; first at slot " << first_bad / I << " col "
                        << first_bad % I;
  std::printf("[moe-prefill] %-8s up: %zu of %zu SwiGLU outputs differ from the value of round(g64), round(u64)\n",
              cuda::tc_backend_name(be), off_step, act_bits.size());
  // mma.sync sums a block's exact products in fp32: only the exp ulps (and g or u at a bf16 midpoint)
  // move an output, rarely. wgmma keeps about 14 bits while accumulating: more outputs move, each
  // within the interval checked above.
  if (be == TcBackend::kMmaSync) {
    EXPECT_LE(off_step, act_bits.size() / 100);
  }

  // ---- act_quant of a, bit-exact with the CPU op on the same values
  std::vector<float> av(act_bits.size());
  for (size_t i = 0; i < av.size(); ++i) av[i] = num::bf16_to_f32(act_bits[i]);
  std::vector<uint8_t> want_codes(av.size()), want_sc(static_cast<size_t>(L * (I / 128)));
  {
    std::vector<float> tmp = av;
    ActQuantFp8Params aq;
    aq.x = tmp.data();
    aq.rows = L;
    aq.cols = I;
    aq.codes = want_codes.data();
    aq.scales = want_sc.data();
    cpu_ops().act_quant_fp8(aq);
  }
  std::vector<uint8_t> codes(av.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(codes.data(), s.act_codes, codes.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(same_values(codes, want_codes)) << "act codes";
  const int64_t sld = (P + 3) / 4 * 4;
  std::vector<float> scales(static_cast<size_t>((I / 128) * sld));
  TANDEM_CUDA_CHECK(cudaMemcpy(scales.data(), s.act_scales, sizeof(float) * scales.size(), cudaMemcpyDeviceToHost));
  size_t bad_sc = 0;
  for (int64_t sl = 0; sl < L; ++sl)
    for (int64_t b = 0; b < I / 128; ++b)
      bad_sc += scales[b * sld + sl] != num::e8m0_to_f32(want_sc[sl * (I / 128) + b]);
  EXPECT_EQ(bad_sc, 0u) << "act scales";

  // ---- down: pair_out rows
  const std::vector<float> po = to_host(pair_out);
  std::vector<float> got_rows;
  std::vector<double> y64, B;
  for (int64_t sl = 0; sl < L; ++sl) {
    const int64_t p = want_order[sl];
    const int e = expert_of_slot(sl);
    for (int64_t n = 0; n < D; ++n) {
      double sum = 0, sa = 0;
      for (int64_t k = 0; k < I; ++k) {
        const double pr = e4m3v(want_codes[sl * I + k]) * num::e8m0_to_f32(want_sc[sl * (I / 128) + k / 128]) *
                          w2.val(e * D + n, k);
        sum += pr;
        sa += std::fabs(pr);
      }
      got_rows.push_back(po[p * D + n]);
      y64.push_back(sum);
      B.push_back(fp8_tc_bound(I, sa));
    }
  }
  double worst = 0;
  EXPECT_TRUE(within_bound(got_rows, y64, B, true, &worst)) << "down (pair_out)";
  size_t written_elsewhere = 0;
  for (int64_t p = 0; p < P; ++p) {
    const int e = eids[p] - expert_begin;
    if (e >= 0 && e < n_local) continue;
    for (int64_t n = 0; n < D; ++n) written_elsewhere += !std::isnan(po[p * D + n]);
  }
  EXPECT_EQ(written_elsewhere, 0u) << "rows of pairs routed to other ranks were written";

  // ---- combine: ascending expert id, fp32, + shared, bf16
  const std::vector<float> shared = randn(static_cast<size_t>(T * D), 77, 1.0f, true);
  DeviceBuffer<float> dsh = to_dev(shared);
  auto y = poisoned<float>(static_cast<size_t>(T * D));
  auto yr = poisoned<float>(static_cast<size_t>(T * D));
  cuda_model::moe_combine_local(pair_out.get(), deids.get(), dsh.get(), T, topk, D, expert_begin, n_local, y.get(),
                                kStream);
  cuda_model::moe_combine_local(pair_out.get(), deids.get(), nullptr, T, topk, D, expert_begin, n_local, yr.get(),
                                kStream);
  std::vector<float> want_y(static_cast<size_t>(T * D)), want_r(want_y.size());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> js;
    for (int j = 0; j < topk; ++j) {
      const int e = eids[t * topk + j] - expert_begin;
      if (e >= 0 && e < n_local) js.push_back(j);
    }
    std::sort(js.begin(), js.end(), [&](int l, int r) { return eids[t * topk + l] < eids[t * topk + r]; });
    for (int64_t n = 0; n < D; ++n) {
      float acc = 0.0f;
      for (int j : js) acc += po[(t * topk + j) * D + n];
      want_r[t * D + n] = acc;
      want_y[t * D + n] = num::round_bf16(acc + shared[t * D + n]);
    }
  }
  EXPECT_TRUE(same_bits(to_host(y), want_y)) << "combine with the shared expert";
  EXPECT_TRUE(same_bits(to_host(yr), want_r)) << "combine, routed sum only";
}

std::vector<TcBackend> backends() {
  std::vector<TcBackend> b{TcBackend::kMmaSync};
  if (cuda::tc_device_has_wgmma()) {
    b.push_back(TcBackend::kWgmma);
    if (cuda::tma_available()) b.push_back(TcBackend::kWgmmaWs);
  }
  return b;
}

// Routing of T tokens: topk distinct experts of E per token, positive weights (run_case's scheme).
void make_routing(int64_t T, int topk, int E, uint64_t seed, std::vector<int32_t>& eids, std::vector<float>& ew) {
  eids.resize(static_cast<size_t>(T * topk));
  ew.resize(eids.size());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < topk; ++j) {
      const int pick = j + static_cast<int>(mix64(seed + t * 97 + j) % (E - j));
      std::swap(all[j], all[pick]);
      eids[t * topk + j] = all[j];
      ew[t * topk + j] = 0.1f + 0.5f * static_cast<float>(mix64(seed + t * 13 + j) % 1000) / 1000.0f;
    }
  }
}

// Device copies of one rank's experts and a runner over any slice of tokens.
struct MoeDev {
  int64_t D = 0, I = 0;
  int topk = 0, expert_begin = 0, n_local = 0;
  float limit = 10.0f;
  DeviceBuffer<uint8_t> d1, s1, d3, s3, d2, s2;
  MoeDev(const HostMxfp4& w1, const HostMxfp4& w3, const HostMxfp4& w2, int64_t dim, int64_t inter, int k,
         int begin, int local)
      : D(dim), I(inter), topk(k), expert_begin(begin), n_local(local), d1(to_dev(w1.data)), s1(to_dev(w1.scale)),
        d3(to_dev(w3.data)), s3(to_dev(w3.scale)), d2(to_dev(w2.data)), s2(to_dev(w2.scale)) {}
  static WeightRef ref(const DeviceBuffer<uint8_t>& d, const DeviceBuffer<uint8_t>& sc, int64_t n, int64_t k) {
    WeightRef r;
    r.format = WeightFormat::kMxfp4;
    r.data = d.get();
    r.scale = sc.get();
    r.n = n;
    r.k = k;
    return r;
  }
  cuda_model::MoePrefillArgs args(const float* x, const int32_t* eids, const float* ew, int64_t T,
                                  float* pair_out) const {
    cuda_model::MoePrefillArgs a;
    a.x = x;
    a.expert_ids = eids;
    a.weights = ew;
    a.tokens = T;
    a.topk = topk;
    a.expert_begin = expert_begin;
    a.n_local = n_local;
    a.w1 = ref(d1, s1, n_local * I, D);
    a.w3 = ref(d3, s3, n_local * I, D);
    a.w2 = ref(d2, s2, n_local * D, I);
    a.dim = D;
    a.inter = I;
    a.limit = limit;
    a.pair_out = pair_out;
    return a;
  }
  // pair_out rows of tokens [t0, t0 + T) of (x, eids, ew), computed in a step of those T tokens.
  std::vector<float> run(const std::vector<float>& x, const std::vector<int32_t>& eids, const std::vector<float>& ew,
                         int64_t t0, int64_t T, TcBackend be) const {
    DeviceBuffer<float> dx = to_dev(std::vector<float>(x.begin() + t0 * D, x.begin() + (t0 + T) * D));
    DeviceBuffer<int32_t> de = to_dev(std::vector<int32_t>(eids.begin() + t0 * topk, eids.begin() + (t0 + T) * topk));
    DeviceBuffer<float> dw = to_dev(std::vector<float>(ew.begin() + t0 * topk, ew.begin() + (t0 + T) * topk));
    DeviceBuffer<uint8_t> scratch(cuda_model::moe_prefill_scratch_bytes(T, topk, n_local, D, I));
    const cuda_model::MoePrefillScratch s = cuda_model::moe_prefill_scratch(scratch.get(), T, topk, n_local, D, I);
    auto po = poisoned<float>(static_cast<size_t>(T * topk * D));
    const cuda_model::MoePrefillArgs a = args(dx.get(), de.get(), dw.get(), T, po.get());
    EXPECT_TRUE(cuda_model::moe_prefill_supported(a, s));
    cuda_model::moe_prefill(a, s, be, kStream);
    return to_host(po);
  }
};

// A pair's output depends on its token, expert and weight only: the pairs of tokens computed in
// steps of other sizes (1, 4, 9, 72, 140 tokens at other offsets, so other tile positions and
// expert groupings) have the same bits as in the whole step; rows of pairs routed to other ranks stay
// unwritten either way.
TEST(CudaMoePrefill, PairsAreIndependentOfTheStep) {
  TANDEM_REQUIRE_GPU();
  const int64_t T = 300, D = 256, I = 256;
  const int topk = 6, E = 16;
  std::vector<int32_t> eids;
  std::vector<float> ew;
  make_routing(T, topk, E, 3, eids, ew);
  const std::vector<float> x = randn(static_cast<size_t>(T * D), 8, 1.0f, true);
  const MoeDev dev(make_mxfp4(8 * I, D, 21), make_mxfp4(8 * I, D, 22), make_mxfp4(8 * D, I, 23), D, I, topk, 4, 8);
  const std::pair<int64_t, int64_t> parts[] = {{0, 1}, {5, 4}, {130, 9}, {200, 72}, {7, 140}};
  for (TcBackend be : backends()) {
    SCOPED_TRACE(cuda::tc_backend_name(be));
    const std::vector<float> whole = dev.run(x, eids, ew, 0, T, be);
    for (auto [t0, n] : parts) {
      SCOPED_TRACE(::testing::Message() << "tokens " << t0 << ".." << t0 + n - 1 << " alone");
      const std::vector<float> part = dev.run(x, eids, ew, t0, n, be);
      EXPECT_TRUE(same_bits(part, std::vector<float>(whole.begin() + t0 * topk * D,
                                                     whole.begin() + (t0 + n) * topk * D)));
    }
  }
}

// Inputs whose K-block sums are exact in any accumulator of >= 13 bits: x blocks hold one +-4 (the
// block's scale becomes 2^-6) and values from {1, 1.5, 2} (codes 64 .. 256), weights e2m1 values
// {0.5, 1, 1.5} with the four group scales of a K block equal (converted values e2m1 x 64, column
// scale 2^(s - 133)): every back end must equal the emulation of the promotion
// (acc = fma(block sum, a_scale * col_scale, acc) in K order) -- g and u through the SwiGLU within
// one bf16 step (the device's expf), the down projection bit for bit (run on act rows of the same
// kind written into the scratch). Pins every slot, column, w1/w3 interleave and scale index of the
// grouped kernels, over more tiles than an H200 has SMs.
TEST(CudaMoePrefill, ExactBlockSumsMatchTheEmulation) {
  TANDEM_REQUIRE_GPU();
  const int64_t T = 900, D = 512, I = 256;  // 8 experts x 6 tiles x 4 column blocks = 192 tiles per GEMM
  const int topk = 6, E = 8;
  std::vector<int32_t> eids;
  std::vector<float> ew;
  make_routing(T, topk, E, 77, eids, ew);
  const int64_t P = T * topk;
  // x: per 128-block one +-4 at a varying place, the rest +-{1, 1.5, 2}.
  auto exact_rows = [](int64_t rows, int64_t cols, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    const float mags[3] = {1.0f, 1.5f, 2.0f};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t h = mix64(seed + static_cast<uint64_t>(r * cols + c));
        float m = mags[h % 3];
        if (c % 128 == static_cast<int64_t>(mix64(seed + r * 131 + c / 128) % 128)) m = 4.0f;
        v[r * cols + c] = (h >> 8) & 1 ? -m : m;
      }
    return v;
  };
  auto exact_w = [](int64_t rows, int64_t k, uint64_t seed) {
    HostMxfp4 w;
    w.rows = rows;
    w.k = k;
    w.data.resize(static_cast<size_t>(rows * k / 2));
    const uint8_t nib[3] = {1, 2, 3};  // 0.5, 1, 1.5
    for (size_t i = 0; i < w.data.size(); ++i) {
      const uint64_t h = mix64(seed * 131 + i);
      const uint8_t lo = static_cast<uint8_t>(nib[h % 3] | ((h >> 8) & 1 ? 8 : 0));
      const uint8_t hi = static_cast<uint8_t>(nib[(h >> 16) % 3] | ((h >> 24) & 1 ? 8 : 0));
      w.data[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
    w.scale.resize(static_cast<size_t>(rows * (k / 32)));
    for (size_t i = 0; i < w.scale.size(); i += 4) {
      const uint8_t sc = static_cast<uint8_t>(118 + mix64(seed * 7 + i) % 9);
      for (int j = 0; j < 4; ++j) w.scale[i + j] = sc;
    }
    w.dequantize();
    return w;
  };
  const std::vector<float> x = exact_rows(T, D, 1000);
  const HostMxfp4 w1 = exact_w(E * I, D, 31), w3 = exact_w(E * I, D, 32), w2 = exact_w(E * D, I, 33);
  const MoeDev dev(w1, w3, w2, D, I, topk, 0, E);
  // Host quantization of x (codes + scales per token) and the slot order.
  std::vector<float> xq = x;
  std::vector<uint8_t> xcodes(x.size()), xsc(static_cast<size_t>(T * (D / 128)));
  {
    ActQuantFp8Params q;
    q.x = xq.data();
    q.rows = T;
    q.cols = D;
    q.codes = xcodes.data();
    q.scales = xsc.data();
    cpu_ops().act_quant_fp8(q);
  }
  std::vector<int32_t> order;
  std::vector<int> expert_of;
  for (int e = 0; e < E; ++e)
    for (int64_t p = 0; p < P; ++p)
      if (eids[p] == e) {
        order.push_back(static_cast<int32_t>(p));
        expert_of.push_back(e);
      }
  // The converted weights (e2m1 x 64, what the tensor cores multiply) and each (row, K block)'s
  // column scale 2^(s - 133).
  struct Conv {
    std::vector<float> v, cs;
  };
  auto convert = [](const HostMxfp4& w) {
    Conv c;
    c.v.resize(static_cast<size_t>(w.rows * w.k));
    c.cs.resize(static_cast<size_t>(w.rows * (w.k / 128)));
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t i = 0; i < w.k; ++i) {
        const uint8_t b = w.data[r * (w.k / 2) + i / 2];
        c.v[r * w.k + i] = num::e2m1_to_f32((i & 1) ? (b >> 4) : (b & 0xf)) * 64.0f;
        if (i % 128 == 0)
          c.cs[r * (w.k / 128) + i / 128] = std::ldexp(1.0f, static_cast<int>(w.scale[r * (w.k / 32) + i / 32]) - 133);
      }
    return c;
  };
  const Conv c1 = convert(w1), c3 = convert(w3), c2 = convert(w2);
  // The promotion over K blocks of one output: acc = fma(block sum, a_scale * col_scale, acc).
  auto emulate = [](const uint8_t* codes, const float* ascale, const Conv& w, int64_t row, int64_t k) {
    float acc = 0.0f;
    for (int64_t b = 0; b < k / 128; ++b) {
      double blk = 0;
      for (int64_t i = b * 128; i < b * 128 + 128; ++i)
        blk += static_cast<double>(num::e4m3_decode(codes[i])) * w.v[row * k + i];
      acc = std::fma(static_cast<float>(blk), ascale[b] * w.cs[row * (k / 128) + b], acc);
    }
    return acc;
  };
  DeviceBuffer<float> dx = to_dev(x), dew = to_dev(ew);
  DeviceBuffer<int32_t> deids = to_dev(eids);
  DeviceBuffer<uint8_t> scratch(cuda_model::moe_prefill_scratch_bytes(T, topk, E, D, I));
  const cuda_model::MoePrefillScratch s = cuda_model::moe_prefill_scratch(scratch.get(), T, topk, E, D, I);
  // Down's input: act rows (bf16, slot order) of the exact kind, quantized as the kernel will.
  const std::vector<float> act = exact_rows(P, I, 2000);
  std::vector<uint16_t> act_bits(act.size());
  for (size_t i = 0; i < act.size(); ++i) act_bits[i] = num::f32_to_bf16(act[i]);
  std::vector<float> aq = act;
  std::vector<uint8_t> acodes(act.size()), asc(static_cast<size_t>(P * (I / 128)));
  {
    ActQuantFp8Params q;
    q.x = aq.data();
    q.rows = P;
    q.cols = I;
    q.codes = acodes.data();
    q.scales = asc.data();
    cpu_ops().act_quant_fp8(q);
  }
  std::vector<float> want_act(static_cast<size_t>(P * I));
  for (size_t sl = 0; sl < order.size(); ++sl) {
    const int64_t p = order[sl], t = p / topk;
    const int e = expert_of[sl];
    float sa[8];
    for (int64_t b = 0; b < D / 128; ++b) sa[b] = num::e8m0_to_f32(xsc[t * (D / 128) + b]);
    for (int64_t i = 0; i < I; ++i) {
      const float g = emulate(&xcodes[t * D], sa, c1, e * I + i, D), u = emulate(&xcodes[t * D], sa, c3, e * I + i, D);
      want_act[sl * I + i] = swiglu_ref(num::round_bf16(g), num::round_bf16(u), ew[p], dev.limit);
    }
  }
  std::vector<float> want_rows;
  want_rows.reserve(order.size() * D);
  for (size_t sl = 0; sl < order.size(); ++sl) {
    float sa[8];
    for (int64_t b = 0; b < I / 128; ++b) sa[b] = num::e8m0_to_f32(asc[sl * (I / 128) + b]);
    for (int64_t n = 0; n < D; ++n)
      want_rows.push_back(num::round_bf16(emulate(&acodes[sl * I], sa, c2, expert_of[sl] * D + n, I)));
  }
  for (TcBackend be : backends()) {
    SCOPED_TRACE(cuda::tc_backend_name(be));
    auto po = poisoned<float>(static_cast<size_t>(P * D));
    const cuda_model::MoePrefillArgs a = dev.args(dx.get(), deids.get(), dew.get(), T, po.get());
    ASSERT_TRUE(cuda_model::moe_prefill_supported(a, s));
    cuda_model::moe_prefill_route(a, s, kStream);
    cuda_model::moe_prefill_up(a, s, be, kStream);
    std::vector<uint16_t> got_act(static_cast<size_t>(P * I));
    sync();
    TANDEM_CUDA_CHECK(cudaMemcpy(got_act.data(), s.act, sizeof(uint16_t) * got_act.size(), cudaMemcpyDeviceToHost));
    size_t far = 0, off = 0, first = got_act.size();
    for (size_t i = 0; i < order.size() * I; ++i) {
      const float got = num::bf16_to_f32(got_act[i]), want = want_act[i];
      if (got != want) ++off;
      if (!(std::fabs(got - want) <= bf16_step(want) * 1.0000001f)) {
        if (first == got_act.size()) first = i;
        ++far;
      }
    }
    EXPECT_EQ(far, 0u) << "up: first at slot " << first / I << " col " << first % I;
    EXPECT_LE(off, got_act.size() / 100) << "up outputs one bf16 step off the emulation (expf ulps)";
    // Down on act rows of the exact kind.
    TANDEM_CUDA_CHECK(cudaMemcpy(s.act, act_bits.data(), sizeof(uint16_t) * act_bits.size(), cudaMemcpyHostToDevice));
    cuda_model::moe_prefill_down(a, s, be, kStream);
    const std::vector<float> got = to_host(po);
    std::vector<float> got_rows;
    for (size_t sl = 0; sl < order.size(); ++sl)
      for (int64_t n = 0; n < D; ++n) got_rows.push_back(got[order[sl] * D + n]);
    EXPECT_TRUE(same_bits(got_rows, want_rows)) << "down";
  }
}

TEST(CudaMoePrefill, AllExpertsLocal) {
  TANDEM_REQUIRE_GPU();
  for (TcBackend be : backends()) run_case(0, 16, be);
}

TEST(CudaMoePrefill, ASliceOfTheExperts) {
  TANDEM_REQUIRE_GPU();
  for (TcBackend be : backends()) run_case(4, 8, be);
}

TEST(MoePrefillFit, ScaleSpreadOfAKBlock) {
  std::vector<uint8_t> sc(8, 120);
  EXPECT_TRUE(cuda_model::mxfp4_blocks_fit_e4m3(sc.data(), 1, 256));
  sc[5] = 131;  // spread 11
  EXPECT_TRUE(cuda_model::mxfp4_blocks_fit_e4m3(sc.data(), 1, 256));
  sc[6] = 132;  // spread 12
  EXPECT_FALSE(cuda_model::mxfp4_blocks_fit_e4m3(sc.data(), 1, 256));
  sc[6] = 120;
  sc[0] = 255;  // NaN scale
  EXPECT_FALSE(cuda_model::mxfp4_blocks_fit_e4m3(sc.data(), 1, 256));
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
