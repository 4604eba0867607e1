// The option table of `tandem serve`, `run` and `logits`, and its argv/env parser.
#include "server/options.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "common/check.h"
#include "io/official_configs.h"

#include <nlohmann/json.hpp>

namespace tandem::server {
namespace {

Result<int64_t> parse_int(const std::string& v) {
  if (v.empty()) return invalid_argument("expected an integer, got an empty value");
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end != v.c_str() + v.size()) return invalid_argument("expected an integer, got '{}'", v);
  return static_cast<int64_t>(x);
}

Result<double> parse_double(const std::string& v) {
  if (v.empty()) return invalid_argument("expected a number, got an empty value");
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end != v.c_str() + v.size() || !std::isfinite(x))
    return invalid_argument("expected a number, got '{}'", v);
  return x;
}

Result<bool> parse_bool(const std::string& v) {
  if (v == "1" || v == "true" || v == "True" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "False" || v == "no" || v == "off") return false;
  return invalid_argument("expected true/false, got '{}'", v);
}

// Integer option in [lo, hi] stored through `set`.
template <typename F>
std::function<Status(ServeOptions&, const std::string&)> int_in(int64_t lo, int64_t hi, F set) {
  return [lo, hi, set](ServeOptions& o, const std::string& v) -> Status {
    auto r = parse_int(v);
    if (!r.ok()) return r.status();
    if (*r < lo || *r > hi) return invalid_argument("must be in [{}, {}], got {}", lo, hi, *r);
    set(o, *r);
    return Status();
  };
}

std::vector<OptionSpec> build_table() {
  using O = ServeOptions;
  std::vector<OptionSpec> t;
  t.push_back({"--model", "TANDEM_MODEL", OptionType::kString, "the built-in model",
               "model directory (config.json, tokenizer.json, *.safetensors)",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.model = v;
                 o.engine.model_dir = v;
                 return Status();
               }});
  t.push_back({"--synthetic", "TANDEM_SYNTHETIC", OptionType::kString, "(none)",
               "run an official config with synthetic weights generated on the GPU, no checkpoint needed: "
               "deepseek-v4-flash-0731 | deepseek-v4-flash-preview | tiny:<make-tiny preset> (the tokenizer comes "
               "from --model, default the built-in model's)",
               [](O& o, const std::string& v) -> Status {
                 auto c = synthetic_config(v);
                 if (!c.ok()) return c.status();
                 o.engine.synthetic = v;
                 return Status();
               },
               nullptr, kServe | kRun});
  t.push_back({"--host", "TANDEM_HOST", OptionType::kString, "127.0.0.1", "address to listen on",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.host = v;
                 return Status();
               }});
  t.push_back({"--port", "TANDEM_PORT", OptionType::kInt, "8000", "TCP port (0 = any free port)",
               int_in(0, 65535, [](O& o, int64_t x) { o.port = static_cast<int>(x); })});
  t.push_back({"--served-model-name", "", OptionType::kStringList, "basename of --model",
               "one or more names the API accepts in \"model\" (the first is reported)",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("model names must not be empty");
                 o.served_model_names.push_back(v);
                 return Status();
               }});
  t.push_back({"--api-key", "TANDEM_API_KEY", OptionType::kString, "(none)",
               "require 'Authorization: Bearer KEY' on /v1/* (env TANDEM_API_KEY or VLLM_API_KEY)",
               [](O& o, const std::string& v) -> Status {
                 o.api_key = v;
                 return Status();
               }});
  t.push_back({"--max-model-len", "", OptionType::kInt, "0 (from the model)",
               "maximum prompt + completion tokens per request",
               int_in(0, int64_t{1} << 31, [](O& o, int64_t x) { o.engine.max_model_len = x; })});
  t.push_back({"--max-num-seqs", "", OptionType::kInt, "8", "maximum sequences decoded together",
               int_in(1, 4096, [](O& o, int64_t x) { o.engine.max_num_seqs = static_cast<int>(x); })});
  t.push_back({"--max-num-batched-tokens", "", OptionType::kInt, "2048", "token budget per engine step",
               int_in(1, 1 << 24, [](O& o, int64_t x) { o.engine.max_num_batched_tokens = static_cast<int>(x); })});
  t.push_back({"--gpu-memory-utilization", "", OptionType::kDouble, "0.9",
               "fraction of GPU memory the engine may use (0, 1]",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (!(*r > 0.0 && *r <= 1.0)) return invalid_argument("must be in (0, 1], got {}", v);
                 o.engine.gpu_memory_utilization = *r;
                 return Status();
               }});
  t.push_back({"--kv-cache-dtype", "", OptionType::kString, "auto",
               "auto | bf16 | fp8 | nvfp4 | fp8_ds_mla | nvfp4_ds_mla",
               [](O& o, const std::string& v) -> Status {
                 static const std::set<std::string> ok = {"auto", "bf16", "fp8", "nvfp4", "fp8_ds_mla", "nvfp4_ds_mla"};
                 if (!ok.count(v)) return invalid_argument("unsupported value '{}' (auto|bf16|fp8|nvfp4|fp8_ds_mla|nvfp4_ds_mla)", v);
                 o.engine.kv_cache_dtype = v;
                 return Status();
               }});
  t.push_back({"--block-size", "", OptionType::kInt, "256", "KV block size in tokens (power of two, 16..4096)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_int(v);
                 if (!r.ok()) return r.status();
                 if (*r < 16 || *r > 4096 || (*r & (*r - 1)) != 0)
                   return invalid_argument("must be a power of two in [16, 4096], got {}", v);
                 o.engine.block_size = static_cast<int>(*r);
                 return Status();
               }});
  t.push_back({"--speculative-config", "", OptionType::kString, "(off)",
               "JSON, e.g. '{\"method\":\"dspark\",\"num_speculative_tokens\":5}'",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_speculative_config(v);  // the one parser (src/engine/speculative_config.cpp)
                 if (!r.ok()) {  // its messages already name the flag
                   std::string m = r.status().message();
                   const std::string prefix = "--speculative-config: ";
                   if (m.rfind(prefix, 0) == 0) m = m.substr(prefix.size());
                   return invalid_argument("{}", m);
                 }
                 o.engine.speculative = *r;
                 return Status();
               }});
  t.push_back({"--tensor-parallel-size", "", OptionType::kInt, "1",
               "ranks (processes) the model is sharded over; on one host the head starts them itself",
               int_in(1, 64, [](O& o, int64_t x) { o.engine.tensor_parallel_size = static_cast<int>(x); })});
  t.push_back({"--nnodes", "", OptionType::kInt, "1", "nodes the tensor-parallel ranks are spread over",
               int_in(1, 64, [](O& o, int64_t x) { o.engine.nnodes = static_cast<int>(x); })});
  t.push_back({"--node-rank", "", OptionType::kInt, "0", "this node's index (0 = the head, which serves HTTP)",
               int_in(0, 63, [](O& o, int64_t x) { o.engine.node_rank = static_cast<int>(x); })});
  t.push_back({"--master-addr", "", OptionType::kString, "127.0.0.1",
               "the head's address: it binds there, the other ranks connect",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.engine.master_addr = v;
                 return Status();
               }});
  t.push_back({"--master-port", "", OptionType::kInt, "29500",
               "the head's port for the ranks' collectives (the next port carries heartbeats)",
               int_in(1, 65534, [](O& o, int64_t x) { o.engine.master_port = static_cast<int>(x); })});
  t.push_back({"--distributed-timeout", "", OptionType::kDouble, "120",
               "seconds the head waits for every rank to connect at start-up",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (*r <= 0 || *r > 86400) return invalid_argument("must be in (0, 86400], got {}", v);
                 o.engine.distributed_timeout_s = *r;
                 return Status();
               }});
  t.push_back({"--tp-collectives", "", OptionType::kString, "auto",
               "GPU tensor parallelism: auto | nccl | peer | symmetric (the paths of the collectives)",
               [](O& o, const std::string& v) -> Status {
                 if (v != "auto" && v != "nccl" && v != "peer" && v != "symmetric")
                   return invalid_argument("must be auto, nccl, peer or symmetric, got '{}'", v);
                 o.engine.tp_collectives = v;
                 return Status();
               }});
  t.push_back({"--tp-peer-max-bytes", "", OptionType::kBytes, "1M",
               "GPU tensor parallelism: largest message (per rank) of the peer-memory path",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_byte_size(v);
                 if (!r.ok()) return r.status();
                 if (*r < 4096 || *r > (int64_t{1} << 30)) return invalid_argument("must be in [4K, 1G], got {}", v);
                 o.engine.tp_peer_max_bytes = *r;
                 return Status();
               }});
  t.push_back({"--nccl-library", "TANDEM_NCCL_LIBRARY", OptionType::kString, "(search)",
               "path of libnccl.so.2 for GPU tensor parallelism (default: LD_LIBRARY_PATH, the loader, pip's nvidia-nccl)",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.engine.nccl_library = v;
                 return Status();
               }});
  t.push_back({"--tp-share-gpus", "TANDEM_TP_SHARE_GPUS", OptionType::kBool, "off",
               "TEST ONLY: let tensor-parallel ranks share GPUs (distinct NCCL_HOSTID per rank; NCCL over loopback: slow)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.engine.tp_share_gpus = *r;
                 return Status();
               }});
  t.push_back({"--enable-prefix-caching", "", OptionType::kBool, "on", "reuse KV of shared prompt prefixes",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.engine.enable_prefix_caching = *r;
                 return Status();
               },
               "--no-enable-prefix-caching"});
  t.push_back({"--max-cudagraph-capture-size", "", OptionType::kInt, "8", "largest batch captured in a CUDA graph",
               int_in(0, 4096, [](O& o, int64_t x) { o.engine.max_cudagraph_capture_size = static_cast<int>(x); })});
  t.push_back({"--generation-config", "", OptionType::kString, "auto",
               "'auto' (model dir's generation_config.json), 'vllm' (built-in defaults) or a directory",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.generation_config = v;
                 return Status();
               }});
  t.push_back({"--kv-cache-memory", "", OptionType::kBytes, "0 (derived)", "KV pool size, e.g. 16G",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_byte_size(v);
                 if (!r.ok()) return r.status();
                 o.engine.kv_cache_memory = *r;
                 return Status();
               }});
  t.push_back({"--threads", "TANDEM_THREADS", OptionType::kInt, "0 (all cores)", "CPU threads for the CPU backend",
               int_in(0, 4096, [](O& o, int64_t x) { o.engine.num_threads = static_cast<int>(x); })});
  t.push_back({"--device", "TANDEM_DEVICE", OptionType::kString, "auto", "auto | cpu | cuda",
               [](O& o, const std::string& v) -> Status {
                 if (v != "auto" && v != "cpu" && v != "cuda") return invalid_argument("must be auto, cpu or cuda, got '{}'", v);
                 o.engine.device = v;
                 return Status();
               }});
  t.push_back({"--seed", "", OptionType::kInt, "0", "default sampling seed",
               int_in(0, INT64_MAX, [](O& o, int64_t x) { o.engine.default_seed = static_cast<uint64_t>(x); })});
  t.push_back({"--max-pending-requests", "", OptionType::kInt, "1024",
               "requests in flight before new ones get 429",
               int_in(1, 1 << 20, [](O& o, int64_t x) { o.max_pending_requests = static_cast<int>(x); })});
  t.push_back({"--max-request-body", "", OptionType::kBytes, "32M", "largest request body (413 above)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_byte_size(v);
                 if (!r.ok()) return r.status();
                 if (*r < 1024) return invalid_argument("must be at least 1024 bytes");
                 o.max_body_bytes = *r;
                 return Status();
               }});
  t.push_back({"--http-threads", "", OptionType::kInt, "256", "HTTP connection threads",
               int_in(4, 8192, [](O& o, int64_t x) { o.http_threads = static_cast<int>(x); })});
  t.push_back({"--shutdown-timeout", "", OptionType::kDouble, "30", "seconds to drain in-flight requests on SIGTERM",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (*r < 0 || *r > 3600) return invalid_argument("must be in [0, 3600], got {}", v);
                 o.shutdown_timeout_s = *r;
                 return Status();
               }});
  t.push_back({"--profile", "TANDEM_PROFILE", OptionType::kString, "(none)",
               "production (200K context, 16 seqs, 16384 batched tokens, DSpark K=5, nvfp4 KV, 0.84) | 1m "
               "(1048576 context, 2 seqs, 4096 batched tokens, 0.75, graphs up to 8); docs/OPERATIONS.md",
               [](O& o, const std::string& v) -> Status {
                 for (const auto& p : serve_profiles())
                   if (v == p.name) {
                     o.profile = v;
                     return Status();
                   }
                 return invalid_argument("unknown profile '{}' (production | 1m)", v);
               }});
  t.push_back({"--allow-experimental-profile", "", OptionType::kBool, "off",
               "allow flags that contradict --profile (an unqualified, experimental configuration)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.allow_experimental_profile = *r;
                 return Status();
               }});
  t.push_back({"--memory-headroom-floor", "TANDEM_MEMORY_HEADROOM_FLOOR", OptionType::kBytes, "1G",
               "refuse to start when host MemAvailable (or GPU free memory) after the planned pools would be under "
               "this (0 = no floor)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_byte_size(v);
                 if (!r.ok()) return r.status();
                 o.engine.memory_headroom_floor = *r;
                 return Status();
               }});
  t.push_back({"--engine-iteration-timeout", "TANDEM_ENGINE_ITERATION_TIMEOUT_S", OptionType::kDouble, "300",
               "watchdog: seconds one engine step may make no progress before its requests fail and the server "
               "exits (0 = off; vLLM's VLLM_ENGINE_ITERATION_TIMEOUT_S)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (*r < 0 || *r > 86400) return invalid_argument("must be in [0, 86400], got {}", v);
                 o.engine.engine_iteration_timeout_s = *r;
                 return Status();
               }});
  t.push_back({"--audit-manifest", "TANDEM_AUDIT_MANIFEST", OptionType::kString, "(none)",
               "JSON runtime contract (tandem audit --manifest); start-up refuses on any mismatch",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.audit_manifest = v;
                 return Status();
               }});
  t.push_back({"--long-prefill-token-threshold", "", OptionType::kInt, "0 (max-num-batched-tokens / 4)",
               "a prompt with more tokens left is long: it prefills at most this many tokens per step "
               "while other requests run or wait, so they get tokens in every step",
               int_in(0, 1 << 24, [](O& o, int64_t x) { o.engine.long_prefill_token_threshold = static_cast<int>(x); })});
  t.push_back({"--max-num-partial-prefills", "", OptionType::kInt, "1",
               "long prompts prefilled at once; further long prompts wait while short ones go ahead",
               int_in(1, 4096, [](O& o, int64_t x) { o.engine.max_num_partial_prefills = static_cast<int>(x); })});
  t.push_back({"--request-timeout", "", OptionType::kDouble, "0 (none)",
               "seconds a request may run before it ends with finish_reason \"timeout\" (a request's own "
               "\"request_timeout\" may shorten it)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (*r < 0 || *r > 86400 * 7) return invalid_argument("must be in [0, 604800], got {}", v);
                 o.request_timeout_s = *r;
                 return Status();
               }});
  t.push_back({"--json-whitespace", "", OptionType::kString, "formatted",
               "whitespace allowed in constrained JSON (response_format, forced tool calls): formatted "
               "(one space, or a newline and an indent per level) | none",
               [](O& o, const std::string& v) -> Status {
                 auto r = json_grammar::parse_json_whitespace(v);
                 if (!r.ok()) return r.status();
                 o.json_whitespace = *r;
                 return Status();
               }});
  // ---- tandem run ----
  t.push_back({"--prompt", "", OptionType::kString, "(required)", "prompt text",
               [](O& o, const std::string& v) -> Status {
                 o.run.prompt = v;
                 return Status();
               }, nullptr, kRun});
  t.push_back({"--chat", "", OptionType::kBool, "off", "wrap the prompt as one user turn of the DeepSeek-V4 chat format",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.run.chat = *r;
                 return Status();
               }, nullptr, kRun});
  t.push_back({"--max-tokens", "", OptionType::kInt, "128", "tokens to generate",
               int_in(1, 1 << 24, [](O& o, int64_t x) { o.run.max_tokens = static_cast<int>(x); }), nullptr, kRun});
  t.push_back({"--temperature", "", OptionType::kDouble, "1.0", "sampling temperature, 0 = greedy",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (*r < 0) return invalid_argument("must be >= 0, got {}", v);
                 o.run.temperature = *r;
                 return Status();
               }, nullptr, kRun});
  t.push_back({"--top-p", "", OptionType::kDouble, "1.0", "nucleus sampling mass (0, 1]",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_double(v);
                 if (!r.ok()) return r.status();
                 if (!(*r > 0 && *r <= 1)) return invalid_argument("must be in (0, 1], got {}", v);
                 o.run.top_p = *r;
                 return Status();
               }, nullptr, kRun});
  t.push_back({"--verbose", "", OptionType::kBool, "off", "log the engine's start-up and progress lines",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.run.verbose = *r;
                 return Status();
               }, nullptr, kRun});
  // ---- tandem logits ----
  t.push_back({"--tokens-file", "", OptionType::kString, "(required)", "JSON with \"prompt\" (and optional \"decode\", \"prefill_chunks\") token ids",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.logits.tokens_file = v;
                 return Status();
               }, nullptr, kLogits});
  t.push_back({"--out", "", OptionType::kString, "(required)", "output .safetensors path",
               [](O& o, const std::string& v) -> Status {
                 if (v.empty()) return invalid_argument("must not be empty");
                 o.logits.out = v;
                 return Status();
               }, nullptr, kLogits});
  t.push_back({"--tp-write-every-rank", "", OptionType::kBool, "off",
               "tensor parallelism: every rank R > 0 also writes OUT.rankR (its own full logits, for cross-rank checks)",
               [](O& o, const std::string& v) -> Status {
                 auto r = parse_bool(v);
                 if (!r.ok()) return r.status();
                 o.logits.every_rank = *r;
                 return Status();
               }, nullptr, kLogits});
  // Options every command shares (the engine's model and sizing).
  for (auto& spec : t) {
    const std::string f = spec.flag;
    if (f == "--model" || f == "--threads" || f == "--device") spec.commands = kServe | kRun | kLogits;
    if (f == "--seed" || f == "--speculative-config" || f == "--kv-cache-dtype" || f == "--kv-cache-memory" ||
        f == "--max-model-len" || f == "--block-size")
      spec.commands = kServe | kRun;
    // Tensor parallelism: every command runs a sharded model the same way (README: one table).
    if (f == "--tensor-parallel-size" || f == "--nnodes" || f == "--node-rank" || f == "--master-addr" ||
        f == "--master-port" || f == "--distributed-timeout" || f == "--tp-collectives" || f == "--tp-peer-max-bytes" ||
        f == "--nccl-library" || f == "--tp-share-gpus")
      spec.commands = kServe | kRun | kLogits;
  }
  return t;
}

}  // namespace

const std::vector<ServeProfile>& serve_profiles() {
  // The seeds' qualified profiles: r0b0tlab's native production lane and the Graph-8 package's
  // stabilized 1M lane (both keep nvfp4_ds_mla KV and DSpark K5).
  static const std::vector<ServeProfile> k = {
      {"production", "r0b0tlab native production lane: 200K ceiling, 16 slots, 16K batched tokens, DSpark K5",
       {{"--max-model-len", "200000"},
        {"--max-num-seqs", "16"},
        {"--max-num-batched-tokens", "16384"},
        {"--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5}"},
        {"--kv-cache-dtype", "nvfp4_ds_mla"},
        {"--gpu-memory-utilization", "0.84"}}},
      {"1m", "Graph-8 stabilized 1M lane: 1,048,576 context, 2 sequences, 4,096 batched tokens, graphs [1,2,4,8]",
       {{"--max-model-len", "1048576"},
        {"--max-num-seqs", "2"},
        {"--max-num-batched-tokens", "4096"},
        {"--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5}"},
        {"--kv-cache-dtype", "nvfp4_ds_mla"},
        {"--gpu-memory-utilization", "0.75"},
        {"--max-cudagraph-capture-size", "8"},
        {"--block-size", "256"}}},
  };
  return k;
}

nlohmann::json options_fingerprint(const ServeOptions& o) {
  const EngineConfig& e = o.engine;
  std::string kv = e.kv_cache_dtype;
  if (kv == "nvfp4_ds_mla") kv = "nvfp4";
  if (kv == "fp8_ds_mla") kv = "fp8";
  return {{"max_model_len", e.max_model_len},
          {"max_num_seqs", e.max_num_seqs},
          {"max_num_batched_tokens", e.max_num_batched_tokens},
          {"block_size", e.block_size},
          {"kv_cache_dtype", kv},
          {"kv_cache_memory", e.kv_cache_memory},
          {"gpu_memory_utilization", e.gpu_memory_utilization},
          {"enable_prefix_caching", e.enable_prefix_caching},
          {"tensor_parallel_size", e.tensor_parallel_size},
          {"tp_collectives", e.tp_collectives},
          {"max_cudagraph_capture_size", e.max_cudagraph_capture_size},
          {"speculative_method", e.speculative.method},
          {"num_speculative_tokens", e.speculative.method.empty() ? 0 : e.speculative.num_speculative_tokens},
          {"device", e.device},
          {"memory_headroom_floor", e.memory_headroom_floor},
          {"engine_iteration_timeout_s", e.engine_iteration_timeout_s},
          {"profile", o.profile}};
}

Result<int64_t> parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return invalid_argument("expected a size like 16G or 512M, got '{}'", text);
  auto num = parse_double(text.substr(0, i));
  if (!num.ok()) return num.status();
  std::string unit = text.substr(i);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else return invalid_argument("unknown size unit '{}' in '{}'", unit, text);
  double bytes = *num * mult;
  if (bytes > 9.0e18) return invalid_argument("size '{}' too large", text);
  return static_cast<int64_t>(bytes);
}

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = build_table();
  return table;
}

namespace {
// Applies o.profile: each setting the user did not give is set; one the user gave must run the
// same way as the profile's value (checked by applying the profile's value to a copy and
// comparing fingerprints), unless --allow-experimental-profile.
Status apply_profile(ServeOptions& o, const std::map<std::string, std::string>& user_values) {
  const ServeProfile* profile = nullptr;
  for (const auto& p : serve_profiles())
    if (o.profile == p.name) profile = &p;
  if (!profile) return invalid_argument("--profile: unknown profile '{}'", o.profile);
  for (const auto& [flag, value] : profile->settings) {
    const OptionSpec* spec = nullptr;
    for (const auto& s : option_table())
      if (std::string(s.flag) == flag) spec = &s;
    TANDEM_CHECK_MSG(spec != nullptr, flag);
    auto user = user_values.find(flag);
    if (user == user_values.end()) {
      TANDEM_RETURN_IF_ERROR(spec->apply(o, value));
      continue;
    }
    ServeOptions with_profile = o;
    TANDEM_RETURN_IF_ERROR(spec->apply(with_profile, value));
    if (options_fingerprint(with_profile) == options_fingerprint(o) || o.allow_experimental_profile) continue;
    return invalid_argument(
        "{} {} contradicts --profile {} ({} {}); drop the flag, or pass --allow-experimental-profile to run an "
        "unqualified configuration",
        flag, user->second, o.profile, flag, value);
  }
  return Status();
}
}  // namespace

std::string builtin_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists("models/builtin/config.json", ec)) return "models/builtin";
#ifdef TANDEM_SOURCE_DIR
  const std::string src = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  if (fs::exists(src + "/config.json", ec)) return src;
#endif
  return "data/builtin";
}

std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

Result<ServeOptions> parse_serve_options(const std::vector<std::string>& args, const EnvLookup& env) {
  return parse_options(kServe, args, env);
}

Result<ServeOptions> parse_options(Command command, const std::vector<std::string>& args, const EnvLookup& env) {
  ServeOptions o;
  // Serving defaults that differ from the engine library's (which tests use bare).
  o.engine.memory_headroom_floor = int64_t{1} << 30;
  o.engine.engine_iteration_timeout_s = 300;
  if (command == kRun) {
    // One prompt: one slot and a small KV pool, unless the flags say otherwise.
    o.engine.max_num_seqs = 1;
    o.engine.kv_cache_memory = int64_t{256} << 20;
  }
  std::map<std::string, std::string> user_values;  // flag -> value the user gave (argv or env)
  const auto& table = option_table();
  std::set<std::string> given;
  auto find = [&](const std::string& flag, bool* negative) -> const OptionSpec* {
    for (const auto& s : table) {
      if (!(s.commands & command)) continue;
      if (flag == s.flag) { *negative = false; return &s; }
      if (s.negative_flag && flag == s.negative_flag) { *negative = true; return &s; }
    }
    return nullptr;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h") return Status(StatusCode::kCancelled, "help requested");
    if (arg.rfind("--", 0) != 0) return invalid_argument("unexpected argument '{}'", arg);
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    bool negative = false;
    const OptionSpec* spec = find(arg, &negative);
    if (!spec) return invalid_argument("unknown flag {}", arg);  // (or one this command does not take)
    given.insert(spec->flag);
    std::vector<std::string> values;
    if (spec->type == OptionType::kBool) {
      if (negative && inline_value) return invalid_argument("{} takes no value", arg);
      values.push_back(negative ? "false" : inline_value.value_or("true"));
    } else if (inline_value) {
      values.push_back(*inline_value);
    } else if (spec->type == OptionType::kStringList) {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) values.push_back(args[++i]);
      if (values.empty()) return invalid_argument("{} needs at least one value", arg);
    } else {
      if (i + 1 >= args.size()) return invalid_argument("{} needs a value", arg);
      values.push_back(args[++i]);
    }
    for (const auto& v : values) {
      Status st = spec->apply(o, v);
      if (!st.ok()) return invalid_argument("{}: {}", spec->flag, st.message());
      user_values[spec->flag] = v;
    }
  }
  // Environment fallbacks for flags not given on the command line.
  if (env) {
    for (const auto& s : table) {
      if (!(s.commands & command) || !*s.env || given.count(s.flag)) continue;
      auto v = env(s.env);
      if (!v && std::string(s.flag) == "--api-key") v = env("VLLM_API_KEY");
      if (!v) continue;
      Status st = s.apply(o, *v);
      if (!st.ok()) return invalid_argument("{} (from env {}): {}", s.flag, s.env, st.message());
      user_values[s.flag] = *v;
    }
  }
  if (!o.profile.empty()) TANDEM_RETURN_IF_ERROR(apply_profile(o, user_values));
  if (o.model.empty()) {
    o.model = builtin_model_dir();
    o.engine.model_dir = o.model;
  }
  if (command == kRun && o.run.prompt.empty()) return invalid_argument("--prompt is required");
  if (command == kLogits && o.logits.tokens_file.empty()) return invalid_argument("--tokens-file is required");
  if (command == kLogits && o.logits.out.empty()) return invalid_argument("--out is required");
  if (o.served_model_names.empty()) {
    std::string m = o.engine.synthetic.empty() ? o.model : o.engine.synthetic;
    while (m.size() > 1 && m.back() == '/') m.pop_back();
    auto slash = m.find_last_of('/');
    o.served_model_names.push_back(slash == std::string::npos ? m : m.substr(slash + 1));
  }
  return o;
}

std::string serve_help() { return command_help(kServe); }

std::string command_help(Command command) {
  const char* usage = command == kRun      ? "usage: tandem run --prompt TEXT [options]"
                      : command == kLogits ? "usage: tandem logits --tokens-file T.json --out OUT.safetensors [options]"
                                           : "usage: tandem serve [--model DIR] [options]";
  std::string out = std::string(usage) + "\n\noptions:\n";
  for (const auto& s : option_table()) {
    if (!(s.commands & command)) continue;
    std::string flag = s.flag;
    if (s.negative_flag) flag += std::string(" / ") + s.negative_flag;
    else if (s.type == OptionType::kBool) {}
    else if (s.type == OptionType::kStringList) flag += " NAME...";
    else flag += " VALUE";
    out += fmt::format("  {:<48} {} (default: {}){}\n", flag, s.help, s.default_text,
                       *s.env ? fmt::format(" [env {}]", s.env) : "");
  }
  return out;
}

}  // namespace tandem::server
