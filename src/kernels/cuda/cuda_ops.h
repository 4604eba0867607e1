// The CUDA launchers of the generic ops (src/kernels/ops.h): the same parameter structs with device
// pointers, each op in its own file under src/kernels/cuda/, tested against the CPU reference op
// on random inputs (tests/cuda/). Every launcher validates its params (ops.h's validate(), the
// same checks as the CPU op), launches asynchronously on the stream it is given and neither
// allocates (beyond the warm-up growth of cuda_util.h's op scratch) nor synchronizes.
// There is no process-wide stream and no CUDA implementation of kernels::Ops: that interface is
// the CPU oracle's (the CPU model is written against it); device code (the CUDA model, the tests)
// calls these launchers with its own stream.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/ops.h"

namespace tandem::kernels::cuda {

// One launcher per op (pointers are device pointers).
void act_quant_fp8(const ActQuantFp8Params& p, cudaStream_t s);
void fp4_act_quant(const Fp4ActQuantParams& p, cudaStream_t s);
void round_bf16(const RoundBf16Params& p, cudaStream_t s);
void gemm(const GemmParams& p, cudaStream_t s);
void rms_norm(const RmsNormParams& p, cudaStream_t s);
void rope(const RopeParams& p, cudaStream_t s);
void hadamard(const HadamardParams& p, cudaStream_t s);
void compress_pool(const CompressPoolParams& p, cudaStream_t s);
void indexer_score(const IndexerScoreParams& p, cudaStream_t s);
void topk(const TopkParams& p, cudaStream_t s);
void sparse_attn(const SparseAttnParams& p, cudaStream_t s);
void hc_pre(const HcPreParams& p, cudaStream_t s);
void hc_post(const HcPostParams& p, cudaStream_t s);
void hc_head(const HcHeadParams& p, cudaStream_t s);
void moe_gate(const MoeGateParams& p, cudaStream_t s);
void moe_group(const MoeGroupParams& p, cudaStream_t s);
void swiglu(const SwigluParams& p, cudaStream_t s);
void rows_copy(const RowsCopyParams& p, cudaStream_t s);
void softmax(const SoftmaxParams& p, cudaStream_t s);
void argmax(const ArgmaxParams& p, cudaStream_t s);

}  // namespace tandem::kernels::cuda
