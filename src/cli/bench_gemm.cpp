// `tandem bench-gemm`: the prefill GEMMs at DeepSeek-V4-Flash's per-rank shapes under tensor
// parallelism over 2 ranks, on the tensor cores: our block-scaled FP8 and bf16 kernels on every back
// end the device runs (sm_90: the warp-specialized TMA kernels the forward uses, and the portable
// loop on wgmma and mma.sync) against cuBLASLt's block-scaled FP8 and bf16, and the grouped MXFP4
// expert GEMMs for --expert-tokens tokens routed 6 per token over 256 experts (this rank: 128) with
// a trained router's uneven load. TF/s and the fraction of the device's dense FP8 peak, measured in
// the same run by a large cuBLASLt FP8 GEMM with scalar scales. Random data (never zeros),
// device-event medians after warm-up. A table, and JSON to --out.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/build_info.h"
#include "common/log.h"
#include "common/numeric.h"
#include "common/status.h"
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/gemm_tc.h"
#include "model/cuda/moe_prefill.h"
#endif

namespace tandem {
namespace {

#ifdef TANDEM_HAVE_CUDA_RUNNER
namespace kc = kernels::cuda;
template <typename T>
using Buf = kc::DeviceBuffer<T>;

struct Args {
  std::string out, tokens = "128,1024,8192";
  int reps = 10;
  int expert_tokens = 8192;
};

std::string today_utc() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return date;
}

// Fast random bytes (xorshift64*), e4m3 codes never NaN when `fp8`.
void fill_random(std::vector<uint8_t>& v, uint64_t seed, bool fp8) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    uint64_t r = s * 0x2545f4914f6cdd1dull;
    for (int j = 0; j < 8; ++j, r >>= 8) {
      uint8_t c = static_cast<uint8_t>(r);
      if (fp8 && (c & 0x7f) == 0x7f) c ^= 1;
      v[i + j] = c;
    }
  }
  for (; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
}
template <typename T>
void upload(Buf<T>& d, const std::vector<T>& h) {
  TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Median device time of `f` (ms) over reps after two warm-up runs.
double time_ms(cudaStream_t s, int reps, const std::function<void()>& f) {
  cudaEvent_t e0, e1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
  f();
  f();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    TANDEM_CUDA_CHECK(cudaEventRecord(e0, s));
    f();
    TANDEM_CUDA_CHECK(cudaEventRecord(e1, s));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Our kernels' back ends on this device, the forward's (kAuto) first: sm_90 wgmma-ws, wgmma,
// mma.sync; elsewhere mma.sync.
std::vector<kc::TcBackend> our_backends() {
  std::vector<kc::TcBackend> b{kc::tc_backend_for_device()};
  if (kc::tc_device_has_wgmma())
    for (kc::TcBackend x : {kc::TcBackend::kWgmma, kc::TcBackend::kMmaSync})
      if (x != b.front()) b.push_back(x);
  return b;
}

struct Shape {
  const char* name;
  int64_t n, k, batch;  // per batch: W [n, k]
  bool fp8;             // FP8 block weight with act quant; else bf16 weight (cuBLASLt)
};

Status bench(const Args& a) {
  std::vector<int64_t> tokens;
  {
    std::stringstream ss(a.tokens);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      char* end = nullptr;
      const long v = std::strtol(tok.c_str(), &end, 10);
      if (!end || *end || v < 1 || v > 65536) return invalid_argument("--tokens: '{}' is not in [1, 65536]", tok);
      tokens.push_back(v);
    }
  }
  if (tokens.empty()) return invalid_argument("--tokens is empty");
  if (a.reps < 1) return invalid_argument("--reps must be >= 1");
  if (a.expert_tokens < 0 || a.expert_tokens > 32768) return invalid_argument("--expert-tokens must be in [0, 32768]");
  if (kc::device_count() == 0) return make_error(StatusCode::kFailedPrecondition, "no CUDA device visible");
  if (!kc::binary_supports_device(0))
    return make_error(StatusCode::kFailedPrecondition, "this build has no kernels for {}", kc::device_description(0));
  cudaStream_t st;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  kc::tc_init();
  const kc::TcBackend be = kc::tc_backend_for_device();
  TANDEM_ASSIGN_OR_RETURN(auto lt, kc::LtGemm::create(size_t{64} << 20));

  nlohmann::json j;
  j["date"] = today_utc();
  const char* commit = std::getenv("TANDEM_COMMIT");
  j["commit"] = commit ? std::string(commit) : build_info().commit + (build_info().commit_dirty ? "-dirty" : "");
  j["gpu"] = kc::device_description(0);
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  j["cuda_driver"] = drv;
  j["cuda_runtime"] = rt;
  j["tc_backend"] = kc::tc_backend_name(be);
  j["reps"] = a.reps;
  j["rows"] = nlohmann::json::array();

  // ---- buffers for the largest dense problem
  const int64_t max_m = std::max<int64_t>(*std::max_element(tokens.begin(), tokens.end()), 8192);
  const std::vector<Shape> shapes = {
      {"wq_a", 1024, 4096, 1, true},     {"wkv", 512, 4096, 1, true},        {"wq_b", 16384, 1024, 1, true},
      {"idx_wq_b", 4096, 1024, 1, true}, {"wo_b", 4096, 4096, 1, true},      {"shared_w1", 2048, 4096, 1, true},
      {"shared_w2", 4096, 2048, 1, true}, {"wo_a", 1024, 4096, 4, false},    {"comp_wkv", 1024, 4096, 1, false},
      {"gate", 256, 4096, 1, false},
  };
  int64_t max_x = max_m * 8192, max_w = 0, max_y = max_m * 8192;
  for (const Shape& s : shapes) {
    max_x = std::max(max_x, max_m * s.k * s.batch);
    max_w = std::max(max_w, s.n * s.k * s.batch);
    max_y = std::max(max_y, max_m * s.n * s.batch);
  }
  max_w = std::max<int64_t>(max_w, 8192 * 8192);
  std::vector<uint8_t> h(static_cast<size_t>(std::max(max_x, max_w) * 2));
  Buf<uint8_t> xbuf(static_cast<size_t>(max_x * 2)), wbuf(static_cast<size_t>(max_w * 2));
  fill_random(h, 1, true);
  TANDEM_CUDA_CHECK(cudaMemcpy(xbuf.get(), h.data(), xbuf.bytes(), cudaMemcpyHostToDevice));
  fill_random(h, 2, true);
  TANDEM_CUDA_CHECK(cudaMemcpy(wbuf.get(), h.data(), wbuf.bytes(), cudaMemcpyHostToDevice));
  // bf16 views of the same bytes must not hold NaN/inf: clear the top exponent bit of every bf16.
  std::vector<uint8_t> hb(static_cast<size_t>(std::max(max_x, max_w) * 2));
  fill_random(hb, 3, false);
  for (size_t i = 1; i < hb.size(); i += 2) hb[i] &= 0xbf;  // |value| < 2
  Buf<uint8_t> xb16(static_cast<size_t>(max_x * 2)), wb16(static_cast<size_t>(max_w * 2));
  TANDEM_CUDA_CHECK(cudaMemcpy(xb16.get(), hb.data(), xb16.bytes(), cudaMemcpyHostToDevice));
  TANDEM_CUDA_CHECK(cudaMemcpy(wb16.get(), hb.data() + 8, wb16.bytes() - 8, cudaMemcpyHostToDevice));
  Buf<float> ybuf(static_cast<size_t>(max_y));
  Buf<float> xf(static_cast<size_t>(max_x));  // fp32 activations (bf16 values) for quantization / conversion
  {
    std::vector<float> hx(xf.size());
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>(static_cast<int8_t>(h[i] | 1)) / 64.0f;
    upload(xf, hx);
  }
  Buf<float> xscale(static_cast<size_t>((8192 / 128) * ((max_m + 3) / 4 * 4)));
  {
    std::vector<float> hs(xscale.size());
    for (size_t i = 0; i < hs.size(); ++i) hs[i] = std::ldexp(1.0f, static_cast<int>(i % 7) - 10);
    upload(xscale, hs);
  }
  Buf<uint8_t> wscale(static_cast<size_t>(8192 / 128 * 128 + 4096));
  Buf<float> wscale_f(wscale.size());
  {
    std::vector<uint8_t> hs(wscale.size());
    for (size_t i = 0; i < hs.size(); ++i) hs[i] = static_cast<uint8_t>(118 + i % 6);
    upload(wscale, hs);
    kc::e8m0_grid_to_f32(wscale.get(), 1, 1, static_cast<int64_t>(hs.size()), wscale_f.get(), 1, st);
  }

  // ---- the device's dense FP8 peak (scalar scales) and bf16, 8192^3
  std::printf("%-10s %-14s %6s %6s %6s %3s %10s %9s %7s\n", "gemm", "path", "m", "n", "k", "b", "us", "TF/s", "%peak");
  double peak = 0;
  auto add_row = [&](const char* name, const std::string& path, int64_t m, int64_t n, int64_t k, int64_t b,
                     double ms) {
    const double tf = 2.0 * m * n * k * b / (ms * 1e-3) / 1e12;
    std::printf("%-10s %-14s %6lld %6lld %6lld %3lld %10.1f %9.1f %6.1f%%\n", name, path.c_str(),
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(b), ms * 1e3, tf, peak > 0 ? 100.0 * tf / peak : 0.0);
    j["rows"].push_back({{"gemm", name}, {"path", path}, {"m", m}, {"n", n}, {"k", k}, {"batch", b}, {"us", ms * 1e3},
                         {"tflops", tf}, {"fraction_of_fp8_peak", peak > 0 ? tf / peak : 0.0}});
    return tf;
  };
  {
    const int64_t P = 8192;
    double best = 0;
    for (bool bf16_out : {true, false}) {
      kc::LtShape sh;
      sh.kind = kc::LtKind::kFp8Scalar;
      sh.n = P;
      sh.k = P;
      sh.ldx = P;
      sh.ldy = P;
      sh.bf16_out = bf16_out;
      if (!lt->prepare(sh, P, P, false).ok()) continue;
      if (!lt->run(sh, P, wbuf.get(), xbuf.get(), ybuf.get(), nullptr, nullptr, st).ok()) continue;
      const double ms = time_ms(st, a.reps, [&] {
        (void)lt->run(sh, P, wbuf.get(), xbuf.get(), ybuf.get(), nullptr, nullptr, st);
      });
      const double tf = add_row("peak", bf16_out ? "lt-fp8-scalar-bf16out" : "lt-fp8-scalar-f32out", P, P, P, 1, ms);
      best = std::max(best, tf);
    }
    peak = best;
    j["fp8_peak_tflops"] = peak;
    kc::LtShape sh;
    sh.kind = kc::LtKind::kBf16;
    sh.n = P;
    sh.k = P;
    sh.ldx = P;
    sh.ldy = P;
    if (lt->prepare(sh, P, P, false).ok() &&
        lt->run(sh, P, wb16.get(), xb16.get(), ybuf.get(), nullptr, nullptr, st).ok()) {
      const double ms = time_ms(st, a.reps, [&] {
        (void)lt->run(sh, P, wb16.get(), xb16.get(), ybuf.get(), nullptr, nullptr, st);
      });
      j["bf16_peak_tflops"] = add_row("peak", "lt-bf16", P, P, P, 1, ms);
    }
    if (peak <= 0) std::printf("(no cuBLASLt FP8 on this device: fractions of peak are not printed)\n");
  }

  // ---- per-rank prefill shapes (cuBLASLt planned once per shape for the whole --tokens range)
  const int64_t m_lo = *std::min_element(tokens.begin(), tokens.end());
  const int64_t m_hi = *std::max_element(tokens.begin(), tokens.end());
  for (const Shape& s : shapes) {
    kc::LtShape lsh;
    lsh.n = s.n;
    lsh.k = s.k;
    if (s.fp8) {
      lsh.kind = kc::LtKind::kFp8Block;
      lsh.ldx = s.k;
      lsh.ldy = s.n;
    } else {
      lsh.kind = kc::LtKind::kBf16;
      lsh.ldx = s.k * s.batch;
      lsh.ldy = s.n * s.batch;
      lsh.batch = s.batch;
      lsh.w_batch_rows = s.n;
      lsh.x_batch_stride = s.k;
      lsh.y_batch_stride = s.n;
    }
    const Status lst = lt->prepare(lsh, m_hi, m_lo, false);  // cuBLASLt at its best per size
    if (!lst.ok()) std::printf("%-10s cuBLASLt: %s\n", s.name, lst.to_string().c_str());
    for (int64_t m : tokens) {
      if (s.fp8) {
        kc::Fp8GemmArgs g;
        g.a = xbuf.get();
        g.a_scale = xscale.get();
        g.a_scale_ld = (m + 3) / 4 * 4;
        g.w = wbuf.get();
        g.w_scale = wscale.get();
        g.y = ybuf.get();
        g.m = m;
        g.n = s.n;
        g.k = s.k;
        g.round_bf16 = true;
        std::vector<kc::TcBackend> bes = our_backends();
        if (kc::tc_device_has_wgmma()) bes.push_back(kc::TcBackend::kWgmmaOverlap);
        for (kc::TcBackend b : bes) {
          const double ms = time_ms(st, a.reps, [&] { kc::fp8_gemm_tc(g, b, st); });
          add_row(s.name, std::string("tc-") + kc::tc_backend_name(b), m, s.n, s.k, 1, ms);
        }
        if (lt->ready(lsh, m)) {
          const Status rs = lt->run(lsh, m, wbuf.get(), xbuf.get(), ybuf.get(), wscale_f.get(), xscale.get(), st);
          if (!rs.ok()) {
            std::printf("%-10s cuBLASLt at %lld rows: %s\n", s.name, static_cast<long long>(m), rs.to_string().c_str());
          } else {
            const double ms = time_ms(st, a.reps, [&] {
              (void)lt->run(lsh, m, wbuf.get(), xbuf.get(), ybuf.get(), wscale_f.get(), xscale.get(), st);
            });
            add_row(s.name, "lt-fp8-block", m, s.n, s.k, 1, ms);
          }
        }
        // The activation quantization feeding the GEMM (memory-bound: reported as time only).
        kc::Fp8QuantArgs q;
        q.x = xf.get();
        q.rows = m;
        q.cols = s.k;
        q.codes = xbuf.get();
        q.scales = xscale.get();
        q.scale_ld = (m + 3) / 4 * 4;
        const double qms = time_ms(st, a.reps, [&] { kc::quantize_fp8_act(q, st); });
        std::printf("%-10s %-14s %6lld %6s %6lld %3s %10.1f  (%.0f GB/s)\n", s.name, "quant-x", static_cast<long long>(m),
                    "", static_cast<long long>(s.k), "", qms * 1e3, m * s.k * 5.0 / (qms * 1e-3) / 1e9);
        j["rows"].push_back({{"gemm", s.name}, {"path", "quant-x"}, {"m", m}, {"k", s.k}, {"us", qms * 1e3}});
        // (The first m*k codes and their scales are now real quantized activations: as good as random.)
      } else {
        // Ours (the forward's bf16 path) on each back end, then cuBLASLt's bf16.
        kc::Bf16GemmArgs g;
        g.x = reinterpret_cast<const uint16_t*>(xb16.get());
        g.ldx = s.k * s.batch;
        g.w = reinterpret_cast<const uint16_t*>(wb16.get());
        g.y = ybuf.get();
        g.ldy = s.n * s.batch;
        g.m = m;
        g.n = s.n;
        g.k = s.k;
        g.batch = s.batch;
        g.x_batch_stride = s.k;
        g.w_batch_rows = s.n;
        g.y_batch_stride = s.n;
        g.round_bf16 = true;
        if (const char* why = kc::bf16_gemm_problem(g)) {
          std::printf("%-10s ours: %s\n", s.name, why);
        } else {
          for (kc::TcBackend b : our_backends()) {
            const double ms = time_ms(st, a.reps, [&] { kc::bf16_gemm_tc(g, b, st); });
            add_row(s.name, std::string("tc-bf16-") + kc::tc_backend_name(b), m, s.n, s.k, s.batch, ms);
          }
        }
        if (lt->ready(lsh, m) && lt->run(lsh, m, wb16.get(), xb16.get(), ybuf.get(), nullptr, nullptr, st).ok()) {
          const double ms = time_ms(st, a.reps, [&] {
            (void)lt->run(lsh, m, wb16.get(), xb16.get(), ybuf.get(), nullptr, nullptr, st);
          });
          add_row(s.name, "lt-bf16", m, s.n, s.k, s.batch, ms);
        }
        const double cms = time_ms(st, a.reps, [&] {
          kc::f32_to_bf16_rows(xf.get(), s.k * s.batch, m, s.k * s.batch, reinterpret_cast<uint16_t*>(xb16.get()),
                               s.k * s.batch, st);
        });
        std::printf("%-10s %-14s %6lld %6s %6lld %3s %10.1f\n", s.name, "f32->bf16", static_cast<long long>(m), "",
                    static_cast<long long>(s.k * s.batch), "", cms * 1e3);
        j["rows"].push_back({{"gemm", s.name}, {"path", "f32->bf16"}, {"m", m}, {"k", s.k * s.batch}, {"us", cms * 1e3}});
      }
    }
  }
  xbuf.release();
  wbuf.release();
  xb16.release();
  wb16.release();

  // ---- grouped MXFP4 experts: T tokens x 6, 256 experts with uneven popularity, this rank 128
  if (a.expert_tokens > 0) {
    const int64_t T = a.expert_tokens, D = 4096, I = 2048;
    const int topk = 6, E = 256, n_local = 128;
    std::mt19937_64 rng(11);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> pop(E);
    for (auto& p : pop) p = std::exp(0.7 * nd(rng));  // log-normal load, as trained routers show
    std::vector<int32_t> eids(static_cast<size_t>(T * topk));
    std::vector<float> ew(eids.size());
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> w = pop;
      for (int j2 = 0; j2 < topk; ++j2) {
        double total = 0;
        for (double v : w) total += v;
        double r = ud(rng) * total;
        int e = 0;
        while (e < E - 1 && (r -= w[e]) > 0) ++e;
        if (w[e] == 0) e = static_cast<int>(std::find_if(w.begin(), w.end(), [](double v) { return v > 0; }) - w.begin());
        w[e] = 0;
        eids[t * topk + j2] = e;
        ew[t * topk + j2] = static_cast<float>(0.2 + 0.3 * ud(rng));
      }
    }
    std::vector<int> load(E, 0);
    for (int32_t e : eids) ++load[e];
    const auto [mn, mx] = std::minmax_element(load.begin(), load.begin() + n_local);
    Buf<int32_t> deids(eids.size());
    Buf<float> dew(ew.size()), dx(static_cast<size_t>(T * D)), pair_out(static_cast<size_t>(T * topk * D));
    upload(deids, eids);
    upload(dew, ew);
    {
      std::vector<float> hx(dx.size());
      for (auto& v : hx) v = num::round_bf16(static_cast<float>(nd(rng)));
      upload(dx, hx);
    }
    auto make = [&](int64_t rows, int64_t k, uint64_t seed, Buf<uint8_t>& data, Buf<uint8_t>& scale) {
      std::vector<uint8_t> hd(static_cast<size_t>(rows * k / 2)), hs(static_cast<size_t>(rows * k / 32));
      fill_random(hd, seed, false);
      fill_random(hs, seed + 1, false);
      for (auto& v : hs) v = static_cast<uint8_t>(118 + v % 6);
      data.reset(hd.size());
      scale.reset(hs.size());
      upload(data, hd);
      upload(scale, hs);
      kernels::WeightRef r;
      r.format = kernels::WeightFormat::kMxfp4;
      r.data = data.get();
      r.scale = scale.get();
      r.n = rows;
      r.k = k;
      return r;
    };
    Buf<uint8_t> d1, s1, d3, s3, d2, s2;
    cuda_model::MoePrefillArgs ma;
    ma.w1 = make(n_local * I, D, 21, d1, s1);
    ma.w3 = make(n_local * I, D, 23, d3, s3);
    ma.w2 = make(n_local * D, I, 25, d2, s2);
    ma.x = dx.get();
    ma.expert_ids = deids.get();
    ma.weights = dew.get();
    ma.tokens = T;
    ma.topk = topk;
    ma.expert_begin = 0;
    ma.n_local = n_local;
    ma.dim = D;
    ma.inter = I;
    ma.limit = 10.0f;
    ma.pair_out = pair_out.get();
    Buf<uint8_t> scratch(cuda_model::moe_prefill_scratch_bytes(T, topk, n_local, D, I));
    const auto ms_ = cuda_model::moe_prefill_scratch(scratch.get(), T, topk, n_local, D, I);
    cuda_model::moe_prefill(ma, ms_, be, st);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(st));
    int32_t local = 0;
    TANDEM_CUDA_CHECK(cudaMemcpy(&local, ms_.offsets + n_local, sizeof local, cudaMemcpyDeviceToHost));
    std::printf("experts: %lld tokens x %d over %d experts, this rank %d: %d local pairs, %d..%d per expert\n",
                static_cast<long long>(T), topk, E, n_local, local, *mn, *mx);
    const std::vector<kc::TcBackend> bes = our_backends();
    nlohmann::json ex = {{"tokens", T}, {"topk", topk}, {"experts", E}, {"local_experts", n_local},
                         {"local_pairs", local}, {"min_pairs_per_expert", *mn}, {"max_pairs_per_expert", *mx}};
    ex["paths"] = nlohmann::json::array();
    const double route_ms = time_ms(st, a.reps, [&] { cuda_model::moe_prefill_route(ma, ms_, st); });
    for (kc::TcBackend b : bes) {
      const double up_ms = time_ms(st, a.reps, [&] { cuda_model::moe_prefill_up(ma, ms_, b, st); });
      const double down_ms = time_ms(st, a.reps, [&] { cuda_model::moe_prefill_down(ma, ms_, b, st); });
      const std::string path = std::string("tc-") + kc::tc_backend_name(b);
      const double up_tf = add_row("experts_up", path, local, 2 * I, D, 1, up_ms);
      const double down_tf = add_row("experts_dn", path, local, D, I, 1, down_ms);
      const double all = route_ms + up_ms + down_ms;
      const double tf = 2.0 * local * 3.0 * I * D / (all * 1e-3) / 1e12;
      std::printf("%-10s %-14s routing %.1f us, up %.1f us, down %.1f us: %.1f TF/s end to end (%.1f%% of peak)\n",
                  "experts", path.c_str(), route_ms * 1e3, up_ms * 1e3, down_ms * 1e3, tf,
                  peak > 0 ? 100 * tf / peak : 0.0);
      ex["paths"].push_back({{"path", path}, {"route_us", route_ms * 1e3}, {"up_us", up_ms * 1e3},
                             {"down_us", down_ms * 1e3}, {"up_tflops", up_tf}, {"down_tflops", down_tf},
                             {"end_to_end_tflops", tf}, {"fraction_of_fp8_peak", peak > 0 ? tf / peak : 0.0}});
    }
    j["experts"] = ex;
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(st));
  const std::string path = a.out.empty() ? "bench/results/bench-gemm-" + today_utc() + ".json" : a.out;
  std::ofstream f(path);
  if (!f) return make_error(StatusCode::kInvalidArgument, "--out: cannot write {}", path);
  f << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return Status();
}
#endif

int bench_gemm_main(int argc, char** argv) {
  CLI::App app{"Prefill GEMMs on the tensor cores at DeepSeek-V4-Flash's TP=2 shapes: TF/s and % of FP8 peak."};
#ifdef TANDEM_HAVE_CUDA_RUNNER
  Args a;
  app.add_option("--out", a.out, "JSON output path (default bench/results/bench-gemm-<date>.json)");
  app.add_option("--tokens", a.tokens, "comma-separated row counts (default 128,1024,8192)");
  app.add_option("--reps", a.reps, "timed repetitions per case (default 10)");
  app.add_option("--expert-tokens", a.expert_tokens, "tokens routed through the grouped experts (default 8192; 0 = skip)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  set_log_level(LogLevel::kWarn);
  Status st = bench(a);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem bench-gemm: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
#else
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::fprintf(stderr, "tandem bench-gemm: this build has no CUDA runner (no CUDA toolkit at build time)\n");
  return 1;
#endif
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(bench_gemm, "bench-gemm", "prefill GEMMs on the tensor cores (TF/s, % of FP8 peak)",
                        tandem::bench_gemm_main);
