// --profile production|1m: the seeds' qualified profiles, conflicts naming both sides, and
// --allow-experimental-profile.
#include <gtest/gtest.h>

#include <map>

#include "server/options.h"
#include "server/parse_options.h"

namespace tandem::server {
namespace {

using testing::parse;

TEST(Profile, ProductionSetsTheR0b0tlabLane) {
  auto o = parse({"--model", "m", "--profile", "production"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->profile, "production");
  EXPECT_EQ(o->engine.max_model_len, 200000);
  EXPECT_EQ(o->engine.max_num_seqs, 16);
  EXPECT_EQ(o->engine.max_num_batched_tokens, 16384);
  EXPECT_EQ(o->engine.speculative.method, "dspark");
  EXPECT_EQ(o->engine.speculative.num_speculative_tokens, 5);
  EXPECT_EQ(o->engine.kv_cache_dtype, "nvfp4_ds_mla");
  EXPECT_DOUBLE_EQ(o->engine.gpu_memory_utilization, 0.84);
}

TEST(Profile, OneMillionSetsTheGraph8Lane) {
  auto o = parse({"--model", "m", "--profile=1m"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.max_model_len, 1048576);
  EXPECT_EQ(o->engine.max_num_seqs, 2);
  EXPECT_EQ(o->engine.max_num_batched_tokens, 4096);
  EXPECT_DOUBLE_EQ(o->engine.gpu_memory_utilization, 0.75);
  EXPECT_EQ(o->engine.max_cudagraph_capture_size, 8);
  EXPECT_EQ(o->engine.block_size, 256);
  EXPECT_EQ(o->engine.kv_cache_dtype, "nvfp4_ds_mla");
  EXPECT_EQ(o->engine.speculative.num_speculative_tokens, 5);
}

TEST(Profile, ContradictingFlagNamesBoth) {
  auto o = parse({"--model", "m", "--profile", "production", "--max-num-seqs", "8"});
  ASSERT_FALSE(o.ok());
  const std::string& m = o.status().message();
  EXPECT_NE(m.find("--max-num-seqs 8"), std::string::npos) << m;
  EXPECT_NE(m.find("--profile production"), std::string::npos) << m;
  EXPECT_NE(m.find("--max-num-seqs 16"), std::string::npos) << m;
  EXPECT_NE(m.find("--allow-experimental-profile"), std::string::npos) << m;

  // Flag order does not matter, nor does the spelling of an equivalent value.
  EXPECT_FALSE(parse({"--model", "m", "--kv-cache-dtype", "fp8", "--profile", "1m"}).ok());
  EXPECT_FALSE(parse({"--model", "m", "--profile", "1m", "--gpu-memory-utilization", "0.8"}).ok());
  EXPECT_FALSE(parse({"--model", "m", "--profile", "1m", "--speculative-config",
                      R"({"method":"dspark","num_speculative_tokens":3})"}).ok());
}

TEST(Profile, AgreeingFlagsAreAccepted) {
  auto o = parse({"--model", "m", "--profile", "production", "--max-num-seqs", "16", "--kv-cache-dtype", "nvfp4",
                  "--speculative-config", R"({"method":"dspark","num_speculative_tokens":5,"verify_mode":"fixed"})"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  // Settings the profile does not pin stay the user's.
  EXPECT_EQ(o->engine.speculative.verify_mode, VerifyMode::kFixed);
  auto p = parse({"--model", "m", "--profile", "production", "--port", "9000", "--max-cudagraph-capture-size", "16"});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->engine.max_cudagraph_capture_size, 16);
}

TEST(Profile, ExperimentalOverrideKeepsTheUsersValue) {
  auto o = parse({"--model", "m", "--profile", "production", "--max-num-seqs", "8", "--allow-experimental-profile"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.max_num_seqs, 8);
  EXPECT_EQ(o->engine.max_num_batched_tokens, 16384);  // the rest of the profile still applies
  EXPECT_TRUE(o->allow_experimental_profile);
}

TEST(Profile, EnvironmentIsCheckedLikeFlags) {
  auto o = parse({"--model", "m"}, {{"TANDEM_PROFILE", "1m"}});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.max_num_seqs, 2);
  auto bad = parse({"--model", "m", "--profile", "1m"}, {{"TANDEM_MEMORY_HEADROOM_FLOOR", "4G"}});
  ASSERT_TRUE(bad.ok());  // not a profile setting
  EXPECT_EQ(bad->engine.memory_headroom_floor, int64_t{4} << 30);
}

TEST(Profile, UnknownProfileIsAnError) {
  auto o = parse({"--model", "m", "--profile", "fast"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--profile"), std::string::npos);
  EXPECT_NE(o.status().message().find("fast"), std::string::npos);
}

TEST(Profile, OperationsFlags) {
  auto d = parse({"--model", "m"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->engine.memory_headroom_floor, int64_t{1} << 30);
  EXPECT_DOUBLE_EQ(d->engine.engine_iteration_timeout_s, 300);
  auto o = parse({"--model", "m", "--memory-headroom-floor", "20G", "--engine-iteration-timeout", "2.5",
                  "--audit-manifest", "/etc/tandem/manifest.json"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.memory_headroom_floor, int64_t{20} << 30);
  EXPECT_DOUBLE_EQ(o->engine.engine_iteration_timeout_s, 2.5);
  EXPECT_EQ(o->audit_manifest, "/etc/tandem/manifest.json");
  auto bad = parse({"--model", "m", "--engine-iteration-timeout", "-1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--engine-iteration-timeout"), std::string::npos);
}

}  // namespace
}  // namespace tandem::server
