// CudaOps: kernels::Ops over the per-op CUDA launchers. Validation is the CPU backend's (shapes and
// pointers are programmer invariants), then the launcher runs on the backend stream.
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels::cuda {

namespace {
cudaStream_t g_stream = nullptr;

class CudaOps final : public Ops {
 public:
  const char* name() const override { return "cuda"; }
#define TANDEM_CUDA_OP(op, P)           \
  void op(const P& p) override {        \
    validate(p);                        \
    ::tandem::kernels::cuda::op(p, g_stream); \
  }
  TANDEM_CUDA_OP(act_quant_fp8, ActQuantFp8Params)
  TANDEM_CUDA_OP(fp4_act_quant, Fp4ActQuantParams)
  TANDEM_CUDA_OP(round_bf16, RoundBf16Params)
  TANDEM_CUDA_OP(gemm, GemmParams)
  TANDEM_CUDA_OP(rms_norm, RmsNormParams)
  TANDEM_CUDA_OP(rope, RopeParams)
  TANDEM_CUDA_OP(hadamard, HadamardParams)
  TANDEM_CUDA_OP(compress_pool, CompressPoolParams)
  TANDEM_CUDA_OP(indexer_score, IndexerScoreParams)
  TANDEM_CUDA_OP(topk, TopkParams)
  TANDEM_CUDA_OP(sparse_attn, SparseAttnParams)
  TANDEM_CUDA_OP(hc_pre, HcPreParams)
  TANDEM_CUDA_OP(hc_post, HcPostParams)
  TANDEM_CUDA_OP(hc_head, HcHeadParams)
  TANDEM_CUDA_OP(moe_gate, MoeGateParams)
  TANDEM_CUDA_OP(moe_group, MoeGroupParams)
  TANDEM_CUDA_OP(swiglu, SwigluParams)
  TANDEM_CUDA_OP(rows_copy, RowsCopyParams)
  TANDEM_CUDA_OP(softmax, SoftmaxParams)
  TANDEM_CUDA_OP(argmax, ArgmaxParams)
#undef TANDEM_CUDA_OP
};
}  // namespace

Ops& cuda_ops() {
  static CudaOps ops;
  return ops;
}
void set_stream(cudaStream_t s) { g_stream = s; }
cudaStream_t stream() { return g_stream; }

}  // namespace tandem::kernels::cuda
