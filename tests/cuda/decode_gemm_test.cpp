// decode_gemm (kernels/cuda/decode_gemm.h) and decode_act_pack against float64 references and the
// ops they replace: FP8 weights on act_quant codes (grouped like wq_a + wkv; ragged, strided,
// accumulating; NaN rows), bf16 weights (gate + compressors + a 4-row projection; the 129280-row LM
// head), FP8 weights on bf16 activations (wo_a's groups); every row count 1..100 (the 100-row call
// runs in two chunks); each row's bits independent of the call's row count; a CUDA graph of
// PDL launches equal to eager. Bounds: decode_test_util.h.
#include <limits>

#include "cuda/decode_test_util.h"
#include "kernels/cuda/timeline.cuh"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda::DecodeActPackArgs;
using cuda::DecodeGemmArgs;

struct Fp8Operand {
  HostCodes h;
  DeviceBuffer<uint8_t> codes, scales;
  int64_t rows = 0, ld = 0;
};
Fp8Operand fp8_operand(const std::vector<float>& x, int64_t rows, int64_t ld) {
  Fp8Operand o;
  o.h = host_act_quant(x, rows, ld, ld);
  o.codes = to_dev(o.h.codes);
  o.scales = to_dev(o.h.scales);
  o.rows = rows;
  o.ld = ld;
  return o;
}
// One FP8 projection of op's first m rows (all k = op.ld columns) into y [m, w.n].
DecodeGemmArgs fp8_args(const Fp8Operand& op, int64_t m, const HostMatrix& w, float* y, bool round_bf16) {
  DecodeGemmArgs a;
  a.x_codes = op.codes.get();
  a.x_scales = op.scales.get();
  a.ldx = op.ld;
  a.m = m;
  a.k = op.ld;
  a.num_segments = 1;
  a.seg[0].w = w.dev();
  a.seg[0].y = y;
  a.seg[0].round_bf16 = round_bf16;
  return a;
}

TEST(CudaDecodeGemm, Fp8CodesGroupedMatchesFloat64AtEveryRowCount) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 4096, M = 100;
  HostMatrix wqa = random_matrix(WeightFormat::kFp8Block, 1024, K, 1);
  HostMatrix wkv = random_matrix(WeightFormat::kFp8Block, 512, K, 2);
  const std::vector<float> x = act_rows(M, K, 3);
  Fp8Operand op = fp8_operand(x, M, K);
  const Ref64 rqa = reference(op.h.values.data(), K, 0, M, wqa), rkv = reference(op.h.values.data(), K, 0, M, wkv);
  std::vector<float> full_qa, full_kv;
  for (int64_t m : {int64_t{100}, int64_t{1}, int64_t{6}, int64_t{8}, int64_t{48}, int64_t{96}}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    auto yqa = poisoned<float>(static_cast<size_t>(m * 1024)), ykv = poisoned<float>(static_cast<size_t>(m * 512));
    DecodeGemmArgs a;
    a.x_codes = op.codes.get();
    a.x_scales = op.scales.get();
    a.ldx = K;
    a.m = m;
    a.k = K;
    a.num_segments = 2;
    a.seg[0].w = wqa.dev();
    a.seg[0].y = yqa.get();
    a.seg[0].round_bf16 = true;
    a.seg[1].w = wkv.dev();
    a.seg[1].y = ykv.get();
    a.seg[1].round_bf16 = true;
    cuda::decode_gemm(a, kStream);
    const std::vector<float> gqa = to_host(yqa), gkv = to_host(ykv);
    const double f = decode_factor(K, cuda::decode_gemm_k_split(a));
    EXPECT_TRUE(within_bound(gqa, 1024, ref_rows(rqa, 0, m), f, true)) << "wq_a";
    EXPECT_TRUE(within_bound(gkv, 512, ref_rows(rkv, 0, m), f, true)) << "wkv";
    if (m == M) {
      full_qa = gqa;
      full_kv = gkv;
    } else {
      EXPECT_TRUE(same_bits(gqa, std::vector<float>(full_qa.begin(), full_qa.begin() + m * 1024))) << "wq_a rows vs m=100";
      EXPECT_TRUE(same_bits(gkv, std::vector<float>(full_kv.begin(), full_kv.begin() + m * 512))) << "wkv rows vs m=100";
    }
  }
}

// The timeline instrument (kernels/cuda/timeline.cuh): recording changes no output bit; each CTA's
// marks are in order and the items of all CTAs add up to the launch's (16-row tiles / tiles an
// item, one 96-row chunk).
TEST(CudaDecodeGemm, TimelineChangesNoResult) {
  TANDEM_REQUIRE_GPU();
  namespace timeline = cuda::timeline;
  const int64_t K = 1024, N = 2048, M = 3;
  HostMatrix w = random_matrix(WeightFormat::kFp8Block, N, K, 21);
  Fp8Operand op = fp8_operand(act_rows(M, K, 22), M, K);
  auto y = poisoned<float>(static_cast<size_t>(M * N));
  DecodeGemmArgs a = fp8_args(op, M, w, y.get(), true);
  cuda::decode_gemm(a, kStream);
  const std::vector<float> want = to_host(y);
  const size_t words = static_cast<size_t>(timeline::kCtas) * timeline::kSlots;
  DeviceBuffer<uint64_t> rec(words);
  TANDEM_CUDA_CHECK(cudaMemset(rec.get(), 0, words * sizeof(uint64_t)));
  TANDEM_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
  a.timeline = rec.get();
  cuda::decode_gemm(a, kStream);
  EXPECT_TRUE(same_bits(to_host(y), want));
  std::vector<uint64_t> h(words);
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), rec.get(), words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  int64_t items = 0;
  int ctas = 0;
  for (int c = 0; c < timeline::kCtas; ++c) {
    const uint64_t* r = h.data() + static_cast<size_t>(c) * timeline::kSlots;
    if (!r[1]) continue;
    ++ctas;
    EXPECT_GE(r[2], r[1]);
    EXPECT_GE(r[3], r[2]);
    EXPECT_GE(r[15], r[3]);
    const int n = static_cast<int>(r[0] >> 32);
    items += n;
    for (int i = 0; i < 5 && i < n; ++i) EXPECT_GE(r[5 + 2 * i], r[4 + 2 * i]) << "CTA " << c << " item " << i;
  }
  EXPECT_GT(ctas, 0);
  const int units = cuda::decode_gemm_k_split(a);
  EXPECT_EQ(items, N / 16 / (8 / units)) << "units " << units;
}

TEST(CudaDecodeGemm, Fp8CodesRaggedStridedAccumulating) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 384, ldx = 640, n = 300, ldy = 310;  // n and the scale grid ragged
  HostMatrix w0 = random_matrix(WeightFormat::kFp8Block, n, K, 11);
  HostMatrix w1 = random_matrix(WeightFormat::kFp8Block, 40, K, 12);
  for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{33}}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const std::vector<float> x = act_rows(m, ldx, 13 + m);
    Fp8Operand op = fp8_operand(x, m, ldx);
    const std::vector<float> y0 = randn(static_cast<size_t>(m * ldy), 14 + m, 1.0f, false);
    DeviceBuffer<float> d0 = to_dev(y0);
    auto d1 = poisoned<float>(static_cast<size_t>(m * 40));
    DecodeGemmArgs a;
    a.x_codes = op.codes.get();
    a.x_scales = op.scales.get();
    a.ldx = ldx;
    a.m = m;
    a.k = K;
    a.num_segments = 2;
    a.seg[0].w = w0.dev();
    a.seg[0].y = d0.get();
    a.seg[0].ldy = ldy;
    a.seg[0].x_col0 = 128;
    a.seg[0].accumulate = true;
    a.seg[1].w = w1.dev();
    a.seg[1].y = d1.get();
    a.seg[1].x_col0 = 256;
    a.seg[1].round_bf16 = true;
    cuda::decode_gemm(a, kStream);
    const std::vector<float> g0 = to_host(d0), g1 = to_host(d1);
    const double f = decode_factor(K, cuda::decode_gemm_k_split(a));
    EXPECT_TRUE(within_bound(g0, ldy, reference(op.h.values.data(), ldx, 128, m, w0), f, false, &y0)) << "accumulate";
    EXPECT_TRUE(within_bound(g1, 40, reference(op.h.values.data(), ldx, 256, m, w1), f, true)) << "bf16 out";
    // Columns past n of the strided output are left alone.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n; j < ldy; ++j) EXPECT_EQ(num::f32_bits(g0[i * ldy + j]), num::f32_bits(y0[i * ldy + j]));
  }
}

TEST(CudaDecodeGemm, Fp8CodesNanRowStaysNan) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 1024, n = 256, m = 5;
  HostMatrix w = random_matrix(WeightFormat::kFp8Block, n, K, 21);
  std::vector<float> x = act_rows(m, K, 22);
  x[2 * K + 100] = std::numeric_limits<float>::quiet_NaN();
  Fp8Operand op = fp8_operand(x, m, K);
  auto y = poisoned<float>(static_cast<size_t>(m * n));
  const DecodeGemmArgs a = fp8_args(op, m, w, y.get(), false);
  cuda::decode_gemm(a, kStream);
  EXPECT_TRUE(within_bound(to_host(y), n, reference(op.h.values.data(), K, 0, m, w),
                           decode_factor(K, cuda::decode_gemm_k_split(a)), false));
}

TEST(CudaDecodeGemm, Bf16GroupedMatchesFloat64) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 4096, M = 96;
  HostMatrix gate = random_matrix(WeightFormat::kBf16, 256, K, 31);
  HostMatrix comp = random_matrix(WeightFormat::kBf16, 1024, K, 32);
  HostMatrix tiny = random_matrix(WeightFormat::kBf16, 4, K, 33);  // rows not a multiple of 16
  const std::vector<float> x = act_rows(M, K, 34);
  DeviceBuffer<float> dx = to_dev(x);
  const Ref64 rg = reference(x.data(), K, 0, M, gate), rc = reference(x.data(), K, 0, M, comp),
              rt = reference(x.data(), K, 0, M, tiny);
  for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{48}, int64_t{96}}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    auto yg = poisoned<float>(static_cast<size_t>(m * 256)), yc = poisoned<float>(static_cast<size_t>(m * 1024)),
         yt = poisoned<float>(static_cast<size_t>(m * 4));
    DecodeGemmArgs a;
    a.x = dx.get();
    a.ldx = K;
    a.m = m;
    a.k = K;
    a.num_segments = 3;
    a.seg[0].w = gate.dev();
    a.seg[0].y = yg.get();
    a.seg[1].w = comp.dev();
    a.seg[1].y = yc.get();
    a.seg[2].w = tiny.dev();
    a.seg[2].y = yt.get();
    cuda::decode_gemm(a, kStream);
    const double f = decode_factor(K, cuda::decode_gemm_k_split(a));
    EXPECT_TRUE(within_bound(to_host(yg), 256, ref_rows(rg, 0, m), f, false)) << "gate";
    EXPECT_TRUE(within_bound(to_host(yc), 1024, ref_rows(rc, 0, m), f, false)) << "compressor";
    EXPECT_TRUE(within_bound(to_host(yt), 4, ref_rows(rt, 0, m), f, false)) << "4 rows";
  }
}

TEST(CudaDecodeGemm, LmHead) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 4096, V = 129280, m = 3;
  HostMatrix head = random_matrix(WeightFormat::kBf16, V, K, 41);
  const std::vector<float> x = act_rows(m, K, 42);
  DeviceBuffer<float> dx = to_dev(x);
  auto y = poisoned<float>(static_cast<size_t>(m * V));
  DecodeGemmArgs a;
  a.x = dx.get();
  a.ldx = K;
  a.m = m;
  a.k = K;
  a.num_segments = 1;
  a.seg[0].w = head.dev();
  a.seg[0].y = y.get();
  cuda::decode_gemm(a, kStream);
  EXPECT_TRUE(within_bound(to_host(y), V, reference(x.data(), K, 0, m, head),
                           decode_factor(K, cuda::decode_gemm_k_split(a)), false));
}

// wo_a: groups g of 1024 weight rows read activation columns [g * 4096, (g + 1) * 4096) and write
// output columns [g * 1024, (g + 1) * 1024) of a 4096-wide row (the grouped einsum).
TEST(CudaDecodeGemm, Fp8OnBf16ActivationsAsWoAGroups) {
  TANDEM_REQUIRE_GPU();
  const int64_t G = 4, R = 1024, gin = 4096;
  HostMatrix w = random_matrix(WeightFormat::kFp8Block, G * R, gin, 51);
  for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{13}}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const std::vector<float> x = act_rows(m, G * gin, 52 + m);
    DeviceBuffer<float> dx = to_dev(x);
    auto u = poisoned<float>(static_cast<size_t>(m * G * R));
    DecodeGemmArgs a;
    a.x = dx.get();
    a.ldx = G * gin;
    a.m = m;
    a.k = gin;
    a.num_segments = static_cast<int>(G);
    for (int64_t g = 0; g < G; ++g) {
      a.seg[g].w = w.dev().rows(g * R, R);
      a.seg[g].y = u.get() + g * R;
      a.seg[g].ldy = G * R;
      a.seg[g].x_col0 = g * gin;
      a.seg[g].round_bf16 = true;
    }
    cuda::decode_gemm(a, kStream);
    const std::vector<float> got = to_host(u);
    const double f = decode_factor(gin, cuda::decode_gemm_k_split(a));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> part(static_cast<size_t>(m * R));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < R; ++j) part[i * R + j] = got[i * G * R + g * R + j];
      EXPECT_TRUE(within_bound(part, R, reference(x.data(), G * gin, g * gin, m, w, g * R, R), f, true)) << "group " << g;
    }
  }
}

// Every kind: rows [i0, i0 + m) computed alone give the bits of the same rows in a 100-row call.
TEST(CudaDecodeGemm, RowsAreIndependentOfTheRowCount) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 1024, M = 100;
  HostMatrix w8 = random_matrix(WeightFormat::kFp8Block, 512, K, 61);
  HostMatrix wb = random_matrix(WeightFormat::kBf16, 512, K, 62);
  const std::vector<float> x = act_rows(M, K, 63);
  Fp8Operand op = fp8_operand(x, M, K);
  DeviceBuffer<float> dx = to_dev(x);
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(::testing::Message() << "kind " << (kind == 0 ? "fp8 codes" : kind == 1 ? "bf16" : "fp8 on bf16"));
    auto call = [&](int64_t i0, int64_t m) {
      auto y = poisoned<float>(static_cast<size_t>(m * 512));
      DecodeGemmArgs a;
      if (kind == 0) {
        a.x_codes = op.codes.get() + i0 * K;
        a.x_scales = op.scales.get() + i0 * (K / 128);
      } else {
        a.x = dx.get() + i0 * K;
      }
      a.ldx = K;
      a.m = m;
      a.k = K;
      a.num_segments = 1;
      a.seg[0].w = kind == 1 ? wb.dev() : w8.dev();
      a.seg[0].y = y.get();
      a.seg[0].round_bf16 = kind != 1;
      cuda::decode_gemm(a, kStream);
      return to_host(y);
    };
    const std::vector<float> all = call(0, M);
    for (auto [i0, m] : {std::pair<int64_t, int64_t>{0, 1}, {5, 1}, {3, 6}, {17, 8}, {11, 9}, {40, 48}, {4, 96}}) {
      const std::vector<float> got = call(i0, m);
      EXPECT_TRUE(same_bits(got, std::vector<float>(all.begin() + i0 * 512, all.begin() + (i0 + m) * 512)))
          << "rows " << i0 << ".." << i0 + m;
    }
  }
}

// A projection's k split depends on its own weight only (decode_gemm_units), so it gives the same
// bits alone and grouped with others; here with segments of different splits (a 24576-row weight in
// two units, a 256-row one in four) whose 392 items outnumber the CTAs (at most two per SM), so
// CTAs stream items of both segments back to back through one ring.
TEST(CudaDecodeGemm, GroupedEqualsAloneWithMixedSplits) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 1024, M = 40;
  HostMatrix big = random_matrix(WeightFormat::kFp8Block, 24576, K, 65);
  HostMatrix small = random_matrix(WeightFormat::kFp8Block, 256, K, 66);
  ASSERT_EQ(cuda::decode_gemm_units(big.dev(), true), 2);
  ASSERT_EQ(cuda::decode_gemm_units(small.dev(), true), 4);
  const std::vector<float> x = act_rows(M, K, 67);
  Fp8Operand op = fp8_operand(x, M, K);
  const Ref64 rs = reference(op.h.values.data(), K, 0, M, small);
  const Ref64 rb = reference(op.h.values.data(), K, 0, 8, big);  // the first 8 rows' reference is enough
  for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{40}}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    auto run = [&](bool grouped) {
      auto yb = poisoned<float>(static_cast<size_t>(m * 24576)), ys = poisoned<float>(static_cast<size_t>(m * 256));
      DecodeGemmArgs a;
      a.x_codes = op.codes.get();
      a.x_scales = op.scales.get();
      a.ldx = K;
      a.m = m;
      a.k = K;
      int s = 0;
      if (grouped) {
        a.seg[s].w = big.dev();
        a.seg[s].y = yb.get();
        a.seg[s].round_bf16 = true;
        ++s;
      }
      a.seg[s].w = small.dev();
      a.seg[s].y = ys.get();
      a.seg[s].round_bf16 = true;
      a.num_segments = s + 1;
      cuda::decode_gemm(a, kStream);
      return std::pair<std::vector<float>, std::vector<float>>(grouped ? to_host(yb) : std::vector<float>(), to_host(ys));
    };
    const auto [gb, gs] = run(true);
    const std::vector<float> alone = run(false).second;
    EXPECT_TRUE(same_bits(gs, alone)) << "256-row weight grouped vs alone";
    EXPECT_TRUE(within_bound(gs, 256, ref_rows(rs, 0, m), decode_factor(K, 4), true)) << "256-row weight";
    std::vector<float> first(static_cast<size_t>(std::min<int64_t>(m, 8) * 24576));
    std::copy(gb.begin(), gb.begin() + first.size(), first.begin());
    EXPECT_TRUE(within_bound(first, 24576, ref_rows(rb, 0, std::min<int64_t>(m, 8)), decode_factor(K, 2), true))
        << "24576-row weight";
  }
}

// decode_act_pack == rms_norm (round_bf16) then act_quant_fp8 with codes/scales, both CUDA ops, bit
// for bit; the codes also equal the CPU op's on the normed rows; quantization alone equals the CPU op.
TEST(CudaDecodeActPack, EqualsNormThenActQuant) {
  TANDEM_REQUIRE_GPU();
  for (auto [rows, dim, ldx, in_place] : {std::tuple<int64_t, int64_t, int64_t, bool>{5, 4096, 4096, false},
                                          {3, 1024, 1100, false}, {7, 384, 384, true}, {2, 12288, 12288, false}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " dim " << dim << (in_place ? " in place" : ""));
    std::vector<float> x = act_rows(rows, ldx, 70 + dim);
    if (rows >= 3) x[1 * ldx + 7] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> w = randn(static_cast<size_t>(dim), 71, 0.5f, true);
    DeviceBuffer<float> dx = to_dev(x), dw = to_dev(w);
    // The two ops.
    auto yref = poisoned<float>(static_cast<size_t>(rows * dim));
    RmsNormParams np;
    np.x = dx.get();
    np.ldx = ldx;
    np.y = yref.get();
    np.weight = dw.get();
    np.rows = rows;
    np.dim = dim;
    np.round_bf16 = true;
    cuda::rms_norm(np, kStream);
    auto xq = poisoned<float>(static_cast<size_t>(rows * dim));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(xq.get(), yref.get(), xq.bytes(), cudaMemcpyDeviceToDevice, kStream));
    auto cref = poisoned<uint8_t>(static_cast<size_t>(rows * dim)), sref = poisoned<uint8_t>(static_cast<size_t>(rows * dim / 128));
    ActQuantFp8Params qp;
    qp.x = xq.get();
    qp.rows = rows;
    qp.cols = dim;
    qp.block = 128;
    qp.codes = cref.get();
    qp.scales = sref.get();
    cuda::act_quant_fp8(qp, kStream);
    const std::vector<float> want_y = to_host(yref);
    const std::vector<uint8_t> want_c = to_host(cref), want_s = to_host(sref);
    // The fused kernel.
    auto y = in_place ? DeviceBuffer<float>() : poisoned<float>(static_cast<size_t>(rows * dim));
    auto c = poisoned<uint8_t>(static_cast<size_t>(rows * dim)), s = poisoned<uint8_t>(static_cast<size_t>(rows * dim / 128));
    DecodeActPackArgs p;
    p.x = dx.get();
    p.ldx = ldx;
    p.rows = rows;
    p.dim = dim;
    p.norm_weight = dw.get();
    p.y = in_place ? dx.get() : y.get();
    p.ldy = in_place ? ldx : dim;
    p.codes = c.get();
    p.scales = s.get();
    cuda::decode_act_pack(p, kStream);
    std::vector<float> got_y;
    if (in_place) {
      const std::vector<float> all = to_host(dx);
      for (int64_t r = 0; r < rows; ++r) got_y.insert(got_y.end(), all.begin() + r * ldx, all.begin() + r * ldx + dim);
    } else {
      got_y = to_host(y);
    }
    EXPECT_TRUE(same_bits(got_y, want_y)) << "normed rows";
    EXPECT_TRUE(same_values(to_host(c), want_c)) << "codes";
    EXPECT_TRUE(same_values(to_host(s), want_s)) << "scales";
    // The CPU act_quant op on the same normed rows.
    const HostCodes hc = host_act_quant(want_y, rows, dim, dim);
    EXPECT_TRUE(same_values(to_host(c), hc.codes)) << "codes vs CPU";
    EXPECT_TRUE(same_values(to_host(s), hc.scales)) << "scales vs CPU";
  }
  // Quantization only (the MoE's SwiGLU rows), rows past 65535 CTAs are not needed here.
  const int64_t rows = 9, dim = 2048;
  std::vector<float> x = act_rows(rows, dim, 80);
  x[3 * dim + 5] = std::numeric_limits<float>::infinity();
  x[4 * dim + 9] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 128; ++i) x[5 * dim + 256 + i] = 1e-9f * (i + 1);  // below the amax floor
  DeviceBuffer<float> dx = to_dev(x);
  auto c = poisoned<uint8_t>(static_cast<size_t>(rows * dim)), s = poisoned<uint8_t>(static_cast<size_t>(rows * dim / 128));
  DecodeActPackArgs p;
  p.x = dx.get();
  p.rows = rows;
  p.dim = dim;
  p.codes = c.get();
  p.scales = s.get();
  cuda::decode_act_pack(p, kStream);
  const HostCodes hc = host_act_quant(x, rows, dim, dim);
  EXPECT_TRUE(same_values(to_host(c), hc.codes)) << "quantize only: codes";
  EXPECT_TRUE(same_values(to_host(s), hc.scales)) << "quantize only: scales";
}

// norm + pack, an FP8 GEMV on the codes and a bf16 GEMV on the normed rows, as PDL launches in a
// captured graph: replays equal the eager run bit for bit.
TEST(CudaDecodeGemm, GraphOfPdlLaunchesEqualsEager) {
  TANDEM_REQUIRE_GPU();
  const int64_t K = 2048, m = 6;
  HostMatrix w8 = random_matrix(WeightFormat::kFp8Block, 768, K, 91);
  HostMatrix wb = random_matrix(WeightFormat::kBf16, 256, K, 92);
  const std::vector<float> x = act_rows(m, K, 93), nw = randn(static_cast<size_t>(K), 94, 0.5f, true);
  DeviceBuffer<float> dx = to_dev(x), dnw = to_dev(nw), xn(static_cast<size_t>(m * K));
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(m * K)), scales(static_cast<size_t>(m * K / 128));
  DeviceBuffer<float> y8(static_cast<size_t>(m * 768)), yb(static_cast<size_t>(m * 256));
  cudaStream_t s = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto launch = [&] {
    DecodeActPackArgs p;
    p.x = dx.get();
    p.rows = m;
    p.dim = K;
    p.norm_weight = dnw.get();
    p.y = xn.get();
    p.codes = codes.get();
    p.scales = scales.get();
    cuda::decode_act_pack(p, s);
    DecodeGemmArgs a;
    a.x_codes = codes.get();
    a.x_scales = scales.get();
    a.ldx = K;
    a.m = m;
    a.k = K;
    a.num_segments = 1;
    a.seg[0].w = w8.dev();
    a.seg[0].y = y8.get();
    a.seg[0].round_bf16 = true;
    cuda::decode_gemm(a, s);
    DecodeGemmArgs b;
    b.x = xn.get();
    b.ldx = K;
    b.m = m;
    b.k = K;
    b.num_segments = 1;
    b.seg[0].w = wb.dev();
    b.seg[0].y = yb.get();
    cuda::decode_gemm(b, s);
  };
  auto fetch = [&](const DeviceBuffer<float>& d) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> h(d.size());
    TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
    return h;
  };
  launch();
  const std::vector<float> e8 = fetch(y8), eb = fetch(yb);
  cudaGraph_t g;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(y8.get(), 0xff, y8.bytes(), s));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(yb.get(), 0xff, yb.bytes(), s));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(codes.get(), 0xff, codes.bytes(), s));
  launch();
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 3; ++rep) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    EXPECT_TRUE(same_bits(fetch(y8), e8)) << "fp8 GEMV, replay " << rep;
    EXPECT_TRUE(same_bits(fetch(yb), eb)) << "bf16 GEMV, replay " << rep;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
