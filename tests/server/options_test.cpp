// The serve option table: defaults, every value form, env fallbacks, errors naming the flag.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <map>

#include "server/options.h"
#include "server/parse_options.h"

namespace tandem::server {
namespace {

using testing::parse;

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
      {{"--model", "m", "--long-prefill-token-threshold", "-1"}, "--long-prefill-token-threshold"},
      {{"--model", "m", "--max-num-partial-prefills", "0"}, "--max-num-partial-prefills"},
      {{"--model", "m", "--request-timeout", "-2"}, "--request-timeout"},
      {{"--model", "m", "--json-whitespace", "lots"}, "--json-whitespace"},
      {{"--model", "m", "--speculative-config", R"({"method":"dspark","frob":1})"}, "frob"},
      {{"--model", "m", "--prompt", "hi"}, "--prompt"},  // a `run` flag: not one of serve's
  };
  for (const auto& [args, flag] : bad) {
    auto o = parse(args);
    ASSERT_FALSE(o.ok()) << flag;
    EXPECT_NE(o.status().message().find(flag), std::string::npos) << o.status().message();
  }
}

TEST(Options, HelpListsEveryFlag) {
  for (Command cmd : {kServe, kRun, kLogits}) {
    std::string h = command_help(cmd);
    for (const auto& s : option_table())
      EXPECT_EQ(h.find(std::string(s.flag) + " ") != std::string::npos, (s.commands & cmd) != 0) << s.flag << " " << cmd;
  }
  EXPECT_EQ(parse({"--help"}).status().code(), StatusCode::kCancelled);
}

// First run: no --model serves the built-in model, under the name "builtin".
TEST(Options, NoModelMeansTheBuiltinModel) {
  auto o = parse({});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->model, builtin_model_dir());
  EXPECT_EQ(o->engine.model_dir, builtin_model_dir());
  EXPECT_EQ(o->served_model_names, std::vector<std::string>{"builtin"});
}

TEST(Options, NewFlags) {
  auto o = parse({"--long-prefill-token-threshold", "512", "--max-num-partial-prefills", "2", "--request-timeout", "30",
                  "--json-whitespace", "none"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.long_prefill_token_threshold, 512);
  EXPECT_EQ(o->engine.max_num_partial_prefills, 2);
  EXPECT_DOUBLE_EQ(o->request_timeout_s, 30.0);
  EXPECT_EQ(o->json_whitespace, json_grammar::JsonWhitespace::kNone);
}

// `run` and `logits` parse through the same table: shared flags, their own, and the same errors.
TEST(Options, RunAndLogitsShareTheTable) {
  auto env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  auto r = parse_options(kRun, {"--prompt", "hi", "--max-tokens", "7", "--temperature", "0", "--chat",
                                "--speculative-config", R"({"method":"mtp","num_speculative_tokens":2})", "--threads", "1"},
                         env);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->run.prompt, "hi");
  EXPECT_EQ(r->run.max_tokens, 7);
  EXPECT_TRUE(r->run.chat);
  EXPECT_EQ(r->engine.speculative.method, "dspark");
  EXPECT_EQ(r->engine.speculative.num_speculative_tokens, 2);
  EXPECT_EQ(r->engine.max_num_seqs, 1);
  EXPECT_EQ(r->model, builtin_model_dir());
  auto bad = parse_options(kRun, {"--max-tokens", "3"}, env);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--prompt is required"), std::string::npos);
  bad = parse_options(kRun, {"--prompt", "x", "--speculative-config", R"({"method":"dspark","bogus":1})"}, env);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bogus"), std::string::npos);
  bad = parse_options(kRun, {"--prompt", "x", "--port", "1"}, env);  // a serve flag
  ASSERT_FALSE(bad.ok());
  auto l = parse_options(kLogits, {"--model", "m", "--tokens-file", "t.json", "--out", "o.safetensors"}, env);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->logits.out, "o.safetensors");
  EXPECT_FALSE(parse_options(kLogits, {"--model", "m", "--out", "o"}, env).ok());
}

TEST(Options, SyntheticNamesAnOfficialConfig) {
  auto o = parse({"--synthetic", "deepseek-v4-flash-0731"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->engine.synthetic, "deepseek-v4-flash-0731");
  EXPECT_EQ(o->served_model_names, std::vector<std::string>{"deepseek-v4-flash-0731"});
  EXPECT_EQ(o->model, builtin_model_dir());  // the tokenizer's source
  auto env = parse({}, {{"TANDEM_SYNTHETIC", "deepseek-v4-flash-preview"}});
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->engine.synthetic, "deepseek-v4-flash-preview");
  auto bad = parse({"--synthetic", "deepseek-v4-pro"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--synthetic"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("deepseek-v4-flash-0731"), std::string::npos) << bad.status().message();
  auto tiny = parse({"--synthetic", "tiny:tp8"});
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  EXPECT_EQ(tiny->engine.synthetic, "tiny:tp8");
  auto bad_tiny = parse({"--synthetic", "tiny:huge"});
  ASSERT_FALSE(bad_tiny.ok());
  EXPECT_NE(bad_tiny.status().message().find("unknown preset"), std::string::npos) << bad_tiny.status().message();
  auto none = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  auto run = parse_options(kRun, {"--prompt", "x", "--synthetic", "deepseek-v4-flash-0731"}, none);
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_FALSE(parse_options(kLogits, {"--tokens-file", "t", "--out", "o", "--synthetic", "deepseek-v4-flash-0731"}, none)
                   .ok());
}

// Tensor parallelism takes the same flags on every command and device (GPU collectives included).
TEST(Options, TensorParallelFlagsOnEveryCommand) {
  auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TANDEM_NCCL_LIBRARY") return std::string("/opt/nccl/libnccl.so.2");
    return std::nullopt;
  };
  const std::vector<std::string> tp = {"--tensor-parallel-size", "4", "--nnodes", "2", "--node-rank", "1",
                                       "--master-addr", "10.0.0.1", "--master-port", "29600", "--distributed-timeout",
                                       "30", "--device", "cuda", "--tp-collectives", "peer", "--tp-peer-max-bytes",
                                       "512K", "--tp-share-gpus"};
  for (Command cmd : {kServe, kRun, kLogits}) {
    std::vector<std::string> args = tp;
    if (cmd == kRun) args.insert(args.end(), {"--prompt", "hi"});
    if (cmd == kLogits) args.insert(args.end(), {"--tokens-file", "t.json", "--out", "o.safetensors"});
    auto o = parse_options(cmd, args, env);
    ASSERT_TRUE(o.ok()) << cmd << ": " << o.status().message();
    const EngineConfig& e = o->engine;
    EXPECT_EQ(e.tensor_parallel_size, 4);
    EXPECT_EQ(e.nnodes, 2);
    EXPECT_EQ(e.node_rank, 1);
    EXPECT_EQ(e.master_addr, "10.0.0.1");
    EXPECT_EQ(e.master_port, 29600);
    EXPECT_DOUBLE_EQ(e.distributed_timeout_s, 30);
    EXPECT_EQ(e.device, "cuda");
    EXPECT_EQ(e.tp_collectives, "peer");
    EXPECT_EQ(e.tp_peer_max_bytes, 512 * 1024);
    EXPECT_TRUE(e.tp_share_gpus);
    EXPECT_EQ(e.nccl_library, "/opt/nccl/libnccl.so.2");
  }
  auto bad = parse_options(kServe, {"--tp-collectives", "nvls"}, env);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tp-collectives"), std::string::npos) << bad.status().message();
  bad = parse_options(kServe, {"--tp-peer-max-bytes", "1K"}, env);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tp-peer-max-bytes"), std::string::npos) << bad.status().message();
}

// The commands: `run` without --prompt says so (exit 2, not CLI11's 106); a missing model
// directory is named as such.
TEST(Options, CommandErrorsAreClear) {
  auto sh = [](const std::string& cmd, std::string* out) {
    std::string full = cmd + " 2>&1";
    FILE* p = popen(full.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  std::string out;
  EXPECT_EQ(sh(std::string(TANDEM_BINARY) + " run", &out), 2) << out;
  EXPECT_NE(out.find("--prompt is required"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(sh(std::string(TANDEM_BINARY) + " run --model /nonexistent-tandem --prompt hi", &out), 1) << out;
  EXPECT_NE(out.find("/nonexistent-tandem: no such directory"), std::string::npos) << out;
  EXPECT_EQ(out.find("tokenizer"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem::server
