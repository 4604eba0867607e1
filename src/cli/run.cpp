// `tandem run [--model DIR] --prompt TEXT [--chat] [--max-tokens N] [--temperature T] [--top-p P]
// [--seed S] [--speculative-config JSON]`: generates from one prompt through the public engine API
// (src/engine/engine.h, the same path the server takes) and streams the text to stdout. Without
// --model it uses the built-in model (models/builtin, else the source tree's data/builtin).
#include <CLI/CLI.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "common/log.h"
#include "common/status.h"
#include "engine/engine.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

struct RunArgs {
  std::string model_dir, prompt, speculative_config, device = "auto";
  bool chat = false;
  int max_tokens = 128;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  bool verbose = false;
};

std::string default_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists("models/builtin/config.json", ec)) return "models/builtin";
#ifdef TANDEM_SOURCE_DIR
  const std::string src = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  if (fs::exists(src + "/config.json", ec)) return src;
#endif
  return "data/builtin";
}

Status run(RunArgs a) {
  if (a.max_tokens < 1) return invalid_argument("--max-tokens must be >= 1");
  if (a.temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (a.top_p <= 0 || a.top_p > 1) return invalid_argument("--top-p must be in (0, 1]");
  if (a.model_dir.empty()) a.model_dir = default_model_dir();
  if (!a.verbose) set_log_level(LogLevel::kWarn);  // keep the terminal for the generated text

  EngineConfig cfg;
  cfg.model_dir = a.model_dir;
  cfg.device = a.device;
  cfg.max_num_seqs = 1;
  cfg.num_threads = a.threads;
  cfg.kv_cache_memory = int64_t{256} << 20;
  if (!a.speculative_config.empty()) {
    TANDEM_ASSIGN_OR_RETURN(cfg.speculative, parse_speculative_config(a.speculative_config));
  }
  TANDEM_ASSIGN_OR_RETURN(auto engine, Engine::create(cfg));

  std::string text = a.prompt;
  if (a.chat) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", a.prompt}});
    TANDEM_ASSIGN_OR_RETURN(text, encode_messages(msgs, nlohmann::ordered_json(), EncodeOptions()));
  }
  Request req;
  req.request_id = "run";
  req.prompt_tokens = engine->tokenizer().encode(text);
  const int32_t bos = 0;
  if (!a.chat && (req.prompt_tokens.empty() || req.prompt_tokens[0] != bos))
    req.prompt_tokens.insert(req.prompt_tokens.begin(), bos);
  req.sampling.temperature = a.temperature;
  req.sampling.top_p = a.top_p;
  req.sampling.seed = a.seed;
  req.sampling.max_tokens = a.max_tokens;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  RequestEvent last;
  const auto t0 = std::chrono::steady_clock::now();
  double ttft = 0.0;
  Status st = engine->submit(std::move(req), [&](const RequestEvent& ev) {
    if (!ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.ttft_s > 0) ttft = ev.ttft_s;
    if (ev.finish != FinishReason::kNone) {
      std::lock_guard<std::mutex> lock(mu);
      last = ev;
      done = true;
      cv.notify_all();
    }
  });
  if (!st.ok()) {
    engine->shutdown(0);
    return st;
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  engine->shutdown(1.0);
  if (last.finish == FinishReason::kError) return make_error(StatusCode::kInternal, "{}", last.error);
  const auto& u = last.usage;
  const double gen_s = std::max(total - ttft, 1e-9);
  std::fprintf(stderr,
               "[tandem run] %s: prompt %lld tokens, first token after %.2f s; %lld tokens in %.2f s "
               "(%.1f tok/s after the first)%s\n",
               finish_reason_name(last.finish), static_cast<long long>(u.prompt_tokens), ttft,
               static_cast<long long>(u.completion_tokens), total,
               u.completion_tokens > 1 ? (u.completion_tokens - 1) / gen_s : 0.0,
               u.draft_tokens > 0 ? fmt::format("; DSpark accepted {}/{} drafts", u.accepted_draft_tokens,
                                                u.draft_tokens).c_str()
                                  : "");
  return Status();
}

int run_main(int argc, char** argv) {
  CLI::App app{"Generate text from one prompt through the engine (streams to stdout)."};
  RunArgs a;
  app.add_option("--model", a.model_dir, "model directory (default: the built-in model)");
  app.add_option("--prompt", a.prompt, "prompt text")->required();
  app.add_flag("--chat", a.chat, "wrap the prompt as one user turn of the DeepSeek-V4 chat format");
  app.add_option("--max-tokens", a.max_tokens, "tokens to generate (default 128)");
  app.add_option("--temperature", a.temperature, "sampling temperature, 0 = greedy (default 1.0)");
  app.add_option("--top-p", a.top_p, "nucleus sampling mass (default 1.0)");
  app.add_option("--seed", a.seed, "sampling seed (default 0)");
  app.add_option("--threads", a.threads, "CPU threads (0 = all)");
  app.add_option("--device", a.device, "auto (the GPU when present) | cpu | cuda");
  app.add_flag("--verbose", a.verbose, "log the engine's start-up and progress lines");
  app.add_option("--speculative-config", a.speculative_config,
                 "vLLM-style JSON, e.g. '{\"method\":\"dspark\",\"num_speculative_tokens\":5}'");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Status st = run(a);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem run: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(run, "run", "generate text from a prompt (default: the built-in model)", tandem::run_main);
