// The device KV cache records, in real bytes. One record holds one cached KV vector of head_dim
// values: the NoPE dims (head_dim - rope_dim) in the cache dtype and the RoPE dims in bf16 (as the
// reference keeps them), laid out as
//   fp8   (the official 584-byte layout for head_dim 512): NoPE e4m3 codes [nope] | one E8M0 scale
//         per 64 dims [nope/64] | pad to 8 bytes | RoPE bf16 [rope]   (448 + 7 + 1 + 128 = 584 B)
//   nvfp4 (nvfp4_ds_mla): NoPE packed e2m1 [nope/2] | one e4m3 scale per 16 dims [nope/16] | pad to 8
//         | RoPE bf16 [rope]                                             (224 + 28 + 4 + 128 = 384 B)
//   bf16: all head_dim dims as bf16                                      (1024 B)
// The CSA indexer keys are FP4 in every mode: packed e2m1 [dim/2] | E8M0 per 32 [dim/32] (68 B).
// Decoding a record gives exactly the fp32 values the CPU model caches after its round trip (the
// values are representable), so the GPU attends to the same keys as the CPU oracle.
// The encoders (kv_quantize, index_key_quantize) are in kv_record.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/numeric_core.h"

namespace tandem::cuda_model {

enum class KvRecordKind : uint8_t { kFp8 = 0, kBf16 = 1, kNvfp4 = 2 };

struct KvRecordLayout {
  KvRecordKind kind = KvRecordKind::kFp8;
  int head_dim = 0;
  int rope_dim = 0;
  int nope = 0;
  int scale_off = 0;  // byte offset of the NoPE scales (fp8 / nvfp4)
  int rope_off = 0;   // byte offset of the bf16 RoPE dims (fp8 / nvfp4)
  int bytes = 0;      // record size

  static KvRecordLayout make(KvRecordKind kind, int head_dim, int rope_dim) {
    KvRecordLayout l;
    l.kind = kind;
    l.head_dim = head_dim;
    l.rope_dim = rope_dim;
    l.nope = head_dim - rope_dim;
    auto align8 = [](int x) { return (x + 7) / 8 * 8; };
    switch (kind) {
      case KvRecordKind::kBf16:
        l.bytes = head_dim * 2;
        break;
      case KvRecordKind::kFp8:
        l.scale_off = l.nope;
        l.rope_off = align8(l.nope + l.nope / 64);
        l.bytes = l.rope_off + rope_dim * 2;
        break;
      case KvRecordKind::kNvfp4:
        l.scale_off = l.nope / 2;
        l.rope_off = align8(l.nope / 2 + (l.nope + 15) / 16);
        l.bytes = l.rope_off + rope_dim * 2;
        break;
    }
    return l;
  }
};

// Indexer key record: packed e2m1 + E8M0 per 32 (the fp4_act_quant stored form).
struct IndexKeyLayout {
  int dim = 0;
  int bytes = 0;
  static IndexKeyLayout make(int dim) { return {dim, dim / 2 + dim / 32}; }
};

// Decodes element d of a KV record.
TANDEM_HD float kv_record_get(const uint8_t* rec, const KvRecordLayout& l, int d) {
  if (l.kind == KvRecordKind::kBf16 || d >= l.nope) {
    const int off = l.kind == KvRecordKind::kBf16 ? 2 * d : l.rope_off + 2 * (d - l.nope);
    const uint16_t h = static_cast<uint16_t>(rec[off] | (rec[off + 1] << 8));
    return num::bf16_to_f32(h);
  }
  if (l.kind == KvRecordKind::kFp8) return num::e4m3_decode(rec[d]) * num::e8m0_to_f32(rec[l.scale_off + d / 64]);
  const uint8_t b = rec[d >> 1];
  const uint8_t nib = (d & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
  return num::e2m1_decode(nib) * num::e4m3_decode(rec[l.scale_off + d / 16]);
}

TANDEM_HD float index_key_get(const uint8_t* rec, const IndexKeyLayout& l, int d) {
  const uint8_t b = rec[d >> 1];
  const uint8_t nib = (d & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
  return num::e2m1_decode(nib) * num::e8m0_to_f32(rec[l.dim / 2 + d / 32]);
}

// x[rows, ldx]: the cache dtype's round trip on the NoPE dims (as the CPU's kv_nope), rewritten in
// place, and every row's record written to out[rows, rec.bytes].
struct KvQuantizeArgs {
  float* x = nullptr;                // [rows, ldx], columns [0, rec.head_dim)
  int64_t rows = 0;
  int64_t ldx = 0;
  KvRecordLayout rec;
  uint8_t* out = nullptr;            // [rows, rec.bytes]
};
void kv_quantize(const KvQuantizeArgs& a, cudaStream_t s);

// x[rows, key.dim]: fp4_act_quant(x, 32) round trip in place, key records to out[rows, key.bytes].
struct IndexKeyQuantizeArgs {
  float* x = nullptr;                // [rows, key.dim] (packed)
  int64_t rows = 0;
  IndexKeyLayout key;
  uint8_t* out = nullptr;            // [rows, key.bytes]
};
void index_key_quantize(const IndexKeyQuantizeArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
