// Shared helpers of the decode-kernel tests (decode_gemm_test.cpp, moe_decode_test.cpp): random
// stored weights (FP8 128x128 blocks, MXFP4, bf16) on the host and the device, the FP8 activation
// operand (the CPU act_quant op's codes, scales and values), float64 references with the sum of
// |x_i w_i| that scales the error bound, and the bound checks:
//   |y - y64| <= factor * sum_i |x_i w_i|, factor = k/16 * 2^-19 + (k_split + 2) * 2^-24 (decode_gemm.h);
//   with a bf16 output, y must be round(y64) or, where y64 lies within that bound of a rounding
//   midpoint, its neighbour (bit_compare.h's correctly_rounded with an absolute slack).
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "common/numeric.h"
#include "cuda/cuda_test_util.h"
#include "kernels/bit_compare.h"
#include "kernels/cuda/decode_gemm.h"

namespace tandem::kernels::cuda_testing {

// Activation rows holding bf16 values with magnitudes spread over 2^-6..2^6 (so the 128-column
// blocks get different act_quant scales).
inline std::vector<float> act_rows(int64_t rows, int64_t ld, uint64_t seed) {
  std::vector<float> x = randn(static_cast<size_t>(rows * ld), seed, 1.0f, true);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const int e = static_cast<int>((r * 5 + c / 128 * 3) % 13) - 6;
      x[r * ld + c] = num::round_bf16(std::ldexp(x[r * ld + c], e));
    }
  return x;
}

struct HostMatrix {
  WeightFormat format = WeightFormat::kBf16;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> data, scale;
  DeviceBuffer<uint8_t> ddata, dscale;

  WeightRef host() const {
    WeightRef w = dev();
    w.data = data.data();
    w.scale = scale.empty() ? nullptr : scale.data();
    return w;
  }
  WeightRef dev() const {
    WeightRef w;
    w.format = format;
    w.data = ddata.get();
    w.scale = dscale.size() ? dscale.get() : nullptr;
    w.n = n;
    w.k = k;
    return w;
  }
  // Row r, dequantized exactly (every stored value times its power-of-two scale is an fp32 value).
  void row(int64_t r, std::vector<double>& out) const {
    out.resize(static_cast<size_t>(k));
    for (int64_t c = 0; c < k; ++c) {
      switch (format) {
        case WeightFormat::kBf16: {
          uint16_t h;
          std::memcpy(&h, &data[2 * (r * k + c)], 2);
          out[c] = num::bf16_to_f32(h);
          break;
        }
        case WeightFormat::kFp8Block:
          out[c] = static_cast<double>(num::e4m3_to_f32(data[r * k + c])) *
                   num::e8m0_to_f32(scale[(r / 128) * ((k + 127) / 128) + c / 128]);
          break;
        case WeightFormat::kMxfp4:
          out[c] = static_cast<double>(num::e2m1_to_f32(num::fp4_get(&data[r * (k / 2)], c))) *
                   num::e8m0_to_f32(scale[r * (k / 32) + c / 32]);
          break;
        default: {
          float f;
          std::memcpy(&f, &data[4 * (r * k + c)], 4);
          out[c] = f;
          break;
        }
      }
    }
  }
};

// Random stored weight: FP8 codes anywhere but the NaN codes, scales 2^-10..2^-5; MXFP4 any
// nibble, scales 2^-8..2^-3; bf16 uniform in [-0.05, 0.05).
inline HostMatrix random_matrix(WeightFormat f, int64_t n, int64_t k, uint64_t seed) {
  HostMatrix w;
  w.format = f;
  w.n = n;
  w.k = k;
  const size_t nk = static_cast<size_t>(n * k);
  switch (f) {
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
        if ((b & 0x7f) == 0x7f) b ^= 1;
        w.data[i] = b;
      }
      w.scale.resize(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)));
      for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(117 + mix64(seed + 5 * i) % 6);
      break;
    }
    case WeightFormat::kMxfp4: {
      w.data.resize(nk / 2);
      for (size_t i = 0; i < nk / 2; ++i) w.data[i] = static_cast<uint8_t>(mix64(seed * 131 + i));
      w.scale.resize(static_cast<size_t>(n * (k / 32)));
      for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = static_cast<uint8_t>(119 + mix64(seed + 7 * i) % 6);
      break;
    }
    default: break;
  }
  w.ddata = to_dev(w.data);
  if (!w.scale.empty()) w.dscale = to_dev(w.scale);
  return w;
}

// act_quant(x, 128) of [rows, ld] (columns [0, cols)) by the CPU op: codes, scales and values.
struct HostCodes {
  std::vector<uint8_t> codes, scales;  // [rows, cols], [rows, cols / 128]
  std::vector<float> values;           // [rows, cols] the quantized x
};
inline HostCodes host_act_quant(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld) {
  HostCodes h;
  h.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) h.values[r * cols + c] = x[r * ld + c];
  h.codes.resize(h.values.size());
  h.scales.resize(static_cast<size_t>(rows * (cols / 128)));
  ActQuantFp8Params q;
  q.x = h.values.data();
  q.rows = rows;
  q.cols = cols;
  q.block = 128;
  q.codes = h.codes.data();
  q.scales = h.scales.data();
  cpu_ops().act_quant_fp8(q);
  return h;
}

// y64[i][j] = sum_c x[i][col0 + c] * W[j][c] and the sum of |terms|, in float64.
struct Ref64 {
  int64_t m = 0, n = 0;
  std::vector<double> y, a;
};
// Weight rows [row0, row0 + nrows) (nrows < 0: all) as the matrix.
inline Ref64 reference(const float* x, int64_t ldx, int64_t col0, int64_t m, const HostMatrix& w, int64_t row0 = 0,
                       int64_t nrows = -1) {
  if (nrows < 0) nrows = w.n - row0;
  Ref64 r;
  r.m = m;
  r.n = nrows;
  r.y.assign(static_cast<size_t>(m * w.n), 0.0);
  r.a.assign(r.y.size(), 0.0);
#pragma omp parallel
  {
    std::vector<double> wr;
#pragma omp for schedule(static)
    for (int64_t j = 0; j < nrows; ++j) {
      w.row(row0 + j, wr);
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x + i * ldx + col0;
        double s = 0, a = 0;
        for (int64_t c = 0; c < w.k; ++c) {
          const double p = static_cast<double>(xi[c]) * wr[c];
          s += p;
          a += std::fabs(p);
        }
        r.y[i * nrows + j] = s;
        r.a[i * nrows + j] = a;
      }
    }
  }
  return r;
}

// Rows [i0, i0 + m) of a reference.
inline Ref64 ref_rows(const Ref64& r, int64_t i0, int64_t m) {
  Ref64 o;
  o.m = m;
  o.n = r.n;
  o.y.assign(r.y.begin() + i0 * r.n, r.y.begin() + (i0 + m) * r.n);
  o.a.assign(r.a.begin() + i0 * r.n, r.a.begin() + (i0 + m) * r.n);
  return o;
}

inline double decode_factor(int64_t k, int k_split) {
  return static_cast<double>(k) / 16.0 * std::ldexp(1.0, -19) + (k_split + 2) * std::ldexp(1.0, -24);
}

// got: [m, ldy] rows, columns [0, n) compared with ref (+ acc0 when accumulating into acc0).
inline ::testing::AssertionResult within_bound(const std::vector<float>& got, int64_t ldy, const Ref64& ref,
                                               double factor, bool bf16, const std::vector<float>* acc0 = nullptr) {
  const size_t cnt = static_cast<size_t>(ref.m * ref.n);
  std::vector<float> g(cnt);
  std::vector<double> want(cnt), slack(cnt);
  for (int64_t i = 0; i < ref.m; ++i)
    for (int64_t j = 0; j < ref.n; ++j) {
      const size_t e = static_cast<size_t>(i * ref.n + j);
      g[e] = got[i * ldy + j];
      const double base = acc0 ? (*acc0)[i * ldy + j] : 0.0;
      want[e] = ref.y[e] + base;
      // The accumulate add rounds once more in fp32.
      slack[e] = factor * ref.a[e] + (acc0 ? std::ldexp(std::fabs(want[e]) + factor * ref.a[e], -24) : 0.0);
    }
  if (bf16) return testing::correctly_rounded(g.data(), want.data(), cnt, testing::Stored::kBf16, 0.0, slack.data());
  size_t bad = 0, worst_i = 0;
  double worst = -1;
  for (size_t e = 0; e < cnt; ++e) {
    if (std::isnan(want[e]) || std::isnan(g[e])) {
      if (std::isnan(want[e]) != std::isnan(g[e]))
        return ::testing::AssertionFailure() << "NaN position mismatch at " << e << ": got " << g[e] << " want " << want[e];
      continue;
    }
    const double err = std::fabs(g[e] - want[e]);
    const double ratio = slack[e] > 0 ? err / slack[e] : (err > 0 ? 1e30 : 0);
    if (ratio > worst) {
      worst = ratio;
      worst_i = e;
    }
    if (err > slack[e]) ++bad;
  }
  std::ostringstream os;
  os << "worst element " << worst_i << " (row " << worst_i / ref.n << ", col " << worst_i % ref.n << "): got "
     << g[worst_i] << " want " << want[worst_i] << " bound " << slack[worst_i] << " (err/bound " << worst << ")";
  if (bad) return ::testing::AssertionFailure() << bad << " of " << cnt << " elements outside the bound; " << os.str();
  return ::testing::AssertionSuccess() << os.str();
}

}  // namespace tandem::kernels::cuda_testing
