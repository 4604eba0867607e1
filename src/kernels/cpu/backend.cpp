// The CPU backend object (Ops implemented by the cpu:: free functions), thread-count control and
// WeightRef helpers.
#include <omp.h>

#include <atomic>

#include "common/check.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels {

WeightRef WeightRef::rows(int64_t row0, int64_t count) const {
  TANDEM_CHECK(row0 >= 0 && count >= 0 && row0 + count <= n);
  WeightRef r = *this;
  r.n = count;
  switch (format) {
    case WeightFormat::kF32:
      r.data = static_cast<const float*>(data) + row0 * k;
      break;
    case WeightFormat::kBf16:
      r.data = static_cast<const uint16_t*>(data) + row0 * k;
      break;
    case WeightFormat::kFp8Block: {
      TANDEM_CHECK(row0 % kFp8WeightBlock == 0);
      const int64_t sld = scale_ld > 0 ? scale_ld : (k + kFp8WeightBlock - 1) / kFp8WeightBlock;
      r.data = static_cast<const uint8_t*>(data) + row0 * k;
      r.scale = scale + (row0 / kFp8WeightBlock) * sld;
      r.scale_ld = sld;
      break;
    }
    case WeightFormat::kMxfp4:
      r.data = static_cast<const uint8_t*>(data) + row0 * (k / 2);
      r.scale = scale + row0 * (k / kMxfp4WeightGroup);
      break;
  }
  return r;
}

size_t WeightRef::bytes() const {
  switch (format) {
    case WeightFormat::kF32: return static_cast<size_t>(n * k * 4);
    case WeightFormat::kBf16: return static_cast<size_t>(n * k * 2);
    case WeightFormat::kFp8Block:
      return static_cast<size_t>(n * k + ((n + 127) / 128) * ((k + 127) / 128));
    case WeightFormat::kMxfp4: return static_cast<size_t>(n * k / 2 + n * (k / 32));
  }
  return 0;
}

namespace cpu {
namespace {
std::atomic<int> g_threads{0};
}
void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0); }
int configured_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}
int num_threads() { return configured_threads(); }
}  // namespace cpu

namespace {
class CpuOps final : public Ops {
 public:
  const char* name() const override { return "cpu"; }
  void act_quant_fp8(const ActQuantFp8Params& p) override { cpu::act_quant_fp8(p); }
  void fp4_act_quant(const Fp4ActQuantParams& p) override { cpu::fp4_act_quant(p); }
  void round_bf16(const RoundBf16Params& p) override { cpu::round_bf16(p); }
  void gemm(const GemmParams& p) override { cpu::gemm(p); }
  void rms_norm(const RmsNormParams& p) override { cpu::rms_norm(p); }
  void rope(const RopeParams& p) override { cpu::rope(p); }
  void hadamard(const HadamardParams& p) override { cpu::hadamard(p); }
  void compress_pool(const CompressPoolParams& p) override { cpu::compress_pool(p); }
  void indexer_score(const IndexerScoreParams& p) override { cpu::indexer_score(p); }
  void topk(const TopkParams& p) override { cpu::topk(p); }
  void sparse_attn(const SparseAttnParams& p) override { cpu::sparse_attn(p); }
  void hc_pre(const HcPreParams& p) override { cpu::hc_pre(p); }
  void hc_post(const HcPostParams& p) override { cpu::hc_post(p); }
  void hc_head(const HcHeadParams& p) override { cpu::hc_head(p); }
  void moe_gate(const MoeGateParams& p) override { cpu::moe_gate(p); }
  void moe_group(const MoeGroupParams& p) override { cpu::moe_group(p); }
  void swiglu(const SwigluParams& p) override { cpu::swiglu(p); }
  void rows_copy(const RowsCopyParams& p) override { cpu::rows_copy(p); }
  void softmax(const SoftmaxParams& p) override { cpu::softmax(p); }
  void argmax(const ArgmaxParams& p) override { cpu::argmax(p); }
};
}  // namespace

Ops& cpu_ops() {
  static CpuOps ops;
  return ops;
}

}  // namespace tandem::kernels
