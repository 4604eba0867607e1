// The tensor cores' accumulation as the layer-by-layer test emulates it (tc_emulation.h), on the
// CPU GEMM's testing hook (no GPU needed): on random inputs every emulated output lies within the
// bound gemm_tc.h states for the tensor-core kernels (tc_bound.h) and most are not the CPU's own
// result (the emulation truncates); on inputs whose sums are exact in any accumulator it gives the
// exact sum bit for bit (every index, scale and batch offset right); the bound-edge mode sits on the
// bound; the hook takes exactly the GEMMs the CUDA model runs on the tensor cores in a prefill step
// and is gone after its scope.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/tc_bound.h"
#include "cuda/tc_emulation.h"
#include "kernels/kernel_test_util.h"

namespace tandem {
namespace {

using kernels::GemmParams;
using kernels::WeightFormat;
using kernels::WeightRef;
using kernels::testing::randn;
namespace tce = tc_emulation;

// A weight of one format with its storage.
struct HostWeight {
  std::vector<uint8_t> data, scale;
  std::vector<uint16_t> bf16;
  WeightRef ref;
};
HostWeight make_weight(WeightFormat f, int64_t n, int64_t k, uint64_t seed, float stddev = 0.05f) {
  HostWeight h;
  const std::vector<float> v = randn(static_cast<size_t>(n * k), seed, stddev, false);
  h.ref.format = f;
  h.ref.n = n;
  h.ref.k = k;
  switch (f) {
    case WeightFormat::kBf16:
      h.bf16.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) h.bf16[i] = num::f32_to_bf16(v[i]);
      h.ref.data = h.bf16.data();
      break;
    case WeightFormat::kFp8Block: {
      auto q = num::quantize_fp8_block(v.data(), static_cast<size_t>(n), static_cast<size_t>(k));
      h.data = std::move(q.data);
      h.scale = std::move(q.scale);
      h.ref.data = h.data.data();
      h.ref.scale = h.scale.data();
      break;
    }
    case WeightFormat::kMxfp4: {
      auto q = num::quantize_mxfp4(v.data(), static_cast<size_t>(n), static_cast<size_t>(k));
      h.data = std::move(q.data);
      h.scale = std::move(q.scale);
      h.ref.data = h.data.data();
      h.ref.scale = h.scale.data();
      break;
    }
    case WeightFormat::kF32:
      break;
  }
  return h;
}

// y64 and S = sum |products| of a GEMM as the tensor cores see its operands (x act_quant'ed for
// FP8 paths, bf16 otherwise; weights dequantized), batch by batch.
void exact(const GemmParams& p, std::vector<double>& y64, std::vector<double>& S) {
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.k, ldy = p.ldy > 0 ? p.ldy : p.n;
  const bool fp8 = tce::tc_path(p) == tce::TcPath::kFp8;
  y64.assign(static_cast<size_t>(p.m * ldy), 0.0);
  S.assign(y64.size(), 0.0);
  std::vector<float> xs(static_cast<size_t>(p.m * p.k)), w(static_cast<size_t>(p.k));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t c = 0; c < p.k; ++c) xs[i * p.k + c] = p.x[b * p.x_batch_stride + i * ldx + c];
    if (fp8) {
      kernels::ActQuantFp8Params q;
      q.x = xs.data();
      q.rows = p.m;
      q.cols = p.k;
      kernels::cpu::act_quant_fp8(q);
    }
    const WeightRef wb = p.w.rows(b * p.w_batch_rows, p.n);
    for (int64_t j = 0; j < p.n; ++j) {
      tce::weight_row(wb, j, w.data());
      for (int64_t i = 0; i < p.m; ++i) {
        double s = 0, a = 0;
        for (int64_t c = 0; c < p.k; ++c) {
          const double t = static_cast<double>(xs[i * p.k + c]) * w[c];
          s += t;
          a += std::fabs(t);
        }
        y64[i * ldy + b * p.y_batch_stride + j] = s;
        S[i * ldy + b * p.y_batch_stride + j] = a;
      }
    }
  }
}

struct Runs {
  std::vector<float> emu, cpu;
  std::vector<double> y64, S;
};
// The GEMM under the emulation (settings st) and on the CPU's own path.
Runs run(GemmParams p, const tce::Settings& st) {
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.n;
  Runs r;
  r.emu.assign(static_cast<size_t>(p.m * ldy), 0.0f);
  r.cpu = r.emu;
  p.y = r.emu.data();
  {
    const tce::Scope on(st);
    kernels::cpu::gemm(p);
  }
  p.y = r.cpu.data();
  kernels::cpu::gemm(p);
  exact(p, r.y64, r.S);
  return r;
}

::testing::AssertionResult within(const Runs& r, const GemmParams& p, size_t* differ_from_cpu) {
  const bool fp8 = tce::tc_path(p) == tce::TcPath::kFp8;
  std::vector<double> B(r.S.size());
  for (size_t i = 0; i < B.size(); ++i)
    B[i] = fp8 ? kernels::cuda_testing::fp8_tc_bound(p.k, r.S[i]) : kernels::cuda_testing::bf16_tc_bound(p.k, r.S[i]);
  *differ_from_cpu = 0;
  for (size_t i = 0; i < r.emu.size(); ++i) *differ_from_cpu += r.emu[i] != r.cpu[i];
  double worst = 0;
  auto ok = kernels::cuda_testing::within_bound(r.emu, r.y64, B, p.round_bf16, &worst);
  std::printf("[tc-emulation] %s k %lld: worst |y - y64| / bound %.3g, %zu of %zu outputs differ from the CPU's\n",
              fp8 ? "fp8" : "bf16", static_cast<long long>(p.k), worst, *differ_from_cpu, r.emu.size());
  return ok;
}

TEST(TcEmulation, Fp8AndMxfp4LinearsWithinTheStatedBound) {
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    for (int64_t k : {128, 512, 2048}) {
      for (bool round : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (f == WeightFormat::kMxfp4 ? "mxfp4" : "fp8") << " k " << k << " round "
                                          << round);
        const int64_t m = 9, n = 256;
        std::vector<float> x = randn(static_cast<size_t>(m * k), 11 + k, 1.0f);
        for (int64_t i = 0; i < m; ++i) x[i * k + (i * 37) % k] *= 40.0f;  // per-block scale variety
        const HostWeight w = make_weight(f, n, k, 3 + k);
        GemmParams p;
        p.x = x.data();
        p.w = w.ref;
        p.m = m;
        p.n = n;
        p.k = k;
        p.round_bf16 = round;
        p.quantize_x_block = 128;
        ASSERT_EQ(tce::tc_path(p), tce::TcPath::kFp8);
        size_t differ = 0;
        EXPECT_TRUE(within(run(p, {}), p, &differ));
        if (!round) {
          EXPECT_GT(differ, static_cast<size_t>(m * n / 4)) << "the emulation hardly truncates";
        }
        // The finer-grained variant the harness's self-test runs (k16 steps) as well.
        tce::Settings k16;
        k16.fp8_step = 16;
        EXPECT_TRUE(within(run(p, k16), p, &differ));
      }
    }
  }
}

TEST(TcEmulation, Bf16LinearsAndTheGroupedEinsumWithinTheStatedBound) {
  for (int64_t k : {64, 256, 1024}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int64_t m = 7, n = 96;
    const std::vector<float> x = randn(static_cast<size_t>(m * k), 5 + k, 1.0f, /*bf16=*/true);
    const HostWeight w = make_weight(WeightFormat::kBf16, n, k, 9 + k);
    GemmParams p;
    p.x = x.data();
    p.w = w.ref;
    p.m = m;
    p.n = n;
    p.k = k;
    ASSERT_EQ(tce::tc_path(p), tce::TcPath::kBf16);
    size_t differ = 0;
    EXPECT_TRUE(within(run(p, {}), p, &differ));
    EXPECT_GT(differ, 0u) << "the emulation never truncates";
  }
  // wo_a's grouped einsum: FP8 weights without act_quant, 3 groups of 128 rows, x groups side by
  // side in a row of 3 * 256, bf16 outputs at y columns [g * 128, + 128).
  const int64_t m = 5, G = 3, R = 128, gin = 256;
  const std::vector<float> x = randn(static_cast<size_t>(m * G * gin), 21, 1.0f, true);
  const HostWeight w = make_weight(WeightFormat::kFp8Block, G * R, gin, 23);
  GemmParams p;
  p.x = x.data();
  p.w = w.ref;
  p.m = m;
  p.n = R;
  p.k = gin;
  p.ldx = G * gin;
  p.ldy = G * R;
  p.batch = G;
  p.x_batch_stride = gin;
  p.y_batch_stride = R;
  p.w_batch_rows = R;
  p.round_bf16 = true;
  ASSERT_EQ(tce::tc_path(p), tce::TcPath::kBf16);
  size_t differ = 0;
  EXPECT_TRUE(within(run(p, {}), p, &differ));
}

// Products that are small integers times one power of two: every partial sum is exact in 11 bits,
// so the emulation must give the exact sum (and then the fp32 promotion, the accumulate and the
// rounding) bit for bit.
TEST(TcEmulation, ExactSumsStayExact) {
  const int64_t m = 6, n = 130, k = 256;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i * 7 % 9) - 4) * 0.25f;
  for (size_t i = 0; i < x.size(); i += 128) x[i] = 4.0f;  // every 128-block's amax: scale 2^-6, codes exact
  std::vector<uint16_t> wb(static_cast<size_t>(n * k));
  for (size_t i = 0; i < wb.size(); ++i) wb[i] = num::f32_to_bf16(static_cast<float>(static_cast<int>(i * 5 % 7) - 3));
  HostWeight fp8 = make_weight(WeightFormat::kFp8Block, n, k, 1);
  for (size_t i = 0; i < fp8.data.size(); ++i) fp8.data[i] = num::f32_to_e4m3(num::bf16_to_f32(wb[i]));
  for (auto& s : fp8.scale) s = 127;  // 2^0
  for (bool fp8_path : {true, false}) {
    GemmParams p;
    p.x = x.data();
    p.m = m;
    p.n = n;
    p.k = k;
    if (fp8_path) {
      p.w = fp8.ref;
      p.quantize_x_block = 128;
    } else {
      p.w = {WeightFormat::kBf16, wb.data(), nullptr, n, k, 0};
    }
    std::vector<float> y0 = randn(static_cast<size_t>(m * n), 3, 1.0f, true);
    for (bool acc : {false, true}) {
      p.accumulate = acc;
      Runs r;
      std::vector<float> y = y0;
      p.y = y.data();
      {
        const tce::Scope on({});
        kernels::cpu::gemm(p);
      }
      exact(p, r.y64, r.S);
      size_t bad = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const float want = acc ? y0[i] + static_cast<float>(r.y64[i]) : static_cast<float>(r.y64[i]);
        bad += y[i] != want;
      }
      EXPECT_EQ(bad, 0u) << (fp8_path ? "fp8" : "bf16") << " accumulate " << acc;
    }
  }
}

TEST(TcEmulation, BoundEdgeSitsOnTheBound) {
  const int64_t m = 4, n = 128, k = 512;
  const std::vector<float> x = randn(static_cast<size_t>(m * k), 31, 1.0f);
  const HostWeight w = make_weight(WeightFormat::kFp8Block, n, k, 33);
  GemmParams p;
  p.x = x.data();
  p.w = w.ref;
  p.m = m;
  p.n = n;
  p.k = k;
  p.quantize_x_block = 128;
  for (double scale : {1.0, 64.0}) {
    const Runs r = run(p, {tce::Mode::kBoundEdge, 32, scale, 7});
    size_t off = 0, up = 0;
    for (size_t i = 0; i < r.emu.size(); ++i) {
      const double B = scale * kernels::cuda_testing::fp8_tc_bound(k, r.S[i]);
      const double d = static_cast<double>(r.emu[i]) - r.y64[i];
      off += std::fabs(std::fabs(d) - B) > std::ldexp(std::fabs(r.y64[i]) + B, -23);
      up += d > 0;
    }
    EXPECT_EQ(off, 0u) << "scale " << scale;
    EXPECT_GT(up, r.emu.size() / 4) << "the signs are not mixed";
    EXPECT_LT(up, 3 * r.emu.size() / 4) << "the signs are not mixed";
  }
}

// Only what a tensor-core step runs on the tensor cores: fp32 weights and FP8 weights without
// act_quant outside wo_a's batched einsum stay on the CPU's own path; no hook outside the scope.
TEST(TcEmulation, TheHookTakesTheTensorCoreGemmsOnly) {
  const int64_t m = 3, n = 128, k = 192;
  const std::vector<float> x = randn(static_cast<size_t>(m * k), 41, 1.0f);
  const std::vector<float> wf = randn(static_cast<size_t>(n * k), 43, 0.05f);
  const HostWeight w8 = make_weight(WeightFormat::kFp8Block, n, k, 45);
  GemmParams p;
  p.x = x.data();
  p.m = m;
  p.n = n;
  p.k = k;
  for (const WeightRef& w : {WeightRef{WeightFormat::kF32, wf.data(), nullptr, n, k, 0}, w8.ref}) {
    p.w = w;
    EXPECT_EQ(tce::tc_path(p), tce::TcPath::kNone);
    const Runs r = run(p, {});
    EXPECT_EQ(r.emu, r.cpu) << "a GEMM the device keeps on the GEMV kernels was emulated";
  }
  // After the scope the CPU's own path again.
  const HostWeight w = make_weight(WeightFormat::kBf16, n, 256, 47);
  const std::vector<float> xb = randn(static_cast<size_t>(m * 256), 49, 1.0f);
  p.x = xb.data();
  p.k = 256;
  p.w = w.ref;
  p.quantize_x_block = 0;
  const Runs r = run(p, {});
  EXPECT_NE(r.emu, r.cpu);
  std::vector<float> again(r.cpu.size());
  p.y = again.data();
  kernels::cpu::gemm(p);
  EXPECT_EQ(again, r.cpu);
}

}  // namespace
}  // namespace tandem
