// The tensor-core prefill FP8 GEMM (kernels/cuda/gemm_tc.h) and the cuBLASLt reference points
// (gemm_lt.h) against exact references, on every back end the device runs (sm_90: the
// warp-specialized TMA kernels, the portable loop on wgmma, overlapped wgmma and mma.sync):
//  * quantize_fp8_act == the CPU's act_quant_fp8, codes and scales bit for bit (fp32 and bf16 input,
//    also gathering rows through src_rows);
//  * on inputs whose K-block sums are exact in any accumulator of >= 11 bits (small codes), the
//    result must equal, bit for bit, the fp32 emulation of the kernels' promotion
//    (acc = fma(block_sum, sa * sw, acc) in K order): this pins every index, scale and the K order,
//    also over enough tiles that the persistent kernels take several tiles per CTA;
//  * on full-range random codes, |y - y64| <= (2^-10 + gamma_{K/128+1}) * S (the bound of gemm_tc.h),
//    and a bf16 output is a rounding of a value within that bound (bf16(y64 - B) <= y <= bf16(y64 + B));
//  * the linear (quantize + multiply) against the CPU gemm on checkpoint-like weights (quantized
//    normals), within the bound, with the count of outputs identical to the CPU's printed;
//  * a row's result does not depend on the rows around it: the same rows computed in calls of 1, 4,
//    9, 72, 128, 140 and 467 rows at different offsets give the same bits;
//  * cuBLASLt's block-scaled FP8 (sm_90) within the same bound, which also pins its scale layout;
//  * cuBLASLt bf16 (fp32 output) within gamma_K (u = 2^-23: truncating adds) of the exact sum, and
//    run() refuses row counts it was not prepared for with a Status.
// Every failure prints the first offending element and the per-case maximum error over the bound.
#include <cmath>
#include <cstdio>
#include <limits>

#include "cuda/cuda_test_util.h"
#include "cuda/tc_bound.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/cuda/tma.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda::TcBackend;

std::vector<TcBackend> backends() {
  std::vector<TcBackend> b{TcBackend::kMmaSync};
  if (cuda::tc_device_has_wgmma()) {
    b.push_back(TcBackend::kWgmma);
    b.push_back(TcBackend::kWgmmaOverlap);
    if (cuda::tma_available()) b.push_back(TcBackend::kWgmmaWs);
  }
  return b;
}

double e8m0(uint8_t b) { return std::ldexp(1.0, static_cast<int>(b) - 127); }

// A quantized activation as the GEMM consumes it: codes [m, k], fp32 scales [k/128][ld].
struct HostAct {
  int64_t m = 0, k = 0, ld = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> deq;  // [m, k]
  double val(int64_t r, int64_t c) const { return deq[r * k + c]; }
  void dequantize() {
    deq.resize(codes.size());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c)
        deq[r * k + c] = static_cast<double>(num::e4m3_to_f32(codes[r * k + c])) * scales[(c / 128) * ld + r];
  }
};
struct HostW {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;  // [n, k]
  std::vector<uint8_t> scale;  // [ceil(n/128), k/128]
  std::vector<double> deq;     // [n, k]
  double val(int64_t r, int64_t c) const { return deq[r * k + c]; }
  void dequantize() {
    deq.resize(codes.size());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c)
        deq[r * k + c] = static_cast<double>(num::e4m3_to_f32(codes[r * k + c])) * e8m0(scale[(r / 128) * (k / 128) + c / 128]);
  }
};

// small = codes of magnitude {1, 1.5, 2} (A) / {1, 2, 3} (W) with random signs: every K-block sum is a
// multiple of 1/2 below 2^11, exact in any accumulator.
HostAct make_act(int64_t m, int64_t k, uint64_t seed, bool small) {
  HostAct a;
  a.m = m;
  a.k = k;
  a.ld = (m + 3) / 4 * 4;
  a.codes.resize(static_cast<size_t>(m * k));
  a.scales.assign(static_cast<size_t>((k / 128) * a.ld), 0.0f);
  const uint8_t small_codes[3] = {0x38, 0x3C, 0x40};  // 1, 1.5, 2
  for (size_t i = 0; i < a.codes.size(); ++i) {
    const uint64_t r = mix64(seed * 31 + i);
    uint8_t c;
    if (small) {
      c = static_cast<uint8_t>(small_codes[r % 3] | ((r >> 8) & 1 ? 0x80 : 0));
    } else {
      c = static_cast<uint8_t>(r);
      if ((c & 0x7f) == 0x7f) c ^= 1;
    }
    a.codes[i] = c;
  }
  for (int64_t b = 0; b < k / 128; ++b)
    for (int64_t r = 0; r < m; ++r)
      a.scales[b * a.ld + r] = std::ldexp(1.0f, static_cast<int>(mix64(seed + 977 * (b * m + r)) % 9) - 4);
  a.dequantize();
  return a;
}
HostW make_w(int64_t n, int64_t k, uint64_t seed, bool small) {
  HostW w;
  w.n = n;
  w.k = k;
  w.codes.resize(static_cast<size_t>(n * k));
  const uint8_t small_codes[3] = {0x38, 0x40, 0x44};  // 1, 2, 3
  for (size_t i = 0; i < w.codes.size(); ++i) {
    const uint64_t r = mix64(seed * 17 + i);
    uint8_t c;
    if (small) {
      c = static_cast<uint8_t>(small_codes[r % 3] | ((r >> 8) & 1 ? 0x80 : 0));
    } else {
      c = static_cast<uint8_t>(r);
      if ((c & 0x7f) == 0x7f) c ^= 1;
    }
    w.codes[i] = c;
  }
  w.scale.resize(static_cast<size_t>(((n + 127) / 128) * (k / 128)));
  for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(122 + mix64(seed + 5 * i) % 9);
  w.dequantize();
  return w;
}

// Checkpoint-like weights: normal values (std 0.02) quantized per 128 x 128 block as the official
// checkpoints are (num::quantize_fp8_block).
HostW make_w_normal(int64_t n, int64_t k, uint64_t seed) {
  std::vector<float> v = randn(static_cast<size_t>(n * k), seed, 0.02f, false);
  num::Fp8BlockWeight q = num::quantize_fp8_block(v.data(), static_cast<size_t>(n), static_cast<size_t>(k));
  HostW w;
  w.n = n;
  w.k = k;
  w.codes = std::move(q.data);
  w.scale = std::move(q.scale);
  w.dequantize();
  return w;
}

struct Case {
  int64_t m, n, k;
  bool accumulate = false, round = false;
};

// y0 (accumulate) + exact products: y64; S = sum |products| (+ |y0|).
void reference(const HostAct& a, const HostW& w, const Case& c, const std::vector<float>& y0, std::vector<double>& y64,
               std::vector<double>& S) {
  y64.assign(static_cast<size_t>(c.m * c.n), 0.0);
  S.assign(y64.size(), 0.0);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0, sa = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        const double p = a.val(r, q) * w.val(j, q);
        s += p;
        sa += std::fabs(p);
      }
      if (c.accumulate) {
        s += y0[r * c.n + j];
        sa += std::fabs(y0[r * c.n + j]);
      }
      y64[r * c.n + j] = s;
      S[r * c.n + j] = sa;
    }
}

// The kernel's arithmetic when every block sum is exact: acc = fma(block, sa * sw, acc), K order.
std::vector<float> emulate(const HostAct& a, const HostW& w, const Case& c, const std::vector<float>& y0) {
  std::vector<float> y(static_cast<size_t>(c.m * c.n));
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < c.k / 128; ++b) {
        double blk = 0;
        for (int64_t q = b * 128; q < b * 128 + 128; ++q)
          blk += static_cast<double>(num::e4m3_to_f32(a.codes[r * c.k + q])) * num::e4m3_to_f32(w.codes[j * c.k + q]);
        const float sc = a.scales[b * a.ld + r] * static_cast<float>(e8m0(w.scale[(j / 128) * (c.k / 128) + b]));
        acc = std::fma(static_cast<float>(blk), sc, acc);
      }
      if (c.accumulate) acc = y0[r * c.n + j] + acc;
      y[r * c.n + j] = c.round ? num::round_bf16(acc) : acc;
    }
  return y;
}

double bound(const Case& c, double S) { return fp8_tc_bound(c.k, S); }

// Runs fp8_gemm_tc on host data; returns y.
std::vector<float> run_tc(const HostAct& a, const HostW& w, const Case& c, const std::vector<float>& y0, TcBackend be) {
  DeviceBuffer<uint8_t> da = to_dev(a.codes), dw = to_dev(w.codes), ds = to_dev(w.scale);
  DeviceBuffer<float> das = to_dev(a.scales), dy = to_dev(y0);
  cuda::Fp8GemmArgs g;
  g.a = da.get();
  g.a_scale = das.get();
  g.a_scale_ld = a.ld;
  g.w = dw.get();
  g.w_scale = ds.get();
  g.y = dy.get();
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.accumulate = c.accumulate;
  g.round_bf16 = c.round;
  cuda::fp8_gemm_tc(g, be, kStream);
  return to_host(dy);
}

TEST(CudaFp8Quant, MatchesActQuantBitExact) {
  TANDEM_REQUIRE_GPU();
  for (bool bf16_in : {false, true}) {
    // ... and a prefill chunk's activation (4,096 x 4,096: the encoder's every exponent and subnormal code).
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 128}, {5, 384}, {97, 1024}, {300, 256}, {4096, 4096}}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " cols " << cols << (bf16_in ? " bf16" : " f32"));
      std::vector<float> x = randn(static_cast<size_t>(rows * cols), 7 + rows, 2.0f, bf16_in);
      for (int64_t r = 0; r < rows; ++r) x[r * cols + (r * 37) % cols] *= 1e4f;  // per-row scale variety
      if (rows > 4) {
        x[3] = std::numeric_limits<float>::quiet_NaN();
        x[7] = -std::numeric_limits<float>::quiet_NaN();  // its code keeps the sign (0xff)
        x[cols + 5] = std::numeric_limits<float>::infinity();
        x[cols + 9] = -std::numeric_limits<float>::infinity();
        for (int64_t c = 128; c < 256 && c < cols; ++c) x[2 * cols + c] = 1e-6f;  // the amax floor
      }
      if (bf16_in)
        for (auto& v : x) v = num::round_bf16(v);  // the bf16 input holds exactly these values
      std::vector<uint8_t> want_codes(x.size()), want_sc(static_cast<size_t>(rows * (cols / 128)));
      std::vector<float> xc = x;
      ActQuantFp8Params q;
      q.x = xc.data();
      q.rows = rows;
      q.cols = cols;
      q.codes = want_codes.data();
      q.scales = want_sc.data();
      cpu_ops().act_quant_fp8(q);
      for (bool rows_major : {false, true}) {
        DeviceBuffer<float> dx = to_dev(x);
        std::vector<uint16_t> xb(x.size());
        for (size_t i = 0; i < x.size(); ++i) xb[i] = num::f32_to_bf16(x[i]);
        DeviceBuffer<uint16_t> dxb = to_dev(xb);
        auto codes = poisoned<uint8_t>(x.size(), 0x7f);
        const int64_t ld = (rows + 3) / 4 * 4;
        auto sc = poisoned<float>(static_cast<size_t>((cols / 128) * ld));
        cuda::Fp8QuantArgs a;
        if (bf16_in) a.xb = dxb.get();
        else a.x = dx.get();
        a.rows = rows;
        a.cols = cols;
        a.codes = codes.get();
        a.scales = sc.get();
        a.scale_ld = ld;
        a.scale_rows_major = rows_major;
        cuda::quantize_fp8_act(a, kStream);
        EXPECT_TRUE(same_values(to_host(codes), want_codes));
        const std::vector<float> got_sc = to_host(sc);
        size_t bad = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t b = 0; b < cols / 128; ++b) {
            const float g = got_sc[rows_major ? r * (cols / 128) + b : b * ld + r];
            if (g != num::e8m0_to_f32(want_sc[r * (cols / 128) + b])) ++bad;
          }
        EXPECT_EQ(bad, 0u) << "scales differ (rows_major " << rows_major << ")";
      }
    }
  }
}

TEST(CudaFp8GemmTc, ExactBlockSumsMatchTheEmulationBitForBit) {
  TANDEM_REQUIRE_GPU();
  // The last two: more tiles than an H200 has SMs (180 and 221), with K blocks (2 and 3) that are
  // not a multiple of the persistent kernels' stage count, so the stage ring wraps inside tiles.
  const std::vector<Case> cases = {{97, 128, 128}, {128, 256, 512}, {200, 384, 1024, false, true},
                                   {300, 200, 256}, {130, 130, 384, true, true}, {1000, 512, 256, true, false},
                                   {150, 131, 256, true, true},  // odd n: odd row stride, scalar stores
                                   {1200, 2304, 256},  {1663, 2176, 384, false, true}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const HostAct a = make_act(c.m, c.k, seed++, true);
    const HostW w = make_w(c.n, c.k, seed++, true);
    const std::vector<float> y0 = c.accumulate ? randn(static_cast<size_t>(c.m * c.n), seed++, 4.0f, true)
                                               : poisoned_host<float>(static_cast<size_t>(c.m * c.n));
    const std::vector<float> want = emulate(a, w, c, y0);
    for (TcBackend be : backends()) {
      SCOPED_TRACE(::testing::Message() << cuda::tc_backend_name(be) << " m " << c.m << " n " << c.n << " k " << c.k
                                      << (c.accumulate ? " acc" : "") << (c.round ? " bf16" : ""));
      EXPECT_TRUE(same_bits(run_tc(a, w, c, y0, be), want));
    }
  }
}

TEST(CudaFp8GemmTc, RandomCodesWithinTheStatedBound) {
  TANDEM_REQUIRE_GPU();
  const std::vector<Case> cases = {{128, 128, 1024}, {257, 384, 2048, false, true}, {200, 256, 4096, true, false}};
  uint64_t seed = 300;
  for (const Case& c : cases) {
    const HostAct a = make_act(c.m, c.k, seed++, false);
    const HostW w = make_w(c.n, c.k, seed++, false);
    const std::vector<float> y0 = c.accumulate ? randn(static_cast<size_t>(c.m * c.n), seed++, 4.0f, true)
                                               : poisoned_host<float>(static_cast<size_t>(c.m * c.n));
    std::vector<double> y64, S;
    reference(a, w, c, y0, y64, S);
    std::vector<double> B(S.size());
    for (size_t i = 0; i < S.size(); ++i) B[i] = bound(c, S[i]);
    for (TcBackend be : backends()) {
      SCOPED_TRACE(::testing::Message() << cuda::tc_backend_name(be) << " m " << c.m << " n " << c.n << " k " << c.k);
      const std::vector<float> got = run_tc(a, w, c, y0, be);
      double worst = 0;
      EXPECT_TRUE(within_bound(got, y64, B, c.round, &worst));
      if (!c.round) {
        double max_rel = 0;
        for (size_t i = 0; i < got.size(); ++i) max_rel = std::max(max_rel, std::fabs(got[i] - y64[i]) / S[i]);
        std::printf("[fp8-tc] %-8s m %4lld n %4lld k %5lld: max |y - y64| / S = %.3g (bound %.3g), worst/bound %.3g\n",
                    cuda::tc_backend_name(be), static_cast<long long>(c.m), static_cast<long long>(c.n),
                    static_cast<long long>(c.k), max_rel, bound(c, 1.0), worst);
      }
    }
  }
}

// gemm_fp8_linear (quantize + multiply) against the CPU gemm with quantize_x_block = 128 on
// checkpoint-like weights, and a row computed inside a larger call equals the same row computed in
// calls of other sizes and offsets.
TEST(CudaFp8GemmTc, LinearMatchesCpuAndRowsAreIndependent) {
  TANDEM_REQUIRE_GPU();
  const int64_t m = 467, n = 512, k = 1024;
  const HostW w = make_w_normal(n, k, 41);
  DeviceBuffer<uint8_t> dw = to_dev(w.codes), ds = to_dev(w.scale);
  std::vector<float> x = randn(static_cast<size_t>(m * k), 42, 1.0f, true);
  DeviceBuffer<float> dx = to_dev(x);
  DeviceBuffer<uint8_t> codes(cuda::TcLinearScratch::codes_bytes(m, k));
  DeviceBuffer<float> scales(cuda::TcLinearScratch::scale_floats(m, k));
  cuda::TcLinearScratch s;
  s.codes = codes.get();
  s.scales = scales.get();
  s.rows = m;
  s.max_k = k;
  GemmParams p;
  p.w.format = WeightFormat::kFp8Block;
  p.w.data = w.codes.data();
  p.w.scale = w.scale.data();
  p.w.n = n;
  p.w.k = k;
  p.m = m;
  p.n = n;
  p.k = k;
  p.round_bf16 = true;
  p.quantize_x_block = 128;
  std::vector<float> want(static_cast<size_t>(m * n));
  p.x = x.data();
  p.y = want.data();
  cpu_ops().gemm(p);
  // y64 of the quantized x (the CPU op's own input to its products).
  std::vector<float> xq = x;
  ActQuantFp8Params q;
  q.x = xq.data();
  q.rows = m;
  q.cols = k;
  cpu_ops().act_quant_fp8(q);
  const Case c{m, n, k, false, true};
  std::vector<double> y64(static_cast<size_t>(m * n)), B(y64.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, sa = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double pr = static_cast<double>(xq[r * k + i]) * w.val(j, i);
        sum += pr;
        sa += std::fabs(pr);
      }
      y64[r * n + j] = sum;
      B[r * n + j] = bound(c, sa);
    }
  // (offset, rows) of the smaller calls: the step sizes of the model tests (a decode step of 4 slots,
  // 9, 72, 128, 140 rows) at offsets that put rows in other tile positions.
  const std::pair<int64_t, int64_t> parts[] = {{0, 1}, {5, 4}, {130, 9}, {300, 72}, {150, 128}, {7, 140}, {327, 140}};
  for (TcBackend be : backends()) {
    SCOPED_TRACE(cuda::tc_backend_name(be));
    auto dy = poisoned<float>(static_cast<size_t>(m * n));
    GemmParams g = p;
    g.x = dx.get();
    g.y = dy.get();
    g.w.data = dw.get();
    g.w.scale = ds.get();
    ASSERT_TRUE(cuda::fp8_linear_supported(g, s));
    cuda::gemm_fp8_linear(g, s, be, kStream);
    const std::vector<float> got = to_host(dy);
    double worst = 0;
    EXPECT_TRUE(within_bound(got, y64, B, true, &worst));
    size_t same = 0;
    double max_rel = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      same += got[i] == want[i];
      max_rel = std::max(max_rel, std::fabs(got[i] - y64[i]) / std::max(std::fabs(y64[i]), 1e-3));
    }
    std::printf("[fp8-tc] %-13s linear vs CPU gemm: %zu of %zu bf16 outputs identical, max |y - y64| / |y64| %.3g\n",
                cuda::tc_backend_name(be), same, got.size(), max_rel);
    for (auto [r0, rows] : parts) {
      SCOPED_TRACE(::testing::Message() << "rows " << r0 << ".." << r0 + rows - 1 << " alone");
      auto dp = poisoned<float>(static_cast<size_t>(rows * n));
      GemmParams h = g;
      h.x = dx.get() + r0 * k;
      h.y = dp.get();
      h.m = rows;
      cuda::gemm_fp8_linear(h, s, be, kStream);
      EXPECT_TRUE(same_bits(to_host(dp), std::vector<float>(got.begin() + r0 * n, got.begin() + (r0 + rows) * n)));
    }
  }
}

// quantize_fp8_act with src_rows: output row r quantizes input row src_rows[r] / src_div (the grouped
// experts' slot order), rows past rows_limit untouched.
// gemm_fp8_linear_packed on the codes of a norm's pack (decode_act_pack with the norm weight, as
// hc_pre_pack leaves them for the prefill's x) equals gemm_fp8_linear on the normed rows, bit for
// bit: the same codes, the E8M0 scales expanded to the quantizer's grid. A prefill chunk's rows
// and a ragged count.
TEST(CudaFp8GemmTc, PackedCodesGiveTheLinearsBits) {
  TANDEM_REQUIRE_GPU();
  const int64_t n = 384, k = 1024;
  const HostW w = make_w_normal(n, k, 51);
  DeviceBuffer<uint8_t> dw = to_dev(w.codes), ds = to_dev(w.scale);
  for (const int64_t m : {int64_t{97}, int64_t{4096}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << m);
    std::vector<float> x = randn(static_cast<size_t>(m * k), 52 + m, 3.0f, true);
    for (int64_t r = 0; r < m; ++r) x[r * k + (r * 41) % k] *= 300.0f;  // per-block scale variety
    const std::vector<float> nw = randn(static_cast<size_t>(k), 53, 1.0f, true);
    DeviceBuffer<float> dx = to_dev(x), dnw = to_dev(nw);
    auto normed = poisoned<float>(x.size());
    auto pcodes = poisoned<uint8_t>(x.size());
    auto pscales = poisoned<uint8_t>(static_cast<size_t>(m * (k / 128)));
    cuda::DecodeActPackArgs pa;
    pa.x = dx.get();
    pa.rows = m;
    pa.dim = k;
    pa.norm_weight = dnw.get();
    pa.y = normed.get();
    pa.codes = pcodes.get();
    pa.scales = pscales.get();
    cuda::decode_act_pack(pa, kStream);
    DeviceBuffer<uint8_t> codes(cuda::TcLinearScratch::codes_bytes(m, k));
    DeviceBuffer<float> scales(cuda::TcLinearScratch::scale_floats(m, k));
    cuda::TcLinearScratch s;
    s.codes = codes.get();
    s.scales = scales.get();
    s.rows = m;
    s.max_k = k;
    GemmParams p;
    p.w.format = WeightFormat::kFp8Block;
    p.w.data = dw.get();
    p.w.scale = ds.get();
    p.w.n = n;
    p.w.k = k;
    p.x = normed.get();
    p.m = m;
    p.n = n;
    p.k = k;
    p.round_bf16 = true;
    p.quantize_x_block = 128;
    for (TcBackend be : backends()) {
      SCOPED_TRACE(cuda::tc_backend_name(be));
      auto y0 = poisoned<float>(static_cast<size_t>(m * n)), y1 = poisoned<float>(static_cast<size_t>(m * n));
      GemmParams q = p;
      q.y = y0.get();
      cuda::gemm_fp8_linear(q, s, be, kStream);
      const std::vector<uint8_t> quant_codes = to_host(codes);
      poison(scales);
      q.y = y1.get();
      cuda::gemm_fp8_linear_packed(q, pcodes.get(), pscales.get(), s, be, kStream);
      EXPECT_TRUE(same_values(to_host(pcodes), quant_codes)) << "the pack's codes vs the quantizer's";
      EXPECT_TRUE(same_bits(to_host(y1), to_host(y0))) << "y (index / " << n << " = row)";
    }
  }
}

TEST(CudaFp8Quant, GathersRowsThroughSrcRows) {
  TANDEM_REQUIRE_GPU();
  const int64_t tokens = 37, cols = 256, topk = 3, rows = tokens * topk;
  std::vector<float> x = randn(static_cast<size_t>(tokens * cols), 17, 3.0f, true);
  std::vector<int32_t> src(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) src[r] = static_cast<int32_t>(mix64(r + 5) % rows);
  const int32_t limit = static_cast<int32_t>(rows - 10);
  std::vector<uint8_t> want_codes(static_cast<size_t>(tokens * cols));
  std::vector<uint8_t> want_sc(static_cast<size_t>(tokens * (cols / 128)));
  {
    std::vector<float> xc = x;
    ActQuantFp8Params q;
    q.x = xc.data();
    q.rows = tokens;
    q.cols = cols;
    q.codes = want_codes.data();
    q.scales = want_sc.data();
    cpu_ops().act_quant_fp8(q);
  }
  DeviceBuffer<float> dx = to_dev(x);
  DeviceBuffer<int32_t> dsrc = to_dev(src), dlim = to_dev(std::vector<int32_t>{limit});
  const int64_t ld = (rows + 3) / 4 * 4;
  auto codes = poisoned<uint8_t>(static_cast<size_t>(rows * cols), 0x7f);
  auto sc = poisoned<float>(static_cast<size_t>((cols / 128) * ld));
  cuda::Fp8QuantArgs a;
  a.x = dx.get();
  a.rows = rows;
  a.cols = cols;
  a.rows_limit = dlim.get();
  a.src_rows = dsrc.get();
  a.src_div = static_cast<int>(topk);
  a.codes = codes.get();
  a.scales = sc.get();
  a.scale_ld = ld;
  cuda::quantize_fp8_act(a, kStream);
  const std::vector<uint8_t> got = to_host(codes);
  const std::vector<float> got_sc = to_host(sc);
  size_t bad = 0, untouched = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = src[r] / topk;
    for (int64_t c = 0; c < cols; ++c) {
      if (r >= limit) untouched += got[r * cols + c] == 0x7f;
      else bad += got[r * cols + c] != want_codes[t * cols + c];
    }
    for (int64_t b = 0; b < cols / 128 && r < limit; ++b)
      bad += got_sc[b * ld + r] != num::e8m0_to_f32(want_sc[t * (cols / 128) + b]);
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(untouched, static_cast<size_t>((rows - limit) * cols)) << "rows past rows_limit were written";
}

// cuBLASLt's block-scaled FP8 (sm_90): prepared, run with our layouts (weights' E8M0 grid converted
// to fp32, activation scales [k/128][round_up(m, 4)]), within the bound above.
TEST(CudaLtGemm, Fp8BlockScaledWithinTheBound) {
  TANDEM_REQUIRE_GPU();
  auto lt = cuda::LtGemm::create();
  ASSERT_TRUE(lt.ok()) << lt.status().to_string();
  for (const Case& c : {Case{256, 512, 1024}, Case{200, 384, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k);
    cuda::LtShape sh;
    sh.kind = cuda::LtKind::kFp8Block;
    sh.n = c.n;
    sh.k = c.k;
    sh.ldx = c.k;
    sh.ldy = c.n;
    const Status st = (*lt)->prepare(sh, 1024);
    if (!st.ok()) {
      std::printf("[lt] block-scaled FP8 unavailable on %s: %s\n", cuda::device_description(0), st.to_string().c_str());
      if (cuda::tc_device_has_wgmma()) ADD_FAILURE() << "sm_90 should have it: " << st.to_string();
      return;
    }
    const HostAct a = make_act(c.m, c.k, 500 + c.m, false);
    const HostW w = make_w(c.n, c.k, 600 + c.n, false);
    ASSERT_EQ(a.ld, cuda::gemm_lt_scale_ld(c.m));
    std::vector<float> wsf(w.scale.size());
    for (size_t i = 0; i < wsf.size(); ++i) wsf[i] = num::e8m0_to_f32(w.scale[i]);
    DeviceBuffer<uint8_t> da = to_dev(a.codes), dw = to_dev(w.codes);
    DeviceBuffer<float> das = to_dev(a.scales), dws = to_dev(wsf);
    auto dy = poisoned<float>(static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE((*lt)->ready(sh, c.m));
    const Status rs = (*lt)->run(sh, c.m, dw.get(), da.get(), dy.get(), dws.get(), das.get(), kStream);
    ASSERT_TRUE(rs.ok()) << rs.to_string();
    EXPECT_FALSE((*lt)->ready(sh, c.m + 1)) << "block-scaled FP8 needs row counts that are multiples of 4";
    EXPECT_FALSE((*lt)->run(sh, c.m + 1, dw.get(), da.get(), dy.get(), dws.get(), das.get(), kStream).ok());
    std::vector<double> y64, S;
    reference(a, w, c, {}, y64, S);
    std::vector<double> B(S.size());
    for (size_t i = 0; i < S.size(); ++i) B[i] = bound(c, S[i]);
    double worst = 0;
    const ::testing::AssertionResult ok = within_bound(to_host(dy), y64, B, false, &worst);
    EXPECT_TRUE(ok);
    std::printf("[lt] block-scaled FP8 m %lld n %lld k %lld: worst error / bound %.3g\n", static_cast<long long>(c.m),
                static_cast<long long>(c.n), static_cast<long long>(c.k), worst);
    if (!ok) {
      // Which activation-scale layout does cuBLASLt read? Try [m][k/128] (K blocks contiguous per row).
      std::vector<float> tr(static_cast<size_t>(c.m * (c.k / 128)));
      for (int64_t r = 0; r < c.m; ++r)
        for (int64_t b = 0; b < c.k / 128; ++b) tr[r * (c.k / 128) + b] = a.scales[b * a.ld + r];
      DeviceBuffer<float> dtr = to_dev(tr);
      ASSERT_TRUE((*lt)->run(sh, c.m, dw.get(), da.get(), dy.get(), dws.get(), dtr.get(), kStream).ok());
      double w2 = 0;
      const bool alt = within_bound(to_host(dy), y64, B, false, &w2);
      std::printf("[lt] with activation scales laid out [m][k/128] instead: %s (worst / bound %.3g)\n",
                  alt ? "within the bound: cuBLASLt reads that layout" : "also outside", w2);
    }
  }
}

// cuBLASLt bf16 x bf16 -> fp32 (the benchmark's reference for the bf16 linears), plain and as the
// batched wo_a einsum, within the tensor-core bf16 bound; a row count it was not prepared for is a
// Status, never an abort. Whether its one split-K-free algorithm gives a row the same bits in a
// smaller call is printed (the forward runs its own kernels, which guarantee that).
TEST(CudaLtGemm, Bf16WithinTheBoundAndUnpreparedRowsAreAStatus) {
  TANDEM_REQUIRE_GPU();
  auto lt = cuda::LtGemm::create();
  ASSERT_TRUE(lt.ok()) << lt.status().to_string();
  struct B16 {
    int64_t m, n, k, batch;
    bool acc;
  };
  for (const B16& c : {B16{200, 256, 4096, 1, false}, B16{130, 1024, 512, 1, true}, B16{97, 128, 256, 2, false}}) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " batch " << c.batch);
    cuda::LtShape sh;
    sh.kind = cuda::LtKind::kBf16;
    sh.n = c.n;
    sh.k = c.k;
    sh.ldx = c.k * c.batch;
    sh.ldy = c.n * c.batch;
    sh.batch = c.batch;
    sh.w_batch_rows = c.n;
    sh.x_batch_stride = c.k;
    sh.y_batch_stride = c.n;
    sh.accumulate = c.acc;
    const Status ps = (*lt)->prepare(sh, 256, 1);
    ASSERT_TRUE(ps.ok()) << ps.to_string();
    EXPECT_FALSE((*lt)->ready(sh, 300));
    EXPECT_FALSE((*lt)->run(sh, 300, nullptr, nullptr, nullptr, nullptr, nullptr, kStream).ok());
    const size_t xs = static_cast<size_t>(c.m * c.k * c.batch), ws = static_cast<size_t>(c.n * c.k * c.batch),
                 ys = static_cast<size_t>(c.m * c.n * c.batch);
    std::vector<float> x = randn(xs, 70 + c.m, 1.0f, true), wf = randn(ws, 71 + c.n, 0.05f, true);
    std::vector<uint16_t> xb(xs), wb(ws);
    for (size_t i = 0; i < xs; ++i) xb[i] = num::f32_to_bf16(x[i]);
    for (size_t i = 0; i < ws; ++i) wb[i] = num::f32_to_bf16(wf[i]);
    const std::vector<float> y0 = c.acc ? randn(ys, 72, 1.0f, true) : poisoned_host<float>(ys);
    DeviceBuffer<uint16_t> dx = to_dev(xb), dw = to_dev(wb);
    DeviceBuffer<float> dy = to_dev(y0);
    const Status rs = (*lt)->run(sh, c.m, dw.get(), dx.get(), dy.get(), nullptr, nullptr, kStream);
    ASSERT_TRUE(rs.ok()) << rs.to_string();
    const std::vector<float> got = to_host(dy);
    size_t bad = 0, first = ys;
    double worst = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t r = 0; r < c.m; ++r)
        for (int64_t j = 0; j < c.n; ++j) {
          double s = 0, sa = 0;
          for (int64_t i = 0; i < c.k; ++i) {
            const double p = static_cast<double>(x[r * c.k * c.batch + b * c.k + i]) * wf[(b * c.n + j) * c.k + i];
            s += p;
            sa += std::fabs(p);
          }
          const size_t at = static_cast<size_t>(r * c.n * c.batch + b * c.n + j);
          if (c.acc) {
            s += y0[at];
            sa += std::fabs(y0[at]);
          }
          const double B = bf16_tc_bound(c.k, sa);
          const double err = std::fabs(got[at] - s);
          worst = std::max(worst, err / B);
          if (!(err <= B)) {
            if (first == ys) first = at;
            ++bad;
          }
        }
    EXPECT_EQ(bad, 0u) << "first at " << first << " got " << got[first];
    std::printf("[lt] bf16 m %lld n %lld k %lld batch %lld: worst error / bound %.3g\n", static_cast<long long>(c.m),
                static_cast<long long>(c.n), static_cast<long long>(c.k), static_cast<long long>(c.batch), worst);
    if (!c.acc) {
      for (const int64_t rows : {c.m - 1, int64_t{4}, int64_t{1}}) {
        const int64_t r0 = c.m - rows;
        auto part = poisoned<float>(static_cast<size_t>(rows * c.n * c.batch));
        ASSERT_TRUE(
            (*lt)->run(sh, rows, dw.get(), dx.get() + r0 * c.k * c.batch, part.get(), nullptr, nullptr, kStream).ok());
        const std::vector<float> ph = to_host(part);
        size_t differ = 0;
        for (size_t i = 0; i < ph.size(); ++i)
          differ += num::f32_bits(ph[i]) != num::f32_bits(got[r0 * c.n * c.batch + i]);
        std::printf("[lt] bf16 one algorithm: the last %lld rows alone: %zu of %zu outputs differ from the %lld-row "
                    "call\n",
                    static_cast<long long>(rows), differ, ph.size(), static_cast<long long>(c.m));
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
