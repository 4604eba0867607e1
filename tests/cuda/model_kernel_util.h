// Shared pieces of the op tests of the runner's own kernels (src/model/cuda/*.cu): the CPU encoder
// of the device KV records and FP4 index keys (built from the CPU oracle's quantizers, never from
// the kernels' code), the CPU round trip of the cached values, a step plan (StepMeta) on the
// device, and the float64 error bounds the tests state for kernels whose arithmetic cannot be
// pinned to the CPU's (exp, and summation orders that differ).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::kernels::cuda_testing {

using cuda_model::IndexKeyLayout;
using cuda_model::KvRecordKind;
using cuda_model::KvRecordLayout;

inline const char* kind_name(KvRecordKind k) {
  return k == KvRecordKind::kFp8 ? "fp8" : k == KvRecordKind::kNvfp4 ? "nvfp4" : "bf16";
}

inline void put_bf16(uint8_t* out, float v) {
  const uint16_t h = num::f32_to_bf16(v);
  out[0] = static_cast<uint8_t>(h & 0xff);
  out[1] = static_cast<uint8_t>(h >> 8);
}

// The CPU model's round trip of a cached KV vector x[head_dim] (DsV4Model::Impl::kv_nope): fp8 =
// act_quant_fp8 of the NoPE dims in blocks of 64; nvfp4 = num::round_nvfp4; bf16 = none (the values
// are bf16 already).
inline void kv_round_trip(float* x, const KvRecordLayout& l) {
  if (l.kind == KvRecordKind::kFp8) {
    ActQuantFp8Params p;
    p.x = x;
    p.rows = 1;
    p.cols = l.nope;
    p.block = 64;
    cpu::act_quant_fp8(p);
  } else if (l.kind == KvRecordKind::kNvfp4) {
    num::round_nvfp4(x, static_cast<size_t>(l.nope));
  }
}

// The record of x[head_dim] from the CPU quantizers (kv_record.h's layout): fp8 = the codes and E8M0
// scales cpu::act_quant_fp8 reports, nvfp4 = num::quantize_nvfp4, RoPE dims (and bf16 records) as
// bf16, pad bytes zero.
inline std::vector<uint8_t> encode_kv_record(const float* x, const KvRecordLayout& l) {
  std::vector<uint8_t> out(static_cast<size_t>(l.bytes), 0);
  if (l.kind == KvRecordKind::kBf16) {
    for (int d = 0; d < l.head_dim; ++d) put_bf16(&out[2 * d], x[d]);
    return out;
  }
  if (l.kind == KvRecordKind::kFp8) {
    std::vector<float> tmp(x, x + l.nope);
    ActQuantFp8Params p;
    p.x = tmp.data();
    p.rows = 1;
    p.cols = l.nope;
    p.block = 64;
    p.codes = out.data();
    p.scales = out.data() + l.scale_off;
    cpu::act_quant_fp8(p);
  } else {
    num::quantize_nvfp4(x, static_cast<size_t>(l.nope), out.data(), out.data() + l.scale_off);
  }
  for (int d = l.nope; d < l.head_dim; ++d) put_bf16(&out[l.rope_off + 2 * (d - l.nope)], x[d]);
  return out;
}

// The FP4 index key record of x[dim] (cpu::fp4_act_quant's codes and scales), and the round trip the
// CPU model applies (fp4_rows).
inline std::vector<uint8_t> encode_index_key(const float* x, const IndexKeyLayout& l) {
  std::vector<uint8_t> out(static_cast<size_t>(l.bytes), 0);
  std::vector<float> tmp(x, x + l.dim);
  Fp4ActQuantParams p;
  p.x = tmp.data();
  p.rows = 1;
  p.cols = l.dim;
  p.block = 32;
  p.codes = out.data();
  p.scales = out.data() + l.dim / 2;
  cpu::fp4_act_quant(p);
  return out;
}
inline void index_key_round_trip(float* x, int dim) {
  Fp4ActQuantParams p;
  p.x = x;
  p.rows = 1;
  p.cols = dim;
  p.block = 32;
  cpu::fp4_act_quant(p);
}

// Decoded values of a record (kv_record.h's decoder, the keys the kernels read).
inline std::vector<float> decode_kv_record(const uint8_t* rec, const KvRecordLayout& l) {
  std::vector<float> v(static_cast<size_t>(l.head_dim));
  for (int d = 0; d < l.head_dim; ++d) v[d] = cuda_model::kv_record_get(rec, l, d);
  return v;
}

// A random cached KV vector as the model makes one (bf16 values after the norm and RoPE), then
// the cache's round trip: the values the CPU keeps and a record decodes to.
inline std::vector<float> random_kv(const KvRecordLayout& l, uint64_t seed, float stddev = 1.0f) {
  std::vector<float> x = randn(static_cast<size_t>(l.head_dim), seed, stddev, true);
  kv_round_trip(x.data(), l);
  return x;
}

// ---- a step plan on the device ----
struct SeqPlan {
  int slot = 0;
  int64_t start = 0;         // first new position
  int len = 1;               // new tokens
  std::vector<int32_t> blocks;  // pool block ids (block table), covering positions < start + len
};

struct DeviceStep {
  std::vector<int64_t> positions, seq_start;
  std::vector<int32_t> tokens, row_seq, seq_row0, seq_len, seq_slot, block_tables;
  int max_blocks = 0, block_size = 256;
  int64_t rows = 0;
  DeviceBuffer<int64_t> d_positions, d_seq_start;
  DeviceBuffer<int32_t> d_tokens, d_row_seq, d_seq_row0, d_seq_len, d_seq_slot, d_block_tables;
  cuda_model::StepMeta meta;  // device pointers (valid once uploaded)

  DeviceStep(const std::vector<SeqPlan>& seqs, int bs) : block_size(bs) {
    for (const SeqPlan& q : seqs) max_blocks = std::max<int>(max_blocks, static_cast<int>(q.blocks.size()));
    max_blocks = std::max(max_blocks, 1);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const SeqPlan& q = seqs[s];
      seq_start.push_back(q.start);
      seq_row0.push_back(static_cast<int32_t>(rows));
      seq_len.push_back(q.len);
      seq_slot.push_back(q.slot);
      for (int b = 0; b < max_blocks; ++b)
        block_tables.push_back(b < static_cast<int>(q.blocks.size()) ? q.blocks[b] : -1);
      for (int t = 0; t < q.len; ++t) {
        positions.push_back(q.start + t);
        row_seq.push_back(static_cast<int32_t>(s));
        tokens.push_back(static_cast<int32_t>((q.start + t) % 1000));
      }
      rows += q.len;
    }
  }
  // The device copy (only on a GPU machine).
  void upload() {
    d_positions = to_dev(positions);
    d_seq_start = to_dev(seq_start);
    d_tokens = to_dev(tokens);
    d_row_seq = to_dev(row_seq);
    d_seq_row0 = to_dev(seq_row0);
    d_seq_len = to_dev(seq_len);
    d_seq_slot = to_dev(seq_slot);
    d_block_tables = to_dev(block_tables);
    meta.tokens = d_tokens.get();
    meta.positions = d_positions.get();
    meta.row_seq = d_row_seq.get();
    meta.seq_start = d_seq_start.get();
    meta.seq_row0 = d_seq_row0.get();
    meta.seq_len = d_seq_len.get();
    meta.seq_slot = d_seq_slot.get();
    meta.block_tables = d_block_tables.get();
    meta.max_blocks = max_blocks;
    meta.block_size = block_size;
  }
};

// (Stated error bounds: kU, gamma_n, kExpRel, sum_bound, bf16_range are bit_compare.h's.)

// float64 gated pooling of one channel (kernels::CompressPoolParams): the softmax over the
// candidates' scores sc (fp32 values, ape included) of their kv values, and the bound of an fp32
// evaluation in candidate order: per candidate exp (kExpRel) of an argument rounded once
// (u |s - m|), the sum z of <= n positive terms (gamma(n)), the division and the product (2u), the
// sum of <= n products (gamma(n)); a factor 1.25 covers the second-order terms.
inline void pool_ref_values(const std::vector<double>& sc, const std::vector<double>& kv, double* want,
                            double* bound) {
  const double m = *std::max_element(sc.begin(), sc.end());
  const double n = static_cast<double>(sc.size());
  double z = 0, eps_max = 0;
  std::vector<double> e(sc.size()), eps(sc.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    e[i] = std::exp(sc[i] - m);
    eps[i] = kExpRel + kU * std::fabs(sc[i] - m);
    eps_max = std::max(eps_max, eps[i]);
    z += e[i];
  }
  const double eps_z = eps_max + gamma_n(n);
  double out = 0, b = 0, mag = 0;
  for (size_t i = 0; i < sc.size(); ++i) {
    const double w = e[i] / z;
    out += kv[i] * w;
    b += std::fabs(kv[i]) * w * (eps[i] + eps_z + 2 * kU);
    mag += std::fabs(kv[i]) * w;
  }
  *want = out;
  *bound = 1.25 * (b + gamma_n(n) * mag);
}

}  // namespace tandem::kernels::cuda_testing
