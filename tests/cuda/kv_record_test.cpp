// The KV record encoders (src/model/cuda/kv_record.cu) against the CPU: every record byte for byte
// with the CPU encoder (cpu::act_quant_fp8's codes and scales, num::quantize_nvfp4, bf16), every
// rewritten value bit for bit with the CPU model's round trip (kv_nope / fp4_rows), for the fp8
// (584-byte), nvfp4 (384-byte) and bf16 (1024-byte) records at head_dim 512 and a small head, and
// the FP4 index keys (68 bytes at dim 128). Inputs: bf16 normals at several scales, rows below the
// amax floors, NaN and inf in the NoPE dims. Also the decoder: a record decodes to the CPU's values.
#include <limits>

#include "cuda/model_kernel_util.h"
#include "model/cuda/kv_record.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::IndexKeyQuantizeArgs;
using cuda_model::KvQuantizeArgs;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows of a KV block: different magnitudes per row (the scales), a row under the fp8 amax floor
// (1e-4) and the nvfp4 zero-scale threshold, specials in the NoPE dims.
std::vector<float> kv_rows(int64_t rows, int64_t ldx, int head_dim, int nope, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * ldx), 0.0f);
  const float scales[] = {1.0f, 1e-3f, 30.0f, 1e-6f, 4000.0f, 0.2f};
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> v = randn(static_cast<size_t>(head_dim), seed + static_cast<uint64_t>(r), scales[r % 6], true);
    std::copy(v.begin(), v.end(), x.begin() + r * ldx);
    for (int64_t d = head_dim; d < ldx; ++d) x[r * ldx + d] = 7.0f;  // the stride's gap: must stay untouched
  }
  if (rows > 2) {
    x[2 * ldx + 5] = kNan;
    x[2 * ldx + nope - 3] = -kInf;
  }
  if (rows > 5) x[5 * ldx + 17] = kInf;
  return x;
}

TEST(CudaKvRecord, EncodesAsTheCpuByteForByte) {
  struct C {
    KvRecordKind kind;
    int head_dim, rope_dim;
    int64_t rows, ldx;
  };
  const C cases[] = {
      {KvRecordKind::kFp8, 512, 64, 6, 512},    {KvRecordKind::kNvfp4, 512, 64, 6, 512},
      {KvRecordKind::kBf16, 512, 64, 6, 512},   {KvRecordKind::kFp8, 512, 64, 13, 520},
      {KvRecordKind::kNvfp4, 512, 64, 13, 516}, {KvRecordKind::kFp8, 128, 64, 7, 128},
      {KvRecordKind::kNvfp4, 128, 64, 7, 130},  {KvRecordKind::kBf16, 128, 64, 3, 128},
  };
  uint64_t seed = 1;
  for (const C& c : cases) {
    const KvRecordLayout l = KvRecordLayout::make(c.kind, c.head_dim, c.rope_dim);
    SCOPED_TRACE(::testing::Message() << kind_name(c.kind) << " head_dim " << c.head_dim << " rows " << c.rows
                                      << " ldx " << c.ldx << " (" << l.bytes << "-byte records)");
    if (c.head_dim == 512) {
      EXPECT_EQ(l.bytes, c.kind == KvRecordKind::kFp8 ? 584 : c.kind == KvRecordKind::kNvfp4 ? 384 : 1024);
    }
    const std::vector<float> x = kv_rows(c.rows, c.ldx, c.head_dim, l.nope, seed);
    seed += 100;
    // The CPU: the model's round trip in place, the records from the CPU quantizers.
    std::vector<float> want_x = x;
    std::vector<uint8_t> want_rec;
    for (int64_t r = 0; r < c.rows; ++r) {
      kv_round_trip(want_x.data() + r * c.ldx, l);
      const std::vector<uint8_t> rec = encode_kv_record(x.data() + r * c.ldx, l);
      want_rec.insert(want_rec.end(), rec.begin(), rec.end());
      // The decoder gives the CPU's cached values (NaN has no FP4 code and becomes 0).
      std::vector<float> dec = decode_kv_record(rec.data(), l);
      std::vector<float> cpu(want_x.begin() + r * c.ldx, want_x.begin() + r * c.ldx + c.head_dim);
      if (c.kind == KvRecordKind::kNvfp4)
        for (auto& v : cpu)
          if (std::isnan(v)) v = 0.0f;
      EXPECT_TRUE(same_bits(dec, cpu)) << "decoded record " << r;
    }
    if (!have_gpu()) continue;
    DeviceBuffer<float> dx = to_dev(x);
    auto drec = poisoned<uint8_t>(want_rec.size());
    cuda_model::kv_quantize(KvQuantizeArgs{dx.get(), c.rows, c.ldx, l, drec.get()}, kStream);
    EXPECT_TRUE(same_values(to_host(drec), want_rec, static_cast<size_t>(l.bytes)));
    EXPECT_TRUE(same_bits(to_host(dx), want_x));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaKvRecord, IndexKeysEncodeAsTheCpuByteForByte) {
  uint64_t seed = 500;
  for (auto [rows, dim] : {std::pair<int64_t, int>{9, 128}, {4, 64}, {1, 128}}) {
    const IndexKeyLayout l = IndexKeyLayout::make(dim);
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " dim " << dim << " (" << l.bytes << "-byte keys)");
    if (dim == 128) {
      EXPECT_EQ(l.bytes, 68);
    }
    std::vector<float> x = kv_rows(rows, dim, dim, dim, seed);
    seed += 100;
    if (rows > 3) x[3 * dim + 40] = kNan;  // next to the -inf / +inf of kv_rows
    std::vector<float> want_x = x;
    std::vector<uint8_t> want_rec;
    for (int64_t r = 0; r < rows; ++r) {
      index_key_round_trip(want_x.data() + r * dim, dim);
      const std::vector<uint8_t> rec = encode_index_key(x.data() + r * dim, l);
      want_rec.insert(want_rec.end(), rec.begin(), rec.end());
    }
    if (!have_gpu()) continue;
    DeviceBuffer<float> dx = to_dev(x);
    auto drec = poisoned<uint8_t>(want_rec.size());
    cuda_model::index_key_quantize(IndexKeyQuantizeArgs{dx.get(), rows, l, drec.get()}, kStream);
    EXPECT_TRUE(same_values(to_host(drec), want_rec, static_cast<size_t>(l.bytes)));
    EXPECT_TRUE(same_bits(to_host(dx), want_x));
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
