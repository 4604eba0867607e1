// CUDA softmax / log-softmax and argmax against the CPU ops at vocabulary size (129280) and small
// odd sizes; argmax's tie and NaN rules must match exactly. Softmax: both sides form the same fp32
// arguments a_i = fl(fl(x_i / T) - max), sum exp(a) in fp64 and differ only in expf and in the
// fp64 sum's last bits; each is held to a float64 reference within a stated bound: probabilities
// exp(a) * fl(1/z) within kExpRel + 2u relative (plus two steps of the subnormal grid, where expf
// and the product underflow); log-probabilities a - fl(log z) within half an ulp of log z plus one
// rounding.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

constexpr int64_t kVocab = 129280;

TEST(CudaSoftmax, MatchesCpu) {
  struct C {
    int64_t rows, n, ldx, ldy;
    float temperature;
    bool log, in_place;
  };
  uint64_t seed = 1;
  for (const C& c : {C{3, kVocab, 0, 0, 1.0f, false, false}, C{3, kVocab, 0, 0, 0.7f, true, false},
                     C{2, kVocab, kVocab + 4, 0, 1.3f, false, true}, C{5, 7, 9, 8, 1.0f, true, false},
                     C{4, 1000, 0, 0, 0.25f, false, false}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " n " << c.n << (c.log ? " log" : ""));
    const int64_t ldx = c.ldx ? c.ldx : c.n, ldy = c.in_place ? ldx : (c.ldy ? c.ldy : c.n);
    std::vector<float> x = randn(static_cast<size_t>(c.rows * ldx), seed++, 4.0f, false);
    x[1] = -std::numeric_limits<float>::infinity();
    std::vector<float> want = c.in_place ? x : poisoned_host<float>(static_cast<size_t>(c.rows * ldy));
    std::vector<float> xin = x;
    SoftmaxParams p;
    p.rows = c.rows;
    p.n = c.n;
    p.ldx = c.ldx;
    p.ldy = c.in_place ? c.ldx : c.ldy;
    p.temperature = c.temperature;
    p.log = c.log;
    p.x = c.in_place ? want.data() : xin.data();
    p.y = want.data();
    cpu_ops().softmax(p);
    // The reference per row (see the file comment), on the written elements only.
    std::vector<double> ref, bound;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::vector<float> a(static_cast<size_t>(c.n));
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < c.n; ++i) {
        a[i] = x[r * ldx + i] / c.temperature;
        m = a[i] > m ? a[i] : m;
      }
      double z = 0;
      for (int64_t i = 0; i < c.n; ++i) z += std::exp(static_cast<double>(a[i] = a[i] - m));
      const double lz = std::log(z), ulp_lz = std::ldexp(1.0, std::ilogb(lz) - 23);
      for (int64_t i = 0; i < c.n; ++i) {
        const double y = c.log ? a[i] - lz : std::exp(static_cast<double>(a[i])) / z;
        ref.push_back(y);
        bound.push_back(c.log ? 1.25 * (0.5 * ulp_lz + 1e-11 + kU * std::fabs(y))
                              : 1.25 * (kExpRel + 2 * kU + 1e-11) * std::fabs(y) + std::ldexp(1.0, -148));
      }
    }
    auto written = [&](const std::vector<float>& out) {
      std::vector<float> v;
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t i = 0; i < c.n; ++i) v.push_back(out[r * ldy + i]);
      return v;
    };
    EXPECT_TRUE(within(written(want), ref, bound)) << "the CPU's softmax";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dx = to_dev(x);
    DeviceBuffer<float> dy = c.in_place ? DeviceBuffer<float>() : poisoned<float>(want.size());
    p.x = dx.get();
    p.y = c.in_place ? dx.get() : dy.get();
    cuda::softmax(p, kStream);
    EXPECT_TRUE(within(written(to_host(c.in_place ? dx : dy)), ref, bound));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaArgmax, MatchesCpuExactly) {
  TANDEM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (auto [rows, n, ldx] : {std::tuple<int64_t, int64_t, int64_t>{8, kVocab, 0}, {6, 7, 9}, {3, 1, 0}, {2, 5000, 5001}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " n " << n);
    const int64_t ld = ldx ? ldx : n;
    std::vector<float> x = randn(static_cast<size_t>(rows * ld), rows * 13 + n, 3.0f, true);  // bf16: many ties
    if (n >= 7 && rows >= 6) {
      x[0 * ld + n - 1] = 100.0f;  // max at the end, tied earlier
      x[0 * ld + 3] = 100.0f;
      x[1 * ld + 5] = nan;  // first NaN wins
      x[1 * ld + 6] = nan;
      x[1 * ld + 2] = inf;
      for (int64_t i = 0; i < n; ++i) x[2 * ld + i] = -inf;  // all -inf: index 0
      for (int64_t i = 0; i < n; ++i) x[3 * ld + i] = -1.0f - static_cast<float>(i);
      x[3 * ld + 1] = 0.0f;  // -0 then +0: equal, the first wins
      x[3 * ld + 0] = -0.0f;
      for (int64_t i = 0; i < n; ++i) x[4 * ld + i] = 2.5f;  // all equal
      x[5 * ld + n - 1] = nan;  // NaN at the end beats the earlier max
    }
    std::vector<int32_t> out(static_cast<size_t>(rows));
    std::vector<float> mv(static_cast<size_t>(rows));
    ArgmaxParams p;
    p.x = x.data();
    p.out = out.data();
    p.max_value = mv.data();
    p.rows = rows;
    p.n = n;
    p.ldx = ldx;
    cpu_ops().argmax(p);
    DeviceBuffer<float> dx = to_dev(x);
    auto dout = poisoned<int32_t>(out.size(), 0x5a);
    auto dmv = poisoned<float>(mv.size(), 0x5a);
    p.x = dx.get();
    p.out = dout.get();
    p.max_value = dmv.get();
    cuda::argmax(p, kStream);
    EXPECT_TRUE(same_values(to_host(dout), out));
    EXPECT_TRUE(same_bits(to_host(dmv), mv));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
