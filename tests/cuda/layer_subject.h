// The two sides of the layer-by-layer comparison (layer_harness.h): the Device interface (the
// CUDA model through its test hooks, or a stand-in), the Subject (the CPU oracle and a device with
// the same weights), and the device byte images of the CPU's state: its encoding with the device's
// own encoders and the record-by-record comparison of what a step wrote.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/layer_compare.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_model_testing.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "model/tiny_weights.h"

namespace tandem::layer_harness {

namespace mt = model_testing;
using layer_compare::Report;
// The device side of the comparison: the CUDA model through cuda_model_testing.h, or a stand-in.
// Byte images use the device layout (mt::CudaStateLayout); every call finishes before returning.
class Device {
 public:
  virtual ~Device() = default;
  virtual bool has_draft() = 0;
  virtual int64_t draft_tokens() = 0;
  virtual void reset(int slot) = 0;
  virtual Status draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps) = 0;
  virtual void read_slot(int slot, std::vector<uint8_t>& out) = 0;
  virtual void write_slot(int slot, std::span<const uint8_t> in) = 0;
  virtual void read_pool(std::vector<uint8_t>& out) = 0;
  virtual void write_pool(std::span<const uint8_t> in) = 0;
  // A slot's DSpark context rings as records ([stages, draft_ring_rows(), rec.bytes]; position p
  // at row p % draft_ring_rows(): the CUDA model's W + max_rollback, the CPU's W).
  virtual int64_t draft_ring_rows() = 0;
  virtual void read_draft_context(int slot, std::vector<uint8_t>& out) = 0;
  virtual void write_draft_context(int slot, std::span<const uint8_t> in) = 0;
  virtual void set_slot_length(int slot, int64_t length) = 0;
  // The device model's encoders: rows [n, head_dim] -> KV records, [n, index_head_dim] -> FP4 keys.
  virtual void encode_kv(const float* rows, int64_t n, std::vector<uint8_t>& out) = 0;
  virtual void encode_index_keys(const float* rows, int64_t n, std::vector<uint8_t>& out) = 0;
  virtual Status begin_step(const StepBatch& batch) = 0;
  // After begin_step: whether the step's GEMMs take the tensor-core path (the CUDA model's prefill
  // chunks of more than tc_min_rows rows); a stand-in has one path.
  virtual bool tensor_core_step() { return false; }
  // Calls of more rows than this outside a step (the draft's context insertion) take the tensor
  // cores; -1: never (a stand-in).
  virtual int64_t tc_min_rows() { return -1; }
  virtual void set_h(const float* h, int64_t rows) = 0;
  virtual void get_h(float* h, int64_t rows) = 0;
  virtual void attention_half(int layer, const StepBatch& batch) = 0;
  virtual void ffn_half(int layer, const StepBatch& batch) = 0;
  virtual void end_step() = 0;
  virtual void logits(const float* h, int64_t rows, std::vector<float>& out) = 0;
  virtual bool last_indexer(int64_t rows, int64_t cols, std::vector<float>& scores, std::vector<int32_t>& topk) = 0;
  virtual void last_routing(int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts) = 0;
  virtual Status draft_begin(std::span<const CudaModel::DraftQueryDev> requests) = 0;
  virtual void draft_stage_attention(int stage, int64_t requests) = 0;
  virtual void draft_stage_ffn(int stage, int64_t requests) = 0;
  virtual void draft_finish(int64_t requests, std::vector<DraftResult>& results) = 0;
};

inline ModelOptions layer_options(KvDtype d) {
  ModelOptions o;
  o.max_slots = 4;
  o.num_blocks = 16;
  o.block_size = 256;
  o.max_rollback = 8;
  o.max_tokens_per_step = 512;
  o.kv_dtype = d;
  return o;
}

// One model on both sides: the CPU oracle and the device under test, same weights and options.
struct Subject {
  std::string name;
  ModelConfig cfg;
  ModelOptions opt;
  testing::TinyWeights tw;  // in-memory weights (both models point into or copied from them)
  std::unique_ptr<DsV4Model> cpu;
  std::unique_ptr<Device> dev;
  // The same model pinned to the GEMV/decode kernels (CUDA: tc_min_rows huge), or null. On a step
  // the device runs on the tensor cores its pieces are compared with the CPU's as well, and its
  // distance to the device's is printed (information, not a limit: layer_compare.h).
  std::unique_ptr<Device> gemv;
  mt::CudaStateLayout lay;
  Report rep;
  int64_t hd() const { return cfg.head_dim; }
  int64_t HD() const { return static_cast<int64_t>(cfg.hc_mult) * cfg.hidden_size; }
};

inline std::string layer_kind(const Subject& s, int l) {
  const int r = s.cfg.compress_ratios[l];
  std::string k = r == 0 ? "SWA" : (r == 4 ? "CSA" : "HCA");
  if (mt::cpu_gate_bias(*s.cpu, l).empty()) k += "/hash";
  return k;
}

// ---- encoding the CPU's state into the device's bytes ----

// Encodes n CPU rows [n, head_dim] into KV records with the device model's encoder and checks that
// every record decodes to exactly the CPU's values (the CPU stores the values after the same round
// trip, so they are representable); *inexact counts the records that do not.
inline void encode_kv(Subject& s, const float* rows, int64_t n, std::vector<uint8_t>& out, int64_t* inexact) {
  s.dev->encode_kv(rows, n, out);
  const int64_t hd = s.hd(), rb = s.lay.rec.bytes;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d)
      if (!layer_compare::same_value(cuda_model::kv_record_get(out.data() + r * rb, s.lay.rec, static_cast<int>(d)),
                                     rows[r * hd + d])) {
        ++*inexact;
        break;
      }
}

inline void encode_keys(Subject& s, const float* rows, int64_t n, std::vector<uint8_t>& out, int64_t* inexact) {
  s.dev->encode_index_keys(rows, n, out);
  const int64_t dim = s.lay.key.dim, kb = s.lay.key.bytes;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < dim; ++d)
      if (!layer_compare::same_value(cuda_model::index_key_get(out.data() + r * kb, s.lay.key, static_cast<int>(d)),
                                     rows[r * dim + d])) {
        ++*inexact;
        break;
      }
}

// The device bytes of one slot from the CPU's slot floats: window rings encoded, compressor rings
// (fp32 rows on both) copied.
inline std::vector<uint8_t> encode_slot(Subject& s, const std::vector<float>& cs, int64_t* inexact) {
  std::vector<uint8_t> out(static_cast<size_t>(s.lay.slot_bytes), 0);
  std::vector<uint8_t> rec;
  for (int l = 0; l < s.cfg.num_hidden_layers; ++l) {
    const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
    const mt::CudaLayerState& g = s.lay.layers[static_cast<size_t>(l)];
    EXPECT_EQ(c.win_ring, s.lay.win_ring);
    encode_kv(s, cs.data() + c.win_off, c.win_ring, rec, inexact);
    std::memcpy(out.data() + g.win_off, rec.data(), rec.size());
    if (c.ratio) {
      EXPECT_TRUE(c.comp_ring == g.comp_ring && c.comp_chans == g.comp_chans) << "layer " << l;
      std::memcpy(out.data() + g.comp_off, cs.data() + c.comp_off, sizeof(float) * c.comp_ring * 2 * c.comp_chans);
    }
    if (c.has_indexer) {
      EXPECT_TRUE(c.icomp_ring == g.icomp_ring && c.icomp_chans == g.icomp_chans) << "layer " << l;
      std::memcpy(out.data() + g.icomp_off, cs.data() + c.icomp_off, sizeof(float) * c.icomp_ring * 2 * c.icomp_chans);
    }
  }
  return out;
}

// The device pool (num_blocks blocks) from the CPU's pool: compressed entries as KV records, the
// indexer keys as FP4 key records.
inline std::vector<uint8_t> encode_pool(Subject& s, const std::vector<float>& cp, int64_t* inexact) {
  const int64_t nb = s.opt.num_blocks, bs = s.opt.block_size, bf = mt::cpu_block_floats(*s.cpu);
  const int64_t hd = s.hd(), ihd = s.cfg.index_head_dim, rb = s.lay.rec.bytes, kb = s.lay.key.bytes;
  std::vector<uint8_t> out(static_cast<size_t>(nb * s.lay.block_bytes), 0);
  std::vector<float> rows;
  std::vector<uint8_t> rec;
  for (int l = 0; l < s.cfg.num_hidden_layers; ++l) {
    const mt::CpuLayerState c = mt::cpu_layer_state(*s.cpu, l);
    const mt::CudaLayerState& g = s.lay.layers[static_cast<size_t>(l)];
    if (!c.ratio) continue;
    const int64_t per = bs / c.ratio;
    rows.resize(static_cast<size_t>(nb * per * hd));
    for (int64_t b = 0; b < nb; ++b)
      std::memcpy(rows.data() + b * per * hd, cp.data() + b * bf + c.pool_main, sizeof(float) * per * hd);
    encode_kv(s, rows.data(), nb * per, rec, inexact);
    for (int64_t b = 0; b < nb; ++b)
      std::memcpy(out.data() + b * s.lay.block_bytes + g.pool_main, rec.data() + b * per * rb, per * rb);
    if (!c.has_indexer) continue;
    const int64_t per4 = bs / 4;
    rows.resize(static_cast<size_t>(nb * per4 * ihd));
    for (int64_t b = 0; b < nb; ++b)
      std::memcpy(rows.data() + b * per4 * ihd, cp.data() + b * bf + c.pool_idx, sizeof(float) * per4 * ihd);
    encode_keys(s, rows.data(), nb * per4, rec, inexact);
    for (int64_t b = 0; b < nb; ++b)
      std::memcpy(out.data() + b * s.lay.block_bytes + g.pool_idx, rec.data() + b * per4 * kb, per4 * kb);
  }
  return out;
}

// Record comparison over a list of (offset) records of a byte image, by the values they decode to
// (layer_compare.h says why not by bytes): against the CPU's values, or against the same records
// of another image (ref).
struct RecordSet {
  std::vector<int64_t> offs;      // byte offsets of the records in the device image
  std::vector<const float*> cpu;  // the CPU's values of each record
};
inline layer_compare::RecordDiff diff_records(const RecordSet& set, const std::vector<uint8_t>& got, bool index_key,
                                              const Subject& s, const std::vector<uint8_t>* ref = nullptr) {
  layer_compare::RecordDiff d;
  d.records = static_cast<int64_t>(set.offs.size());
  const int64_t dim = index_key ? s.lay.key.dim : s.hd();
  auto value = [&](const uint8_t* rec, int64_t e) {
    return index_key ? cuda_model::index_key_get(rec, s.lay.key, static_cast<int>(e))
                     : cuda_model::kv_record_get(rec, s.lay.rec, static_cast<int>(e));
  };
  for (size_t i = 0; i < set.offs.size(); ++i) {
    const uint8_t* a = got.data() + set.offs[i];
    bool differs = false;
    for (int64_t e = 0; e < dim; ++e) {
      const float v = value(a, e);
      const float w = ref ? value(ref->data() + set.offs[i], e) : set.cpu[i][e];
      if (!layer_compare::same_value(v, w)) differs = true;
      if (!std::isnan(v) && !std::isnan(w)) d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(v) - w));
    }
    if (differs) {
      ++d.differ;
      if (d.first < 0) d.first = static_cast<int64_t>(i);
    }
  }
  return d;
}

inline void mark(std::vector<uint8_t>& mask, int64_t off, int64_t bytes) {
  std::fill(mask.begin() + off, mask.begin() + off + bytes, uint8_t{1});
}

// Bytes outside the written records that differ from the uploaded image: must be none.
inline int64_t untouched_differ(const std::vector<uint8_t>& got, const std::vector<uint8_t>& uploaded,
                         const std::vector<uint8_t>& mask, int64_t* first) {
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!mask[i] && got[i] != uploaded[i]) {
      if (n == 0) *first = static_cast<int64_t>(i);
      ++n;
    }
  return n;
}

}  // namespace tandem::layer_harness
