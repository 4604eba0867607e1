// CUDA act_quant_fp8 / fp4_act_quant / round_bf16 against the CPU ops: bit-exact outputs, codes and
// scales, NaN/inf inputs, strided rows whose padding must stay untouched.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows with very different magnitudes, a few NaN/inf, a block of tiny values (below the amax floor).
std::vector<float> quant_input(int64_t rows, int64_t ld, uint64_t seed, bool specials) {
  std::vector<float> x = randn(static_cast<size_t>(rows * ld), seed, 1.0f, false);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, static_cast<int>((r * 7) % 41) - 20);
    for (int64_t c = 0; c < ld; ++c) x[r * ld + c] *= mag;
  }
  if (specials && rows >= 3 && ld >= 40) {
    x[0 * ld + 3] = std::numeric_limits<float>::quiet_NaN();
    x[1 * ld + 5] = kInf;
    x[2 * ld + 7] = -kInf;
    for (int c = 0; c < 32; ++c) x[2 * ld + c + 8] = 1e-9f * (c + 1);
  }
  return x;
}

struct QuantCase {
  int64_t rows, cols, ldx;
  int block;
  bool outputs;
};

TEST(CudaActQuant, Fp8MatchesCpuBitExact) {
  TANDEM_REQUIRE_GPU();
  const QuantCase cases[] = {
      {7, 4096, 4096 + 8, 128, false},  // linear() input, padded rows
      {5, 448, 512, 64, true},          // KV NoPE dims with stored codes/scales
      {3, 1024, 1024, 128, true},
      {33, 192, 200, 64, false},        // odd sizes
      {1, 32, 32, 32, true},
  };
  uint64_t seed = 1;
  for (const QuantCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " cols " << c.cols << " block " << c.block);
    for (bool specials : {false, true}) {
      std::vector<float> x = quant_input(c.rows, c.ldx, seed++, specials);
      std::vector<float> xc = x;
      const int64_t nb = c.cols / c.block;
      std::vector<uint8_t> codes(c.outputs ? c.rows * c.cols : 0), scales(c.outputs ? c.rows * nb : 0);
      ActQuantFp8Params p;
      p.x = xc.data();
      p.rows = c.rows;
      p.cols = c.cols;
      p.ldx = c.ldx;
      p.block = c.block;
      p.codes = c.outputs ? codes.data() : nullptr;
      p.scales = c.outputs ? scales.data() : nullptr;
      cpu_ops().act_quant_fp8(p);

      DeviceBuffer<float> dx = to_dev(x);
      auto dcodes = poisoned<uint8_t>(codes.size(), 0x5a), dscales = poisoned<uint8_t>(scales.size(), 0x5a);
      p.x = dx.get();
      p.codes = c.outputs ? dcodes.get() : nullptr;
      p.scales = c.outputs ? dscales.get() : nullptr;
      cuda::act_quant_fp8(p, kStream);
      EXPECT_TRUE(same_bits(to_host(dx), xc));
      if (c.outputs) {
        EXPECT_TRUE(same_values(to_host(dcodes), codes));
        EXPECT_TRUE(same_values(to_host(dscales), scales));
      }
    }
  }
}

TEST(CudaActQuant, Fp4MatchesCpuBitExact) {
  TANDEM_REQUIRE_GPU();
  const QuantCase cases[] = {
      {9, 128, 160, 32, true},    // indexer q / k
      {64, 128, 128, 32, false},
      {3, 96, 97, 32, true},
      {2, 64, 64, 16, true},
  };
  uint64_t seed = 100;
  for (const QuantCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " cols " << c.cols << " block " << c.block);
    for (bool specials : {false, true}) {
      std::vector<float> x = quant_input(c.rows, c.ldx, seed++, specials);
      std::vector<float> xc = x;
      const int64_t nb = c.cols / c.block;
      std::vector<uint8_t> codes(c.outputs ? c.rows * c.cols / 2 : 0), scales(c.outputs ? c.rows * nb : 0);
      Fp4ActQuantParams p;
      p.x = xc.data();
      p.rows = c.rows;
      p.cols = c.cols;
      p.ldx = c.ldx;
      p.block = c.block;
      p.codes = c.outputs ? codes.data() : nullptr;
      p.scales = c.outputs ? scales.data() : nullptr;
      cpu_ops().fp4_act_quant(p);

      DeviceBuffer<float> dx = to_dev(x);
      auto dcodes = poisoned<uint8_t>(codes.size(), 0x5a), dscales = poisoned<uint8_t>(scales.size(), 0x5a);
      p.x = dx.get();
      p.codes = c.outputs ? dcodes.get() : nullptr;
      p.scales = c.outputs ? dscales.get() : nullptr;
      cuda::fp4_act_quant(p, kStream);
      EXPECT_TRUE(same_bits(to_host(dx), xc));
      if (c.outputs) {
        EXPECT_TRUE(same_values(to_host(dcodes), codes));
        EXPECT_TRUE(same_values(to_host(dscales), scales));
      }
    }
  }
}

TEST(CudaRoundBf16, MatchesCpuBitExact) {
  TANDEM_REQUIRE_GPU();
  for (auto [rows, cols, ldx] : {std::tuple<int64_t, int64_t, int64_t>{5, 1000, 1003}, {1, 4096, 4096}, {300, 7, 9}}) {
    std::vector<float> x = randn(static_cast<size_t>(rows * ldx), rows * 31 + cols, 3.0f, false);
    x[0] = std::numeric_limits<float>::quiet_NaN();
    x[1] = kInf;
    x[2] = 3.4e38f;   // rounds past the largest bf16: inf
    x[3] = 1e-40f;    // subnormal
    x[4] = -0.0f;
    std::vector<float> xc = x;
    RoundBf16Params p;
    p.x = xc.data();
    p.rows = rows;
    p.cols = cols;
    p.ldx = ldx;
    cpu_ops().round_bf16(p);
    DeviceBuffer<float> dx = to_dev(x);
    p.x = dx.get();
    cuda::round_bf16(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dx), xc)) << rows << "x" << cols;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
