// CUDA gemm against the CPU op for every weight format: decode/verify/prefill row counts, the real
// model's projection shapes (incl. the 129280-row LM head), batched wo_a, accumulate, bf16 output,
// quantize_x_block, unaligned strides (scalar path). The CPU and the kernel sum in different
// orders: each is held to a float64 reference within gamma(depth) * sum_k |x w| for its own
// summation depth (the kernel's: gpu_gemm_depth; the CPU's: its vector lanes, cpu_gemm_depth), and
// a bf16 output must be the correct rounding of a value within that bound (a dropped or truncated
// rounding fails). Also: a row's result does not depend on how many rows the call has.
#include <cmath>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

struct HostWeight {
  WeightFormat format;
  int64_t n, k;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  WeightRef ref(const void* d, const uint8_t* s) const {
    WeightRef w;
    w.format = format;
    w.data = d;
    w.scale = s;
    w.n = n;
    w.k = k;
    return w;
  }
};

HostWeight make_weight(WeightFormat f, int64_t n, int64_t k, uint64_t seed) {
  HostWeight w{f, n, k, {}, {}};
  const size_t nk = static_cast<size_t>(n * k);
  switch (f) {
    case WeightFormat::kF32: {
      w.data.resize(nk * 4);
      float* d = reinterpret_cast<float*>(w.data.data());
      for (size_t i = 0; i < nk; ++i) d[i] = 0.05f * fast_uniform(seed, i);
      break;
    }
    case WeightFormat::kBf16: {
      w.data.resize(nk * 2);
      uint16_t* d = reinterpret_cast<uint16_t*>(w.data.data());
      for (size_t i = 0; i < nk; ++i) d[i] = num::f32_to_bf16(0.05f * fast_uniform(seed, i));
      break;
    }
    case WeightFormat::kFp8Block: {
      w.data.resize(nk);
      for (size_t i = 0; i < nk; ++i) {
        uint8_t b = static_cast<uint8_t>(mix64(seed * 977 + i));
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes in a checkpoint
        w.data[i] = b;
      }
      const int64_t sn = (n + 127) / 128, sk = (k + 127) / 128;
      w.scale.resize(static_cast<size_t>(sn * sk));
      for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(117 + mix64(seed + 5 * i) % 6);
      break;
    }
    case WeightFormat::kMxfp4: {
      w.data.resize(nk / 2);
      for (size_t i = 0; i < nk / 2; ++i) w.data[i] = static_cast<uint8_t>(mix64(seed * 131 + i));
      w.scale.resize(static_cast<size_t>(n * (k / 32)));
      for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(120 + mix64(seed + 7 * i) % 6);
      break;
    }
  }
  return w;
}

// Element (r, c) of the weight, exactly (every stored value times its power-of-two scale is an fp32
// value).
double weight_at(const HostWeight& w, int64_t r, int64_t c) {
  switch (w.format) {
    case WeightFormat::kF32: return reinterpret_cast<const float*>(w.data.data())[r * w.k + c];
    case WeightFormat::kBf16: return num::bf16_to_f32(reinterpret_cast<const uint16_t*>(w.data.data())[r * w.k + c]);
    case WeightFormat::kFp8Block:
      return static_cast<double>(num::e4m3_to_f32(w.data[r * w.k + c])) *
             num::e8m0_to_f32(w.scale[(r / 128) * ((w.k + 127) / 128) + c / 128]);
    case WeightFormat::kMxfp4:
      return static_cast<double>(num::e2m1_to_f32(num::fp4_get(w.data.data() + r * (w.k / 2), static_cast<size_t>(c)))) *
             num::e8m0_to_f32(w.scale[r * (w.k / 32) + c / 32]);
  }
  return 0;
}

struct GemmCase {
  WeightFormat f;
  int64_t m, n, k;
  int64_t ldx = 0, ldy = 0;
  bool accumulate = false, round = false;
  int qblock = 0;
  int64_t batch = 1, w_batch_rows = 0, xbs = 0, ybs = 0;
};

const char* fmt_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8Block: return "fp8";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

// Summation depth of one output of the kernel: a lane's FMA chain of k / (32 * warps) products,
// a 5-level shuffle tree, then the warps' partials in order (4 warps, or 16 for narrow weights).
double gpu_gemm_depth(int64_t k) { return std::max(k / 128.0 + 9, k / 512.0 + 21); }

// Runs one case on both backends (weights generated once per (format, wn, k, seed)) and holds both
// to a float64 reference: fp32 outputs within gamma(depth) * sum |x w| (+ one rounding of the
// accumulated y0), bf16 outputs the correct rounding of a value within that bound.
void run_case(const GemmCase& c, const HostWeight& w, const DeviceBuffer<uint8_t>& dw,
              const DeviceBuffer<uint8_t>& dscale, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << fmt_name(c.f) << " m " << c.m << " n " << c.n << " k " << c.k << " batch "
                                    << c.batch << (c.accumulate ? " acc" : "") << (c.round ? " bf16" : "")
                                    << (c.qblock ? " quantized x" : ""));
  const int64_t ldx = c.ldx ? c.ldx : c.k, ldy = c.ldy ? c.ldy : c.n;
  const size_t xsize = static_cast<size_t>((c.batch - 1) * c.xbs + c.m * ldx);
  const size_t ysize = static_cast<size_t>((c.batch - 1) * c.ybs + c.m * ldy);
  std::vector<float> x = randn(xsize, seed, 1.0f, true);
  std::vector<float> y0 = c.accumulate ? randn(ysize, seed + 1, 1.0f, true) : poisoned_host<float>(ysize);

  GemmParams p;
  p.w = w.ref(w.data.data(), w.scale.empty() ? nullptr : w.scale.data());
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.ldx = c.ldx;
  p.ldy = c.ldy;
  p.batch = c.batch;
  p.x_batch_stride = c.xbs;
  p.y_batch_stride = c.ybs;
  p.w_batch_rows = c.w_batch_rows;
  p.accumulate = c.accumulate;
  p.round_bf16 = c.round;
  p.quantize_x_block = c.qblock;
  std::vector<float> want = y0;
  p.x = x.data();
  p.y = want.data();
  cpu_ops().gemm(p);

  // The operand the products see: x, or its act_quant_fp8 (bit-exact on both sides, tested apart).
  std::vector<float> xa = x;
  if (c.qblock) {
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.m; ++i) {
        ActQuantFp8Params q;
        q.x = xa.data() + b * c.xbs + i * ldx;
        q.rows = 1;
        q.cols = c.k;
        q.block = c.qblock;
        cpu::act_quant_fp8(q);
      }
  }
  std::vector<double> ref, mag, acc_mag;
  std::vector<size_t> where;  // the written elements
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0, a = 0;
        const float* xr = xa.data() + b * c.xbs + i * ldx;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double t = xr[kk] * weight_at(w, b * c.w_batch_rows + j, kk);
          s += t;
          a += std::fabs(t);
        }
        const size_t o = static_cast<size_t>(b * c.ybs + i * ldy + j);
        const double y = c.accumulate ? s + y0[o] : s;
        ref.push_back(y);
        mag.push_back(a);
        acc_mag.push_back(c.accumulate ? 1.25 * kU * std::fabs(y) : 0.0);  // the add of y0
        where.push_back(o);
      }
  auto check = [&](const std::vector<float>& out, double depth) {
    std::vector<float> v;
    std::vector<double> bound;
    for (size_t e = 0; e < where.size(); ++e) {
      v.push_back(out[where[e]]);
      bound.push_back(gamma_n(depth) * mag[e] + acc_mag[e]);
    }
    return c.round ? correctly_rounded(v.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, bound.data())
                   : within(v, ref, bound);
  };
  EXPECT_TRUE(check(want, cpu_gemm_depth(c.k))) << "the CPU's gemm (" << cpu::gemm_isa_name() << ")";
  if (!have_gpu()) return;

  DeviceBuffer<float> dx = to_dev(x), dy = to_dev(y0);
  GemmParams g = p;
  g.x = dx.get();
  g.y = dy.get();
  g.w = w.ref(dw.get(), dscale.size() ? dscale.get() : nullptr);
  cuda::gemm(g, kStream);
  EXPECT_TRUE(check(to_host(dy), gpu_gemm_depth(c.k))) << "cuda::gemm";
  EXPECT_TRUE(same_bits(to_host(dx), x)) << "x must be left unchanged";
}

void run_cases(WeightFormat f, int64_t wn, int64_t k, const std::vector<GemmCase>& cases, uint64_t seed) {
  const HostWeight w = make_weight(f, wn, k, seed);
  DeviceBuffer<uint8_t> dw = have_gpu() ? to_dev(w.data) : DeviceBuffer<uint8_t>();
  DeviceBuffer<uint8_t> ds = have_gpu() ? to_dev(w.scale) : DeviceBuffer<uint8_t>();
  for (const GemmCase& c : cases) run_case(c, w, dw, ds, seed + c.m * 7 + c.n);
}

std::vector<GemmCase> row_counts(WeightFormat f, int64_t n, int64_t k, std::initializer_list<int64_t> ms) {
  std::vector<GemmCase> v;
  for (int64_t m : ms) v.push_back({f, m, n, k});
  return v;
}

TEST(CudaGemm, F32) {
  run_cases(WeightFormat::kF32, 256, 512, row_counts(WeightFormat::kF32, 256, 512, {1, 2, 3, 8, 13, 64, 200}), 11);
  run_cases(WeightFormat::kF32, 37, 200, row_counts(WeightFormat::kF32, 37, 200, {1, 5, 9}), 12);     // odd
  run_cases(WeightFormat::kF32, 24, 16384, row_counts(WeightFormat::kF32, 24, 16384, {1, 4}), 13);   // hc fn
  run_cases(WeightFormat::kF32, 5, 3, row_counts(WeightFormat::kF32, 5, 3, {1, 2}), 14);             // tiny
  TANDEM_REQUIRE_GPU();
}

TEST(CudaGemm, Bf16) {
  run_cases(WeightFormat::kBf16, 256, 4096, row_counts(WeightFormat::kBf16, 256, 4096, {1, 4, 8, 13, 64}), 21);  // gate
  run_cases(WeightFormat::kBf16, 1024, 4096, {{WeightFormat::kBf16, 3, 1024, 4096, 0, 0, false, true}}, 22);
  run_cases(WeightFormat::kBf16, 33, 100, row_counts(WeightFormat::kBf16, 33, 100, {1, 6}), 23);  // k % 8 != 0
  run_cases(WeightFormat::kBf16, 64, 512, {{WeightFormat::kBf16, 5, 64, 512, 520, 70, true, true}}, 24);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaGemm, Fp8Block) {
  // wq_a (4096 -> 1024) with the reference's act_quant on x and bf16 output, all decode/verify sizes
  std::vector<GemmCase> cs;
  for (int64_t m : {1, 2, 4, 7, 8, 16, 64}) cs.push_back({WeightFormat::kFp8Block, m, 1024, 4096, 0, 0, false, true, 128});
  run_cases(WeightFormat::kFp8Block, 1024, 4096, cs, 31);
  // wq_b (1024 -> 64 x 512), plain
  run_cases(WeightFormat::kFp8Block, 32768, 1024, row_counts(WeightFormat::kFp8Block, 32768, 1024, {1, 3}), 32);
  // ragged scale grid (n, k not multiples of 128), k % 16 != 0 -> scalar path, strided x/y, accumulate
  run_cases(WeightFormat::kFp8Block, 300, 200, row_counts(WeightFormat::kFp8Block, 300, 200, {1, 9}), 33);
  run_cases(WeightFormat::kFp8Block, 300, 336,
            {{WeightFormat::kFp8Block, 3, 300, 336, 339, 301, true, false}, {WeightFormat::kFp8Block, 10, 300, 336}}, 34);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaGemm, Fp8BatchedWoA) {
  // einsum("bsgd,grd->bsgr", o, wo_a): 8 groups of (4096 -> 1024), x rows of 8 x 4096, y rows of 8 x 1024
  std::vector<GemmCase> cs;
  for (int64_t m : {1, 5}) {
    GemmCase c{WeightFormat::kFp8Block, m, 1024, 4096, 32768, 8192, false, true};
    c.batch = 8;
    c.w_batch_rows = 1024;
    c.xbs = 4096;
    c.ybs = 1024;
    cs.push_back(c);
  }
  run_cases(WeightFormat::kFp8Block, 8192, 4096, cs, 41);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaGemm, Mxfp4Experts) {
  // w1 / w3 (4096 -> 2048) and w2 (2048 -> 4096) of a routed expert
  run_cases(WeightFormat::kMxfp4, 2048, 4096, row_counts(WeightFormat::kMxfp4, 2048, 4096, {1, 2, 6, 8, 17, 64}), 51);
  run_cases(WeightFormat::kMxfp4, 4096, 2048, {{WeightFormat::kMxfp4, 3, 4096, 2048, 0, 0, false, true}}, 52);
  // k % 32 == 0 but strided x (scalar path), odd n
  run_cases(WeightFormat::kMxfp4, 45, 96, {{WeightFormat::kMxfp4, 4, 45, 96, 99, 0}, {WeightFormat::kMxfp4, 9, 45, 96}}, 53);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaGemm, LmHead) {
  run_cases(WeightFormat::kBf16, 129280, 4096, row_counts(WeightFormat::kBf16, 129280, 4096, {1, 3}), 61);
  TANDEM_REQUIRE_GPU();
}

// A row's result is the same whether it is computed alone (decode) or with other rows (verify,
// prefill), for every path.
TEST(CudaGemm, RowsAreIndependentOfM) {
  TANDEM_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    for (int64_t k : {int64_t{512}, int64_t{96}, int64_t{4096}}) {  // 4096: the 16-warp path for f32/bf16
      const int64_t n = 130, m = 13;
      const HostWeight w = make_weight(f, n, k, 71);
      DeviceBuffer<uint8_t> dw = to_dev(w.data), ds = to_dev(w.scale);
      const int64_t ldx = k == 96 ? 97 : k;  // 97: the unaligned path
      std::vector<float> x = randn(static_cast<size_t>(m * ldx), 72, 1.0f, true);
      DeviceBuffer<float> dx = to_dev(x);
      auto all = poisoned<float>(static_cast<size_t>(m * n));
      GemmParams g;
      g.x = dx.get();
      g.w = w.ref(dw.get(), ds.size() ? ds.get() : nullptr);
      g.y = all.get();
      g.m = m;
      g.n = n;
      g.k = k;
      g.ldx = ldx;
      cuda::gemm(g, kStream);
      const std::vector<float> ref = to_host(all);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t rows : {int64_t{1}, int64_t{3}}) {
          if (i + rows > m) continue;
          auto part = poisoned<float>(static_cast<size_t>(rows * n));
          GemmParams h = g;
          h.x = dx.get() + i * ldx;
          h.y = part.get();
          h.m = rows;
          cuda::gemm(h, kStream);
          const std::vector<float> got = to_host(part);
          const std::vector<float> want(ref.begin() + i * n, ref.begin() + (i + rows) * n);
          EXPECT_TRUE(same_bits(got, want)) << fmt_name(f) << " k " << k << " row " << i << " of " << rows;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
