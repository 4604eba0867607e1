// The device runner's decode-size path (cuda_decode.cpp): which kernels it routes a layer piece to
// and the scratch they need. Routing is decided by the weights' format and shape and by the step:
// the prefill path when a sequence adds more than tc_min_rows tokens or the step has more rows
// than the decode MoE holds (moe_max_tokens, 512), the decode path otherwise, so decode, verify,
// padded graph batches and short prompts up to that size compute a row with the same arithmetic
// (the decode GEMV runs any row count, in chunks of 96).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/moe_decode.h"

namespace tandem::cuda_model {

struct DecodePath {
  bool enabled = true;            // CudaModelOptions::decode_kernels
  int64_t max_rows = 0;           // rows the activation operand holds (every step's rows)
  int64_t max_k = 0;              // widest act-quant input
  kernels::cuda::DeviceBuffer<uint8_t> codes;   // [max_rows, max_k] act_quant codes
  kernels::cuda::DeviceBuffer<uint8_t> scales;  // [max_rows, max_k / 128]
  // The codes in `codes` are those of rows [0, packed_rows) of packed_x, left by dec_norm_rows or
  // dec_hc_pre_norm for the next consumer (q/kv or the MoE), which clears it; any other pack
  // clears it too.
  // Prefill rows (cuda_prefill.cpp's linear_tc) read them too, without clearing: x's FP8 linears
  // then skip their own quantization.
  const float* packed_x = nullptr;
  int64_t packed_rows = 0;
  int64_t packed_dim = 0;  // the codes' columns (row stride)
  // Projections already computed by a grouped launch (the indexer's wq_b with wq_b; the
  // compressors' and the indexer weights' projections of x): the linear() call that asks for one
  // with the same input, output, rows, rounding and output stride returns at once. Cleared at the start of every layer's
  // attention (attention_target), so an entry never outlives the layer that made it.
  struct Done {
    const void* linear = nullptr;
    const float* x = nullptr;
    float* y = nullptr;
    int64_t rows = 0;
    bool round = false;
    int64_t ldy = 0;
  };
  static constexpr int kMaxDone = 8;
  Done done[kMaxDone];
  int n_done = 0;
  void add_done(const void* l, const float* x, float* y, int64_t rows, bool round, int64_t ldy = 0) {
    if (n_done < kMaxDone) done[n_done++] = {l, x, y, rows, round, ldy};
  }
  // True (and the entry removed) when a grouped launch already computed this projection.
  bool take_done(const void* l, const float* x, const float* y, int64_t rows, bool round, int64_t ldy) {
    for (int i = 0; i < n_done; ++i)
      if (done[i].linear == l && done[i].x == x && done[i].y == y && done[i].rows == rows && done[i].round == round &&
          done[i].ldy == ldy) {
        done[i] = done[--n_done];
        return true;
      }
    return false;
  }
  // MoE: steps of up to moe_max_tokens rows take moe_decode, longer ones the generic path.
  MoeDecodeDims moe_dims;
  int64_t moe_max_tokens = 0;
  kernels::cuda::DeviceBuffer<uint8_t> moe_mem;
  MoeDecodeBuffers moe;
};

// Rows the MoE decode path is sized for: every step of the runner up to this bound (its buffers
// grow with tokens x top-k x (inter + dim)); longer prefill steps use the generic MoE.
constexpr int64_t kMoeDecodeMaxTokens = 512;

}  // namespace tandem::cuda_model
