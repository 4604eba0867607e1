// `tandem run [--model DIR] --prompt TEXT [--chat] [--max-tokens N] [--temperature T] [--top-p P]
// [--seed S] [--speculative-config JSON] ...`: generates from one prompt through the public engine
// API (src/engine/engine.h, the same path the server takes) and streams the text to stdout. Flags
// come from the one option table (src/server/options.cpp) shared with `serve`. Without --model it
// uses the built-in model (models/builtin, else the source tree's data/builtin).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "common/log.h"
#include "common/status.h"
#include "engine/engine.h"
#include "server/options.h"
#include "text/encoding_dsv4.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

Status run(const server::ServeOptions& o) {
  const server::RunOptions& a = o.run;
  if (!a.verbose) set_log_level(LogLevel::kWarn);  // keep the terminal for the generated text
  TANDEM_ASSIGN_OR_RETURN(auto engine, Engine::create(o.engine));

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
  req.sampling.seed = o.engine.default_seed;
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
  std::vector<std::string> args(argv + 1, argv + argc);
  auto opts = server::parse_options(server::kRun, args, server::process_env);
  if (!opts.ok()) {
    if (opts.status().code() == StatusCode::kCancelled) {
      std::printf("%s", server::command_help(server::kRun).c_str());
      return 0;
    }
    std::fprintf(stderr, "tandem run: %s\n(tandem run --help lists the options)\n", opts.status().message().c_str());
    return 2;
  }
  Status st = run(*opts);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem run: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

TANDEM_REGISTER_COMMAND(run, "run", "generate text from a prompt (default: the built-in model)", tandem::run_main);
