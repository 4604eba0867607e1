// CUDA rms_norm (both modes), rope (forward / inverse, YaRN frequencies, strided heads) and hadamard
// against the CPU ops. The bf16 chain and the Hadamard butterflies are defined bit for bit and must
// match exactly; the fp32 norm and the rotation (device sincosf) within a few fp32 ulps.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

struct NormCase {
  int64_t rows, dim, ldx, ldy;
  int weight;  // 0 none, 1 fp32, 2 bf16
  RmsNormMode mode;
  bool round, in_place, specials;
};

TEST(CudaRmsNorm, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  const NormCase cases[] = {
      {5, 4096, 0, 0, 1, RmsNormMode::kF32, true, false, true},     // attn/ffn norm
      {7, 4096, 0, 0, 2, RmsNormMode::kF32, false, false, false},   // bf16 weight
      {4, 1024, 0, 0, 2, RmsNormMode::kF32, true, true, false},     // q_norm, in place
      {3, 1000, 1010, 1005, 0, RmsNormMode::kF32, false, false, true},
      {192, 512, 0, 0, 0, RmsNormMode::kBf16Chain, false, true, false},  // per-head q (64 heads x 3)
      {9, 512, 520, 515, 2, RmsNormMode::kBf16Chain, false, false, true},
      {2, 7, 0, 0, 1, RmsNormMode::kBf16Chain, false, false, false},
      {1, 7, 0, 0, 1, RmsNormMode::kF32, true, false, false},
  };
  uint64_t seed = 1;
  for (const NormCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " dim " << c.dim << " mode " << static_cast<int>(c.mode)
                                    << " weight " << c.weight << (c.in_place ? " in place" : ""));
    const int64_t ldx = c.ldx ? c.ldx : c.dim, ldy = c.in_place ? ldx : (c.ldy ? c.ldy : c.dim);
    std::vector<float> x = randn(static_cast<size_t>(c.rows * ldx), seed++, 2.0f, true);
    if (c.specials && c.rows >= 3) {
      x[1 * ldx + 2] = std::numeric_limits<float>::quiet_NaN();
      x[2 * ldx + 1] = std::numeric_limits<float>::infinity();
    }
    std::vector<float> w = randn(static_cast<size_t>(c.dim), seed++, 0.5f, true);
    std::vector<uint16_t> wb(static_cast<size_t>(c.dim));
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = num::f32_to_bf16(w[i]);
    std::vector<float> want = c.in_place ? x : poisoned_host<float>(static_cast<size_t>(c.rows * ldy));
    std::vector<float> xin = x;
    RmsNormParams p;
    p.rows = c.rows;
    p.dim = c.dim;
    p.ldx = c.ldx;
    p.ldy = c.in_place ? c.ldx : c.ldy;
    p.mode = c.mode;
    p.round_bf16 = c.round;
    p.weight = c.weight == 1 ? w.data() : nullptr;
    p.weight_bf16 = c.weight == 2 ? wb.data() : nullptr;
    p.x = c.in_place ? want.data() : xin.data();
    p.y = want.data();
    cpu_ops().rms_norm(p);

    DeviceBuffer<float> dx = to_dev(x), dwt = to_dev(w);
    DeviceBuffer<uint16_t> dwb = to_dev(wb);
    DeviceBuffer<float> dy = c.in_place ? DeviceBuffer<float>() : poisoned<float>(want.size());
    p.x = dx.get();
    p.y = c.in_place ? dx.get() : dy.get();
    p.weight = c.weight == 1 ? dwt.get() : nullptr;
    p.weight_bf16 = c.weight == 2 ? dwb.get() : nullptr;
    cuda::rms_norm(p, kStream);
    const std::vector<float> got = to_host(c.in_place ? dx : dy);
    if (c.mode == RmsNormMode::kBf16Chain) {
      EXPECT_TRUE(same_bits(got, want));
    } else {
      EXPECT_TRUE(close(got, want, 1e-30, c.round ? 1.0 / 128 : 4e-7));
    }
  }
}

struct RopeCase {
  int64_t tokens, heads, token_stride, head_stride;
  int rope_offset, rope_dim;
  bool yarn, inverse, round;
};

TEST(CudaRope, MatchesCpu) {
  TANDEM_REQUIRE_GPU();
  const RopeCase cases[] = {
      {5, 64, 0, 0, 448, 64, true, false, true},         // q heads
      {5, 64, 0, 0, 448, 64, true, true, true},          // de-rotation of the attention output
      {9, 1, 0, 0, 448, 64, false, false, true},         // kv (SWA layer: no YaRN)
      {3, 8, 8 * 600 + 5, 600, 64, 64, true, false, false},  // strided heads, rope in the middle
      {2, 3, 0, 0, 0, 6, false, true, false},
  };
  uint64_t seed = 50;
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << (c.inverse ? " inverse" : ""));
    const int64_t hs = c.head_stride ? c.head_stride : c.rope_offset + c.rope_dim;
    const int64_t ts = c.token_stride ? c.token_stride : c.heads * hs;
    const size_t size = static_cast<size_t>((c.tokens - 1) * ts + c.heads * hs);
    std::vector<float> x = randn(size, seed++, 1.0f, true);
    std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
    for (int64_t t = 0; t < c.tokens; ++t) pos[t] = (t * 7919 * 131) % 1000003 + t;  // up to ~1M
    std::vector<float> inv(static_cast<size_t>(c.rope_dim / 2));
    RopeFreqParams fp;
    fp.inv_freq = inv.data();
    fp.rope_dim = c.rope_dim;
    fp.base = 10000.0;
    if (c.yarn) {
      fp.original_seq_len = 65536;
      fp.factor = 16.0;
    }
    rope_inv_freq(fp);
    std::vector<float> want = x;
    RopeParams p;
    p.x = want.data();
    p.positions = pos.data();
    p.inv_freq = inv.data();
    p.tokens = c.tokens;
    p.heads = c.heads;
    p.token_stride = c.token_stride;
    p.head_stride = c.head_stride;
    p.rope_offset = c.rope_offset;
    p.rope_dim = c.rope_dim;
    p.inverse = c.inverse;
    p.round_bf16 = c.round;
    cpu_ops().rope(p);

    DeviceBuffer<float> dx = to_dev(x), dinv = to_dev(inv);
    DeviceBuffer<int64_t> dpos = to_dev(pos);
    p.x = dx.get();
    p.positions = dpos.get();
    p.inv_freq = dinv.get();
    cuda::rope(p, kStream);
    const std::vector<float> got = to_host(dx);
    // Pair magnitude |a| + |b| bounds the effect of a cos/sin ulp; untouched dims must be equal.
    std::vector<double> tol(size);
    for (size_t i = 0; i < size; ++i) {
      const size_t j = i ^ 1;
      double t = 4e-7 * (std::fabs(x[i]) + (j < size ? std::fabs(x[j]) : 0.0));
      if (c.round) t += std::ldexp(std::fabs(want[i]), -7);
      tol[i] = t;
    }
    EXPECT_TRUE(close(got, want, 1e-30, 1.0, &tol));
  }
}

TEST(CudaHadamard, MatchesCpuBitExact) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int64_t rows, n, ldx;
    bool round;
  };
  for (const C& c : {C{9, 128, 130, true}, C{64, 128, 0, true}, C{3, 4096, 0, false}, C{2, 1, 0, false},
                     C{5, 2, 3, true}, C{1, 8192, 0, false}}) {
    const int64_t ldx = c.ldx ? c.ldx : c.n;
    std::vector<float> x = randn(static_cast<size_t>(c.rows * ldx), c.n * 3 + c.rows, 1.0f, true);
    x[0] = std::numeric_limits<float>::infinity();
    std::vector<float> want = x;
    HadamardParams p;
    p.x = want.data();
    p.rows = c.rows;
    p.n = c.n;
    p.ldx = c.ldx;
    p.round_bf16 = c.round;
    cpu_ops().hadamard(p);
    DeviceBuffer<float> dx = to_dev(x);
    p.x = dx.get();
    cuda::hadamard(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dx), want)) << "rows " << c.rows << " n " << c.n;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
