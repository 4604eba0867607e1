// Tensor-core GEMMs for prefill rows (more than kTcMinRows rows): the reference's FP8 linear
// (activations quantized per 128 along K to e4m3 with a power-of-two scale, weights e4m3 with one
// E8M0 scale per 128 x 128 block, exact products, fp32 accumulation), the bf16 linears (bf16 x bf16,
// fp32 accumulation, optionally batched as wo_a's grouped einsum), and the activation quantization
// they consume. sm_90: warp-specialized kernels with TMA loads (tc_ws.cuh, gemm_ws.cu); other
// architectures (sm_100a, sm_120, sm_121) and test references: the portable cp.async main loop of
// tc_gemm.cuh on mma.sync (or wgmma on sm_90a).
//
// Numerics (tests/cuda/gemm_tc_test.cpp). FP8: each K block of 128 is summed on the tensor cores
// from exact products into a fresh fp32 partial, which is scaled (exactly: powers of two) and added
// to the fp32 accumulator in K order. Against the exact sum y64 of the dequantized products, with
// S = sum |x_i w_i| and S_b the same over K block b:
//   |y - y64| <= sum_b e_tc(S_b) + gamma_{K/128} * S,  gamma_n = n u / (1 - n u), u = 2^-24,
// where e_tc is the tensor core's error on one block. Hopper's FP8 MMA keeps about 14 bits while
// accumulating (DeepSeek-V3 report, 3.3.2): we take e_tc(S_b) <= 2^-10 S_b (four k32 steps of at
// most 2^-12 each). When every partial sum of a block is a multiple of its smallest product's
// quantum below 2^13 quanta (tested inputs of that kind), e_tc = 0 and only gamma remains: every
// back end then gives the same bits. bf16: products are exact; each k16 step is aligned to its
// largest term and truncated to 24 bits, so |y - y64| <= (k/16 (2^-19 + 2^-23) + 2^-22) S.
// A row's result never depends on the number of rows, the other rows or its place in the call: each
// output is one fixed K loop of one tile (no split-K, no row-dependent choice of kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cuda {

// Calls with more rows than this take the tensor-core paths (prefill chunks); fewer stay on the
// GEMV kernels of gemm.cu (decode, verify).
constexpr int64_t kTcMinRows = 96;

enum class TcBackend : uint8_t {
  kAuto,          // kWgmmaWs on sm_90 (this build's sm_90a code, a driver with TMA), mma.sync elsewhere
  kMmaSync,       // portable loop, mma.sync.m16n8k32 e4m3 / m16n8k16 bf16 (any sm_89+ device)
  kWgmma,         // portable loop, wgmma.m64n128 (sm_90a only)
  kWgmmaOverlap,  // the same, the next K block's MMAs in flight during a promotion (dense FP8 only;
                  // bf16 and grouped experts run kWgmma)
  kWgmmaWs,       // warp-specialized: TMA producer, two wgmma consumer warpgroups, persistent tiles
                  // (sm_90a; FP8 128x128 tiles, bf16 128x256)
};
// The back end kAuto resolves to on the current device.
TcBackend tc_backend_for_device();
// True when the current device runs this build's sm_90a code (wgmma; kWgmma, kWgmmaOverlap and,
// with TMA, kWgmmaWs are usable).
bool tc_device_has_wgmma();
// kAuto resolved; CHECK-fails for a back end the device cannot run (a programmer's choice).
TcBackend tc_resolve(TcBackend b);
const char* tc_backend_name(TcBackend b);
// Sets the kernels' shared-memory limits (idempotent; call at start-up, outside graph capture).
void tc_init();
// Streaming multiprocessors of the current device (cached per device; the persistent grids' size).
int tc_sm_count();

// Per 128-column block b of row r of x (fp32, or bf16 bits when xb is set):
//   e = ue8m0 exponent of the block's amax (act_quant), codes[r * ldc + c] = e4m3(x / 2^e),
//   scales[b * scale_ld + r] = 2^e  (scale_rows_major: scales[r * (cols / 128) + b]).
// Rows r >= *rows_limit (when given, a device count) are skipped. With src_rows, output row r
// quantizes input row src_rows[r] / src_div (the grouped experts' rows in expert order).
// Bit-exact with act_quant_fp8.
struct Fp8QuantArgs {
  const float* x = nullptr;        // [rows, ldx] fp32
  const uint16_t* xb = nullptr;    // or [rows, ldx] bf16 bits
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t cols = 0;                // multiple of 128
  const int32_t* rows_limit = nullptr;  // optional device scalar
  const int32_t* src_rows = nullptr;    // optional [rows] device: src_rows[r] / src_div = input row of row r
  int src_div = 1;
  uint8_t* codes = nullptr;        // [rows, ldc] e4m3
  int64_t ldc = 0;                 // 0 = cols
  float* scales = nullptr;         // [cols / 128, scale_ld] fp32
  int64_t scale_ld = 0;            // >= rows (0 = rows)
  bool scale_rows_major = false;
};
void quantize_fp8_act(const Fp8QuantArgs& a, cudaStream_t s);

// y[m, n] (+)= dequant(a) . dequant(w)^T with a = quantize_fp8_act output, w kFp8Block.
struct Fp8GemmArgs {
  const uint8_t* a = nullptr;      // [m, k] e4m3 codes (row stride k)
  const float* a_scale = nullptr;  // [k / 128, a_scale_ld] fp32
  int64_t a_scale_ld = 0;
  const uint8_t* w = nullptr;      // [n, k] e4m3
  const uint8_t* w_scale = nullptr;  // [ceil(n / 128), w_scale_ld] E8M0
  int64_t w_scale_ld = 0;          // 0 = ceil(k / 128)
  float* y = nullptr;              // [m, ldy]
  int64_t ldy = 0;                 // 0 = n
  int64_t m = 0, n = 0, k = 0;     // k multiple of 128
  bool accumulate = false;         // y += (before the rounding)
  bool round_bf16 = false;
};
void fp8_gemm_tc(const Fp8GemmArgs& a, TcBackend backend, cudaStream_t s);

// y[m, n] (+)= x . W^T in bf16 x bf16 -> fp32, batched: batch b multiplies x columns
// [b * x_batch_stride, + k) with W rows [b * w_batch_rows, + n) into y columns [b * y_batch_stride, + n).
struct Bf16GemmArgs {
  const uint16_t* x = nullptr;     // [m, ldx] bf16 bits
  int64_t ldx = 0;                 // 0 = k; a multiple of 8
  const uint16_t* w = nullptr;     // [rows, k] bf16 bits (row stride k)
  uint64_t w_rows = 0;             // rows of W in all (0 = batch * w_batch_rows, or n)
  float* y = nullptr;              // [m, ldy]
  int64_t ldy = 0;                 // 0 = n
  int64_t m = 0, n = 0, k = 0;     // k multiple of 64
  int64_t batch = 1, x_batch_stride = 0, w_batch_rows = 0, y_batch_stride = 0;
  bool accumulate = false;         // y += (before the rounding)
  bool round_bf16 = false;
};
// Why bf16_gemm_tc cannot run `a` (null when it can): layout and alignment rules.
const char* bf16_gemm_problem(const Bf16GemmArgs& a);
void bf16_gemm_tc(const Bf16GemmArgs& a, TcBackend backend, cudaStream_t s);

// Device scratch of the tensor-core linears: the quantized activations of up to `rows` x `max_k`
// (FP8) and the bf16 copy of up to `rows` x `bf16_cols` (bf16 weights).
struct TcLinearScratch {
  uint8_t* codes = nullptr;        // >= rows * max_k bytes
  float* scales = nullptr;         // >= (max_k / 128) * round_up(rows, 4) floats
  uint16_t* xb = nullptr;          // >= rows * bf16_cols
  int64_t rows = 0, max_k = 0, bf16_cols = 0;
  static size_t codes_bytes(int64_t rows, int64_t max_k) { return static_cast<size_t>(rows * max_k); }
  static size_t scale_floats(int64_t rows, int64_t max_k) {
    return static_cast<size_t>((max_k / 128) * ((rows + 3) / 4 * 4));
  }
};
// True when gemm_fp8_linear can run `p` (FP8 weight, quantize_x_block 128, k % 128 == 0, batch 1,
// rows and k within the scratch, 16-byte aligned x rows and weight).
bool fp8_linear_supported(const GemmParams& p, const TcLinearScratch& s);
// GemmParams with an FP8 weight and quantize_x_block = 128 (the reference's linear()): quantize x,
// then fp8_gemm_tc. Same contract as kernels::cuda::gemm, up to summation order (bound above).
// x_ready: s already holds x's codes and scales (the previous call quantized the same x, rows, k and
// row stride, and x is unchanged since): linears sharing an input quantize it once.
void gemm_fp8_linear(const GemmParams& p, const TcLinearScratch& s, TcBackend backend, cudaStream_t st,
                     bool x_ready = false);
// gemm_fp8_linear on codes made elsewhere (decode_act's pack, hc_pre_pack: act_quant of the same x,
// the same codes): codes [m, p.k] (row stride p.k, 16-byte aligned) and E8M0 scales [m, p.k / 128]
// (row-major); the scales are expanded into s.scales (2^e as the quantizer writes them), x is not
// read. The same y bits as gemm_fp8_linear(p, ...).
void gemm_fp8_linear_packed(const GemmParams& p, const uint8_t* codes, const uint8_t* e8m0_scales,
                            const TcLinearScratch& s, TcBackend backend, cudaStream_t st);
// True when gemm_bf16_linear can run `p`: a bf16 weight without activation quantization, k % 64 == 0,
// batches side by side in x's rows (x_batch_stride == k), rows and batch * k within the scratch.
bool bf16_linear_supported(const GemmParams& p, const TcLinearScratch& s);
// x (fp32 holding bf16 values: copied to bf16 exactly) times a bf16 weight on the tensor cores,
// rounding to bf16 when p.round_bf16. Same contract as kernels::cuda::gemm up to summation order.
// x_ready: s already holds x's bf16 copy (as gemm_fp8_linear's).
void gemm_bf16_linear(const GemmParams& p, const TcLinearScratch& s, TcBackend backend, cudaStream_t st,
                      bool x_ready = false);

// bf16 copy of fp32 values that hold bf16 values (exact; other values round to nearest even):
// dst[r * ldd + c] = bf16(src[r * lds + c]), r < rows, c < cols.
void f32_to_bf16_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldd,
                      cudaStream_t s);
// fp32 copy of an E8M0 scale grid (exact powers of two): dst[i] = 2^(src[i] - 127), rows x cols with
// row strides lds / ldd (cuBLASLt's BLK128x128 grid, converted once at load).
void e8m0_grid_to_f32(const uint8_t* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd,
                      cudaStream_t s);
// bf16 copy of a kFp8Block weight [n, k] (dst row stride k): exact when every dequantized value is a
// bf16 value (E8M0 exponents in [-124, 119]); other values round to nearest even.
void fp8_block_to_bf16(const WeightRef& w, uint16_t* dst, cudaStream_t s);

}  // namespace tandem::kernels::cuda
