// The bf16 tensor-core GEMM of the prefill linears (kernels/cuda/gemm_tc.h: bf16_gemm_tc,
// gemm_bf16_linear) on every back end the device runs (sm_90: the warp-specialized TMA kernel with
// 128 x 256 tiles, the portable loop on wgmma and on mma.sync), against exact references:
//  * inputs whose products and partial sums are exact in 24 bits (small integers times powers of
//    two): every back end must give the exact sum (then y0 + sum, then the bf16 rounding, as asked)
//    bit for bit: this pins every index, the batch offsets, the epilogue's accumulate/round and the
//    persistent tile loop (one case has more tiles than an H200 has SMs);
//  * random bf16 values: |y - y64| <= the bf16 bound of gemm_tc.h (tests/cuda/tc_bound.h);
//  * a row's result does not depend on the other rows of the call (calls of 1..467 rows at other
//    offsets give the same bits);
//  * gemm_bf16_linear (fp32 input holding bf16 values, copied to bf16) against the CPU gemm, also
//    batched as wo_a's grouped einsum, and fp8_block_to_bf16 bit-exact with the CPU dequantization.
#include <cmath>
#include <cstdio>

#include "cuda/cuda_test_util.h"
#include "cuda/tc_bound.h"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/cuda/tma.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda::TcBackend;

std::vector<TcBackend> backends() {
  std::vector<TcBackend> b{TcBackend::kMmaSync};
  if (cuda::tc_device_has_wgmma()) {
    b.push_back(TcBackend::kWgmma);
    if (cuda::tma_available()) b.push_back(TcBackend::kWgmmaWs);
  }
  return b;
}

struct Bf16Case {
  int64_t m, n, k;
  int64_t batch = 1;
  bool accumulate = false, round = false;
};

// Host operands of a case: x [m, batch * k] (batches side by side), W [batch * n, k], y [m, batch * n].
struct Operands {
  Bf16Case c;
  std::vector<uint16_t> x, w;
  std::vector<float> y0;
  int64_t ldx() const { return c.batch * c.k; }
  int64_t ldy() const { return c.batch * c.n; }
  double xv(int64_t r, int64_t col) const { return num::bf16_to_f32(x[r * ldx() + col]); }
  double wv(int64_t row, int64_t col) const { return num::bf16_to_f32(w[row * c.k + col]); }
};

// exact: values (integers in [-4, 4]) * 2^-3 for x and * 2^-5 for W, so products are multiples of
// 2^-8 below 2^-4 and every partial sum of up to 2^20 of them is an exact fp32 (and 24-bit) value;
// else normal values rounded to bf16.
Operands make_operands(const Bf16Case& c, uint64_t seed, bool exact) {
  Operands o;
  o.c = c;
  const size_t xs = static_cast<size_t>(c.m * c.batch * c.k), ws = static_cast<size_t>(c.batch * c.n * c.k);
  o.x.resize(xs);
  o.w.resize(ws);
  if (exact) {
    for (size_t i = 0; i < xs; ++i)
      o.x[i] = num::f32_to_bf16(std::ldexp(static_cast<float>(static_cast<int>(mix64(seed * 7 + i) % 9) - 4), -3));
    for (size_t i = 0; i < ws; ++i)
      o.w[i] = num::f32_to_bf16(std::ldexp(static_cast<float>(static_cast<int>(mix64(seed * 11 + i) % 9) - 4), -5));
  } else {
    const std::vector<float> xf = randn(xs, seed, 1.0f, true), wf = randn(ws, seed + 1, 0.05f, true);
    for (size_t i = 0; i < xs; ++i) o.x[i] = num::f32_to_bf16(xf[i]);
    for (size_t i = 0; i < ws; ++i) o.w[i] = num::f32_to_bf16(wf[i]);
  }
  const size_t ys = static_cast<size_t>(c.m * c.batch * c.n);
  o.y0 = c.accumulate ? randn(ys, seed + 2, 1.0f, true) : poisoned_host<float>(ys);
  if (c.accumulate && exact)
    for (auto& v : o.y0) v = std::ldexp(std::round(std::ldexp(v, 6)), -6);  // multiples of 2^-6: exact sums
  return o;
}

// y64 and S = sum |products| (+ |y0|) per output, [m, batch * n].
void reference(const Operands& o, std::vector<double>& y64, std::vector<double>& S) {
  const Bf16Case& c = o.c;
  y64.assign(static_cast<size_t>(c.m * o.ldy()), 0.0);
  S.assign(y64.size(), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0, sa = 0;
        for (int64_t i = 0; i < c.k; ++i) {
          const double p = o.xv(r, b * c.k + i) * o.wv(b * c.n + j, i);
          s += p;
          sa += std::fabs(p);
        }
        const size_t at = static_cast<size_t>(r * o.ldy() + b * c.n + j);
        if (c.accumulate) {
          s += o.y0[at];
          sa += std::fabs(o.y0[at]);
        }
        y64[at] = s;
        S[at] = sa;
      }
}

std::vector<float> run(const Operands& o, TcBackend be, int64_t r0 = 0, int64_t rows = -1) {
  const Bf16Case& c = o.c;
  if (rows < 0) rows = c.m;
  DeviceBuffer<uint16_t> dx = to_dev(o.x), dw = to_dev(o.w);
  std::vector<float> y0(o.y0.begin() + r0 * o.ldy(), o.y0.begin() + (r0 + rows) * o.ldy());
  DeviceBuffer<float> dy = to_dev(y0);
  cuda::Bf16GemmArgs g;
  g.x = dx.get() + r0 * o.ldx();
  g.ldx = o.ldx();
  g.w = dw.get();
  g.w_rows = static_cast<uint64_t>(c.batch * c.n);
  g.y = dy.get();
  g.ldy = o.ldy();
  g.m = rows;
  g.n = c.n;
  g.k = c.k;
  g.batch = c.batch;
  g.x_batch_stride = c.k;
  g.w_batch_rows = c.n;
  g.y_batch_stride = c.n;
  g.accumulate = c.accumulate;
  g.round_bf16 = c.round;
  const char* why = cuda::bf16_gemm_problem(g);
  EXPECT_EQ(why, nullptr) << why;
  if (why) return {};
  cuda::bf16_gemm_tc(g, be, kStream);
  return to_host(dy);
}

std::string name(const Bf16Case& c) {
  return "m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " batch " +
         std::to_string(c.batch) + (c.accumulate ? " acc" : "") + (c.round ? " bf16" : "");
}

TEST(CudaBf16GemmTc, ExactSumsBitForBitOnEveryBackEnd) {
  TANDEM_REQUIRE_GPU();
  // The last cases: 17 x 9 = 153 tiles of 128 x 256, more than an H200's 132 SMs; K of one and two
  // blocks of 64 with every SM loading (the portable loop once read K block 0 before its copies
  // had landed: only short K under load showed it).
  const std::vector<Bf16Case> cases = {{97, 128, 64},        {200, 256, 512, 1, false, true},
                                       {130, 300, 256, 1, true},  {150, 131, 128, 1, true, true},
                                       {300, 128, 256, 4},   {45, 96, 192, 3, true, true},
                                       {2100, 2304, 128},    {2100, 2304, 64, 1, true}};
  uint64_t seed = 900;
  for (const Bf16Case& c : cases) {
    const Operands o = make_operands(c, seed++, true);
    std::vector<double> y64, S;
    reference(o, y64, S);
    std::vector<float> want(y64.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // The exact sum is an fp32 value; accumulate adds it to y0 with one fp32 rounding.
      const float sum = static_cast<float>(c.accumulate ? y64[i] - o.y0[i] : y64[i]);
      const float v = c.accumulate ? o.y0[i] + sum : sum;
      want[i] = c.round ? num::round_bf16(v) : v;
    }
    for (TcBackend be : backends()) {
      SCOPED_TRACE(::testing::Message() << cuda::tc_backend_name(be) << " " << name(c));
      EXPECT_TRUE(same_bits(run(o, be), want));
    }
  }
}

TEST(CudaBf16GemmTc, RandomValuesWithinTheStatedBound) {
  TANDEM_REQUIRE_GPU();
  const std::vector<Bf16Case> cases = {{200, 256, 4096}, {130, 1024, 512, 1, true}, {97, 128, 256, 2},
                                       {257, 384, 1024, 1, false, true}};
  uint64_t seed = 950;
  for (const Bf16Case& c : cases) {
    const Operands o = make_operands(c, seed++, false);
    std::vector<double> y64, S, B;
    reference(o, y64, S);
    B.resize(S.size());
    for (size_t i = 0; i < S.size(); ++i) B[i] = bf16_tc_bound(c.k, S[i]);
    for (TcBackend be : backends()) {
      SCOPED_TRACE(::testing::Message() << cuda::tc_backend_name(be) << " " << name(c));
      double worst = 0;
      EXPECT_TRUE(within_bound(run(o, be), y64, B, c.round, &worst));
      if (!c.round)
        std::printf("[bf16-tc] %-13s %s: worst |y - y64| / bound %.3g\n", cuda::tc_backend_name(be), name(c).c_str(),
                    worst);
    }
  }
}

// The same rows in calls of other sizes and offsets (the model tests' step sizes): identical bits.
TEST(CudaBf16GemmTc, RowsAreIndependentOfTheCall) {
  TANDEM_REQUIRE_GPU();
  const Bf16Case c{467, 384, 512, 2};
  const Operands o = make_operands(c, 990, false);
  const std::pair<int64_t, int64_t> parts[] = {{0, 1}, {5, 4}, {130, 9}, {300, 72}, {150, 128}, {7, 140}, {327, 140}};
  for (TcBackend be : backends()) {
    SCOPED_TRACE(cuda::tc_backend_name(be));
    const std::vector<float> whole = run(o, be);
    for (auto [r0, rows] : parts) {
      SCOPED_TRACE(::testing::Message() << "rows " << r0 << ".." << r0 + rows - 1 << " alone");
      EXPECT_TRUE(same_bits(run(o, be, r0, rows),
                            std::vector<float>(whole.begin() + r0 * o.ldy(), whole.begin() + (r0 + rows) * o.ldy())));
    }
  }
}

// gemm_bf16_linear against the CPU gemm: a plain bf16 linear with fp32 output and wo_a's batched
// einsum (x [m, G * k] with groups side by side, W [G * R, k], bf16 output), and a step larger than
// the scratch refused by bf16_linear_supported.
TEST(CudaBf16GemmTc, LinearMatchesCpu) {
  TANDEM_REQUIRE_GPU();
  struct L {
    int64_t m, n, k, batch;
    bool round;
  };
  for (const L& l : {L{300, 256, 1024, 1, false}, L{200, 128, 256, 4, true}}) {
    SCOPED_TRACE(::testing::Message() << "m " << l.m << " n " << l.n << " k " << l.k << " batch " << l.batch);
    const int64_t ldx = l.batch * l.k, ldy = l.batch * l.n;
    const std::vector<float> x = randn(static_cast<size_t>(l.m * ldx), 60 + l.batch, 1.0f, true);
    const std::vector<float> wf = randn(static_cast<size_t>(l.batch * l.n * l.k), 61 + l.batch, 0.05f, true);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = num::f32_to_bf16(wf[i]);
    GemmParams p;
    p.w.format = WeightFormat::kBf16;
    p.w.data = wb.data();
    p.w.n = l.batch * l.n;
    p.w.k = l.k;
    p.m = l.m;
    p.n = l.n;
    p.k = l.k;
    p.ldx = ldx;
    p.ldy = ldy;
    p.batch = l.batch;
    p.x_batch_stride = l.k;
    p.w_batch_rows = l.n;
    p.y_batch_stride = l.n;
    p.round_bf16 = l.round;
    std::vector<float> want(static_cast<size_t>(l.m * ldy));
    p.x = x.data();
    p.y = want.data();
    cpu_ops().gemm(p);
    std::vector<double> y64(want.size()), B(want.size());
    for (int64_t b = 0; b < l.batch; ++b)
      for (int64_t r = 0; r < l.m; ++r)
        for (int64_t j = 0; j < l.n; ++j) {
          double s = 0, sa = 0;
          for (int64_t i = 0; i < l.k; ++i) {
            const double pr =
                static_cast<double>(x[r * ldx + b * l.k + i]) * num::bf16_to_f32(wb[(b * l.n + j) * l.k + i]);
            s += pr;
            sa += std::fabs(pr);
          }
          y64[r * ldy + b * l.n + j] = s;
          B[r * ldy + b * l.n + j] = bf16_tc_bound(l.k, sa);
        }
    DeviceBuffer<float> dx = to_dev(x);
    DeviceBuffer<uint16_t> dw = to_dev(wb), xb(static_cast<size_t>(l.m * ldx));
    cuda::TcLinearScratch s;
    s.xb = xb.get();
    s.rows = l.m;
    s.bf16_cols = ldx;
    for (TcBackend be : backends()) {
      SCOPED_TRACE(cuda::tc_backend_name(be));
      auto dy = poisoned<float>(want.size());
      GemmParams g = p;
      g.x = dx.get();
      g.y = dy.get();
      g.w.data = dw.get();
      ASSERT_TRUE(cuda::bf16_linear_supported(g, s));
      GemmParams big = g;
      big.m = l.m + 1;
      EXPECT_FALSE(cuda::bf16_linear_supported(big, s)) << "more rows than the scratch";
      cuda::gemm_bf16_linear(g, s, be, kStream);
      const std::vector<float> got = to_host(dy);
      double worst = 0;
      EXPECT_TRUE(within_bound(got, y64, B, l.round, &worst));
      size_t same = 0;
      for (size_t i = 0; i < got.size(); ++i) same += got[i] == want[i];
      std::printf("[bf16-tc] %-13s linear vs CPU gemm: %zu of %zu outputs identical\n", cuda::tc_backend_name(be), same,
                  got.size());
    }
  }
}

TEST(CudaBf16GemmTc, Fp8BlockWeightToBf16MatchesTheCpuDequantization) {
  TANDEM_REQUIRE_GPU();
  const int64_t n = 300, k = 384;
  std::vector<float> v = randn(static_cast<size_t>(n * k), 71, 0.02f, false);
  num::Fp8BlockWeight q = num::quantize_fp8_block(v.data(), static_cast<size_t>(n), static_cast<size_t>(k));
  const std::vector<float> deq = num::dequantize_fp8_block(q.data.data(), q.scale.data(), n, k);
  DeviceBuffer<uint8_t> dd = to_dev(q.data), ds = to_dev(q.scale);
  auto out = poisoned<uint16_t>(static_cast<size_t>(n * k));
  WeightRef w;
  w.format = WeightFormat::kFp8Block;
  w.data = dd.get();
  w.scale = ds.get();
  w.n = n;
  w.k = k;
  cuda::fp8_block_to_bf16(w, out.get(), kStream);
  const std::vector<uint16_t> got = to_host(out);
  std::vector<uint16_t> want(got.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = num::f32_to_bf16(deq[i]);
  EXPECT_TRUE(same_values(got, want));
}

// f32_to_bf16_rows' vector kernel at row lengths below, at and above one CTA row (256 quads),
// padded strides, more rows than one grid column (65535 CTAs of 16 rows), and its scalar
// fallback (cols % 4 != 0): every element equals the host's rounding, the padding is untouched.
TEST(CudaBf16GemmTc, F32ToBf16RowsMatchesTheHostRounding) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int64_t rows, cols, lds, ldd;
  };
  uint64_t seed = 80;
  for (const C& c : {C{5, 12, 16, 12}, C{3, 2052, 2056, 2060}, C{7, 1024, 1024, 1028}, C{1048600, 64, 64, 64},
                     C{4, 10, 12, 10}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " cols " << c.cols);
    const std::vector<float> src = randn(static_cast<size_t>(c.rows * c.lds), seed++, 3.0f, false);
    DeviceBuffer<float> ds = to_dev(src);
    auto dd = poisoned<uint16_t>(static_cast<size_t>(c.rows * c.ldd), 0x5a);
    cuda::f32_to_bf16_rows(ds.get(), c.lds, c.rows, c.cols, dd.get(), c.ldd, kStream);
    const std::vector<uint16_t> got = to_host(dd);
    std::vector<uint16_t> want(got.size(), 0x5a5a);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k) want[r * c.ldd + k] = num::f32_to_bf16(src[r * c.lds + k]);
    EXPECT_TRUE(same_values(got, want, static_cast<size_t>(c.ldd)));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
