// The engine over the real DeepSeek-V4 CPU model on a tiny checkpoint written by `tandem make-tiny`
// into a temporary directory: speculative greedy == plain greedy (DSpark draft + verify + rollback of
// the compressor state) and prefix hits (snapshot restore) reproduce outputs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "engine/greedy_draft_check.h"
#include "engine/model_runner.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class TinyCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::temp_directory_path() / ("tandem-engine-tiny-" + std::to_string(getpid()))).string());
    std::string cmd = std::string(TANDEM_BINARY) + " make-tiny " + *dir_ + " --seed 3 > /dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0 && fs::exists(*dir_ + "/config.json");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string* dir_;
  static bool ok_;
};
std::string* TinyCheckpoint::dir_ = nullptr;
bool TinyCheckpoint::ok_ = false;

struct Out {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
};

EngineConfig tiny_config(const std::string& dir, int max_num_seqs) {
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = max_num_seqs;
  ec.max_num_batched_tokens = 512;
  ec.block_size = 128;
  ec.max_model_len = 1024;
  ec.num_threads = 1;  // no OpenMP spinning on a shared CI machine
  return ec;
}

std::map<std::string, Out> run_all(const EngineConfig& ec, const std::vector<std::vector<int32_t>>& prompts,
                                   int max_tokens, EngineMetrics* metrics = nullptr, std::string* kv_dtype = nullptr) {
  std::map<std::string, Out> outs;
  auto runner = create_dsv4_runner(ec);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return outs;
  CoreOptions o;
  o.check_integrity_each_step = true;
  o.log_startup = false;
  auto core_r = EngineCore::create(std::move(runner).value(), ec, o);
  EXPECT_TRUE(core_r.ok()) << core_r.status().to_string();
  if (!core_r.ok()) return outs;
  auto core = std::move(core_r).value();
  if (kv_dtype) *kv_dtype = core->kv_cache_dtype();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = "p" + std::to_string(i);
    r.prompt_tokens = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    Status st = core->add_request(std::move(r), [&outs](const RequestEvent& ev) {
      Out& o = outs[ev.request_id];
      o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finish != FinishReason::kNone) {
        o.finish = ev.finish;
        o.usage = ev.usage;
      }
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  for (int i = 0; i < 100000 && core->has_work(); ++i) {
    Status st = core->step();
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  if (metrics) *metrics = core->metrics(true);
  EXPECT_EQ(core->kv().num_free(), core->kv().num_blocks());
  return outs;
}

std::vector<std::vector<int32_t>> tiny_prompts(const std::string& dir, int n, int min_len) {
  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok());
  std::vector<std::vector<int32_t>> out;
  const int64_t V = (*tok)->vocab_size();
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    uint64_t x = 1234567 + i;
    for (int k = 0; k < min_len + 37 * i; ++k) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      p.push_back(static_cast<int32_t>(2 + (x >> 33) % static_cast<uint64_t>(std::min<int64_t>(V - 2, 200))));
    }
    out.push_back(p);
  }
  return out;
}

// Prompt log-probabilities come from the same logits as decoding: scoring a prompt followed by its
// own greedy continuation (in prefill chunks of 16 and of 512 tokens) gives each continuation token
// the log-probability, rank 1 (greedy) and alternatives the decode steps reported, bit for bit.
TEST_F(TinyCheckpoint, PromptLogprobsEqualTheDecodeStepsLogprobs) {
  ASSERT_TRUE(ok_);
  const std::vector<int32_t> prompt = tiny_prompts(*dir_, 1, 50)[0];
  auto run = [&](int budget, std::vector<int32_t> tokens, SamplingParams sp, std::vector<int32_t>& out,
                 std::vector<TokenLogprob>& lps, std::vector<TokenLogprob>& plps) {
    EngineConfig ec = tiny_config(*dir_, 2);
    ec.max_num_batched_tokens = budget;
    auto runner = create_dsv4_runner(ec);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    CoreOptions o;
    o.check_integrity_each_step = true;
    o.log_startup = false;
    auto core = EngineCore::create(std::move(runner).value(), ec, o);
    ASSERT_TRUE(core.ok()) << core.status().to_string();
    Request r;
    r.request_id = "r";
    r.prompt_tokens = std::move(tokens);
    r.sampling = sp;
    ASSERT_TRUE((*core)
                    ->add_request(std::move(r),
                                  [&](const RequestEvent& ev) {
                                    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
                                    lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
                                    plps.insert(plps.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
                                  })
                    .ok());
    for (int i = 0; i < 10000 && (*core)->has_work(); ++i) ASSERT_TRUE((*core)->step().ok());
  };
  SamplingParams gen;
  gen.temperature = 0;
  gen.max_tokens = 24;
  gen.ignore_eos = true;
  gen.logprobs = 3;
  std::vector<int32_t> cont, none;
  std::vector<TokenLogprob> want, unused;
  run(512, prompt, gen, cont, want, unused);
  ASSERT_EQ(cont.size(), 24u);
  ASSERT_EQ(want.size(), 24u);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), cont.begin(), cont.end());
  SamplingParams score;
  score.temperature = 0;
  score.max_tokens = 0;
  score.prompt_logprobs = 3;
  for (int budget : {16, 512}) {
    std::vector<TokenLogprob> got;
    run(budget, all, score, none, unused, got);
    EXPECT_TRUE(none.empty());
    ASSERT_EQ(got.size(), all.size() - 1) << "budget " << budget;
    for (size_t k = 0; k < cont.size(); ++k) {
      const TokenLogprob& g = got[prompt.size() - 1 + k];
      EXPECT_EQ(g.token, cont[k]) << "budget " << budget << " token " << k;
      EXPECT_EQ(g.logprob, want[k].logprob) << "budget " << budget << " token " << k;
      EXPECT_EQ(g.top, want[k].top) << "budget " << budget << " token " << k;
      EXPECT_EQ(g.rank, 1) << "a greedy token ranks first (ties aside)";
    }
  }
}

TEST_F(TinyCheckpoint, SpeculativeGreedyEqualsPlainGreedy) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  // 20 and 120 tokens: the second crosses position 128 (window size, ratio-128 boundary) while
  // verifying, so rejected drafts there roll back compressor state.
  std::vector<std::vector<int32_t>> prompts = tiny_prompts(*dir_, 1, 20);
  prompts.push_back(tiny_prompts(*dir_, 1, 120)[0]);
  for (int conc : {1, 2}) {
    EngineConfig plain = tiny_config(*dir_, conc);
    auto want = run_all(plain, prompts, 20);
    ASSERT_EQ(want.size(), prompts.size());
    EngineConfig spec = plain;
    spec.speculative.method = "dspark";
    spec.speculative.num_speculative_tokens = 5;
    spec.speculative.verify_mode = VerifyMode::kFixed;
    EngineMetrics m;
    auto got = run_all(spec, prompts, 20, &m);
    for (const auto& [id, o] : want) {
      EXPECT_EQ(o.finish, FinishReason::kLength) << id;
      EXPECT_EQ(o.tokens.size(), 20u) << id;
      EXPECT_EQ(got[id].tokens, o.tokens) << id << " concurrency " << conc;
    }
    EXPECT_GT(m.spec_decode_num_draft_tokens_total, 0);
  }
}

// num_speculative_tokens reaches the draft: with K = 2 the DSpark draft drafts 2 tokens (not its
// whole block), and out of range K is an error, not a crash.
TEST_F(TinyCheckpoint, DraftDraftsKTokens) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  EngineConfig ec = tiny_config(*dir_, 1);
  auto runner = create_dsv4_runner(ec);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  ModelRunner& r = **runner;
  ASSERT_TRUE(r.has_draft());
  ASSERT_GT(r.num_draft_tokens(), 2);
  RunnerAllocation alloc;
  alloc.num_blocks = 4;
  alloc.block_size = 128;
  alloc.max_slots = 1;
  alloc.max_tokens_per_step = 64;
  alloc.max_verify_tokens = 3;
  alloc.num_draft_tokens = 2;
  alloc.kv_cache_dtype = "bf16";
  ASSERT_TRUE(r.allocate(alloc).ok());
  std::vector<int32_t> prompt = tiny_prompts(*dir_, 1, 20)[0];
  std::vector<int32_t> table = {0, 1};
  RunnerSeq seq;
  seq.slot = 0;
  seq.tokens = prompt;
  seq.block_table = table;
  seq.collect_taps = true;
  seq.reset = true;
  std::vector<RunnerSeq> batch = {seq};
  RunnerOutput out;
  ASSERT_TRUE(r.forward(batch, nullptr, out).ok());
  const int64_t n = static_cast<int64_t>(prompt.size());
  ASSERT_TRUE(r.commit(std::vector<SlotCommit>{{0, 0, n, n, -1}}).ok());
  std::vector<DraftQuery> q(1);
  q[0].slot = 0;
  q[0].anchor_token = prompt.back();
  q[0].anchor_pos = n;
  std::vector<DraftProposal> props;
  ASSERT_TRUE(r.draft_propose(q, props).ok());
  ASSERT_EQ(props.size(), 1u);
  EXPECT_EQ(props[0].tokens.size(), 2u);
  EXPECT_EQ(props[0].confidence.size(), 2u);
}

TEST_F(TinyCheckpoint, DraftAtTinyTemperatureIsGreedy) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  auto runner = create_dsv4_runner(tiny_config(*dir_, 1));
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  testing::expect_tiny_temperature_drafts_greedily(**runner, tiny_prompts(*dir_, 1, 24)[0]);
}

TEST_F(TinyCheckpoint, PrefixHitReproducesOutputs) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  auto prompts = tiny_prompts(*dir_, 1, 270);  // > two 128-token blocks
  prompts.push_back(prompts[0]);               // identical second prompt: a prefix hit
  EngineConfig ec = tiny_config(*dir_, 1);     // one at a time: the second sees the cached blocks
  auto outs = run_all(ec, prompts, 6);
  EXPECT_EQ(outs["p0"].usage.cached_tokens, 0);
  EXPECT_GE(outs["p1"].usage.cached_tokens, 256);
  EXPECT_EQ(outs["p1"].tokens, outs["p0"].tokens);
}

// Every KV cache dtype the CPU model takes (and the vLLM aliases) starts the engine, and DSpark
// greedy equals plain greedy in each (draft, verify and rollback all see that dtype's KV).
TEST_F(TinyCheckpoint, EachKvDtypeStartsAndSpeculativeGreedyEqualsPlain) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  std::vector<std::vector<int32_t>> prompts = tiny_prompts(*dir_, 1, 120);  // crosses position 128
  const std::pair<const char*, const char*> dtypes[] = {
      {"fp8", "fp8"}, {"bf16", "bf16"}, {"nvfp4", "nvfp4"}, {"nvfp4_ds_mla", "nvfp4"}, {"auto", "fp8"}};
  for (const auto& [flag, canonical] : dtypes) {
    EngineConfig plain = tiny_config(*dir_, 1);
    plain.kv_cache_dtype = flag;
    std::string used;
    auto want = run_all(plain, prompts, 12, nullptr, &used);
    EXPECT_EQ(used, canonical) << flag;
    EngineConfig spec = plain;
    spec.speculative.method = "dspark";
    spec.speculative.num_speculative_tokens = 5;
    spec.speculative.verify_mode = VerifyMode::kFixed;
    EngineMetrics m;
    auto got = run_all(spec, prompts, 12, &m);
    ASSERT_EQ(want.size(), 1u) << flag;
    EXPECT_EQ(want["p0"].tokens.size(), 12u) << flag;
    EXPECT_EQ(got["p0"].tokens, want["p0"].tokens) << flag;
    EXPECT_GT(m.spec_decode_num_draft_tokens_total, 0) << flag;
  }
}

TEST_F(TinyCheckpoint, UnknownKvDtypeIsAStartupError) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  for (const char* bad : {"int4", "fp16", ""}) {
    EngineConfig ec = tiny_config(*dir_, 1);
    ec.kv_cache_dtype = bad;
    auto runner = create_dsv4_runner(ec);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    EXPECT_FALSE((*runner)->check_kv_cache_dtype(bad).ok()) << bad;
    CoreOptions o;
    o.log_startup = false;
    auto core = EngineCore::create(std::move(runner).value(), ec, o);
    ASSERT_FALSE(core.ok()) << bad;
    EXPECT_NE(core.status().message().find("kv-cache-dtype"), std::string::npos) << core.status().message();
  }
}

// A prefix hit restores the draft's context window with the slot snapshot: the draft proposes
// exactly what it proposes on a cold run of the same tokens. Also: the sizes the runner reports
// before allocate() (from config.json alone) are the loaded model's.
TEST_F(TinyCheckpoint, PrefixHitRestoresTheDraftContext) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  EngineConfig ec = tiny_config(*dir_, 2);
  ec.speculative.method = "dspark";
  ec.speculative.num_speculative_tokens = 5;
  auto r = create_dsv4_runner(ec);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ModelRunner& runner = **r;
  ASSERT_TRUE(runner.has_draft());  // known before the weights are loaded
  ASSERT_EQ(runner.num_draft_tokens(), 5);
  const int64_t slot_bytes_before = runner.slot_state_bytes();
  const int64_t block_bytes_before = runner.kv_bytes_per_block(128, "fp8");
  RunnerAllocation a;
  a.num_blocks = 6;
  a.block_size = 128;
  a.max_slots = 2;
  a.max_tokens_per_step = 512;
  a.max_verify_tokens = 6;
  a.kv_cache_dtype = "fp8";
  a.num_snapshots = 1;
  ASSERT_TRUE(runner.allocate(a).ok());
  EXPECT_EQ(runner.slot_state_bytes(), slot_bytes_before);
  EXPECT_EQ(runner.kv_bytes_per_block(128, "fp8"), block_bytes_before);
  EXPECT_EQ(runner.kv_bytes_per_block(128, "nvfp4"), block_bytes_before);  // fp32 storage in every mode

  const std::vector<int32_t> toks = tiny_prompts(*dir_, 1, 150)[0];
  RunnerOutput out;
  // One step of n tokens from `start` (the slot starts over when `restore` >= 0 or start is 0),
  // every row into the draft's context, the slot's state saved as snapshot `snapshot` if >= 0.
  auto step = [&](int slot, int64_t start, int64_t n, const std::vector<int32_t>& table, int restore = -1,
                  int snapshot = -1) {
    RunnerSeq s;
    s.slot = slot;
    s.start_pos = start;
    s.tokens = std::span<const int32_t>(toks.data() + start, n);
    s.block_table = table;
    s.collect_taps = true;
    s.reset = start == 0 || restore >= 0;
    s.restore = restore;
    ASSERT_TRUE(runner.forward(std::span<const RunnerSeq>(&s, 1), nullptr, out).ok());
    ASSERT_TRUE(runner.commit(std::vector<SlotCommit>{{slot, 0, start + n, n, snapshot}}).ok());
  };
  auto propose = [&](int slot) {
    DraftQuery q;
    q.slot = slot;
    q.anchor_token = toks[140];
    q.anchor_pos = 140;
    std::vector<DraftProposal> p;
    EXPECT_TRUE(runner.draft_propose(std::span<const DraftQuery>(&q, 1), p).ok());
    return p.empty() ? DraftProposal() : p[0];
  };
  // cold: slot 0 runs 128 tokens (snapshot at the block boundary), then 12 more
  const std::vector<int32_t> cold_table = {0, 1};
  {  // a snapshot never saved is refused before anything changes
    RunnerSeq s;
    s.slot = 1;
    s.tokens = std::span<const int32_t>(toks.data() + 128, 12);
    s.start_pos = 128;
    s.block_table = cold_table;
    s.reset = true;
    s.restore = 0;
    EXPECT_FALSE(runner.forward(std::span<const RunnerSeq>(&s, 1), nullptr, out).ok());
  }
  step(0, 0, 128, cold_table, -1, /*snapshot=*/0);
  step(0, 128, 12, cold_table);
  const DraftProposal cold = propose(0);
  // prefix hit: slot 1 starts from the snapshot, shares block 0, runs the same 12 tokens
  const std::vector<int32_t> hit_table = {0, 2};
  step(1, 128, 12, hit_table, /*restore=*/0);
  const DraftProposal hit = propose(1);
  ASSERT_EQ(cold.tokens.size(), 5u);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_EQ(hit.confidence, cold.confidence);  // bit-identical: the whole window was restored
}

// Through the engine: a request whose prompt is a prefix hit drafts exactly as the same request
// did cold (same drafts verified, same accepted), with the window of the snapshot restored.
TEST_F(TinyCheckpoint, PrefixHitDraftsLikeAColdRun) {
  ASSERT_TRUE(ok_) << "tandem make-tiny failed";
  auto prompts = tiny_prompts(*dir_, 1, 131);  // the hit restores positions < 128, 3 are recomputed
  prompts.push_back(prompts[0]);
  EngineConfig ec = tiny_config(*dir_, 1);  // one at a time: the second request hits the first's blocks
  ec.speculative.method = "dspark";
  ec.speculative.verify_mode = VerifyMode::kFixed;
  auto outs = run_all(ec, prompts, 100);
  const Out &cold = outs["p0"], &hit = outs["p1"];
  std::printf("cold: %ld drafted, %ld accepted; prefix hit (%ld cached): %ld drafted, %ld accepted\n",
              (long)cold.usage.draft_tokens, (long)cold.usage.accepted_draft_tokens, (long)hit.usage.cached_tokens,
              (long)hit.usage.draft_tokens, (long)hit.usage.accepted_draft_tokens);
  EXPECT_EQ(cold.usage.cached_tokens, 0);
  EXPECT_GE(hit.usage.cached_tokens, 128);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_GT(cold.usage.draft_tokens, 0);
  EXPECT_EQ(hit.usage.draft_tokens, cold.usage.draft_tokens);
  EXPECT_EQ(hit.usage.accepted_draft_tokens, cold.usage.accepted_draft_tokens);
}

// The trained built-in checkpoint (data/builtin): its DSpark draft is good at counting, so full
// accepts, bonus tokens and rollbacks across position 128 (window and ratio-128 compression
// boundary) all happen; outputs must still equal plain greedy, also with preemption forcing
// recompute + prefix-snapshot resume.
TEST(BuiltinCheckpoint, SpeculativeAndPreemptedGreedyEqualPlainGreedy) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "no data/builtin";
  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int start : {1, 38})
    prompts.push_back((*tok)->encode("<｜begin▁of▁sentence｜><｜User｜>Count from " + std::to_string(start) + " to " +
                                     std::to_string(start + 150) + ".<｜Assistant｜></think>"));
  EngineConfig plain = tiny_config(dir, 2);
  auto want = run_all(plain, prompts, 130);
  EngineConfig spec = plain;
  spec.speculative.method = "dspark";
  spec.speculative.verify_mode = VerifyMode::kFixed;
  EngineMetrics m;
  auto got = run_all(spec, prompts, 130, &m);
  for (const auto& [id, o] : want) {
    EXPECT_EQ(o.tokens.size(), 130u);
    EXPECT_EQ(got[id].tokens, o.tokens) << id;
  }
  EXPECT_GT(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total / 2);
  // Two 128-token blocks for two sequences that need two each: whichever crosses position 128
  // first forces a preemption; the victim resumes later (prefix hit on its own cached block).
  auto probe = create_dsv4_runner(spec);
  ASSERT_TRUE(probe.ok());
  EngineConfig tight = spec;
  tight.kv_cache_memory = 2 * ((*probe)->kv_bytes_per_block(128, "fp8") + (*probe)->slot_state_bytes());
  auto again = run_all(tight, prompts, 130, &m);
  EXPECT_GT(m.num_preemptions_total, 0);
  for (const auto& [id, o] : want) EXPECT_EQ(again[id].tokens, o.tokens) << id;
}

}  // namespace
}  // namespace tandem
