// Long context on the real CPU model: a 65,536-token prompt through chunked prefill on a tiny
// checkpoint (preset "long": no CSA layers, whose indexer would make 64K tokens cost minutes), with the KV pool sized to exactly the blocks it needs; block accounting is checked
// exactly after every step, and one token more than the capacity is refused at submit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/dsv4_runner.h"
#include "engine/engine_core.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(LongContext, Prompt64kWithExactCapacityAccounting) {
  const std::string dir = (fs::temp_directory_path() / ("tandem-long-" + std::to_string(getpid()))).string();
  std::string cmd = std::string(TANDEM_BINARY) + " make-tiny " + dir + " --seed 7 --preset long > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "tandem make-tiny failed";

  constexpr int64_t kPrompt = 65536, kGen = 3, kBs = 256;
  constexpr int64_t kBlocks = (kPrompt + kGen + kBs - 1) / kBs;  // 257: the last holds 3 tokens
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = 8192;
  ec.block_size = static_cast<int>(kBs);
  ec.kv_cache_dtype = "fp8";
  ec.enable_prefix_caching = false;  // every block is the request's own: exact counts
  ec.num_threads = 1;
  auto runner = create_dsv4_runner(ec);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  ec.kv_cache_memory = kBlocks * (*runner)->kv_bytes_per_block(static_cast<int>(kBs), "fp8");
  CoreOptions o;
  o.check_integrity_each_step = true;
  o.log_startup = false;
  auto core_r = EngineCore::create(std::move(runner).value(), ec, o);
  ASSERT_TRUE(core_r.ok()) << core_r.status().to_string();
  auto& core = *core_r;
  EXPECT_EQ(core->num_kv_blocks(), kBlocks);
  EXPECT_EQ(core->model_info().kv_capacity_tokens, kBlocks * kBs);
  EXPECT_EQ(core->model_info().max_model_len, kBlocks * kBs);  // capped by the pool, not the config

  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  const int64_t V = (*tok)->vocab_size();
  auto prompt_of = [&](int64_t n) {
    std::vector<int32_t> p(n);
    uint64_t x = 99;
    for (auto& t : p) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      t = static_cast<int32_t>(2 + (x >> 33) % static_cast<uint64_t>(std::min<int64_t>(V - 2, 300)));
    }
    return p;
  };

  // A prompt that fills the whole capacity leaves no room to generate: refused with the numbers.
  Request too_long;
  too_long.request_id = "too-long";
  too_long.prompt_tokens = prompt_of(kBlocks * kBs);
  Status refused = core->validate(too_long);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find(std::to_string(kBlocks * kBs)), std::string::npos) << refused.message();

  Request r;
  r.request_id = "long";
  r.prompt_tokens = prompt_of(kPrompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = kGen;
  r.sampling.ignore_eos = true;
  std::vector<int32_t> out;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
  ASSERT_TRUE(core->validate(r).ok());
  ASSERT_TRUE(core->add_request(std::move(r), [&](const RequestEvent& ev) {
                    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
                    if (ev.finish != FinishReason::kNone) {
                      finish = ev.finish;
                      usage = ev.usage;
                    }
                  }).ok());
  int steps = 0;
  int64_t last_done = 0;
  while (core->has_work()) {
    ASSERT_TRUE(core->step().ok());
    ++steps;
    if (!core->has_work()) break;
    const int64_t computed = core->num_computed("long");
    const int64_t held = static_cast<int64_t>(core->block_table("long").size());
    // Blocks cover exactly what this step computed (plus the next step's chunk at most).
    EXPECT_GE(held * kBs, computed);
    EXPECT_LE(held, std::min<int64_t>(kBlocks, (computed + ec.max_num_batched_tokens + kBs - 1) / kBs));
    EXPECT_EQ(core->kv().num_free(), kBlocks - held);
    EngineMetrics m = core->metrics(true);
    if (computed < kPrompt) {
      EXPECT_EQ(m.long_prefill_prompt_tokens, kPrompt);
      EXPECT_EQ(m.long_prefill_done_tokens, computed);
      EXPECT_GT(computed, last_done);  // progress every step
      last_done = computed;
    }
  }
  EXPECT_EQ(steps, static_cast<int>(kPrompt / ec.max_num_batched_tokens) + static_cast<int>(kGen) - 1);
  EXPECT_EQ(finish, FinishReason::kLength);
  EXPECT_EQ(out.size(), static_cast<size_t>(kGen));
  EXPECT_EQ(usage.prompt_tokens, kPrompt);
  EXPECT_EQ(usage.cached_tokens, 0);
  EXPECT_EQ(usage.completion_tokens, kGen);
  EXPECT_EQ(core->kv().num_free(), kBlocks);
  EXPECT_EQ(core->metrics(true).kv_blocks_leaked, 0);
  std::error_code ec2;
  fs::remove_all(dir, ec2);
}

}  // namespace
}  // namespace tandem
