// Synthetic weights and state on the device: the fill kernels bit for bit against their host
// functions, the stand-in collectives against their host definition, every make-tiny preset's
// config through the same generator as the full-size model (every catalog tensor generated, finite
// logits, routing spread over experts), a synthetic context followed by decode / verify / draft
// steps, the refusal of a model that does not fit, and one rank of the real 0731 shapes (TP=8 on
// the stand-in). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>

#include "engine/engine.h"
#include "io/catalog.h"
#include "io/official_configs.h"
#include "io/tiny_checkpoint.h"
#include "cuda/require_gpu.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/standin_comm.h"
#include "model/cuda/standin_kernels.h"
#include "model/cuda/synthetic_fill.h"
#include "model/cuda/synthetic_weights.h"
#include "model/shard_plan.h"

namespace tandem {
namespace {

namespace synth = cuda_model::synth;


template <typename T>
std::vector<T> download(const kernels::cuda::DeviceBuffer<T>& d) {
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> h(d.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// The builder's layout pass (no device needed): every tensor of each rank's catalog slice is
// generated exactly once, the structure has the rank's shapes, and the device bytes are the
// catalog's stored bytes (vectors widened to fp32, expert tables narrowed to int32, aligned).
TEST(SyntheticLayout, EveryCatalogTensorOfEveryRankIsGenerated) {
  struct Case {
    std::string name;
    int tp;
  };
  for (const Case& k : std::vector<Case>{{"deepseek-v4-flash-0731", 1}, {"deepseek-v4-flash-0731", 2},
                                         {"deepseek-v4-flash-0731", 8}, {"deepseek-v4-flash-preview", 2}}) {
    auto cfg = official_config(k.name);
    ASSERT_TRUE(cfg.ok());
    auto cat = build_catalog(*cfg);
    ASSERT_TRUE(cat.ok());
    for (int r : {0, k.tp - 1}) {
      auto plan = model::plan_shard(*cfg, *cat, {r, k.tp}, true);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      auto b = cuda_model::build_synthetic_weights(*cfg, *plan, nullptr, 1, nullptr);
      ASSERT_TRUE(b.ok()) << k.name << " TP=" << k.tp << ": " << b.status().to_string();
      EXPECT_EQ(b->tensors, plan->held_tensors);
      const double ratio = static_cast<double>(b->arena_bytes) / static_cast<double>(plan->held_bytes);
      EXPECT_NEAR(ratio, 1.0, 0.01) << k.name << " TP=" << k.tp;
      ASSERT_EQ(b->w.layers.size(), 43u);
      const auto& l4 = b->w.layers[4];
      EXPECT_EQ(l4.attn.n_heads, 64 / k.tp);
      EXPECT_EQ(l4.attn.n_groups, 8 / k.tp);
      EXPECT_EQ(l4.attn.n_idx_heads, 64 / k.tp);
      EXPECT_EQ(l4.attn.wq_b.w.n, 64 / k.tp * 512);
      EXPECT_EQ(l4.attn.wo_b.w.k, 8 / k.tp * 1024);
      EXPECT_EQ(l4.ffn.n_local, 256 / k.tp);
      EXPECT_EQ(l4.ffn.expert_begin, r * (256 / k.tp));
      EXPECT_TRUE(l4.ffn.grouped);  // MXFP4 experts take the grouped prefill path, as a checkpoint's
      EXPECT_EQ(l4.ffn.w1_all.n, 256 / k.tp * 2048);
      EXPECT_EQ(l4.ffn.w1_all.format, kernels::WeightFormat::kMxfp4);
      EXPECT_EQ(l4.attn.wo_a.w.format, kernels::WeightFormat::kFp8Block);  // kept as stored, no bf16 copy
      EXPECT_FALSE(l4.attn.wo_a.act_quant);
      EXPECT_EQ(b->w.vocab_end - b->w.vocab_begin, 129280 / k.tp);
      EXPECT_EQ(b->w.has_draft, k.name == "deepseek-v4-flash-0731");
      std::printf("[synthetic layout] %s TP=%d rank %d: %lld tensors, %.2f GB on the device (%.2f GB stored)\n",
                  k.name.c_str(), k.tp, r, static_cast<long long>(b->tensors), b->arena_bytes / 1e9,
                  plan->held_bytes / 1e9);
    }
  }
}

TEST(SyntheticFill, EveryKindEqualsItsHostFunction) {
  TANDEM_REQUIRE_GPU();
  const int64_t n = 100003;  // not a multiple of the block size
  for (synth::Fill k : {synth::Fill::kBf16, synth::Fill::kF32, synth::Fill::kF32Exact, synth::Fill::kFp8,
                        synth::Fill::kFp4, synth::Fill::kE8M0, synth::Fill::kExpertIds}) {
    synth::FillArgs a;
    a.kind = k;
    a.seed = 0x1234 + static_cast<int>(k);
    a.mean = 0.5f;
    a.stdev = 0.25f;
    a.e8m0 = 120;
    a.cols = 6;
    a.modulo = 256;
    const int bytes = synth::fill_element_bytes(k);
    kernels::cuda::DeviceBuffer<uint8_t> d(static_cast<size_t>(n * bytes));
    TANDEM_CUDA_CHECK(cudaMemset(d.get(), 0xa5, d.bytes()));
    a.out = d.get();
    a.n = n;
    synth::fill(a, nullptr);
    const auto h = download(d);
    int64_t first_bad = -1;
    for (int64_t i = 0; i < n && first_bad < 0; ++i) {
      const uint32_t want = synth::fill_element(a, i);
      uint32_t got = 0;
      std::memcpy(&got, h.data() + i * bytes, static_cast<size_t>(bytes));
      const uint32_t mask = bytes == 4 ? 0xffffffffu : (1u << (8 * bytes)) - 1u;
      if ((want & mask) != got) first_bad = i;
    }
    EXPECT_EQ(first_bad, -1) << "fill kind " << static_cast<int>(k) << ": first mismatch at element " << first_bad;
  }
  // Values: FP8 codes never NaN, scales as asked, distinct expert ids per row.
  synth::FillArgs ids;
  ids.kind = synth::Fill::kExpertIds;
  ids.cols = 6;
  ids.modulo = 256;
  ids.seed = 9;
  for (int64_t r = 0; r < 1000; ++r) {
    std::set<uint32_t> row;
    for (int64_t k = 0; k < 6; ++k) row.insert(synth::fill_element(ids, r * 6 + k));
    ASSERT_EQ(row.size(), 6u) << "row " << r;
  }
  synth::FillArgs f8;
  f8.kind = synth::Fill::kFp8;
  f8.seed = 3;
  for (int64_t i = 0; i < 100000; ++i) ASSERT_NE(synth::fill_element(f8, i) & 0x7f, 0x7fu) << i;
}

TEST(SyntheticFill, RecordsEqualTheirHostFunctionAndDecodeToUnitValues) {
  TANDEM_REQUIRE_GPU();
  for (auto kind : {cuda_model::KvRecordKind::kFp8, cuda_model::KvRecordKind::kNvfp4, cuda_model::KvRecordKind::kBf16}) {
    synth::RecordFillArgs a;
    a.rec = cuda_model::KvRecordLayout::make(kind, 512, 64);
    a.key = cuda_model::IndexKeyLayout::make(128);
    for (synth::RecordKind rk : {synth::RecordKind::kKv, synth::RecordKind::kKey, synth::RecordKind::kF32}) {
      a.kind = rk;
      a.rec_bytes = rk == synth::RecordKind::kKv ? a.rec.bytes : rk == synth::RecordKind::kKey ? a.key.bytes : 4 * 96;
      a.count = 37;
      a.regions = 3;
      a.region_stride = 100000;
      a.offset = 1234;
      a.seed = 77;
      const std::vector<int32_t> blocks = {2, 0, 1};
      kernels::cuda::DeviceBuffer<int32_t> dblocks(3);
      TANDEM_CUDA_CHECK(cudaMemcpy(dblocks.get(), blocks.data(), 12, cudaMemcpyHostToDevice));
      a.blocks = dblocks.get();
      kernels::cuda::DeviceBuffer<uint8_t> d(300000);
      TANDEM_CUDA_CHECK(cudaMemset(d.get(), 0, d.bytes()));
      a.base = d.get();
      synth::fill_records(a, nullptr);
      const auto h = download(d);
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t j = 0; j < a.count; ++j)
          for (int64_t b = 0; b < a.rec_bytes; ++b) {
            const int64_t at = blocks[r] * a.region_stride + a.offset + j * a.rec_bytes + b;
            ASSERT_EQ(h[at], synth::record_byte(a, blocks[r], j, b)) << "record kind " << static_cast<int>(rk)
                                                                      << " region " << r << " record " << j << " byte " << b;
          }
      if (rk == synth::RecordKind::kKv) {
        double sq = 0;
        const uint8_t* rec = h.data() + blocks[0] * a.region_stride + a.offset;
        for (int dim = 0; dim < 512; ++dim) {
          const float v = cuda_model::kv_record_get(rec, a.rec, dim);
          ASSERT_TRUE(std::isfinite(v)) << dim;
          sq += static_cast<double>(v) * v;
        }
        const double rms = std::sqrt(sq / 512);
        EXPECT_GT(rms, 0.3) << static_cast<int>(kind);
        EXPECT_LT(rms, 3.0) << static_cast<int>(kind);
      }
    }
  }
}

TEST(StandinComm, CollectivesAreTheirHostDefinition) {
  TANDEM_REQUIRE_GPU();
  std::vector<float> x(5000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  kernels::cuda::DeviceBuffer<float> d(x.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), x.data(), d.bytes(), cudaMemcpyHostToDevice));
  cuda_model::StandinComm c(1, 4);
  ASSERT_TRUE(c.all_reduce_sum(d.get(), x.size(), CommDtype::kF32, nullptr).ok());
  auto h = download(d);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h[i], x[i] * 4.0f) << i;
  std::vector<uint16_t> hb(x.size());
  for (size_t i = 0; i < x.size(); ++i) hb[i] = num::f32_to_bf16(x[i]);
  kernels::cuda::DeviceBuffer<uint16_t> db(hb.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(db.get(), hb.data(), db.bytes(), cudaMemcpyHostToDevice));
  ASSERT_TRUE(c.all_reduce_sum(db.get(), hb.size(), CommDtype::kBf16, nullptr).ok());
  const auto gb = download(db);
  for (size_t i = 0; i < hb.size(); ++i) ASSERT_EQ(gb[i], num::f32_to_bf16(num::bf16_to_f32(hb[i]) * 4.0f)) << i;
  kernels::cuda::DeviceBuffer<float> out(4 * x.size());
  ASSERT_TRUE(c.all_gather(d.get(), 4 * x.size(), out.get(), nullptr).ok());
  const auto g = download(out);
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(g[r * x.size() + i], h[i]) << r << " " << i;
  // An odd byte count takes the byte path.
  kernels::cuda::DeviceBuffer<uint8_t> ob(4 * 7);
  ASSERT_TRUE(c.all_gather(d.get(), 7, ob.get(), nullptr).ok());
  const auto og = download(ob);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 7; ++i) ASSERT_EQ(og[r * 7 + i], reinterpret_cast<const uint8_t*>(h.data())[i]);
  EXPECT_EQ(c.counts().all_reduce, 2);
  EXPECT_EQ(c.counts().all_gather, 2);
  EXPECT_FALSE(c.broadcast(d.get(), 4, 4, nullptr).ok());
}

CudaModelOptions small_options(int rank = 0, int size = 1, DataComm* comm = nullptr) {
  CudaModelOptions o;
  o.model.max_slots = 2;
  o.model.num_blocks = 24;
  o.model.block_size = 256;
  o.model.max_tokens_per_step = 256;
  o.model.max_rollback = 6;
  o.model.tp_rank = rank;
  o.model.tp_size = size;
  o.model.comm = comm;
  o.max_graph_batch = 2;
  return o;
}

// Runs `n` tokens in chunks of at most 200 from position 0 of slot 0; returns the last step's logits.
std::vector<float> prefill(CudaModel& m, int64_t n, uint32_t seed, const std::vector<int32_t>& table, int64_t lo,
                           int64_t hi) {
  std::vector<int32_t> toks(static_cast<size_t>(n));
  uint64_t x = seed;
  for (auto& t : toks) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<int32_t>(lo + static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(hi - lo)));
  }
  m.reset(0);
  StepOutput out;
  for (int64_t pos = 0; pos < n;) {
    const int64_t c = std::min<int64_t>(200, n - pos);
    StepBatch b;
    b.seqs.push_back({0, pos, std::span<const int32_t>(toks.data() + pos, static_cast<size_t>(c)), table,
                      LogitsMode::kLast, false});
    Status st = m.forward(b, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return {};
    pos += c;
  }
  return std::vector<float>(out.logits.begin(), out.logits.begin() + m.vocab_size());
}

void expect_sane(const std::vector<float>& logits, const std::string& what) {
  ASSERT_FALSE(logits.empty()) << what;
  double sq = 0, mean = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v)) << what;
    mean += v;
  }
  mean /= static_cast<double>(logits.size());
  for (float v : logits) sq += (v - mean) * (v - mean);
  const double sd = std::sqrt(sq / static_cast<double>(logits.size()));
  std::printf("[synthetic] %-40s logits std %.3g\n", what.c_str(), sd);
  EXPECT_GT(sd, 1e-3) << what << ": degenerate logits";
  EXPECT_LT(sd, 1e3) << what;
}

TEST(Synthetic, EveryTinyPresetThroughTheGenerator) {
  TANDEM_REQUIRE_GPU();
  TinyVocab v;
  v.vocab_size = 2048;
  v.noise_token_id = 2000;
  for (const std::string& preset : tiny_preset_names()) {
    auto cfg = tiny_preset_config(preset, v);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    auto cat = build_catalog(*cfg);
    ASSERT_TRUE(cat.ok());
    for (int n : {1, 2}) {
      if (preset != "tp8" && n > 1) continue;
      for (int r = 0; r < n; ++r) {
        cuda_model::StandinComm standin(r, n);
        auto m = CudaModel::synthetic(*cfg, small_options(r, n, n > 1 ? &standin : nullptr), {preset, 11});
        ASSERT_TRUE(m.ok()) << preset << ": " << m.status().to_string();
        auto plan = model::plan_shard(*cfg, *cat, {r, n}, true);
        ASSERT_TRUE(plan.ok());
        const LoadReport& rep = (*m)->load_report();
        EXPECT_EQ(rep.target_tensors_loaded + rep.draft_tensors_loaded, plan->held_tensors) << preset;
        EXPECT_EQ(rep.other_rank_tensors, plan->other_rank_tensors) << preset;
        EXPECT_EQ(rep.skipped_tensors, plan->skipped_tensors) << preset;
        // Device bytes: the catalog's stored bytes, vectors widened to fp32, expert tables to int32, aligned.
        EXPECT_NEAR(static_cast<double>((*m)->memory().weights) / static_cast<double>(plan->held_bytes), 1.0, 0.1)
            << preset;
        auto table = std::vector<int32_t>{0, 1, 2};
        const auto vr = model::vocab_range(cfg->vocab_size, {r, n});
        expect_sane(prefill(**m, 300, 5, table, std::max<int64_t>(3, vr.first), vr.second),
                    preset + " TP=" + std::to_string(n) + " rank " + std::to_string(r));
      }
    }
  }
}

TEST(Synthetic, ContextFillThenDecodeVerifyAndDraft) {
  TANDEM_REQUIRE_GPU();
  TinyVocab v;
  v.vocab_size = 2048;
  v.noise_token_id = 2000;
  auto cfg = tiny_preset_config("default", v);
  ASSERT_TRUE(cfg.ok());
  for (KvDtype d : {KvDtype::kFp8, KvDtype::kNvfp4, KvDtype::kBf16}) {
    CudaModelOptions o = small_options();
    o.model.kv_dtype = d;
    auto m = CudaModel::synthetic(*cfg, o, {"default", 3});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::vector<int32_t> table(24);
    for (int i = 0; i < 24; ++i) table[i] = 23 - i;
    const int64_t ctx = 5000;  // crosses pool blocks; no prefill runs
    ASSERT_TRUE((*m)->fill_synthetic_context(0, ctx, table, 9).ok());
    EXPECT_EQ((*m)->slot_length(0), ctx);
    std::vector<int32_t> toks = {5, 6, 7, 8, 9, 10};
    StepOutput out;
    StepBatch b;
    b.seqs.push_back({0, ctx, std::span<const int32_t>(toks.data(), 1), table, LogitsMode::kLast, false});
    auto routing = (*m)->routing_of_step(b);
    ASSERT_TRUE(routing.ok()) << routing.status().to_string();
    EXPECT_EQ(routing->size(), static_cast<size_t>(cfg->num_hidden_layers * cfg->num_experts_per_tok));
    ASSERT_TRUE((*m)->rollback(0, ctx).ok());
    auto p = (*m)->profile_step(b, 3, &out);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    expect_sane(std::vector<float>(out.logits.begin(), out.logits.begin() + cfg->vocab_size),
                std::string("filled context decode, kv ") + kv_dtype_name(d));
    ASSERT_TRUE((*m)->rollback(0, ctx).ok());
    b.seqs[0].tokens = std::span<const int32_t>(toks.data(), 6);
    b.seqs[0].logits = LogitsMode::kAll;
    ASSERT_TRUE((*m)->forward(b, &out).ok());
    for (int64_t i = 0; i < 6 * cfg->vocab_size; ++i) ASSERT_TRUE(std::isfinite(out.logits[i])) << i;
    std::vector<CudaModel::DraftQueryDev> qs = {{0, 7, ctx + 6, 0.0, 0}};
    auto dr = (*m)->routing_of_draft(qs);
    ASSERT_TRUE(dr.ok()) << dr.status().to_string();
    std::vector<DraftResult> res;
    ASSERT_TRUE((*m)->draft_propose(qs, false, res).ok());
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].tokens.size(), 5u);
    for (int32_t t : res[0].tokens) EXPECT_TRUE(t >= 0 && t < cfg->vocab_size);
    // Bad fills are errors.
    EXPECT_FALSE((*m)->fill_synthetic_context(5, 10, table, 1).ok());
    EXPECT_FALSE((*m)->fill_synthetic_context(0, 24 * 256 + 1, table, 1).ok());
  }
}

TEST(Synthetic, FullSizeThatDoesNotFitIsRefusedBeforeAllocating) {
  TANDEM_REQUIRE_GPU();
  auto cfg = official_config("deepseek-v4-flash-0731");
  ASSERT_TRUE(cfg.ok());
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b > (size_t{200} << 30)) GTEST_SKIP() << "this GPU holds all of 0731";
  const auto before = kernels::cuda::alloc_stats();
  auto m = CudaModel::synthetic(*cfg, small_options(), {"deepseek-v4-flash-0731", 1});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kResourceExhausted) << m.status().to_string();
  EXPECT_NE(m.status().message().find("GiB are free"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("weights 1"), std::string::npos) << m.status().message();  // 155 GiB
  EXPECT_EQ(kernels::cuda::alloc_stats().count, before.count) << "nothing allocated before refusing";
}

// The real shapes: one rank of TP=8 of 0731 (about a quarter of a TP=2 rank's weights).
TEST(Synthetic, FullSizeRankOfEightRunsFinite) {
  TANDEM_REQUIRE_GPU();
  auto cfg = official_config("deepseek-v4-flash-0731");
  ASSERT_TRUE(cfg.ok());
  cuda_model::StandinComm standin(0, 8);
  CudaModelOptions o = small_options(0, 8, &standin);
  o.model.num_blocks = 20;
  o.max_graph_batch = 0;
  auto m = CudaModel::synthetic(*cfg, o, {"deepseek-v4-flash-0731", 1});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::printf("[synthetic] 0731 TP=8 rank 0: %s; %s\n", (*m)->load_report().summary().c_str(),
              (*m)->memory_summary().c_str());
  std::vector<int32_t> table(20);
  for (int i = 0; i < 20; ++i) table[i] = i;
  ASSERT_TRUE((*m)->fill_synthetic_context(0, 4096, table, 2).ok());
  std::vector<int32_t> toks = {1000, 2000, 3000, 4000, 5000, 6000};
  StepBatch b;
  b.seqs.push_back({0, 4096, std::span<const int32_t>(toks.data(), 1), table, LogitsMode::kLast, false});
  standin.reset_counts();
  auto routing = (*m)->routing_of_step(b);
  ASSERT_TRUE(routing.ok()) << routing.status().to_string();
  std::printf("[synthetic] 0731 TP=8 decode: %lld collectives per step on the stand-in\n",
              static_cast<long long>(standin.counts().total()));
  // 43 attention + 43 MoE all-reduces, 21 indexer score all-reduces, the embedding and the LM head.
  EXPECT_EQ(standin.counts().total(), 43 + 43 + 21 + 1 + 1);
  ASSERT_TRUE((*m)->rollback(0, 4096).ok());
  StepOutput out;
  b.seqs[0].tokens = std::span<const int32_t>(toks.data(), 6);
  b.seqs[0].logits = LogitsMode::kAll;
  ASSERT_TRUE((*m)->forward(b, &out).ok());
  expect_sane(std::vector<float>(out.logits.begin(), out.logits.begin() + 6 * cfg->vocab_size), "0731 TP=8 verify");
  std::vector<CudaModel::DraftQueryDev> qs = {{0, 77, 4096 + 6, 0.0, 0}};
  std::vector<DraftResult> res;
  ASSERT_TRUE((*m)->draft_propose(qs, false, res).ok());
  EXPECT_EQ(res[0].tokens.size(), 5u);
}

// `--synthetic` through the engine on the GPU: a tiny preset whose vocabulary (16,384) is twice the
// built-in tokenizer's, so generated ids the tokenizer cannot decode reach the text stream (they
// become no text, never a crash), with and without DSpark.
TEST(Synthetic, ServesThroughTheEngineWithIdsTheTokenizerCannotDecode) {
  TANDEM_REQUIRE_GPU();
  for (bool dspark : {false, true}) {
    EngineConfig c;
    c.model_dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
    c.synthetic = "tiny:default";
    c.device = "cuda";
    c.max_num_seqs = 2;
    c.max_num_batched_tokens = 256;
    c.max_model_len = 2048;
    c.kv_cache_memory = int64_t{64} << 20;
    if (dspark) c.speculative.method = "dspark";
    auto e = Engine::create(c);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ((*e)->model_info().vocab_size, 16384);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> toks;
    FinishReason fin = FinishReason::kNone;
    std::string err;
    Request r;
    r.request_id = "synthetic";
    for (int i = 0; i < 40; ++i) r.prompt_tokens.push_back(100 + 37 * i);
    r.sampling.temperature = 1.0;
    r.sampling.seed = 7;
    r.sampling.max_tokens = 48;
    r.sampling.ignore_eos = true;
    ASSERT_TRUE((*e)->submit(std::move(r), [&](const RequestEvent& ev) {
                       std::lock_guard<std::mutex> lock(mu);
                       toks.insert(toks.end(), ev.tokens.begin(), ev.tokens.end());
                       if (ev.finish != FinishReason::kNone) {
                         fin = ev.finish;
                         err = ev.error;
                         cv.notify_all();
                       }
                     }).ok());
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return fin != FinishReason::kNone; }));
    EXPECT_EQ(fin, FinishReason::kLength) << err;
    EXPECT_EQ(toks.size(), 48u);
    int64_t beyond = 0;
    for (int32_t t : toks) {
      EXPECT_TRUE(t >= 0 && t < 16384) << t;
      beyond += t >= 8192;
    }
    std::printf("[synthetic engine] dspark %d: 48 tokens, %lld of them beyond the tokenizer's 8,192 ids\n", dspark ? 1 : 0,
                static_cast<long long>(beyond));
    EXPECT_TRUE((*e)->healthy());
    lock.unlock();
    (*e)->shutdown(5.0);
  }
}

}  // namespace
}  // namespace tandem
