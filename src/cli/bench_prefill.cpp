// `tandem bench-kernels --only prefill` (bench_prefill.h): each kernel at 4,096 rows (one prefill
// chunk) on device-generated random rows; bytes = what the kernel must read and write at least (its
// inputs once, its outputs once), floor_us = bytes at the measured copy bandwidth. The mHC rows: the
// mix, the finish and hc_post alone, and hc_pre_pack (mix + finish) as the layer half launches it.
#ifdef TANDEM_HAVE_CUDA_RUNNER
#include "cli/bench_prefill.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/cuda/hc_mix.h"
#include "kernels/cuda/random_fill.h"
#include "model/cuda/kv_record.h"
#include "model/cuda/norm_rope.h"

namespace tandem::bench_kernels {
namespace {

namespace kc = kernels::cuda;
using cuda_model::KvRecordKind;
using cuda_model::KvRecordLayout;
using cuda_model::NormRopeArgs;

constexpr int64_t kRows = 4096;  // tokens of one prefill chunk

struct Table {
  cudaStream_t s;
  double copy_bps;
  const TimeCalls& time_calls;
  nlohmann::json rows = nlohmann::json::array();

  void add(const std::string& name, double bytes, const std::function<void(int)>& call) {
    const double us = time_calls(s, call);
    const double floor_us = bytes / copy_bps * 1e6;
    std::printf("%-52s %9.1f %9.1f %6.1f%% %8.1f\n", name.c_str(), us, floor_us, 100.0 * floor_us / us, bytes / 1e6);
    std::fflush(stdout);
    rows.push_back({{"kernel", name}, {"rows", kRows}, {"us", us}, {"bytes", bytes}, {"floor_us", floor_us},
                    {"frac_of_copy", floor_us / us}});
  }
};

}  // namespace

nlohmann::json prefill_kernels(cudaStream_t s, double copy_bps, const TimeCalls& time_calls) {
  const int64_t T = kRows, H = 32, D = 512, IH = 32, ID = 128, hidden = 4096;
  const int rope_dim = 64;
  std::printf("\nprefill kernels at %lld rows (one chunk of one rank of TP=2)\n", static_cast<long long>(T));
  std::printf("%-52s %9s %9s %7s %8s\n", "kernel", "us", "floor us", "floor%", "MB");
  Table tab{s, copy_bps, time_calls};

  // ---- norm_rope: positions, YaRN-like frequencies, rows holding bf16 values.
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = 8192 + t;
  std::vector<float> inv(static_cast<size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i)
    inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dim));
  kc::DeviceBuffer<int64_t> dpos(pos.size());
  kc::DeviceBuffer<float> dinv(inv.size()), knorm(static_cast<size_t>(D));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dpos.get(), pos.data(), pos.size() * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dinv.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  kc::random_fill(knorm.get(), knorm.size(), kc::RandomFill::kF32Bf16, 31, s, 1.0f);
  kc::DeviceBuffer<float> q(static_cast<size_t>(T * H * D)), iq(static_cast<size_t>(T * IH * ID)),
      kv(static_cast<size_t>(T * D));
  kc::random_fill(q.get(), q.size(), kc::RandomFill::kF32Bf16, 32, s, 2.0f);
  kc::random_fill(iq.get(), iq.size(), kc::RandomFill::kF32Bf16, 33, s, 2.0f);
  kc::random_fill(kv.get(), kv.size(), kc::RandomFill::kF32Bf16, 34, s, 2.0f);
  const KvRecordLayout rec = KvRecordLayout::make(KvRecordKind::kFp8, static_cast<int>(D), rope_dim);
  kc::DeviceBuffer<uint8_t> records(static_cast<size_t>(T * rec.bytes));
  auto args = [&](bool qh, bool ih, bool keys, int rpb) {
    NormRopeArgs a;
    if (qh) {
      a.q = q.get();
      a.heads = H;
      a.q_dim = static_cast<int>(D);
    }
    if (ih) {
      a.iq = iq.get();
      a.iheads = IH;
      a.iq_dim = static_cast<int>(ID);
    }
    if (keys) {
      a.k = kv.get();
      a.k_dim = static_cast<int>(D);
      a.k_norm = knorm.get();
      a.rec = rec;
      a.records = records.get();
    }
    a.positions = dpos.get();
    a.inv_freq = dinv.get();
    a.rope_dim = rope_dim;
    a.tokens = T;
    a.rows_per_block = rpb;
    return a;
  };
  const double qb = 2.0 * T * H * D * 4, ib = 2.0 * T * IH * ID * 4, kb = 2.0 * T * D * 4 + T * rec.bytes;
  for (int rpb : {0, 1}) {
    const std::string tail = rpb == 0 ? " (prefill kernel)" : " (decode kernel)";
    tab.add("norm_rope q heads 32 x 512" + tail, qb,
            [&](int) { cuda_model::norm_rope(args(true, false, false, rpb), s); });
    tab.add("norm_rope indexer q heads 32 x 128" + tail, ib,
            [&](int) { cuda_model::norm_rope(args(false, true, false, rpb), s); });
  }
  tab.add("norm_rope key rows 512 + fp8 records", kb,
          [&](int) { cuda_model::norm_rope(args(false, false, true, 0), s); });
  tab.add("norm_rope CSA layer: q + indexer q + kv", qb + ib + kb,
          [&](int) { cuda_model::norm_rope(args(true, true, true, 0), s); });

  // ---- FP8 activation quantization (quant_kernel) and the bf16 copy (f32_to_bf16_rows).
  const int64_t K = hidden, sld = (T + 3) / 4 * 4;
  kc::DeviceBuffer<float> x(static_cast<size_t>(T * K)), scales(static_cast<size_t>(K / 128 * sld));
  kc::DeviceBuffer<uint8_t> codes(static_cast<size_t>(T * K));
  kc::DeviceBuffer<uint16_t> xb(static_cast<size_t>(T * K));
  kc::random_fill(x.get(), x.size(), kc::RandomFill::kF32Bf16, 35, s, 3.0f);
  for (int64_t k : {hidden, int64_t{1024}}) {
    const double bytes = T * k * 4.0 + T * k + T * (k / 128) * 4.0;
    tab.add("fp8 act quant " + std::to_string(T) + " x " + std::to_string(k), bytes,
            [&, k](int) {
              kc::Fp8QuantArgs a;
              a.x = x.get();
              a.rows = T;
              a.cols = k;
              a.codes = codes.get();
              a.scales = scales.get();
              a.scale_ld = sld;
              kc::quantize_fp8_act(a, s);
            });
  }
  tab.add("f32 -> bf16 rows " + std::to_string(T) + " x " + std::to_string(K), T * K * 6.0,
          [&](int) { kc::f32_to_bf16_rows(x.get(), K, T, K, xb.get(), K, s); });

  // ---- hc_pre_pack (the mix kernel and hc_pre_finish<true>): hc 4 x 4096 streams per token.
  const int hc = 4, nmix = (2 + hc) * hc;
  kc::DeviceBuffer<float> h(static_cast<size_t>(T * hc * hidden)), fn(static_cast<size_t>(nmix * hc * hidden));
  kc::DeviceBuffer<float> hscale(3), hbase(static_cast<size_t>(nmix)), nw(static_cast<size_t>(hidden));
  kc::DeviceBuffer<float> hx(static_cast<size_t>(T * hidden)), post(static_cast<size_t>(T * hc)),
      comb(static_cast<size_t>(T * hc * hc));
  kc::DeviceBuffer<uint8_t> pcodes(static_cast<size_t>(T * hidden)), pscales(static_cast<size_t>(T * hidden / 128));
  kc::random_fill(h.get(), h.size(), kc::RandomFill::kF32Bf16, 36, s, 1.0f);
  kc::random_fill(fn.get(), fn.size(), kc::RandomFill::kF32Bf16, 37, s, 0.02f);
  kc::random_fill(hscale.get(), hscale.size(), kc::RandomFill::kF32Bf16, 38, s, 0.5f);
  kc::random_fill(hbase.get(), hbase.size(), kc::RandomFill::kF32Bf16, 39, s, 0.5f);
  kc::random_fill(nw.get(), nw.size(), kc::RandomFill::kF32Bf16, 40, s, 1.0f);
  // hc_pre_pack as the layer half launches it (partials null: the mix, then the finish), or the
  // finish alone on partials the mix left.
  auto pre_pack = [&](const double* partials) {
    kernels::HcPreParams p;
    p.h = h.get();
    p.fn = fn.get();
    p.scale = hscale.get();
    p.base = hbase.get();
    p.tokens = T;
    p.hc = hc;
    p.dim = hidden;
    p.x = hx.get();
    p.post = post.get();
    p.comb = comb.get();
    kc::HcPrePackArgs pk;
    pk.norm_weight = nw.get();
    pk.codes = pcodes.get();
    pk.scales = pscales.get();
    pk.partials = partials;
    kc::hc_pre_pack(p, pk, s);
  };
  const double hbytes = T * hc * hidden * 4.0 + T * hidden * 4.0 + T * hidden + T * hidden / 128.0;
  tab.add("hc_pre_pack 4 x 4096 (mix + finish)", hbytes, [&](int) { pre_pack(nullptr); });
  // ---- The three mHC kernels of a layer half alone (issue 24). The mix: h once, fn per tile from
  // the L2, the partials written; its arithmetic, 24 fp32 dot products of 16,384 per token (1.6 G
  // FMAs) + the fp64 squares, is about 50 us of the device's FP32 lanes, under its bytes floor.
  const int ksplit = kc::hc_mix_ksplit(hc * hidden, nmix);
  const int64_t npart = T * (nmix + 1) * ksplit;
  kc::DeviceBuffer<double> part(static_cast<size_t>(npart));
  tab.add("hc mix partials 4 x 4096 (kAuto)", T * hc * hidden * 4.0 + nmix * hc * hidden * 4.0 + npart * 8.0,
          [&](int) { kc::hc_mix_partials(h.get(), fn.get(), T, nmix, hc * hidden, ksplit, part.get(), s); });
  // The finish (hc_pre_finish<true>) on those partials: h once, x, codes, scales, post and comb written.
  tab.add("hc_pre_pack finish 4 x 4096 (partials given)",
          T * hc * hidden * 4.0 + npart * 8.0 + T * hidden * 4.0 + T * hidden + T * hidden / 128.0 +
              T * (hc + hc * hc) * 4.0,
          [&](int) { pre_pack(part.get()); });
  // hc_post (hc_post_vec_kernel<4>): the residual streams and f read, the new streams written; the
  // attention half loads bf16(f), the MoE half bf16(f + shared) (f_add: one more row read).
  kc::DeviceBuffer<float> hout(h.size()), fadd(static_cast<size_t>(T * hidden));
  kc::random_fill(fadd.get(), fadd.size(), kc::RandomFill::kF32Bf16, 41, s, 1.0f);
  for (bool moe : {false, true}) {
    tab.add(std::string("hc_post 4 x 4096 (") + (moe ? "f + f_add: the MoE half)" : "f: the attention half)"),
            2 * T * hc * hidden * 4.0 + (moe ? 2 : 1) * T * hidden * 4.0, [&](int) {
              kernels::HcPostParams p;
              p.f = hx.get();
              p.f_add = moe ? fadd.get() : nullptr;
              p.f_round = true;
              p.res = h.get();
              p.post = post.get();
              p.comb = comb.get();
              p.out = hout.get();
              p.tokens = T;
              p.hc = hc;
              p.dim = hidden;
              kc::hc_post(p, s);
            });
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  return tab.rows;
}

}  // namespace tandem::bench_kernels
#endif
