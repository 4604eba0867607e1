// Prefix-cache snapshots kept on the device (CudaModel::allocate_snapshots / save_snapshot /
// load_snapshot, the CUDA runner's snapshot pool): a prefix hit restored from a device snapshot
// gives bit for bit the logits, taps-fed draft context and draft proposals of the cold run it
// snapshots (decode and verify steps replaying CUDA graphs right behind the stream-ordered copies);
// a recycled buffer holds its new slot, not the old; bad numbers are errors that change nothing;
// and through the engine a repeated long prompt hits its predecessor's device snapshot and
// generates what it generated, with nothing allocated under load. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "cuda/model_options.h"
#include "cuda/require_gpu.h"
#include "kernels/bit_compare.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_model.h"
#include "model/run_helpers.h"
#include "model/tiny_weights.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using kernels::testing::same_bits;
using testing::model_options;
using testing::tiny_config;
using testing::tiny_weights;
using testing::tokens;


struct TinyGpu {
  ModelConfig cfg = tiny_config(true);
  testing::TinyWeights tw = tiny_weights(cfg, 7);
  std::unique_ptr<CudaModel> m;
  TinyGpu() {
    CudaModelOptions co;
    co.model = model_options();
    co.max_graph_batch = 4;  // decode and verify steps replay graphs
    auto g = CudaModel::from_tensors(cfg, tw.ptrs(), co);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (g.ok()) m = std::move(g).value();
  }
};

// What the tail of a sequence yields: every step's logits (host copies), in order, and the draft's
// greedy proposal after it.
struct Tail {
  std::vector<float> logits;
  DraftResult draft;
};

// Runs toks[start, end) through `slot` as the engine's steps would after a prefix hit at `start`:
// one prefill chunk of 20 tokens, then decode steps of 1 and verify steps of 6 (graph replays),
// every row's taps into the draft context; then one greedy draft from the last token.
Tail run_tail(CudaModel& m, int slot, const std::vector<int32_t>& toks, int64_t start, int64_t end,
              const std::vector<int32_t>& table) {
  Tail t;
  int64_t pos = start;
  int step = 0;
  StepOutput out;
  while (pos < end - 1) {
    const int64_t n = std::min<int64_t>(step == 0 ? 20 : step % 3 == 2 ? 6 : 1, end - 1 - pos);
    StepBatch b;
    b.seqs.push_back({slot, pos, std::span<const int32_t>(toks.data() + pos, static_cast<size_t>(n)), table,
                      LogitsMode::kAll, true});
    Status st = m.forward(b, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return t;
    t.logits.insert(t.logits.end(), out.logits.begin(), out.logits.begin() + n * m.vocab_size());
    st = m.draft_insert_context_from_step(slot, pos, 0, n);
    EXPECT_TRUE(st.ok()) << st.to_string();
    pos += n;
    ++step;
  }
  std::vector<DraftResult> res;
  const CudaModel::DraftQueryDev q{slot, toks[static_cast<size_t>(end - 1)], end - 1, 0.0, 0};
  Status st = m.draft_propose(std::span<const CudaModel::DraftQueryDev>(&q, 1), false, res);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (st.ok() && !res.empty()) t.draft = res[0];
  return t;
}

// A full block of 256 tokens (with its draft context) in `slot`, from position 0.
void run_head(CudaModel& m, int slot, const std::vector<int32_t>& toks, const std::vector<int32_t>& table) {
  m.reset(slot);
  StepBatch b;
  b.seqs.push_back({slot, 0, std::span<const int32_t>(toks.data(), 256), table, LogitsMode::kLast, true});
  ASSERT_TRUE(m.forward(b, nullptr).ok());
  ASSERT_TRUE(m.draft_insert_context_from_step(slot, 0, 0, 256).ok());
}

TEST(CudaSnapshot, PrefixHitFromDeviceSnapshotIsBitIdenticalToTheColdRun) {
  TANDEM_REQUIRE_GPU();
  TinyGpu g;
  ASSERT_TRUE(g.m && g.m->has_draft());
  CudaModel& m = *g.m;
  ASSERT_TRUE(m.allocate_snapshots(2).ok());
  EXPECT_EQ(m.num_snapshots(), 2);
  EXPECT_EQ(m.snapshot_device_bytes() + sizeof(int64_t), m.slot_state_bytes());  // the length stays on the host
  EXPECT_EQ(m.memory().snapshots, static_cast<int64_t>(2 * m.snapshot_device_bytes()));
  const int64_t V = m.vocab_size();
  const auto toks = tokens(300, 71);
  // Warm-up in slot 3 (its own blocks): every step shape of the tail is captured here, so the cold
  // and the hit run replay the same graphs.
  const std::vector<int32_t> warm_table = {15, 14, 13, 12};
  run_head(m, 3, toks, warm_table);
  run_tail(m, 3, toks, 256, 300, warm_table);
  const auto replays_before = m.graph_stats().replays;
  // Cold: slot 1 runs the block, is snapshotted on the device at 256, and goes on.
  const std::vector<int32_t> cold_table = {7, 6, 5, 4};
  run_head(m, 1, toks, cold_table);
  ASSERT_TRUE(m.save_snapshot(1, 0).ok());
  const Tail cold = run_tail(m, 1, toks, 256, 300, cold_table);
  // Hit: slot 2 shares block 7 (positions 0..255), loads the snapshot and runs the same tail in
  // blocks of its own. Nothing synchronizes between the copies and the graph replays that follow.
  const std::vector<int32_t> hit_table = {7, 10, 9, 8};
  m.reset(2);
  ASSERT_TRUE(m.load_snapshot(2, 0).ok());
  EXPECT_EQ(m.slot_length(2), 256);
  const Tail hit = run_tail(m, 2, toks, 256, 300, hit_table);
  EXPECT_GT(m.graph_stats().replays - replays_before, 10) << "the tails' decode and verify steps replay graphs";
  ASSERT_EQ(cold.logits.size(), static_cast<size_t>(43 * V));
  const ::testing::AssertionResult same = same_bits(hit.logits, cold.logits);
  std::printf("[cuda-snapshot] prefix hit vs cold run: 43 rows of logits %s; draft %zu tokens %s\n",
              same ? "bit-identical" : same.message(), hit.draft.tokens.size(),
              hit.draft.tokens == cold.draft.tokens && hit.draft.confidence == cold.draft.confidence ? "identical"
                                                                                                  : "DIFFER");
  EXPECT_TRUE(same) << "logits (index / V = row, V = " << V << ")";
  ASSERT_FALSE(cold.draft.tokens.empty());
  EXPECT_EQ(hit.draft.tokens, cold.draft.tokens);
  EXPECT_EQ(hit.draft.confidence, cold.draft.confidence);  // the draft context came with the snapshot
}

TEST(CudaSnapshot, RecycledBufferHoldsItsNewSlotAndBadNumbersChangeNothing) {
  TANDEM_REQUIRE_GPU();
  TinyGpu g;
  ASSERT_TRUE(g.m);
  CudaModel& m = *g.m;
  // Before allocation there is no buffer; after it, numbers outside [0, 2), slots outside the
  // engine's and a buffer never saved are refused.
  EXPECT_FALSE(m.save_snapshot(0, 0).ok());
  ASSERT_TRUE(m.allocate_snapshots(2).ok());
  const auto toks_a = tokens(300, 81), toks_b = tokens(300, 82);
  const std::vector<int32_t> ta = {3, 2, 1, 0}, tb = {7, 6, 5, 4};
  run_head(m, 0, toks_a, ta);
  EXPECT_FALSE(m.load_snapshot(2, 1).ok()) << "buffer 1 was never saved";
  EXPECT_FALSE(m.save_snapshot(0, 2).ok());
  EXPECT_FALSE(m.save_snapshot(0, -1).ok());
  EXPECT_FALSE(m.save_snapshot(4, 0).ok());  // max_slots 4
  EXPECT_FALSE(m.load_snapshot(-1, 0).ok());
  ASSERT_TRUE(m.save_snapshot(0, 1).ok());
  // Buffer 1 first holds A at 256; then, recycled as the LRU would, B at 261.
  run_head(m, 1, toks_b, tb);
  StepBatch b;
  b.seqs.push_back({1, 256, std::span<const int32_t>(toks_b.data() + 256, 5), tb, LogitsMode::kLast, true});
  ASSERT_TRUE(m.forward(b, nullptr).ok());
  ASSERT_TRUE(m.draft_insert_context_from_step(1, 256, 0, 5).ok());
  ASSERT_TRUE(m.save_snapshot(1, 1).ok());
  // Slot 0 goes on past its snapshot: what slot 2 loads must not depend on it.
  b.seqs.clear();
  b.seqs.push_back({0, 256, std::span<const int32_t>(toks_a.data() + 256, 9), ta, LogitsMode::kLast, true});
  ASSERT_TRUE(m.forward(b, nullptr).ok());
  m.reset(2);
  ASSERT_TRUE(m.load_snapshot(2, 1).ok());
  EXPECT_EQ(m.slot_length(2), 261);
  // Slot 2 (B's state, B's blocks) and slot 1 continue B with the same 12 tokens (eager steps, more
  // than a graph step's): the same logits, bit for bit. Slot 2 first, then slot 1 rewrites the same
  // records with the same values.
  const int64_t V = m.vocab_size();
  StepOutput o2, o1;
  b.seqs.clear();
  b.seqs.push_back({2, 261, std::span<const int32_t>(toks_b.data() + 261, 12), tb, LogitsMode::kAll, false});
  ASSERT_TRUE(m.forward(b, &o2).ok());
  b.seqs[0].slot = 1;
  ASSERT_TRUE(m.forward(b, &o1).ok());
  std::vector<float> l2(o2.logits.begin(), o2.logits.begin() + 12 * V),
      l1(o1.logits.begin(), o1.logits.begin() + 12 * V);
  const ::testing::AssertionResult same = same_bits(l1, l2);
  std::printf("[cuda-snapshot] recycled buffer: slot loaded from it vs the slot it was saved from: %s\n",
              same ? "bit-identical" : same.message());
  EXPECT_TRUE(same) << "logits (index / V = row, V = " << V << ")";
  // Re-allocating frees the pool (start-up only) and forgets what was saved.
  ASSERT_TRUE(m.allocate_snapshots(0).ok());
  EXPECT_EQ(m.num_snapshots(), 0);
  EXPECT_EQ(m.memory().snapshots, 0);
  EXPECT_FALSE(m.load_snapshot(2, 0).ok());
}

// Through the engine on the built-in model: one request at a time, the second prompt equal to the
// first (more than one 256-token block, prefilled in 256-token chunks so the block boundary is a
// chunk's end): it restores the device snapshot, computes only the rest, and generates the same
// tokens; with DSpark the restored draft context makes it draft and accept exactly as the cold run.
TEST(CudaSnapshot, EnginePrefixHitRestoresFromTheDeviceAndMatchesTheColdRun) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  if (!fs::exists(dir + "/config.json")) FAIL() << "missing " << dir << "/config.json (the built-in model)";
  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::string text;
  for (int i = 1; i <= 200; ++i) text += std::to_string(i) + " ";  // about 410 tokens
  const std::vector<int32_t> prompt = (*tok)->encode("<｜begin▁of▁sentence｜><｜User｜>Continue: " + text +
                                                      "<｜Assistant｜></think>");
  ASSERT_GT(prompt.size(), 300u) << "the prompt must cover more than one block";
  for (bool spec : {false, true}) {
    EngineConfig ec;
    ec.model_dir = dir;
    ec.device = "cuda";
    ec.max_num_seqs = 1;  // one at a time: the second request hits the first's blocks
    ec.max_num_batched_tokens = 256;
    ec.block_size = 256;
    ec.max_model_len = 1024;
    ec.enable_prefix_caching = true;
    if (spec) {
      ec.speculative.method = "dspark";
      ec.speculative.verify_mode = VerifyMode::kFixed;
    }
    auto runner = create_cuda_runner(ec);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    CoreOptions co;
    co.check_integrity_each_step = true;
    co.log_startup = false;
    auto core_r = EngineCore::create(std::move(runner).value(), ec, co);
    ASSERT_TRUE(core_r.ok()) << core_r.status().to_string();
    auto core = std::move(core_r).value();
    // The snapshots are a device pool of the memory plan.
    const MemoryPlan& plan = core->model_info().memory;
    int64_t snap_bytes = 0;
    std::string snap_domain;
    for (const auto& p : plan.pools)
      if (p.name == kPoolPrefixSnapshots) snap_bytes += p.bytes, snap_domain = p.domain;
    EXPECT_GT(snap_bytes, 0);
    EXPECT_EQ(snap_domain, plan.gpu_domain);
    std::map<std::string, std::vector<int32_t>> outs;
    std::map<std::string, Usage> usage;
    for (const char* id : {"cold", "hit"}) {
      Request r;
      r.request_id = id;
      r.prompt_tokens = prompt;
      r.sampling.temperature = 0;
      r.sampling.max_tokens = 64;
      r.sampling.ignore_eos = true;
      ASSERT_TRUE(core->add_request(std::move(r), [&](const RequestEvent& ev) {
                        auto& o = outs[ev.request_id];
                        o.insert(o.end(), ev.tokens.begin(), ev.tokens.end());
                        if (ev.finish != FinishReason::kNone) usage[ev.request_id] = ev.usage;
                      }).ok());
      for (int i = 0; i < 100000 && core->has_work(); ++i) {
        Status st = core->step();
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
    }
    const EngineMetrics m = core->metrics(true);
    std::printf("[cuda-snapshot] engine%s: prompt %zu tokens, hit cached %lld; cold drafted %lld accepted %lld, hit "
                "drafted %lld accepted %lld; outputs %s; device allocations after start %lld, bytes taken %lld\n",
                spec ? " (dspark)" : "", prompt.size(), static_cast<long long>(usage["hit"].cached_tokens),
                static_cast<long long>(usage["cold"].draft_tokens),
                static_cast<long long>(usage["cold"].accepted_draft_tokens),
                static_cast<long long>(usage["hit"].draft_tokens),
                static_cast<long long>(usage["hit"].accepted_draft_tokens),
                outs["hit"] == outs["cold"] ? "equal" : "DIFFER", static_cast<long long>(m.device_allocations_after_start),
                static_cast<long long>(m.device_bytes_taken_after_start));
    EXPECT_EQ(outs["cold"].size(), 64u);
    EXPECT_EQ(usage["cold"].cached_tokens, 0);
    EXPECT_GE(usage["hit"].cached_tokens, 256);
    EXPECT_EQ(outs["hit"], outs["cold"]);
    if (spec) {
      EXPECT_GT(usage["cold"].draft_tokens, 0);
      EXPECT_EQ(usage["hit"].draft_tokens, usage["cold"].draft_tokens);
      EXPECT_EQ(usage["hit"].accepted_draft_tokens, usage["cold"].accepted_draft_tokens);
    }
    EXPECT_EQ(m.device_allocations_after_start, 0);
    EXPECT_EQ(m.device_bytes_taken_after_start, 0);
  }
}

}  // namespace
}  // namespace tandem
