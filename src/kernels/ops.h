// The op interface of the DeepSeek-V4 forward pass: one plain parameter struct per op (every pointer
// carries its shape), the CPU oracle's interface (`Ops`, which the CPU model is written against) and
// the CPU entry points (`cpu::<op>`). The CUDA launchers (kernels/cuda/cuda_ops.h) take the same
// structs with device pointers and an explicit stream.
//
// Conventions (all ops):
//  * Activations are fp32 arrays. Where the official reference keeps a tensor in bf16, the op that
//    produces it takes `round_bf16` (or the model calls round_bf16()) so the stored value is the bf16
//    value in an fp32 slot. Inputs are read as given (no implicit rounding).
//  * Row-major. `ld*` = row stride in elements (>= the row length); 0 means "packed" (= row length).
//  * Pointers are host pointers for the CPU backend and device pointers for the CUDA backend.
//  * Shapes and pointers are programmer invariants (TANDEM_CHECK in validate_*); anything derived
//    from a file or a request (token ids, tid2eid entries, positions) must be validated by the
//    caller before it reaches an op.
//  * CPU ops are multithreaded with OpenMP (cpu::set_num_threads) and allocate nothing once warm
//    (per-thread scratch grows on first use and is reused).
//  * Numerics follow the official inference/model.py + kernel.py (0731); each struct says how.
//  * Row independence: every op computes a token's row with the same arithmetic whatever the other
//    rows of the call and the thread count, so chunked prefill, decode and verify agree bit for bit
//    (for a given CPU instruction set; see GemmParams).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

// ============================== quantization simulation ==============================

// FP8 e4m3 activation quantization round trip ("act_quant(x, block, 'ue8m0', inplace=True)"):
// for each row r and each block of `block` columns in [0, cols):
//   amax = max(|x|, 1e-4); s = 2^ceil(log2(amax * fl32(1/448)));  x <- e4m3_rne(clamp(x/s, +-448)) * s.
// Used with block=128 on the input of every FP8/FP4-weight GEMM, block=64 on the 448 non-RoPE dims of
// every KV vector (ld = 512). NaN elements stay NaN and are ignored by amax; +-inf gives the block
// the largest scale (2^127). Optional outputs give the stored form (KV cache in FP8).
struct ActQuantFp8Params {
  float* x = nullptr;              // [rows, ldx], columns [0, cols) rewritten in place
  int64_t rows = 0;
  int64_t cols = 0;                // multiple of block
  int64_t ldx = 0;
  int block = 128;
  uint8_t* codes = nullptr;        // optional [rows, cols] e4m3fn bytes (packed)
  uint8_t* scales = nullptr;       // optional [rows, cols/block] E8M0 bytes (packed)
};

// FP4 e2m1 activation round trip ("fp4_act_quant(x, 32, inplace=True)"), per `block` (=32) columns:
//   amax = max(|x|, 6*2^-126); s = 2^ceil(log2(amax * fl32(1/6)));  x <- e2m1_rne(clamp(x/s, +-6)) * s.
// Used on indexer queries and indexer compressed keys after the Hadamard rotation.
struct Fp4ActQuantParams {
  float* x = nullptr;              // [rows, ldx], columns [0, cols) in place
  int64_t rows = 0;
  int64_t cols = 0;                // multiple of block
  int64_t ldx = 0;
  int block = 32;
  uint8_t* codes = nullptr;        // optional [rows, cols/2] packed e2m1 (even col = low nibble)
  uint8_t* scales = nullptr;       // optional [rows, cols/block] E8M0
};

// x <- bf16(x) (round to nearest even), elementwise over a [rows, cols] view.
struct RoundBf16Params {
  float* x = nullptr;              // [rows, ldx]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ldx = 0;
};

// ==================================== GEMM ====================================

enum class WeightFormat : uint8_t {
  kF32,       // data: float [n, k]
  kBf16,      // data: uint16 bf16 bits [n, k]
  kFp8Block,  // data: e4m3fn [n, k]; scale: E8M0 [ceil(n/128), ceil(k/128)] (official FP8 linear)
  kMxfp4,     // data: packed e2m1 [n, k/2] (even k = low nibble); scale: E8M0 [n, k/32] (experts)
};

// A weight matrix W[n, k] as stored (never dequantized in memory).
struct WeightRef {
  WeightFormat format = WeightFormat::kF32;
  const void* data = nullptr;      // see WeightFormat
  const uint8_t* scale = nullptr;  // E8M0, kFp8Block / kMxfp4 only
  int64_t n = 0;                   // rows (output features)
  int64_t k = 0;                   // columns (input features)
  int64_t scale_ld = 0;            // kFp8Block: row stride of the scale grid (0 = ceil(k/128))

  // Rows [row0, row0 + count) as a weight of its own (kFp8Block: row0 % 128 == 0).
  WeightRef rows(int64_t row0, int64_t count) const;
  // Bytes of weight data + scales.
  size_t bytes() const;
};

constexpr int kFp8WeightBlock = 128;
constexpr int kMxfp4WeightGroup = 32;

// y[m, n] (+)= sum_k x[m, k] * W[n, k]   (F.linear / fp8_gemm / fp4_gemm), fp32 accumulate.
// For FP8/FP4 weights the reference first runs act_quant(x, 128) — the caller does that
// (ActQuantFp8Params on a copy); the GEMM itself is exact dequantization + fp32 dot products, so it
// equals the reference's block-scaled product up to summation order. With round_bf16 the result is
// rounded to bf16 (fp8_gemm/fp4_gemm/bf16 F.linear outputs are bf16 in the reference; the gate,
// compressor and LM head are fp32). `accumulate` adds to y (before the bf16 rounding).
// Batched: `batch` independent problems, operand b at x + b*x_batch_stride, W rows
// [b*w_batch_rows, ...) (the grouped wo_a einsum: batch 8, w_batch_rows 1024), y + b*y_batch_stride.
// Batch invariance: each y[i][j] is computed with one fixed summation order that does not depend on
// m, on the row's place in the batch or on the thread count (for a given CPU instruction set), so
// chunked prefill, decode and multi-token verify give bit-identical rows.
struct GemmParams {
  const float* x = nullptr;        // [m, ldx] (per batch)
  WeightRef w;                     // [n, k] (per batch: n rows starting at b*w_batch_rows)
  float* y = nullptr;              // [m, ldy] (per batch)
  int64_t m = 0;
  int64_t n = 0;                   // output columns per batch (<= w.n)
  int64_t k = 0;                   // == w.k
  int64_t ldx = 0;
  int64_t ldy = 0;
  int64_t batch = 1;
  int64_t x_batch_stride = 0;
  int64_t y_batch_stride = 0;
  int64_t w_batch_rows = 0;
  bool accumulate = false;
  bool round_bf16 = false;
  // > 0: run act_quant_fp8 with this block (128 = the reference's linear()) on a private copy of x
  // first (k % block == 0); x itself is left unchanged. Same result as calling act_quant_fp8 then gemm.
  int quantize_x_block = 0;
};

// ============================ norms and rotations ============================

// RMSNorm over the last dim: y = w * x * rsqrt(mean(x^2) + eps), fp32 math (RMSNorm in model.py),
// weight optional (weightless when both weight pointers are null; weights are bf16 in the file).
// mode kBf16Chain reproduces the per-head q normalization, which the reference computes with bf16
// tensors: r = bf16(rsqrt(bf16(bf16(mean(bf16(x^2))) + eps))), y = bf16(x * r) (errata 4).
enum class RmsNormMode : uint8_t { kF32, kBf16Chain };
struct RmsNormParams {
  const float* x = nullptr;        // [rows, ldx]
  float* y = nullptr;              // [rows, ldy] (may equal x)
  const float* weight = nullptr;   // optional [dim] fp32
  const uint16_t* weight_bf16 = nullptr;  // optional [dim] bf16 bits
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t ldx = 0;
  int64_t ldy = 0;
  float eps = 1e-6f;
  RmsNormMode mode = RmsNormMode::kF32;
  bool round_bf16 = false;         // round y to bf16 (input tensor was bf16)
};

// RoPE inverse frequencies, fp32 as precompute_freqs_cis computes them:
// w_i = 1 / base^(2i/rope_dim); with YaRN (original_seq_len > 0):
// low = max(floor(rope_dim*ln(orig/(beta_fast*2pi))/(2 ln base)), 0),
// high = min(ceil(rope_dim*ln(orig/(beta_slow*2pi))/(2 ln base)), rope_dim-1),
// ramp_i = clamp((i-low)/(high-low), 0, 1), w'_i = w_i/factor*ramp_i + w_i*(1-ramp_i).
// SWA-only layers and DSpark stages: original_seq_len = 0 (no YaRN), base = rope_theta.
struct RopeFreqParams {
  float* inv_freq = nullptr;       // [rope_dim/2] out
  int rope_dim = 64;
  double base = 10000.0;
  int64_t original_seq_len = 0;    // 0 = no YaRN
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// Interleaved RoPE on dims [rope_offset, rope_offset + rope_dim) of every head of every token:
// pairs (x[2i], x[2i+1]) rotated as complex numbers by angle = fl32(pos * inv_freq[i]); cos/sin
// in fp32; inverse = conjugate rotation (attention output de-rotation at the query position).
struct RopeParams {
  float* x = nullptr;              // [tokens, heads, head_dim] with strides below, in place
  const int64_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [rope_dim/2]
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t token_stride = 0;        // elements between tokens (0 = heads * head_stride)
  int64_t head_stride = 0;         // elements between heads (0 = rope_offset + rope_dim)
  int rope_offset = 448;           // head_dim - rope_dim
  int rope_dim = 64;
  bool inverse = false;
  bool round_bf16 = false;
};

// Walsh-Hadamard transform (Sylvester order, as fast_hadamard_transform) of each row, scaled by
// 1/sqrt(n): y = H_n x / sqrt(n). n is a power of two (128 for the indexer).
struct HadamardParams {
  float* x = nullptr;              // [rows, ldx], columns [0, n) in place
  int64_t rows = 0;
  int64_t n = 128;
  int64_t ldx = 0;
  bool round_bf16 = false;
};

// ============================ KV compressor ============================

// Gated pooling of the KV compressor (Compressor.forward; spec 6.3) for a run of complete blocks.
// Token rows cover consecutive positions: row i = position first_pos + i. For entry j (block of
// `ratio` tokens starting at ratio*j) with overlap (ratio 4): for channel c in [0, d) the 2*ratio
// candidates are (kv[t][c], score[t][c]) for t in block j-1 (none when j == 0) and
// (kv[t][d+c], score[t][d+c]) for t in block j; without overlap: (kv[t][c], score[t][c]), t in block j.
// out[j][c] = sum_t softmax_t(score)[t] * kv[t]  (fp32, softmax as torch: exp(s-max)/sum).
// If `ape` is given, ape[pos % ratio][ch] is added to every score first (the reference stores
// score + ape). Rows for every needed position must be present (CHECKed).
struct CompressPoolParams {
  const float* kv = nullptr;       // [rows, ld] with coff*d valid columns (coff = 2 if overlap else 1)
  const float* score = nullptr;    // [rows, ld]
  const float* ape = nullptr;      // optional [ratio, coff*d]
  int64_t rows = 0;
  int64_t ld = 0;                  // 0 = coff*d
  int64_t first_pos = 0;
  int ratio = 4;
  int64_t d = 512;                 // output head dim (512 main, 128 indexer)
  bool overlap = true;             // must equal (ratio == 4)
  int64_t first_entry = 0;         // j of out row 0
  int64_t num_entries = 0;
  float* out = nullptr;            // [num_entries, ldo]
  int64_t ldo = 0;                 // 0 = d
  bool round_bf16 = true;          // the reference casts the pooled kv to bf16 before its norm
};

// ============================ CSA lightning indexer ============================

// Index scores I[t][s] = sum_h w[t][h] * relu(q[t][h] . k[s]) for s < visible[t]; -inf for
// s >= visible[t] (future / not yet compressed). With bf16_numerics the reference's bf16 tensors are
// reproduced: dot = bf16(q.k fp32), term = bf16(relu(dot) * w), I = bf16(sum_h term) (errata 6).
// w already includes the 128^-0.5 * 64^-0.5 factor (and is bf16-rounded by the caller).
struct IndexerScoreParams {
  const float* q = nullptr;        // [tokens, heads, dim] (packed)
  const float* k = nullptr;        // [entries, ldk] compressed index keys
  const float* w = nullptr;        // [tokens, heads]
  const int32_t* visible = nullptr;  // [tokens] entries visible to each query, <= entries
  int64_t tokens = 0;
  int64_t heads = 64;
  int64_t dim = 128;
  int64_t entries = 0;
  int64_t ldk = 0;
  float* scores = nullptr;         // [tokens, lds]
  int64_t lds = 0;                 // 0 = entries
  bool bf16_numerics = true;
};

// Top-k per row (torch.topk(scores, k)[1], then visible masking as Indexer.forward does):
// out[r][0..k) = indices of the k largest of scores[r][0..n_valid[r]) plus `index_offset`,
// ordered by score descending; equal scores are ordered by ascending index (so among tied
// candidates at the cut the lower index is kept); NaN counts as larger than +inf (as torch).
// Slots past min(k, n_valid[r]) are -1.
struct TopkParams {
  const float* scores = nullptr;   // [rows, lds]
  const int32_t* n_valid = nullptr;  // optional [rows]; null = n for every row
  int64_t rows = 0;
  int64_t n = 0;                   // columns
  int64_t lds = 0;
  int64_t k = 0;
  int32_t index_offset = 0;
  int32_t* out = nullptr;          // [rows, ldo]
  int64_t ldo = 0;                 // 0 = k
};

// ============================ sparse attention ============================

// Sparse MQA with attention sink (sparse_attn_kernel; spec 6.6, errata 5). For token t, head h:
//   s_i = (q[t][h] . kv[idx[t][i]]) * scale,   idx -1 = no key (masked)
//   o = sum_i exp(s_i - m) kv_i / (sum_i exp(s_i - m) + exp(sink[h] - m)),  m = max_i s_i.
// Kernel numerics: the index list is walked in blocks of `block` (64) list positions with a running
// max; within a block p = exp(s - m_running) (fp32, summed into the denominator in fp32) and, with
// bf16_numerics, p is rounded to bf16 before P.V and the output is rounded to bf16.
// A token with no valid index gets o = 0. Same kv row serves as key and value.
struct SparseAttnParams {
  const float* q = nullptr;        // [tokens, heads, dim] with q_token_stride (0 = heads*dim)
  const float* kv = nullptr;       // [kv_rows, ldkv]
  const int32_t* idx = nullptr;    // [tokens, ldi], topk entries used per token, -1 = none
  const float* sink = nullptr;     // [heads]
  float* out = nullptr;            // [tokens, heads, dim] with out_token_stride (0 = heads*dim)
  int64_t tokens = 0;
  int64_t heads = 64;
  int64_t dim = 512;
  int64_t kv_rows = 0;
  int64_t ldkv = 0;
  int64_t topk = 0;
  int64_t ldi = 0;                 // 0 = topk
  int64_t q_token_stride = 0;
  int64_t out_token_stride = 0;
  float scale = 0.0f;              // 0 = dim^-0.5
  int block = 64;
  bool bf16_numerics = true;
};

// ============================ mHC ============================

// hc_pre (Block.hc_pre + hc_split_sinkhorn; spec 5.1) per token t:
//   xf = h[t] flattened (hc*dim), r = rsqrt(mean(xf^2) + norm_eps), mix = (fn . xf) * r  [(2+hc)*hc]
//   pre_i = sigmoid(mix_i*scale[0] + base_i) + hc_eps; post_i = 2*sigmoid(mix_{hc+i}*scale[1] + base_{hc+i})
//   C[j][k] = mix_{2hc + j*hc + k}*scale[2] + base_{..}; C = softmax_rows(C) + hc_eps;
//   C = C / (colsum + hc_eps); then (sinkhorn_iters - 1) x { C /= rowsum + hc_eps; C /= colsum + hc_eps }
//   x[t] = bf16(sum_i pre_i * h[t][i])
struct HcPreParams {
  const float* h = nullptr;        // [tokens, hc, dim] residual streams (packed)
  const float* fn = nullptr;       // [(2+hc)*hc, hc*dim]
  const float* scale = nullptr;    // [3]
  const float* base = nullptr;     // [(2+hc)*hc]
  int64_t tokens = 0;
  int hc = 4;
  int64_t dim = 4096;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
  float* x = nullptr;              // [tokens, dim] out (bf16-rounded)
  float* post = nullptr;           // [tokens, hc] out
  float* comb = nullptr;           // [tokens, hc, hc] out, C[j][k] at j*hc + k
};

// hc_post (spec 5.2): out[t][k] = bf16(post[t][k] * f[t] + sum_j comb[t][j][k] * res[t][j])
// (contracts the FIRST index of comb). out may alias res (not f, f_add). f as loaded: f + f_add
// (f_add null: f alone), then bf16-rounded if f_round: the epilogue of a tensor-parallel all-reduce
// of the sub-block output (the attention output's round, the MoE's shared-expert add and round),
// done by this consumer as it loads instead of by a launch of its own.
struct HcPostParams {
  const float* f = nullptr;        // [tokens, dim] sub-block output
  const float* f_add = nullptr;    // [tokens, dim] or null: added to f as loaded (before f_round)
  bool f_round = false;            // f (+ f_add) rounded to bf16 as loaded
  const float* res = nullptr;      // [tokens, hc, dim]
  const float* post = nullptr;     // [tokens, hc]
  const float* comb = nullptr;     // [tokens, hc, hc]
  float* out = nullptr;            // [tokens, hc, dim]
  int64_t tokens = 0;
  int hc = 4;
  int64_t dim = 4096;
  bool round_bf16 = true;
};

// hc_head (spec 5.3): mix = (fn . xf) * rsqrt(mean(xf^2)+norm_eps) [hc];
// pre_i = sigmoid(mix_i*scale[0] + base_i) + hc_eps;  y[t] = bf16(sum_i pre_i * h[t][i]).
struct HcHeadParams {
  const float* h = nullptr;        // [tokens, hc, dim]
  const float* fn = nullptr;       // [hc, hc*dim]
  const float* scale = nullptr;    // [1]
  const float* base = nullptr;     // [hc]
  int64_t tokens = 0;
  int hc = 4;
  int64_t dim = 4096;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
  float* y = nullptr;              // [tokens, dim]
  bool round_bf16 = true;
};

// ============================ MoE ============================

// Gate (Gate.forward; spec 7.1) from fp32 logits z = x @ gate.weight^T (a kBf16 GEMM, no rounding):
//   s = sqrt(softplus(z)) (torch softplus: z > 20 -> z);
//   hash layers (tid2eid != null): experts = tid2eid[token_ids[t]]; else experts = topk(s + bias)
//   (ties: lower expert id first); weights = s[experts] / sum * route_scale.
// tid2eid entries and token ids must have been validated by the caller.
struct MoeGateParams {
  const float* logits = nullptr;   // [tokens, n_experts]
  const float* bias = nullptr;     // [n_experts], score layers (null in hash layers)
  const int32_t* token_ids = nullptr;  // [tokens], hash layers
  const int32_t* tid2eid = nullptr;    // [vocab, topk], hash layers (I64 in the file: convert at load)
  int64_t tokens = 0;
  int n_experts = 256;
  int topk = 6;
  float route_scale = 1.5f;
  int32_t* expert_ids = nullptr;   // [tokens, topk] out
  float* weights = nullptr;        // [tokens, topk] out
};

// Groups (token, slot) pairs by expert: for expert e, pairs [offsets[e], offsets[e+1]) of
// token_of / slot_of (ascending token order within an expert). Lets the model gather each
// expert's rows, run its GEMMs once, and scatter back.
struct MoeGroupParams {
  const int32_t* expert_ids = nullptr;  // [tokens, topk], each in [0, n_experts)
  int64_t tokens = 0;
  int topk = 6;
  int n_experts = 256;
  int32_t* offsets = nullptr;      // [n_experts + 1] out
  int32_t* token_of = nullptr;     // [tokens * topk] out
  int32_t* slot_of = nullptr;      // [tokens * topk] out
};

// SwiGLU with clamp (Expert.forward; spec 7.2):
//   u = clamp(up, -limit, limit); g = min(gate, limit) (limit <= 0: no clamp);
//   out = silu(g) * u * row_weight[r] (routing weight, optional), optionally rounded to bf16
//   (the reference casts to bf16 before w2).
struct SwigluParams {
  const float* gate = nullptr;     // [rows, ldg] (w1 output)
  const float* up = nullptr;       // [rows, ldu] (w3 output)
  const float* row_weight = nullptr;  // optional [rows]
  float* out = nullptr;            // [rows, ldo] (may alias gate or up)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ldg = 0;
  int64_t ldu = 0;
  int64_t ldo = 0;
  float limit = 10.0f;
  bool round_bf16 = true;
};

// dst[rows[i]] (+)= src[i] (fp32; the reference's y[idx] += expert(x[idx])). With gather = true
// the direction flips: dst[i] = src[rows[i]] (gathering an expert's input rows).
struct RowsCopyParams {
  const float* src = nullptr;      // [*, lds]
  float* dst = nullptr;            // [*, ldd]
  const int32_t* rows = nullptr;   // [count]
  int64_t count = 0;
  int64_t cols = 0;
  int64_t lds = 0;
  int64_t ldd = 0;
  bool gather = false;             // false: scatter-add into dst; true: gather copy
};

// ============================ sampling helpers ============================

// Per row: y = softmax(x / temperature) (or log_softmax), fp32, max-subtracted.
struct SoftmaxParams {
  const float* x = nullptr;        // [rows, ldx]
  float* y = nullptr;              // [rows, ldy] (may equal x)
  int64_t rows = 0;
  int64_t n = 0;
  int64_t ldx = 0;
  int64_t ldy = 0;
  float temperature = 1.0f;        // > 0
  bool log = false;
};

// Per row: index of the maximum (first one on ties; NaN wins, as torch.argmax).
struct ArgmaxParams {
  const float* x = nullptr;        // [rows, ldx]
  int32_t* out = nullptr;          // [rows]
  float* max_value = nullptr;      // optional [rows]
  int64_t rows = 0;
  int64_t n = 0;
  int64_t ldx = 0;
};

// ============================ reference call -> op ============================
// linear(x, W) with FP8/FP4 W          gemm{w=stored, quantize_x_block=128, round_bf16=true}
// F.linear on a BF16 weight (bf16 out)  gemm{w=kBf16, round_bf16=true}
// Gate / Compressor wkv,wgate / head    gemm{w=kBf16 or kF32, round_bf16=false} (fp32 in the reference)
// einsum("bsgd,grd->bsgr", o, wo_a)     gemm{w=wo_a (kFp8Block), batch=o_groups, w_batch_rows=o_lora_rank,
//                                            x_batch_stride=heads/groups*head_dim, y_batch_stride=o_lora_rank,
//                                            round_bf16=true} (wo_a's bf16 copy equals its exact dequant)
// RMSNorm / q per-head rsqrt            rms_norm (kF32, round_bf16) / rms_norm (kBf16Chain, no weight)
// apply_rotary_emb(x[..., -64:])        rope{round_bf16=true}; inverse=true on the attention output
// act_quant(kv[..., :-64], 64, inplace) act_quant_fp8{cols=448, ldx=512, block=64}
// rotate_activation + fp4_act_quant     hadamard{round_bf16=true} then fp4_act_quant
// Compressor pooling                    compress_pool, then rms_norm, rope at ratio*j, act/fp4 quant
// Indexer scores + topk                 indexer_score then topk{index_offset = window offset}
// sparse_attn                           sparse_attn
// Block.hc_pre / hc_post / hc_head      hc_pre / hc_post / hc_head
// Gate.forward / Expert / MoE           moe_gate, moe_group + rows_copy(gather), gemm x3, swiglu,
//                                       rows_copy(scatter-add)
// sample(): softmax / argmax            softmax / argmax

// ============================ backend interface ============================

// The CPU backend implements every op with the semantics above; it is the oracle the CUDA launchers
// (kernels/cuda/cuda_ops.h: `cuda::<op>(params, stream)`) are tested against (same params, random
// inputs). There is no CUDA implementation of this interface: device code passes its stream.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  virtual void act_quant_fp8(const ActQuantFp8Params& p) = 0;
  virtual void fp4_act_quant(const Fp4ActQuantParams& p) = 0;
  virtual void round_bf16(const RoundBf16Params& p) = 0;
  virtual void gemm(const GemmParams& p) = 0;
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void rope(const RopeParams& p) = 0;
  virtual void hadamard(const HadamardParams& p) = 0;
  virtual void compress_pool(const CompressPoolParams& p) = 0;
  virtual void indexer_score(const IndexerScoreParams& p) = 0;
  virtual void topk(const TopkParams& p) = 0;
  virtual void sparse_attn(const SparseAttnParams& p) = 0;
  virtual void hc_pre(const HcPreParams& p) = 0;
  virtual void hc_post(const HcPostParams& p) = 0;
  virtual void hc_head(const HcHeadParams& p) = 0;
  virtual void moe_gate(const MoeGateParams& p) = 0;
  virtual void moe_group(const MoeGroupParams& p) = 0;
  virtual void swiglu(const SwigluParams& p) = 0;
  virtual void rows_copy(const RowsCopyParams& p) = 0;
  virtual void softmax(const SoftmaxParams& p) = 0;
  virtual void argmax(const ArgmaxParams& p) = 0;
};

// Shape/pointer validation shared by all backends (TANDEM_CHECK; programmer errors only).
void validate(const ActQuantFp8Params& p);
void validate(const Fp4ActQuantParams& p);
void validate(const RoundBf16Params& p);
void validate(const GemmParams& p);
void validate(const RmsNormParams& p);
void validate(const RopeParams& p);
void validate(const HadamardParams& p);
void validate(const CompressPoolParams& p);
void validate(const IndexerScoreParams& p);
void validate(const TopkParams& p);
void validate(const SparseAttnParams& p);
void validate(const HcPreParams& p);
void validate(const HcPostParams& p);
void validate(const HcHeadParams& p);
void validate(const MoeGateParams& p);
void validate(const MoeGroupParams& p);
void validate(const SwigluParams& p);
void validate(const RowsCopyParams& p);
void validate(const SoftmaxParams& p);
void validate(const ArgmaxParams& p);

// Host-side helper (not an op): fills RopeFreqParams::inv_freq.
void rope_inv_freq(const RopeFreqParams& p);

// The CPU backend (process-wide instance).
Ops& cpu_ops();

namespace cpu {
// Threads used by CPU ops, process-wide (whichever thread calls an op); n <= 0 restores the
// OpenMP default (OMP_NUM_THREADS / cores). On an oversubscribed machine also consider
// OMP_WAIT_POLICY=passive: spinning barriers cost milliseconds when threads are descheduled.
void set_num_threads(int n);
int num_threads();

// Instruction set of the GEMM inner loops (picked at start-up from the CPU). Tests force each one
// the machine supports; returns false (and changes nothing) when the CPU lacks it. kAvx512 and
// kAvx2 exist on x86-64, kNeon on aarch64; kBaseline (portable vector code) everywhere.
enum class Isa : uint8_t { kAuto, kAvx512, kAvx2, kNeon, kBaseline };
bool set_gemm_isa(Isa isa);
const char* gemm_isa_name();

void act_quant_fp8(const ActQuantFp8Params& p);
void fp4_act_quant(const Fp4ActQuantParams& p);
void round_bf16(const RoundBf16Params& p);
void gemm(const GemmParams& p);
void rms_norm(const RmsNormParams& p);
void rope(const RopeParams& p);
void hadamard(const HadamardParams& p);
void compress_pool(const CompressPoolParams& p);
void indexer_score(const IndexerScoreParams& p);
void topk(const TopkParams& p);
void sparse_attn(const SparseAttnParams& p);
void hc_pre(const HcPreParams& p);
void hc_post(const HcPostParams& p);
void hc_head(const HcHeadParams& p);
void moe_gate(const MoeGateParams& p);
void moe_group(const MoeGroupParams& p);
void swiglu(const SwigluParams& p);
void rows_copy(const RowsCopyParams& p);
void softmax(const SoftmaxParams& p);
void argmax(const ArgmaxParams& p);
}  // namespace cpu

}  // namespace tandem::kernels
