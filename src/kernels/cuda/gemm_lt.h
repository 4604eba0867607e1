// cuBLASLt GEMMs, the benchmark's reference points (`tandem bench-gemm`; the forward runs its own
// kernels, gemm_tc.h, whose rows never depend on the other rows of a call): bf16 x bf16 -> fp32,
// the block-scaled FP8 GEMM (weights' E8M0 grid as fp32 per 128 x 128 block, activations one fp32
// scale per 128 along K: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F / VEC128_32F, sm_90 only; row
// counts a multiple of 4, as its activation-scale layout needs) and the scalar-scaled FP8 GEMM the
// benchmark measures the device's FP8 peak with.
//
// y[m, n] (+)= x[m, k] . W[n, k]^T in cuBLASLt's column-major terms: A = W (transposed), B = x,
// D = y^T, so row-major buffers need no copies. Algorithms are chosen when a shape is prepared;
// run() builds its descriptors on the stack and allocates nothing, so it may be captured in a CUDA
// graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda {

enum class LtKind : uint8_t {
  kBf16,       // W bf16, x bf16, D fp32
  kFp8Block,   // W e4m3 + fp32 [ceil(n/128), k/128] grid, x e4m3 + fp32 per 128 along K, D fp32 or bf16
  kFp8Scalar,  // W e4m3, x e4m3, scalar scales 1, D fp32 or bf16
};

struct LtShape {
  LtKind kind = LtKind::kBf16;
  int64_t n = 0, k = 0;
  int64_t ldx = 0;            // row stride of x (elements)
  int64_t ldy = 0;            // row stride of y (elements)
  int64_t batch = 1;          // strided batch: W rows b*w_batch_rows.., x + b*x_batch_stride, y + b*y_batch_stride
  int64_t w_batch_rows = 0, x_batch_stride = 0, y_batch_stride = 0;
  bool accumulate = false;    // y += (beta = 1)
  bool bf16_out = false;      // D in bf16 (FP8 kinds only)
  bool operator==(const LtShape& o) const {
    return kind == o.kind && n == o.n && k == o.k && ldx == o.ldx && ldy == o.ldy && batch == o.batch &&
           w_batch_rows == o.w_batch_rows && x_batch_stride == o.x_batch_stride &&
           y_batch_stride == o.y_batch_stride && accumulate == o.accumulate && bf16_out == o.bf16_out;
  }
};

class LtGemm {
 public:
  // A handle and `workspace_bytes` of device workspace on the current device.
  static Result<std::unique_ptr<LtGemm>> create(size_t workspace_bytes = size_t{32} << 20);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Chooses algorithms for `s` for row counts in [min_m, max_m] (start-up, host only; kFp8Block:
  // the multiples of 4 in that range). one_algo: one algorithm without split-K for every row count;
  // else the heuristic's best per bucket (ends 128, 256, 512, ...: the benchmark's). Candidates are
  // the heuristic's first 16 answers at the range's ends and at each bucket end, each checked at
  // every row count that bounds its bucket. FailedPrecondition naming the rows that had no
  // algorithm when cuBLASLt offers none.
  Status prepare(const LtShape& s, int64_t max_m, int64_t min_m = 97, bool one_algo = true);
  // True when prepare(s) succeeded and m is a row count it covers.
  bool ready(const LtShape& s, int64_t m) const;
  // Runs a prepared shape: w/x in the kind's types; w_scale/x_scale fp32 for kFp8Block (x_scale
  // laid out [k/128][x_scale_ld], x_scale_ld = round_up(m, 4) as quantize_fp8_act writes it with
  // gemm_lt_scale_ld). FailedPrecondition for a shape or row count not prepared (ready() says);
  // Internal when cuBLASLt refuses the call.
  Status run(const LtShape& s, int64_t m, const void* w, const void* x, void* y, const float* w_scale,
             const float* x_scale, cudaStream_t st) const;

  size_t workspace_bytes() const { return ws_.bytes(); }

 private:
  LtGemm() = default;
  struct Bucket {
    int64_t m_hi = 0;
    alignas(16) uint64_t algo[8] = {};  // cublasLtMatmulAlgo_t, opaque 64 bytes
  };
  struct Plan {
    LtShape shape;
    int64_t min_m = 1;
    int64_t m_multiple = 1;       // kFp8Block: 4
    std::vector<Bucket> buckets;  // ascending m_hi
  };
  const Plan* find(const LtShape& s) const;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer<uint8_t> ws_;
  DeviceBuffer<float> one_;   // scalar scale 1.0 (kFp8Scalar)
  std::vector<Plan> plans_;
};

// Row stride of the activation scales cuBLASLt's VEC128 mode reads for m rows.
inline int64_t gemm_lt_scale_ld(int64_t m) { return (m + 3) / 4 * 4; }

}  // namespace tandem::kernels::cuda
