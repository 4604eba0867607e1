// Seeded values generated directly in device memory: the synthetic weights (every stored format:
// bf16, fp32, FP8 e4m3 codes, MXFP4 e2m1 nibbles, E8M0 scales, expert-id tables) and synthetic KV
// state (valid KV records, FP4 indexer keys, compressor rows). Every value is a pure function of
// (seed, element index) computed by the TANDEM_HD functions below, so a host loop reproduces any
// element bit for bit (tests/cuda/synthetic_test.cpp) and nothing is ever copied from the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "common/numeric_core.h"
#include "model/cuda/kv_record.h"

namespace tandem::cuda_model::synth {

// splitmix64's finalizer: a bijective 64-bit mix.
TANDEM_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
TANDEM_HD uint64_t hash(uint64_t seed, uint64_t i) { return mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ull)); }
// FNV-1a of a name: the per-tensor seed is hash(model seed, name_seed(name)).
inline uint64_t name_seed(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ static_cast<uint8_t>(*s)) * 0x100000001b3ull;
  return h;
}

// An approximately standard normal value from 64 random bits: the sum of four 16-bit uniforms
// (Irwin-Hall, exact in fp32), centred and scaled to unit variance (the scaling by 2^-16 is exact,
// so a contracted multiply-add rounds as the separate operations do).
TANDEM_HD float normal(uint64_t h) {
  const float s = static_cast<float>(h & 0xffffu) + static_cast<float>((h >> 16) & 0xffffu) +
                  static_cast<float>((h >> 32) & 0xffffu) + static_cast<float>(h >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

enum class Fill : uint8_t {
  kBf16,       // uint16 bf16(mean + stdev * normal)
  kF32,        // float, bf16-exact (the file's bf16 vectors, loaded to fp32 as the loader does)
  kF32Exact,   // float (the file's fp32 tensors)
  kFp8,        // e4m3 code of 16 * normal (never the NaN code)
  kFp4,        // two e2m1 nibbles of 2 * normal each
  kE8M0,       // byte e8m0 - (one random bit): a power-of-two scale, one binade of spread
  kExpertIds,  // int32 [rows, cols]: row r's `cols` distinct ids in [0, modulo) (tid2eid)
};

struct FillArgs {
  void* out = nullptr;
  int64_t n = 0;          // elements (values, bytes for kFp8 / kFp4 / kE8M0)
  Fill kind = Fill::kF32;
  uint64_t seed = 0;
  float mean = 0.0f, stdev = 1.0f;
  int e8m0 = 127;         // kE8M0: the base scale byte
  int64_t cols = 1;       // kExpertIds
  int64_t modulo = 1;     // kExpertIds
};

// mean + stdev * n with one rounding on host and device alike (nvcc would contract it to an FMA).
TANDEM_HD float affine(float mean, float stdev, float n) { return fmaf(stdev, n, mean); }

// Element i of a fill, as raw bits (the low 8, 16 or 32 bits are stored for the element's size).
TANDEM_HD uint32_t fill_element(const FillArgs& a, int64_t i) {
  const uint64_t h = hash(a.seed, static_cast<uint64_t>(i));
  switch (a.kind) {
    case Fill::kBf16:
      return num::f32_to_bf16(affine(a.mean, a.stdev, normal(h)));
    case Fill::kF32:
      return num::f32_bits(num::round_bf16(affine(a.mean, a.stdev, normal(h))));
    case Fill::kF32Exact:
      return num::f32_bits(affine(a.mean, a.stdev, normal(h)));
    case Fill::kFp8:
      return num::f32_to_e4m3(16.0f * normal(h));
    case Fill::kFp4: {
      const uint8_t lo = num::f32_to_e2m1(2.0f * normal(h));
      const uint8_t hi = num::f32_to_e2m1(2.0f * normal(mix64(h)));
      return static_cast<uint32_t>(lo | (hi << 4));
    }
    case Fill::kE8M0:
      return static_cast<uint32_t>(a.e8m0 - static_cast<int>(h & 1u));
    case Fill::kExpertIds: {
      const int64_t r = i / a.cols, k = i % a.cols;
      const uint64_t base = hash(a.seed, static_cast<uint64_t>(r)) % static_cast<uint64_t>(a.modulo);
      return static_cast<uint32_t>((base + static_cast<uint64_t>(k)) % static_cast<uint64_t>(a.modulo));
    }
  }
  return 0;
}
TANDEM_HD int fill_element_bytes(Fill k) {
  switch (k) {
    case Fill::kBf16: return 2;
    case Fill::kF32:
    case Fill::kF32Exact:
    case Fill::kExpertIds: return 4;
    default: return 1;
  }
}

// Synthetic KV state: `count` records in each of `regions` regions (region r at
// base + (blocks ? blocks[r] : r) * region_stride + offset), every byte a function of (seed,
// region id, record, byte). Records decode to values of about unit size, as kv_norm leaves them.
enum class RecordKind : uint8_t {
  kKv,      // a KV record of `rec` (fp8 / nvfp4 / bf16)
  kKey,     // an FP4 indexer key of `key`
  kF32,     // `rec_bytes / 4` fp32 values (compressor rows)
};
struct RecordFillArgs {
  uint8_t* base = nullptr;
  const int32_t* blocks = nullptr;  // [regions] device block ids, or null (region r = r)
  int64_t regions = 1;
  int64_t region_stride = 0;
  int64_t offset = 0;
  int64_t count = 0;
  RecordKind kind = RecordKind::kKv;
  KvRecordLayout rec;
  IndexKeyLayout key;
  int64_t rec_bytes = 0;            // bytes of one record (rec.bytes, key.bytes or 4 * floats)
  uint64_t seed = 0;
};

// Byte b of record j of the region whose block id is `blk`.
TANDEM_HD uint8_t record_byte(const RecordFillArgs& a, int64_t blk, int64_t j, int64_t b) {
  const uint64_t rid = static_cast<uint64_t>(blk) * 0x100000001ull + static_cast<uint64_t>(j);
  const uint64_t rs = hash(a.seed, rid);
  auto bf16_byte = [&](int64_t dim, int64_t byte_in_dim) {
    const uint16_t v = num::f32_to_bf16(normal(hash(rs, static_cast<uint64_t>(dim))));
    return static_cast<uint8_t>(byte_in_dim ? v >> 8 : v & 0xff);
  };
  switch (a.kind) {
    case RecordKind::kF32: {
      const uint32_t v = num::f32_bits(normal(hash(rs, static_cast<uint64_t>(b / 4))));
      return static_cast<uint8_t>(v >> (8 * (b % 4)));
    }
    case RecordKind::kKey: {
      const int64_t packed = a.key.dim / 2;
      if (b < packed) {
        const uint64_t h = hash(rs, static_cast<uint64_t>(b));
        return static_cast<uint8_t>(num::f32_to_e2m1(2.0f * normal(h)) | (num::f32_to_e2m1(2.0f * normal(mix64(h))) << 4));
      }
      return num::e8m0_from_exponent(-1);  // key values of about unit size
    }
    case RecordKind::kKv: {
      const KvRecordLayout& l = a.rec;
      if (l.kind == KvRecordKind::kBf16) return bf16_byte(b / 2, b % 2);
      if (b >= l.rope_off) return bf16_byte(l.nope + (b - l.rope_off) / 2, (b - l.rope_off) % 2);
      if (l.kind == KvRecordKind::kFp8) {
        if (b < l.nope) return num::f32_to_e4m3(16.0f * normal(hash(rs, static_cast<uint64_t>(b))));
        if (b < l.scale_off + l.nope / 64) return num::e8m0_from_exponent(-4);  // codes of std 16 -> values of std 1
        return 0;
      }
      if (b < l.nope / 2) {
        const uint64_t h = hash(rs, static_cast<uint64_t>(b));
        return static_cast<uint8_t>(num::f32_to_e2m1(2.0f * normal(h)) | (num::f32_to_e2m1(2.0f * normal(mix64(h))) << 4));
      }
      if (b < l.scale_off + (l.nope + 15) / 16) return num::f32_to_e4m3(0.5f);  // e4m3 group scale
      return 0;
    }
  }
  return 0;
}

// Launchers (stream-ordered, no allocation).
void fill(const FillArgs& a, cudaStream_t s);
void fill_records(const RecordFillArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model::synth
