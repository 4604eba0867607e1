// The slot-ring writes (src/model/cuda/ring.cu) byte for byte against the CPU forward's commits:
// after a layer, rows t >= len - ring of each sequence go to ring row (start + t) % ring of its slot
// (DsV4Model::Impl::attention_target's commit loops), and the DSpark context rows [first, n) go to
// ring row (pos0 + t) % ring (project_draft_context). Steps longer than the ring, several
// sequences, wrap-around; every other byte of the slot state must stay as it was.
#include "cuda/model_kernel_util.h"
#include "model/cuda/ring.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::RingCommitArgs;
using cuda_model::RingWriteArgs;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(mix64(seed + i) >> 24);
  return v;
}

TEST(CudaRing, CommitMatchesCpuByteForByte) {
  struct C {
    int ring;
    int64_t bpr;  // bytes per row (a KV record, or 2 * chans floats of a compressor row)
    std::vector<SeqPlan> seqs;
  };
  const C cases[] = {
      {133, 584, {{0, 0, 7, {}}, {3, 300, 1, {}}, {1, 128, 5, {}}}},      // window ring, decode + prefill rows
      {133, 384, {{2, 10, 200, {}}, {0, 5000, 3, {}}}},                  // a step longer than the ring
      {11, 2 * 1024 * 4, {{1, 6, 9, {}}, {3, 40, 2, {}}, {0, 0, 11, {}}}},  // compressor rows, len == ring
  };
  uint64_t seed = 1;
  for (const C& c : cases) {
    DeviceStep st(c.seqs, 256);
    const int64_t rows = st.rows, ring_off = 96, slot_bytes = ring_off + c.ring * c.bpr + 40, slots = 4;
    SCOPED_TRACE(::testing::Message() << "ring " << c.ring << " bytes per row " << c.bpr << " rows " << rows);
    const std::vector<uint8_t> src = random_bytes(static_cast<size_t>(rows * c.bpr), seed);
    const std::vector<uint8_t> state = random_bytes(static_cast<size_t>(slots * slot_bytes), seed + 7777777);
    seed += 100;
    std::vector<uint8_t> want = state;
    for (size_t q = 0; q < c.seqs.size(); ++q) {
      const SeqPlan& sp = c.seqs[q];
      uint8_t* st_base = want.data() + sp.slot * slot_bytes + ring_off;
      for (int64_t t = std::max<int64_t>(0, sp.len - c.ring); t < sp.len; ++t)
        std::memcpy(st_base + ((sp.start + t) % c.ring) * c.bpr, src.data() + (st.seq_row0[q] + t) * c.bpr,
                    static_cast<size_t>(c.bpr));
    }
    if (!have_gpu()) continue;
    st.upload();
    DeviceBuffer<uint8_t> dsrc = to_dev(src), dstate = to_dev(state);
    cuda_model::ring_commit(RingCommitArgs{dsrc.get(), c.bpr, st.meta, rows, dstate.get(), slot_bytes, ring_off, c.ring},
                            kStream);
    EXPECT_TRUE(same_values(to_host(dstate), want, static_cast<size_t>(c.bpr)));
  }
  TANDEM_REQUIRE_GPU();
}

// The layer's commits in one launch (ring_commit_batch): three rings of one slot state with
// different row sizes and offsets, laid out so that each takes another copy word (16-, 8-, 4- and
// 1-byte), against the CPU's commit loops; every other byte of the slot state stays as it was.
TEST(CudaRing, BatchMatchesCpuByteForByteAtEveryWordSize) {
  struct R {
    int ring;
    int64_t bpr, off;  // bytes per row, offset in the slot
  };
  struct C {
    int64_t slot_bytes;
    std::vector<R> rings;
  };
  const std::vector<SeqPlan> seqs = {{0, 0, 7, {}}, {3, 300, 1, {}}, {1, 128, 5, {}}, {2, 10, 140, {}}};
  const C cases[] = {
      {200000, {{133, 592, 16}, {11, 8192, 80000}, {6, 2048, 180000}}},  // 16-byte words
      {200008, {{133, 584, 8}, {11, 8192, 80000}, {6, 2048, 180000}}},   // 8: the fp8 record's 584 bytes
      {200004, {{133, 100, 4}, {11, 4096, 80000}, {6, 2048, 180000}}},   // 4
      {200001, {{133, 37, 3}, {11, 4096, 80001}, {6, 1000, 180000}}},    // bytes
  };
  uint64_t seed = 900;
  for (const C& c : cases) {
    DeviceStep st(seqs, 256);
    const int64_t rows = st.rows, slots = 4;
    SCOPED_TRACE(::testing::Message() << "slot bytes " << c.slot_bytes);
    const std::vector<uint8_t> state = random_bytes(static_cast<size_t>(slots * c.slot_bytes), seed + 7777777);
    std::vector<uint8_t> want = state;
    std::vector<std::vector<uint8_t>> srcs;
    for (const R& r : c.rings) {
      srcs.push_back(random_bytes(static_cast<size_t>(rows * r.bpr), seed++));
      for (size_t q = 0; q < seqs.size(); ++q) {
        const SeqPlan& sp = seqs[q];
        uint8_t* base = want.data() + sp.slot * c.slot_bytes + r.off;
        for (int64_t t = std::max<int64_t>(0, sp.len - r.ring); t < sp.len; ++t)
          std::memcpy(base + ((sp.start + t) % r.ring) * r.bpr, srcs.back().data() + (st.seq_row0[q] + t) * r.bpr,
                      static_cast<size_t>(r.bpr));
      }
    }
    if (!have_gpu()) continue;
    st.upload();
    DeviceBuffer<uint8_t> dstate = to_dev(state);
    std::vector<DeviceBuffer<uint8_t>> dsrc;
    std::vector<RingCommitArgs> args;
    for (size_t i = 0; i < c.rings.size(); ++i) {
      dsrc.push_back(to_dev(srcs[i]));
      const R& r = c.rings[i];
      args.push_back(
          RingCommitArgs{dsrc.back().get(), r.bpr, st.meta, rows, dstate.get(), c.slot_bytes, r.off, r.ring});
    }
    cuda_model::ring_commit_batch(args.data(), static_cast<int>(args.size()), kStream);
    EXPECT_TRUE(same_values(to_host(dstate), want, 64));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaRing, WriteMatchesCpuByteForByte) {
  struct C {
    int ring;
    int64_t bpr, first, n, pos0;
  };
  // At most `ring` rows per call, as the runner passes them (it skips the rows a later one overwrites).
  const C cases[] = {{128, 584, 0, 5, 0}, {128, 384, 72, 200, 77}, {128, 1024, 100, 200, 1000}, {5, 200, 4, 9, 3}};
  uint64_t seed = 50;
  for (const C& c : cases) {
    SCOPED_TRACE(::testing::Message() << "ring " << c.ring << " rows [" << c.first << ", " << c.n << ") pos0 " << c.pos0);
    const std::vector<uint8_t> src = random_bytes(static_cast<size_t>(c.n * c.bpr), seed);
    const std::vector<uint8_t> ring = random_bytes(static_cast<size_t>(c.ring * c.bpr), seed + 99999);
    seed += 100;
    std::vector<uint8_t> want = ring;
    for (int64_t t = c.first; t < c.n; ++t)
      std::memcpy(want.data() + ((c.pos0 + t) % c.ring) * c.bpr, src.data() + t * c.bpr, static_cast<size_t>(c.bpr));
    if (!have_gpu()) continue;
    DeviceBuffer<uint8_t> dsrc = to_dev(src), dring = to_dev(ring);
    cuda_model::ring_write(RingWriteArgs{dsrc.get(), c.bpr, c.first, c.n, c.pos0, dring.get(), c.ring}, kStream);
    EXPECT_TRUE(same_values(to_host(dring), want, static_cast<size_t>(c.bpr)));
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
