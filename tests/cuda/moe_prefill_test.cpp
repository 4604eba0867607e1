// The grouped routed experts of prefill (model/cuda/moe_prefill.h), stage by stage against float64
// references built from the reference's definition, on both tensor-core back ends, for a rank that
// holds all experts and one that holds a slice (tensor parallelism):
//  * the routing sort: sorted slot -> pair exactly the stable order (ascending expert, then pair),
//    offsets per expert;
//  * up: the SwiGLU output a = bf16(silu(bf16(g)) * bf16(u) * w) with g, u within the FP8 bound of
//    their exact sums (tests/cuda/tc_bound.h): a must equal the value computed from round(g64),
//    round(u64) (either rounding where g64 or u64 lies within the bound of a bf16 midpoint) up to the
//    exp ulps of the SwiGLU op (one bf16 step, counted);
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
// The two bf16 candidates of y64 given a bound: {round(y64)} or, near a midpoint, both neighbours.
std::vector<float> candidates(double y64, double B) {
  const float r = num::round_bf16(static_cast<float>(y64));
  std::vector<float> c{r};
  const float step = bf16_step(r);
  for (float o : {r - step, r + step}) {
    const double mid = 0.5 * (static_cast<double>(o) + r);
    if (std::fabs(y64 - mid) <= B) c.push_back(num::round_bf16(o));
  }
  return c;
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
      bool ok = false, exact = false;
      for (float gc : candidates(g, fp8_tc_bound(D, sg)))
        for (float uc : candidates(u, fp8_tc_bound(D, su))) {
          const float want = swiglu_ref(gc, uc, ew[p], limit);
          if (got == want) exact = ok = true;
          else if (std::fabs(got - want) <= bf16_step(want) * 1.0000001f) ok = true;
        }
      if (!exact) ++off_step;
      if (!ok) {
        if (first_bad == act_bits.size()) first_bad = static_cast<size_t>(sl * I + i);
        ++bad_up;
      }
    }
  }
  EXPECT_EQ(bad_up, 0u) << "up/SwiGLU outputs outside the bound; first at slot " << first_bad / I << " col "
                        << first_bad % I;
  std::printf("[moe-prefill] %-8s up: %zu of %zu SwiGLU outputs one bf16 step off (the exp ulps)\n",
              cuda::tc_backend_name(be), off_step, act_bits.size());
  EXPECT_LE(off_step, act_bits.size() / 100);

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
  if (cuda::tc_backend_for_device() == TcBackend::kWgmma) b.push_back(TcBackend::kWgmma);
  return b;
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
