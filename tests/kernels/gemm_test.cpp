// gemm on every weight format against a float64 reference built from an independent dequantization
// (common/numeric.h tables), over decode/prefill shapes, ragged tiles, batching, accumulation,
// bf16 output rounding, and NaN propagation from a NaN weight code.
#include <gtest/gtest.h>

#include <cmath>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::close;
using testing::randn;

struct Weight {
  WeightFormat fmt;
  int64_t n, k;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> data, scale;
  std::vector<float> deq;  // reference values
  WeightRef ref() const {
    WeightRef w;
    w.format = fmt;
    w.n = n;
    w.k = k;
    switch (fmt) {
      case WeightFormat::kF32: w.data = f32.data(); break;
      case WeightFormat::kBf16: w.data = bf16.data(); break;
      default:
        w.data = data.data();
        w.scale = scale.data();
    }
    return w;
  }
};

Weight make_weight(WeightFormat fmt, int64_t n, int64_t k, uint64_t seed) {
  Weight w{fmt, n, k, {}, {}, {}, {}, {}};
  auto src = randn(n * k, seed, 0.05f, false);
  // Vary magnitudes across rows so block scales differ.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) src[r * k + c] *= 1.0f + static_cast<float>((r * 7 + c / 32) % 11);
  switch (fmt) {
    case WeightFormat::kF32:
      w.f32 = src;
      w.deq = src;
      break;
    case WeightFormat::kBf16:
      for (float v : src) {
        w.bf16.push_back(num::f32_to_bf16(v));
        w.deq.push_back(num::bf16_to_f32(w.bf16.back()));
      }
      break;
    case WeightFormat::kFp8Block: {
      auto q = num::quantize_fp8_block(src.data(), n, k);
      // Also exercise subnormal and negative codes explicitly.
      q.data[0] = 0x03;
      if (n * k > 1) q.data[1] = 0x85;
      w.data = q.data;
      w.scale = q.scale;
      w.deq = num::dequantize_fp8_block(w.data.data(), w.scale.data(), n, k);
      break;
    }
    case WeightFormat::kMxfp4: {
      auto q = num::quantize_mxfp4(src.data(), n, k);
      w.data = q.data;
      w.scale = q.scale;
      w.deq = num::dequantize_mxfp4(w.data.data(), w.scale.data(), n, k);
      break;
    }
  }
  return w;
}

// want[m][n] = sum_k x w (double) and the magnitude sum |x||w| for the tolerance.
void reference(const std::vector<float>& x, int64_t ldx, const Weight& w, int64_t row0, int64_t m, int64_t n,
               std::vector<double>& want, std::vector<double>& mag) {
  want.assign(m * n, 0.0);
  mag.assign(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < w.k; ++c) {
        const double p = static_cast<double>(x[i * ldx + c]) * w.deq[(row0 + j) * w.k + c];
        s += p;
        a += std::fabs(p);
      }
      want[i * n + j] = s;
      mag[i * n + j] = a;
    }
}

const char* fmt_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8Block: return "fp8";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

TEST(Gemm, AllFormatsAndShapes) {
  for (auto isa : {cpu::Isa::kAvx512, cpu::Isa::kAvx2, cpu::Isa::kNeon, cpu::Isa::kBaseline}) {
  if (!cpu::set_gemm_isa(isa)) continue;
  SCOPED_TRACE(cpu::gemm_isa_name());
  const WeightFormat fmts[] = {WeightFormat::kF32, WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kMxfp4};
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 3, 32}, {2, 5, 64}, {1, 1, 128}, {1, 37, 160}, {3, 130, 256}, {5, 17, 96}, {133, 70, 384}, {2, 256, 4128}};
  for (auto fmt : fmts)
    for (auto s : shapes) {
      if (fmt == WeightFormat::kMxfp4 && s.k % 32) continue;
      Weight w = make_weight(fmt, s.n, s.k, 100 + s.n + s.k);
      const int64_t ldx = s.k + 3;
      auto x = randn(s.m * ldx, 7 + s.m, 1.0f);
      std::vector<float> y(s.m * s.n, -1.0f);
      GemmParams p;
      p.x = x.data();
      p.ldx = ldx;
      p.w = w.ref();
      p.y = y.data();
      p.m = s.m;
      p.n = s.n;
      p.k = s.k;
      cpu::gemm(p);
      std::vector<double> want, mag;
      reference(x, ldx, w, 0, s.m, s.n, want, mag);
      EXPECT_TRUE(close(y, want, 1e-30, 2e-6, &mag)) << fmt_name(fmt) << " m=" << s.m << " n=" << s.n << " k=" << s.k;
    }
  }
  cpu::set_gemm_isa(cpu::Isa::kAuto);
}

TEST(Gemm, AccumulateRoundAndLdy) {
  Weight w = make_weight(WeightFormat::kFp8Block, 40, 256, 5);
  auto x = randn(3 * 256, 6);
  const int64_t ldy = 50;
  std::vector<float> y(3 * ldy);
  for (size_t i = 0; i < y.size(); ++i) y[i] = 0.5f * static_cast<float>(i % 7);
  const auto y0 = y;
  GemmParams p;
  p.x = x.data();
  p.w = w.ref();
  p.y = y.data();
  p.m = 3;
  p.n = 40;
  p.k = 256;
  p.ldy = ldy;
  p.accumulate = true;
  p.round_bf16 = true;
  cpu::gemm(p);
  std::vector<double> want, mag;
  reference(x, 256, w, 0, 3, 40, want, mag);
  // The accumulated sum is rounded once, to nearest even bf16: within half a bf16 ulp of the exact
  // sum, up to the fp32 accumulation error (a few fp32 ulps of the sum of |products|).
  std::vector<float> got;
  std::vector<double> exact, err;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 40; ++j) {
      got.push_back(y[i * ldy + j]);
      exact.push_back(want[i * 40 + j] + y0[i * ldy + j]);
      err.push_back(1e-5 * mag[i * 40 + j] + 1e-7 * std::fabs(y0[i * ldy + j]));
    }
    for (int64_t j = 40; j < ldy; ++j) EXPECT_EQ(y[i * ldy + j], y0[i * ldy + j]);  // padding untouched
  }
  EXPECT_TRUE(testing::correctly_rounded(got, exact, testing::Stored::kBf16, 0.0, &err));
}

TEST(Gemm, BatchedGroupedEinsum) {
  // wo_a-like: 4 groups, each group's x slice [m, 256] times its own 128 weight rows.
  const int64_t groups = 4, r = 128, d = 256, m = 3;
  Weight w = make_weight(WeightFormat::kFp8Block, groups * r, d, 9);
  auto x = randn(m * groups * d, 10);
  std::vector<float> y(m * groups * r);
  GemmParams p;
  p.x = x.data();
  p.ldx = groups * d;
  p.w = w.ref();
  p.y = y.data();
  p.ldy = groups * r;
  p.m = m;
  p.n = r;
  p.k = d;
  p.batch = groups;
  p.x_batch_stride = d;
  p.y_batch_stride = r;
  p.w_batch_rows = r;
  cpu::gemm(p);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<float> xg(m * d);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < d; ++c) xg[i * d + c] = x[i * groups * d + g * d + c];
    std::vector<double> want, mag;
    reference(xg, d, w, g * r, m, r, want, mag);
    std::vector<float> yg(m * r);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < r; ++j) yg[i * r + j] = y[i * groups * r + g * r + j];
    EXPECT_TRUE(close(yg, want, 1e-30, 2e-6, &mag)) << "group " << g;
  }
}

TEST(Gemm, WeightRowsView) {
  Weight w = make_weight(WeightFormat::kMxfp4, 64, 64, 12);
  WeightRef sub = w.ref().rows(16, 8);
  auto x = randn(64, 13);
  std::vector<float> y(8);
  GemmParams p;
  p.x = x.data();
  p.w = sub;
  p.y = y.data();
  p.m = 1;
  p.n = 8;
  p.k = 64;
  cpu::gemm(p);
  std::vector<double> want, mag;
  reference(x, 64, w, 16, 1, 8, want, mag);
  EXPECT_TRUE(close(y, want, 1e-30, 2e-6, &mag));
  EXPECT_EQ(w.ref().bytes(), 64u * 32u + 64u * 2u);
}

TEST(Gemm, NanCodeAndInfInputPropagate) {
  Weight w = make_weight(WeightFormat::kFp8Block, 4, 128, 14);
  w.data[1 * 128 + 5] = 0x7f;  // NaN code in weight row 1
  auto x = randn(2 * 128, 15);
  x[1 * 128 + 9] = std::numeric_limits<float>::infinity();  // inf in token 1
  std::vector<float> y(2 * 4);
  GemmParams p;
  p.x = x.data();
  p.w = w.ref();
  p.y = y.data();
  p.m = 2;
  p.n = 4;
  p.k = 128;
  cpu::gemm(p);
  EXPECT_TRUE(std::isnan(y[0 * 4 + 1]));
  EXPECT_TRUE(std::isnan(y[1 * 4 + 1]));
  EXPECT_FALSE(std::isnan(y[0 * 4 + 0]));
  EXPECT_FALSE(std::isfinite(y[1 * 4 + 0]));
}

TEST(Gemm, BatchInvariantBitExact) {
  // A row's result must not depend on how many rows are computed together, where it sits in the
  // M block, or the thread count (chunked prefill == decode == verify, bit for bit).
  Weight w = make_weight(WeightFormat::kMxfp4, 48, 512, 16);
  const int64_t m = 137;
  auto x = randn(m * 512, 17);
  std::vector<float> all(m * 48);
  GemmParams p;
  p.x = x.data();
  p.w = w.ref();
  p.y = all.data();
  p.m = m;
  p.n = 48;
  p.k = 512;
  cpu::gemm(p);
  cpu::set_num_threads(1);
  for (int64_t r : {int64_t{0}, int64_t{5}, int64_t{129}, m - 1}) {
    std::vector<float> one(48);
    GemmParams q = p;
    q.x = x.data() + r * 512;
    q.y = one.data();
    q.m = 1;
    cpu::gemm(q);
    EXPECT_TRUE(testing::bits_equal(one.data(), all.data() + r * 48, 48)) << "row " << r;
  }
  cpu::set_num_threads(0);
}

TEST(Gemm, QuantizeXMatchesActQuantThenGemmAndKeepsX) {
  Weight w = make_weight(WeightFormat::kMxfp4, 30, 256, 50);
  const int64_t m = 4, ldx = 300;
  auto x = randn(m * ldx, 51, 3.0f);
  const auto x0 = x;
  std::vector<float> fused(m * 30), manual(m * 30);
  GemmParams p;
  p.x = x.data();
  p.ldx = ldx;
  p.w = w.ref();
  p.y = fused.data();
  p.m = m;
  p.n = 30;
  p.k = 256;
  p.quantize_x_block = 128;
  cpu::gemm(p);
  EXPECT_EQ(x, x0);  // input untouched
  ActQuantFp8Params q;
  q.x = x.data();
  q.rows = m;
  q.cols = 256;
  q.ldx = ldx;
  cpu::act_quant_fp8(q);
  p.quantize_x_block = 0;
  p.y = manual.data();
  cpu::gemm(p);
  EXPECT_EQ(fused, manual);
  EXPECT_NE(x, x0);  // the activation quantization did change values
}

TEST(Gemm, DecodePathBitIdenticalToPanelPathAllFormatsAndIsas) {
  // m == 1 takes the chunked decode path; rows of an m > 1 call take the panel path. Ragged K
  // (200 = 12*16 + 8, 1100 crosses decode chunks) exercises the scalar tails.
  for (auto isa : {cpu::Isa::kAvx512, cpu::Isa::kAvx2, cpu::Isa::kNeon, cpu::Isa::kBaseline}) {
    if (!cpu::set_gemm_isa(isa)) continue;
    for (auto fmt : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kMxfp4})
      for (int64_t k : {int64_t{200}, int64_t{1100}, int64_t{1024}}) {
        if (fmt == WeightFormat::kMxfp4 && k % 32) continue;
        Weight w = make_weight(fmt, 23, k, 40 + k);
        auto x = randn(3 * k, 41);
        std::vector<float> all(3 * 23), one(23);
        GemmParams p;
        p.x = x.data();
        p.w = w.ref();
        p.y = all.data();
        p.m = 3;
        p.n = 23;
        p.k = k;
        cpu::gemm(p);
        p.x = x.data() + 2 * k;
        p.y = one.data();
        p.m = 1;
        cpu::gemm(p);
        for (int64_t j = 0; j < 23; ++j)
          ASSERT_EQ(one[j], all[2 * 23 + j]) << cpu::gemm_isa_name() << " " << fmt_name(fmt) << " k=" << k << " j=" << j;
      }
  }
  cpu::set_gemm_isa(cpu::Isa::kAuto);
}

}  // namespace
}  // namespace tandem::kernels
