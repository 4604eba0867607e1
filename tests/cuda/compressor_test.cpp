// The KV compressor kernels (src/model/cuda/compressor.cu) against the CPU forward's compressor
// (model::compressor_rows, model::pool_entry = kernels::cpu::compress_pool over the gathered rows):
// ratio 4 with overlap (main d 512, indexer d 128) and ratio 128, several sequences per step whose
// entries take their rows from this step, from the slot's row ring, or from both; entries at the
// start (no previous block) and later. comp_rows_build is bit-exact (one add per element); the
// pooled entries (softmax with exp) are correctly rounded to bf16 against a float64 reference with
// a stated bound of the fp32 arithmetic, the CPU's result checked against the same reference;
// store_entries byte for byte; compress_step (the two launches fused) equals comp_rows_build then
// compress_entries bit for bit (also at the verify sizes 6 and 96 rows), and norm_rope with the store
// (the forward's compressor tail) equals norm_rope then store_entries (entries, records, pool bytes).
#include <cmath>
#include <cstdio>

#include "cuda/model_kernel_util.h"
#include "model/cuda/compressor.h"
#include "model/cuda/norm_rope.h"
#include "model/math.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::CompressArgs;
using cuda_model::CompRowsArgs;
using cuda_model::StoreEntriesArgs;

struct CompCase {
  int ratio;
  int64_t d;
  int bs;                       // pool block size
  std::vector<SeqPlan> seqs;    // slots < 3
};

std::vector<CompCase> cases() {
  std::vector<CompCase> v;
  // ratio 4: entries from the step only / ring + step / a single decode row at j == 0.
  v.push_back({4, 512, 16, {{0, 0, 9, {3, 1, 4}}, {2, 10, 7, {0, 5, 2, 6, 7}}, {1, 3, 1, {8}}}});
  v.push_back({4, 128, 16, {{1, 20, 12, {9, 8, 7, 6, 5, 4, 3}}, {0, 31, 1, {2, 1, 0}}}});
  // ratio 128 (no overlap): the entry's 128 rows mostly from the ring.
  v.push_back({128, 512, 256, {{0, 120, 16, {1}}, {2, 250, 8, {0, 2}}}});
  // Verify sizes: 6 rows (main compressor), 96 rows (indexer's compressor; ratio 128 from ring + step).
  v.push_back({4, 512, 16, {{0, 37, 6, {5, 1, 9}}}});
  v.push_back({4, 128, 256, {{1, 200, 96, {2, 7}}}});
  v.push_back({128, 512, 256, {{2, 100, 96, {3, 4}}}});
  return v;
}

// The compressor of one layer as the tests lay it out: slot rings of R rows [kv | score + ape].
struct CompSetup {
  int ratio, R;
  int64_t d, C;
  bool overlap;
  int64_t slot_floats;
  std::vector<float> slot_state;  // [3 slots, R, 2C]
  std::vector<float> kv, gate, ape;  // [rows, C], [rows, C], [ratio, C]
};

CompSetup make_setup(const CompCase& c, int64_t rows, uint64_t seed) {
  CompSetup s;
  s.ratio = c.ratio;
  s.R = 2 * c.ratio + 3;
  s.d = c.d;
  s.overlap = c.ratio == 4;
  s.C = (s.overlap ? 2 : 1) * c.d;
  s.slot_floats = static_cast<int64_t>(s.R) * 2 * s.C;
  s.slot_state.resize(static_cast<size_t>(3 * s.slot_floats));
  // Ring rows: kv as the wkv GEMM gives it (fp32), scores with ape already added (fp32).
  for (int64_t i = 0; i < 3 * s.R; ++i) {
    std::vector<float> kvr = randn(static_cast<size_t>(s.C), seed + 2 * i, 1.0f, false);
    std::vector<float> sc = randn(static_cast<size_t>(s.C), seed + 2 * i + 1, 2.0f, false);
    std::copy(kvr.begin(), kvr.end(), s.slot_state.begin() + i * 2 * s.C);
    std::copy(sc.begin(), sc.end(), s.slot_state.begin() + i * 2 * s.C + s.C);
  }
  s.kv = randn(static_cast<size_t>(rows * s.C), seed + 100000, 1.0f, false);
  s.gate = randn(static_cast<size_t>(rows * s.C), seed + 100001, 2.0f, false);
  s.ape = randn(static_cast<size_t>(c.ratio * s.C), seed + 100002, 0.5f, false);
  return s;
}

// float64 pooled value of entry j, channel ch, and its bound (pool_ref_values).
template <class RowAt>
void pool_ref(RowAt&& row_at, int64_t j, const CompSetup& s, int64_t ch, double* want, double* bound) {
  const int r = s.ratio;
  std::vector<double> sc, kv;
  if (s.overlap && j > 0)
    for (int i = 0; i < r; ++i) {
      const float* row = row_at(r * (j - 1) + i);
      sc.push_back(row[s.C + ch]);
      kv.push_back(row[ch]);
    }
  for (int i = 0; i < r; ++i) {
    const float* row = row_at(r * j + i);
    const int64_t off = s.overlap ? s.d : 0;
    sc.push_back(row[s.C + off + ch]);
    kv.push_back(row[off + ch]);
  }
  pool_ref_values(sc, kv, want, bound);
}

TEST(CudaCompressor, RowsEntriesAndStoresMatchCpu) {
  uint64_t seed = 1;
  for (const CompCase& c : cases()) {
    DeviceStep st(c.seqs, c.bs);
    const int64_t rows = st.rows;
    const CompSetup s = make_setup(c, rows, seed);
    seed += 1000;
    SCOPED_TRACE(::testing::Message() << "ratio " << c.ratio << " d " << c.d << " rows " << rows << " seqs "
                                      << c.seqs.size());
    // ---- CPU: the rows of every sequence, then every entry the step completes ----
    std::vector<float> step_rows(static_cast<size_t>(rows * 2 * s.C));
    for (size_t q = 0; q < c.seqs.size(); ++q) {
      const int64_t r0 = st.seq_row0[q];
      model::compressor_rows(s.kv.data() + r0 * s.C, s.gate.data() + r0 * s.C, s.ape.data(), c.seqs[q].len, s.C,
                             c.ratio, c.seqs[q].start, step_rows.data() + r0 * 2 * s.C);
    }
    std::vector<float> want_entry(static_cast<size_t>(rows * s.d), 0.0f);
    std::vector<double> ref(want_entry.size(), 0.0), bound(want_entry.size(), 0.0);
    std::vector<int32_t> want_flag(static_cast<size_t>(rows), 0);
    std::vector<int64_t> want_pos(static_cast<size_t>(rows), 0);
    std::vector<float> gather;
    for (int64_t t = 0; t < rows; ++t) {
      const int q = st.row_seq[t];
      const int64_t p = st.positions[t], start = c.seqs[q].start;
      if ((p + 1) % c.ratio) continue;
      const int64_t j = (p + 1) / c.ratio - 1;
      want_flag[t] = 1;
      want_pos[t] = c.ratio * j;
      auto row_at = [&](int64_t pos) -> const float* {
        if (pos >= start) return step_rows.data() + (st.seq_row0[q] + (pos - start)) * 2 * s.C;
        return s.slot_state.data() + c.seqs[q].slot * s.slot_floats + (pos % s.R) * 2 * s.C;
      };
      model::pool_entry(row_at, j, c.ratio, s.d, s.C, s.overlap, gather, want_entry.data() + t * s.d);
      for (int64_t ch = 0; ch < s.d; ++ch) pool_ref(row_at, j, s, ch, &ref[t * s.d + ch], &bound[t * s.d + ch]);
    }
    // The oracle against the reference (this also checks the reference and its bound).
    EXPECT_TRUE(correctly_rounded(want_entry.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, bound.data()))
        << "the CPU's pooled entries";

    // ---- store_entries: records of the flagged rows into the pool ----
    const int64_t rec_bytes = 72, pool_off = 40, per_block = c.bs / c.ratio;
    const int64_t block_bytes = pool_off + per_block * rec_bytes + 24, nblocks = 12;
    std::vector<uint8_t> rec(static_cast<size_t>(rows * rec_bytes)), pool(static_cast<size_t>(nblocks * block_bytes));
    for (size_t i = 0; i < rec.size(); ++i) rec[i] = static_cast<uint8_t>(mix64(seed + i));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(mix64(seed * 3 + i));
    std::vector<uint8_t> want_pool = pool;
    for (int64_t t = 0; t < rows; ++t) {
      if (!want_flag[t]) continue;
      const int q = st.row_seq[t];
      const int64_t pos = want_pos[t];
      const int32_t blk = c.seqs[q].blocks[pos / c.bs];
      std::memcpy(&want_pool[blk * block_bytes + pool_off + ((pos % c.bs) / c.ratio) * rec_bytes],
                  &rec[t * rec_bytes], static_cast<size_t>(rec_bytes));
    }
    if (!have_gpu()) continue;

    st.upload();
    DeviceBuffer<float> dkv = to_dev(s.kv), dgate = to_dev(s.gate), dape = to_dev(s.ape);
    auto drows = poisoned<float>(step_rows.size());
    cuda_model::comp_rows_build(CompRowsArgs{dkv.get(), dgate.get(), dape.get(), st.meta, rows, s.C, c.ratio,
                                             drows.get()},
                                kStream);
    EXPECT_TRUE(same_bits(to_host(drows), step_rows)) << "comp_rows_build";

    DeviceBuffer<float> dstep = to_dev(step_rows);
    DeviceBuffer<uint8_t> dslots = to_dev(std::vector<uint8_t>(
        reinterpret_cast<const uint8_t*>(s.slot_state.data()),
        reinterpret_cast<const uint8_t*>(s.slot_state.data() + s.slot_state.size())));
    auto dentry = poisoned<float>(want_entry.size());
    auto dpos = poisoned<int64_t>(want_pos.size());
    auto dflag = poisoned<int32_t>(want_flag.size());
    CompressArgs ca;
    ca.step_rows = dstep.get();
    ca.slot_state = dslots.get();
    ca.slot_bytes = s.slot_floats * static_cast<int64_t>(sizeof(float));
    ca.ring_off = 0;
    ca.ring = s.R;
    ca.chans = s.C;
    ca.ratio = c.ratio;
    ca.d = s.d;
    ca.overlap = s.overlap;
    ca.m = st.meta;
    ca.rows = rows;
    ca.entry = dentry.get();
    ca.entry_pos = dpos.get();
    ca.flag = dflag.get();
    cuda_model::compress_entries(ca, kStream);
    const std::vector<float> got = to_host(dentry);
    EXPECT_TRUE(same_values(to_host(dflag), want_flag)) << "flags";
    EXPECT_TRUE(same_values(to_host(dpos), want_pos)) << "entry positions";
    EXPECT_TRUE(correctly_rounded(got.data(), ref.data(), ref.size(), Stored::kBf16, 0.0, bound.data()))
        << "compress_entries";
    size_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += num::f32_bits(got[i]) == num::f32_bits(want_entry[i]);
    std::printf("[cuda compress_entries] ratio %d d %lld: %zu of %zu values bit-equal to the CPU's\n", c.ratio,
                static_cast<long long>(c.d), same, got.size());

    // ---- compress_step: comp_rows_build + compress_entries in one launch, bit for bit ----
    {
      auto frows = poisoned<float>(step_rows.size());
      auto fentry = poisoned<float>(want_entry.size());
      auto fpos = poisoned<int64_t>(want_pos.size());
      auto fflag = poisoned<int32_t>(want_flag.size());
      CompressArgs fa = ca;
      fa.step_rows = nullptr;  // the fused kernel reads this step's rows from kv, gate and ape
      fa.entry = fentry.get();
      fa.entry_pos = fpos.get();
      fa.flag = fflag.get();
      cuda_model::compress_step(
          CompRowsArgs{dkv.get(), dgate.get(), dape.get(), st.meta, rows, s.C, c.ratio, frows.get()}, fa, kStream);
      EXPECT_TRUE(same_bits(to_host(frows), to_host(drows))) << "compress_step's rows vs comp_rows_build";
      EXPECT_TRUE(same_bits(to_host(fentry), got)) << "compress_step's entries vs compress_entries (element = row * "
                                                   << s.d << " + channel)";
      EXPECT_TRUE(same_values(to_host(fflag), want_flag)) << "compress_step's flags";
      EXPECT_TRUE(same_values(to_host(fpos), want_pos)) << "compress_step's entry positions";
    }

    DeviceBuffer<uint8_t> drec = to_dev(rec), dpool = to_dev(pool);
    DeviceBuffer<int32_t> dwflag = to_dev(want_flag);
    DeviceBuffer<int64_t> dwpos = to_dev(want_pos);
    cuda_model::store_entries(StoreEntriesArgs{drec.get(), rec_bytes, dwflag.get(), dwpos.get(), st.meta, rows,
                                               c.ratio, dpool.get(), block_bytes, pool_off},
                              kStream);
    EXPECT_TRUE(same_values(to_host(dpool), want_pool, static_cast<size_t>(block_bytes))) << "store_entries";

    // ---- the forward's compressor tail: norm_rope with the store (NormRopeArgs::pool) == norm_rope,
    // then store_entries of its records: the same entries, records and pool bytes ----
    {
      const bool rotate = c.d == 128;  // the indexer's compressor: Hadamard + index key records
      std::vector<float> inv(32), knorm = randn(static_cast<size_t>(c.d), seed + 7, 0.2f, true);
      for (int i = 0; i < 32; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / 64));
      for (float& w : knorm) w = num::round_bf16(1.0f + w);
      DeviceBuffer<float> dinv = to_dev(inv), dknorm = to_dev(knorm);
      for (KvRecordKind kind : {KvRecordKind::kFp8, KvRecordKind::kNvfp4}) {
        if (rotate && kind != KvRecordKind::kFp8) continue;  // one key layout
        const KvRecordLayout kvl = KvRecordLayout::make(kind, c.d, 64);
        const IndexKeyLayout kl = IndexKeyLayout::make(c.d);
        const int64_t rb = rotate ? kl.bytes : kvl.bytes, bb = pool_off + per_block * rb + 24;
        std::vector<uint8_t> pool0(static_cast<size_t>(nblocks * bb));
        for (size_t i = 0; i < pool0.size(); ++i) pool0[i] = static_cast<uint8_t>(mix64(seed * 5 + i));
        DeviceBuffer<float> x_ref = to_dev(got), x_got = to_dev(got);  // compress_entries' entries
        auto rec_ref = poisoned<uint8_t>(static_cast<size_t>(rows * rb));
        auto rec_got = poisoned<uint8_t>(static_cast<size_t>(rows * rb));
        DeviceBuffer<uint8_t> pool_ref = to_dev(pool0), pool_got = to_dev(pool0);
        cuda_model::NormRopeArgs nr;
        nr.k_dim = static_cast<int>(c.d);
        nr.k_norm = dknorm.get();
        nr.rotate = rotate;
        nr.rec = kvl;
        nr.key = kl;
        nr.positions = dpos.get();  // compress_entries' entry positions
        nr.inv_freq = dinv.get();
        nr.rope_dim = 64;
        nr.tokens = rows;
        nr.k = x_ref.get();
        nr.records = rec_ref.get();
        cuda_model::norm_rope(nr, kStream);
        cuda_model::store_entries(StoreEntriesArgs{rec_ref.get(), rb, dflag.get(), dpos.get(), st.meta, rows, c.ratio,
                                                   pool_ref.get(), bb, pool_off},
                                  kStream);
        nr.k = x_got.get();
        nr.records = rec_got.get();
        nr.store_flag = dflag.get();
        nr.m = st.meta;
        nr.ratio = c.ratio;
        nr.pool = pool_got.get();
        nr.block_bytes = bb;
        nr.pool_off = pool_off;
        cuda_model::norm_rope(nr, kStream);
        const char* what = rotate ? "index keys" : kind_name(kind);
        EXPECT_TRUE(same_bits(to_host(x_got), to_host(x_ref))) << "norm_rope + store: entries (" << what << ")";
        EXPECT_TRUE(same_values(to_host(rec_got), to_host(rec_ref), static_cast<size_t>(rb)))
            << "norm_rope + store: records (" << what << ", record = row)";
        EXPECT_TRUE(same_values(to_host(pool_got), to_host(pool_ref), static_cast<size_t>(bb)))
            << "norm_rope + store vs norm_rope then store_entries: the pool (" << what << ", record = block)";
      }
    }
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
