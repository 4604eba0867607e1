// norm_rope (src/model/cuda/norm_rope.cu), the attention's row finishing in one kernel, against the
// launches it replaces, bit for bit: q's per-head rms_norm (bf16 chain) and rope, the indexer
// queries' rope, hadamard and fp4_act_quant, kv's rms_norm (kv_norm, rounded) and rope, kv_quantize
// (the layer's q/kv, fp8 / nvfp4 / bf16 records); and the
// compressors' entries: rms_norm, rope, then kv_quantize (the main compressor) or hadamard +
// index_key_quantize (the indexer's). Every output is compared: q, the key rows' round trip, the
// records byte for byte. Inputs: bf16 normals at several scales per row, positions up to ~1M, YaRN
// frequencies, a NaN in one key row (its row is NaN / NaN-coded on both sides). Every kernel choice
// (decode, prefill) runs on fresh inputs and is compared with the sequence and with the decode kernel.
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda/model_kernel_util.h"
#include "model/cuda/norm_rope.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::NormRopeArgs;

// Rows of `dim` values, bf16, with a different scale per row.
std::vector<float> scaled_rows(int64_t rows, int64_t dim, uint64_t seed) {
  const float scales[] = {1.0f, 0.01f, 30.0f, 3e-4f, 400.0f, 0.2f, 7.0f};
  std::vector<float> x;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = randn(static_cast<size_t>(dim), seed + static_cast<uint64_t>(r), scales[r % 7], true);
    x.insert(x.end(), v.begin(), v.end());
  }
  return x;
}

std::vector<float> yarn_inv_freq(int rope_dim) {
  std::vector<float> inv(static_cast<size_t>(rope_dim / 2));
  RopeFreqParams fp;
  fp.inv_freq = inv.data();
  fp.rope_dim = rope_dim;
  fp.base = 10000.0;
  fp.original_seq_len = 65536;
  fp.factor = 16.0;
  rope_inv_freq(fp);
  return inv;
}

struct Case {
  int64_t tokens;
  int64_t heads;  // 0: key rows only (a compressor's entries)
  int dim;        // q_dim and k_dim
  bool keys;
  bool rotate;    // keys: Hadamard + index key record, else the KV record of `kind`
  KvRecordKind kind;
  int64_t iheads = 0;  // the indexer's query heads, idim wide
  int idim = 128;
};

TEST(CudaNormRope, EqualsTheOpSequence) {
  const Case cases[] = {
      // the layer's q and kv (model shape: 512-wide heads, 64 RoPE dims; TP=2 ranks hold 32 heads)
      {1, 64, 512, true, false, KvRecordKind::kFp8},
      {1, 32, 512, true, false, KvRecordKind::kFp8, 32},  // a CSA layer: the indexer's 64 heads / 2 ranks
      {1, 64, 512, true, false, KvRecordKind::kFp8, 64},
      {5, 3, 512, true, false, KvRecordKind::kNvfp4, 2},
      {3, 2, 512, true, false, KvRecordKind::kBf16, 5, 64},
      {2, 0, 512, false, false, KvRecordKind::kFp8, 3},  // indexer query heads only
      {5, 3, 512, true, false, KvRecordKind::kNvfp4},
      {7, 2, 512, true, false, KvRecordKind::kBf16},
      {2, 4, 128, true, false, KvRecordKind::kFp8},
      {3, 5, 512, false, false, KvRecordKind::kFp8},  // query heads only
      // a prefill row count (>= kNormRopePrefillTokens): choice 0 takes the prefill kernels, as the
      // model's q_and_kv does, with the key rows (and a NaN key row) in the same call
      {130, 4, 512, true, false, KvRecordKind::kFp8, 3},
      // the main compressor's entries (KV records) and the indexer's (Hadamard, FP4 keys)
      {1, 0, 512, true, false, KvRecordKind::kFp8},
      {6, 0, 512, true, false, KvRecordKind::kNvfp4},
      {1, 0, 128, true, true, KvRecordKind::kFp8},
      {9, 0, 128, true, true, KvRecordKind::kFp8},
      {4, 0, 64, true, true, KvRecordKind::kFp8},
  };
  const int rope_dim = 64;
  const float eps = 1e-6f;
  const std::vector<float> inv = yarn_inv_freq(rope_dim);
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const KvRecordLayout rec = KvRecordLayout::make(c.kind, c.dim, rope_dim);
    const IndexKeyLayout key = IndexKeyLayout::make(c.dim);
    const int64_t rec_bytes = c.rotate ? key.bytes : rec.bytes;
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << " dim " << c.dim
                                      << (c.keys ? (c.rotate ? " + index keys" : " + KV records ") : " (no keys)")
                                      << (c.keys && !c.rotate ? kind_name(c.kind) : "") << " indexer heads "
                                      << c.iheads << " x " << c.idim);
    const int64_t T = c.tokens, H = c.heads, D = c.dim, IH = c.iheads, ID = c.idim;
    const std::vector<float> q = scaled_rows(T * H, D, seed);
    seed += 1000;
    const std::vector<float> iq = scaled_rows(T * IH, ID, seed + 500);
    std::vector<float> k = scaled_rows(T, D, seed);
    seed += 1000;
    if (T > 2) k[2 * D + 11] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN throughout after the norm
    const std::vector<float> w = randn(static_cast<size_t>(D), seed++, 0.5f, true);
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[t] = (t * 7919 * 131 + 17) % 1000003;
    if (!have_gpu()) continue;

    DeviceBuffer<float> dw = to_dev(w), dinv = to_dev(inv);
    DeviceBuffer<int64_t> dpos = to_dev(pos);
    // The op sequence.
    DeviceBuffer<float> q0 = to_dev(q), k0 = to_dev(k), iq0 = to_dev(iq);
    auto r0 = poisoned<uint8_t>(static_cast<size_t>(T * rec_bytes));
    auto sequence = [&] {
      if (H > 0) {
        RmsNormParams hn;
        hn.x = q0.get();
        hn.y = q0.get();
        hn.rows = T * H;
        hn.dim = D;
        hn.eps = eps;
        hn.mode = RmsNormMode::kBf16Chain;
        cuda::rms_norm(hn, kStream);
        RopeParams rp;
        rp.x = q0.get();
        rp.positions = dpos.get();
        rp.inv_freq = dinv.get();
        rp.tokens = T;
        rp.heads = H;
        rp.head_stride = D;
        rp.rope_offset = D - rope_dim;
        rp.rope_dim = rope_dim;
        rp.round_bf16 = true;
        cuda::rope(rp, kStream);
      }
      if (IH > 0) {  // as attention_target's indexer: rope, hadamard, fp4_act_quant
        RopeParams rp;
        rp.x = iq0.get();
        rp.positions = dpos.get();
        rp.inv_freq = dinv.get();
        rp.tokens = T;
        rp.heads = IH;
        rp.head_stride = ID;
        rp.rope_offset = ID - rope_dim;
        rp.rope_dim = rope_dim;
        rp.round_bf16 = true;
        cuda::rope(rp, kStream);
        HadamardParams hp;
        hp.x = iq0.get();
        hp.rows = T * IH;
        hp.n = ID;
        hp.ldx = ID;
        hp.round_bf16 = true;
        cuda::hadamard(hp, kStream);
        Fp4ActQuantParams fq;
        fq.x = iq0.get();
        fq.rows = T * IH;
        fq.cols = ID;
        fq.ldx = ID;
        fq.block = 32;
        cuda::fp4_act_quant(fq, kStream);
      }
      if (!c.keys) return;
      RmsNormParams kn;
      kn.x = k0.get();
      kn.y = k0.get();
      kn.weight = dw.get();
      kn.rows = T;
      kn.dim = D;
      kn.eps = eps;
      kn.round_bf16 = true;
      cuda::rms_norm(kn, kStream);
      RopeParams rp;
      rp.x = k0.get();
      rp.positions = dpos.get();
      rp.inv_freq = dinv.get();
      rp.tokens = T;
      rp.heads = 1;
      rp.head_stride = D;
      rp.rope_offset = D - rope_dim;
      rp.rope_dim = rope_dim;
      rp.round_bf16 = true;
      cuda::rope(rp, kStream);
      if (c.rotate) {
        HadamardParams hp;
        hp.x = k0.get();
        hp.rows = T;
        hp.n = D;
        hp.ldx = D;
        hp.round_bf16 = true;
        cuda::hadamard(hp, kStream);
        cuda_model::index_key_quantize({k0.get(), T, key, r0.get()}, kStream);
      } else {
        cuda_model::kv_quantize({k0.get(), T, D, rec, r0.get()}, kStream);
      }
    };
    // The fused kernel.
    DeviceBuffer<float> q1 = to_dev(q), k1 = to_dev(k), iq1 = to_dev(iq);
    auto r1 = poisoned<uint8_t>(static_cast<size_t>(T * rec_bytes));
    int rpb = 0;  // NormRopeArgs::rows_per_block
    auto fused = [&] {
      NormRopeArgs a;
      a.q = H > 0 ? q1.get() : nullptr;
      a.heads = H;
      a.q_dim = D;
      a.iq = IH > 0 ? iq1.get() : nullptr;
      a.iheads = IH;
      a.iq_dim = static_cast<int>(ID);
      a.k = c.keys ? k1.get() : nullptr;
      a.k_dim = D;
      a.k_norm = dw.get();
      a.rotate = c.rotate;
      a.rec = rec;
      a.key = key;
      a.records = r1.get();
      a.positions = dpos.get();
      a.inv_freq = dinv.get();
      a.rope_dim = rope_dim;
      a.tokens = T;
      a.eps = eps;
      a.rows_per_block = rpb;
      cuda_model::norm_rope(a, kStream);
    };
    // Every side runs on fresh copies of the inputs: both rewrite their buffers in place, so a rerun
    // (median_us below) would apply them twice. The expected outputs are read back once, before any
    // timing, and the timing runs last.
    struct Outputs {
      std::vector<float> q, iq, k;
      std::vector<uint8_t> rec;
    };
    auto run_fresh = [&](DeviceBuffer<float>& dq, DeviceBuffer<float>& dk, DeviceBuffer<float>& diq,
                         DeviceBuffer<uint8_t>& dr, const auto& launch) {
      upload(dq, q);
      upload(dk, k);
      upload(diq, iq);
      poison(dr);
      launch();
      return Outputs{to_host(dq), to_host(diq), to_host(dk), to_host(dr)};
    };
    const Outputs want = run_fresh(q0, k0, iq0, r0, sequence);
    // The sequence did its work (a test of two no-ops would pass): every row was rewritten.
    size_t q_changed = 0, iq_changed = 0, k_changed = 0;
    for (int64_t r = 0; r < T * H; ++r)
      q_changed += std::memcmp(want.q.data() + r * D, q.data() + r * D, sizeof(float) * D) != 0;
    for (int64_t r = 0; r < T * IH; ++r)
      iq_changed += std::memcmp(want.iq.data() + r * ID, iq.data() + r * ID, sizeof(float) * ID) != 0;
    for (int64_t r = 0; r < T; ++r)
      k_changed += std::memcmp(want.k.data() + r * D, k.data() + r * D, sizeof(float) * D) != 0;
    EXPECT_EQ(q_changed, static_cast<size_t>(T * H)) << "q rows rewritten by the sequence";
    EXPECT_EQ(iq_changed, static_cast<size_t>(T * IH)) << "indexer q rows rewritten by the sequence";
    if (c.keys) {
      EXPECT_EQ(k_changed, static_cast<size_t>(T)) << "key rows rewritten by the sequence";
    }
    // Every kernel choice: the decode kernel (1), by the row count (0: the decode kernel below
    // kNormRopePrefillTokens rows, the prefill kernels from there), and the prefill kernels with 2 and
    // 16 query heads per block (blocks spanning tokens, ragged last blocks) beside the decode kernel's
    // key rows in the same call. Each is compared with the sequence and with the decode kernel on the
    // same inputs: a prefill kernel that differs from both is wrong; one that equals the decode
    // kernel while both differ from the sequence points at the sequence's outputs (the expected side).
    Outputs decode;
    for (const int choice : {1, 0, 2, 16}) {
      SCOPED_TRACE(::testing::Message() << "rows_per_block " << choice);
      rpb = choice;
      const Outputs got = run_fresh(q1, k1, iq1, r1, fused);
      EXPECT_TRUE(same_bits(got.q, want.q)) << "q (index / " << D << " = token * heads + head): fused vs rms_norm + rope";
      EXPECT_TRUE(same_bits(got.iq, want.iq)) << "indexer q (index / " << ID
                                              << " = token * iheads + head): fused vs rope + hadamard + fp4_act_quant";
      EXPECT_TRUE(same_bits(got.k, want.k)) << "key rows (index / " << D << " = token): fused vs the sequence";
      EXPECT_TRUE(same_values(got.rec, want.rec, static_cast<size_t>(rec_bytes))) << "records: fused vs the sequence";
      if (choice == 1) {
        decode = got;
      } else {
        EXPECT_TRUE(same_bits(got.q, decode.q)) << "q: this choice vs the decode kernel";
        EXPECT_TRUE(same_bits(got.iq, decode.iq)) << "indexer q: this choice vs the decode kernel";
        EXPECT_TRUE(same_bits(got.k, decode.k)) << "key rows: this choice vs the decode kernel";
        EXPECT_TRUE(same_values(got.rec, decode.rec, static_cast<size_t>(rec_bytes)))
            << "records: this choice vs the decode kernel";
      }
      if (T > 2 && c.keys) {
        size_t nan = 0;
        for (int64_t d = 0; d < D; ++d) nan += std::isnan(got.k[2 * D + d]);
        EXPECT_EQ(nan, static_cast<size_t>(D)) << "the NaN key row: NaN throughout";
      }
    }
    // Last: median_us reruns both sides in place on outputs nothing reads any more.
    if (T == 1 && D == 512 && H > 0) {
      rpb = 0;
      std::printf("[cuda perf] norm_rope tokens %lld heads %lld indexer heads %lld: fused %.1f us, the %d-launch "
                  "sequence %.1f us\n",
                  static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(IH), median_us(fused),
                  2 + (c.keys ? 3 : 0) + (IH > 0 ? 3 : 0), median_us(sequence));
    }
  }
  TANDEM_REQUIRE_GPU();
}

// The prefill kernels at prefill row counts against the decode kernel (EqualsTheOpSequence ties
// that one to the ops), bit for bit: the model's rank shapes (32 heads of 512, 32 indexer heads of
// 128) at 1, 97 and 4,096 tokens, and odd shapes whose blocks span tokens with ragged tails (3 heads
// of 128, indexer heads of 64 and 256). A NaN in one query row and one indexer row stays in its row.
TEST(CudaNormRope, PrefillKernelsEqualTheDecodeKernel) {
  struct Shape {
    int64_t tokens, heads;
    int dim;
    int64_t iheads;
    int idim;
  };
  const Shape shapes[] = {{1, 32, 512, 32, 128}, {97, 32, 512, 32, 128}, {4096, 32, 512, 32, 128},
                          {131, 3, 128, 5, 64},  {200, 7, 256, 3, 256},  {129, 1, 512, 0, 128}};
  const int rope_dim = 64;
  const std::vector<float> inv = yarn_inv_freq(rope_dim);
  uint64_t seed = 7000;
  for (const Shape& c : shapes) {
    const int64_t T = c.tokens, H = c.heads, D = c.dim, IH = c.iheads, ID = c.idim;
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " heads " << H << " x " << D << " indexer heads " << IH
                                      << " x " << ID);
    std::vector<float> q = scaled_rows(T * H, D, seed), iq = scaled_rows(T * IH, ID, seed + 1000000);
    seed += 17;
    if (T * H > 5) q[5 * D + 3] = std::numeric_limits<float>::quiet_NaN();
    if (T * IH > 9) iq[9 * ID + 1] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[t] = (t * 7919 * 131 + 17) % 1000003;
    if (!have_gpu()) continue;
    DeviceBuffer<float> dinv = to_dev(inv);
    DeviceBuffer<int64_t> dpos = to_dev(pos);
    DeviceBuffer<float> q0 = to_dev(q), iq0 = to_dev(iq), q1 = to_dev(q), iq1 = to_dev(iq);
    auto run = [&](DeviceBuffer<float>& dq, DeviceBuffer<float>& diq, int rpb) {
      NormRopeArgs a;
      a.q = H > 0 ? dq.get() : nullptr;
      a.heads = H;
      a.q_dim = static_cast<int>(D);
      a.iq = IH > 0 ? diq.get() : nullptr;
      a.iheads = IH;
      a.iq_dim = static_cast<int>(ID);
      a.positions = dpos.get();
      a.inv_freq = dinv.get();
      a.rope_dim = rope_dim;
      a.tokens = T;
      a.rows_per_block = rpb;
      cuda_model::norm_rope(a, kStream);
    };
    run(q0, iq0, 1);  // the decode kernel
    const std::vector<float> wq = to_host(q0), wiq = to_host(iq0);
    for (const int choice : {0, 2, 5, 16, 32}) {
      if (choice == 0 && T < cuda_model::kNormRopePrefillTokens) continue;  // that is the decode kernel
      SCOPED_TRACE(::testing::Message() << "rows_per_block " << choice);
      upload(q1, q);
      upload(iq1, iq);
      run(q1, iq1, choice);
      EXPECT_TRUE(same_bits(to_host(q1), wq)) << "q (index / " << D << " = token * heads + head)";
      EXPECT_TRUE(same_bits(to_host(iq1), wiq)) << "indexer q (index / " << ID << " = token * iheads + head)";
    }
    size_t changed = 0;
    for (size_t i = 0; i < q.size(); ++i) changed += std::memcmp(&q[i], &wq[i], 4) != 0;
    EXPECT_GT(changed, q.size() / 2) << "the decode kernel rewrote q";
    if (T * H > 5) {
      size_t nan = 0;
      for (int64_t d = 0; d < D; ++d) nan += std::isnan(wq[5 * D + d]);
      EXPECT_EQ(nan, static_cast<size_t>(D)) << "the NaN query row: NaN throughout";
    }
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
