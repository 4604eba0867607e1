// The serve option table: defaults, every value form, env fallbacks, errors naming the flag.
#include <gtest/gtest.h>

#include <map>

#include "server/options.h"

namespace tandem::server {
namespace {

Result<ServeOptions> parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  return parse_serve_options(args, [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

TEST(Options, DefaultsAndBasics) {
  auto o = parse({"--model", "/m/DeepSeek-V4-Flash/"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->host, "127.0.0.1");
  EXPECT_EQ(o->port, 8000);
  EXPECT_EQ(o->served_model_names, std::vector<std::string>{"DeepSeek-V4-Flash"});
  EXPECT_EQ(o->engine.model_dir, "/m/DeepSeek-V4-Flash/");
  EXPECT_TRUE(o->engine.enable_prefix_caching);
  EXPECT_EQ(o->engine.block_size, 256);
}

TEST(Options, AllFlags) {
  auto o = parse({"--model", "m", "--host", "0.0.0.0", "--port=9001", "--served-model-name", "a", "b", "--api-key", "k",
                  "--max-model-len", "65536", "--max-num-seqs", "16", "--max-num-batched-tokens", "8192",
                  "--gpu-memory-utilization", "0.85", "--kv-cache-dtype", "fp8", "--block-size", "128",
                  "--speculative-config", R"({"method":"dspark","num_speculative_tokens":3})", "--tensor-parallel-size", "2",
                  "--no-enable-prefix-caching", "--max-cudagraph-capture-size", "32", "--generation-config", "vllm",
                  "--kv-cache-memory", "16G", "--threads", "4"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->host, "0.0.0.0");
  EXPECT_EQ(o->port, 9001);
  EXPECT_EQ(o->served_model_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o->api_key, "k");
  EXPECT_EQ(o->engine.max_model_len, 65536);
  EXPECT_EQ(o->engine.max_num_seqs, 16);
  EXPECT_EQ(o->engine.max_num_batched_tokens, 8192);
  EXPECT_DOUBLE_EQ(o->engine.gpu_memory_utilization, 0.85);
  EXPECT_EQ(o->engine.kv_cache_dtype, "fp8");
  EXPECT_EQ(o->engine.block_size, 128);
  EXPECT_EQ(o->engine.speculative.method, "dspark");
  EXPECT_EQ(o->engine.speculative.num_speculative_tokens, 3);
  EXPECT_EQ(o->engine.tensor_parallel_size, 2);
  EXPECT_FALSE(o->engine.enable_prefix_caching);
  EXPECT_EQ(o->engine.max_cudagraph_capture_size, 32);
  EXPECT_EQ(o->generation_config, "vllm");
  EXPECT_EQ(o->engine.kv_cache_memory, int64_t{16} << 30);
  EXPECT_EQ(o->engine.num_threads, 4);
}

TEST(Options, EnvFallbacks) {
  auto o = parse({"--model", "m"}, {{"VLLM_API_KEY", "v"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->api_key, "v");
  o = parse({"--model", "m"}, {{"VLLM_API_KEY", "v"}, {"TANDEM_API_KEY", "t"}});
  EXPECT_EQ(o->api_key, "t");
  o = parse({"--model", "m", "--api-key", "flag"}, {{"TANDEM_API_KEY", "t"}});
  EXPECT_EQ(o->api_key, "flag");
  o = parse({"--model", "m"}, {{"TANDEM_PORT", "abc"}});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--port"), std::string::npos);
}

TEST(Options, InvalidValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--model", "m", "--port", "70000"}, "--port"},
      {{"--model", "m", "--port", "12x"}, "--port"},
      {{"--model", "m", "--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization"},
      {{"--model", "m", "--kv-cache-dtype", "int3"}, "--kv-cache-dtype"},
      {{"--model", "m", "--block-size", "100"}, "--block-size"},
      {{"--model", "m", "--speculative-config", "{bad"}, "--speculative-config"},
      {{"--model", "m", "--speculative-config", R"({"method":"eagle"})"}, "--speculative-config"},
      {{"--model", "m", "--kv-cache-memory", "12Q"}, "--kv-cache-memory"},
      {{"--model", "m", "--max-num-seqs", "0"}, "--max-num-seqs"},
      {{"--model", "m", "--max-num-seqs"}, "--max-num-seqs"},
      {{"--model", "m", "--frobnicate"}, "--frobnicate"},
      {{"--port", "1"}, "--model"},
  };
  for (const auto& [args, flag] : bad) {
    auto o = parse(args);
    ASSERT_FALSE(o.ok()) << flag;
    EXPECT_NE(o.status().message().find(flag), std::string::npos) << o.status().message();
  }
}

TEST(Options, HelpListsEveryFlag) {
  std::string h = serve_help();
  for (const auto& s : serve_option_table()) EXPECT_NE(h.find(s.flag), std::string::npos) << s.flag;
  EXPECT_EQ(parse({"--help"}).status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace tandem::server
