// `tandem serve`: parses the option table, binds the HTTP port (so /health answers 503 while the
// model loads), creates the engine, serves, and on SIGTERM/SIGINT drains within
// --shutdown-timeout, then exits 0. `--model echo:` serves the built-in EchoEngine (protocol tests,
// no weights).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/log.h"
#include "engine/engine.h"
#include "engine/parallel/tp_runner.h"
#include "server/echo_engine.h"
#include "server/options.h"
#include "server/runtime_audit.h"
#include "server/server.h"

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

// Sampling defaults from generation_config.json ("auto": the model dir; "vllm": none; else a dir).
void load_generation_config(const tandem::server::ServeOptions& o, tandem::server::ServerConfig& cfg) {
  if (o.generation_config == "vllm" || o.model.rfind("echo:", 0) == 0) return;
  std::string dir = o.generation_config == "auto" ? o.model : o.generation_config;
  std::ifstream f(dir + "/generation_config.json");
  if (!f) return;
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) {
    TLOG_WARN("serve", "ignoring unreadable {}/generation_config.json", dir);
    return;
  }
  if (j.contains("temperature") && j["temperature"].is_number()) cfg.default_temperature = j["temperature"].get<double>();
  if (j.contains("top_p") && j["top_p"].is_number()) cfg.default_top_p = j["top_p"].get<double>();
  if (j.contains("top_k") && j["top_k"].is_number_integer()) cfg.default_top_k = j["top_k"].get<int>();
}

int run_serve(int argc, char** argv) {
  using namespace tandem;
  std::vector<std::string> args(argv + 1, argv + argc);
  auto opts = server::parse_serve_options(args, server::process_env);
  if (!opts.ok()) {
    if (opts.status().code() == StatusCode::kCancelled) {
      std::printf("%s", server::serve_help().c_str());
      return 0;
    }
    std::fprintf(stderr, "tandem serve: %s\n(tandem serve --help lists the options)\n", opts.status().message().c_str());
    return 2;
  }
  const server::ServeOptions& o = *opts;

  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  // A node other than the head runs its tensor-parallel ranks only: no HTTP, no scheduler.
  if (o.engine.nnodes > 1 && o.engine.node_rank > 0)
    return run_tp_node(o.engine, [] { return g_signal.load() != 0; });

  // Fail closed before loading anything when the contract itself is unreadable.
  nlohmann::json manifest;
  if (!o.audit_manifest.empty()) {
    auto m = server::load_audit_manifest(o.audit_manifest);
    if (!m.ok()) {
      std::fprintf(stderr, "tandem serve: --audit-manifest: %s\nTANDEM_RUNTIME_AUDIT_FAIL\n", m.status().message().c_str());
      return 1;
    }
    manifest = *m;
  }

  server::ServerConfig cfg;
  cfg.served_model_names = o.served_model_names;
  cfg.api_key = o.api_key;
  cfg.max_body_bytes = o.max_body_bytes;
  cfg.http_threads = o.http_threads;
  cfg.max_pending_requests = o.max_pending_requests;
  cfg.json_whitespace = o.json_whitespace;
  cfg.request_timeout_s = o.request_timeout_s;
  load_generation_config(o, cfg);

  server::HttpServer http(cfg);
  Status st = http.bind(o.host, o.port);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem serve: --host/--port: %s\n", st.message().c_str());
    return 1;
  }
  (void)http.start();
  TLOG_INFO("serve", "listening on http://{}:{} (loading model {})", o.host, http.port(), o.model);

  std::unique_ptr<Engine> engine;
  if (o.model.rfind("echo:", 0) == 0) {
    server::EchoEngineOptions eo;
    if (o.engine.max_model_len > 0) eo.max_model_len = o.engine.max_model_len;
    eo.max_num_seqs = std::max(o.engine.max_num_seqs, 1);
    engine = std::make_unique<server::EchoEngine>(eo);
  } else {
    TLOG_INFO("serve", "loading {}: config, weights (mapped), tokenizer, then the KV pool{}", o.model,
              o.engine.speculative.method.empty() ? "" : " and the speculative planner's timing");
    auto e = Engine::create(o.engine);
    if (!e.ok()) {
      std::fprintf(stderr, "tandem serve: loading %s: %s\n", o.model.c_str(), e.status().message().c_str());
      http.stop();
      return 1;
    }
    engine = std::move(*e);
  }
  const auto& info = engine->model_info();
  // The runtime audit: the same facts as `tandem audit`, checked before the server reports ready.
  if (o.model.rfind("echo:", 0) != 0 || !o.audit_manifest.empty()) {
    nlohmann::json audit = server::build_runtime_audit(o, &info);
    if (!server::finish_audit(audit, o.audit_manifest.empty() ? nullptr : &manifest)) {
      std::fprintf(stderr, "tandem serve: runtime audit failed; refusing to start:\n");
      for (const auto& p : audit["problems"]) std::fprintf(stderr, "  problem: %s\n", p.get<std::string>().c_str());
      for (const auto& p : audit["mismatches"]) std::fprintf(stderr, "  mismatch: %s\n", p.get<std::string>().c_str());
      std::fprintf(stderr, "TANDEM_RUNTIME_AUDIT_FAIL\n");
      http.stop();
      return 1;
    }
    TLOG_INFO("serve", "TANDEM_RUNTIME_AUDIT_PASS: device {}, KV {}, speculative {}, identity {}{}", info.device,
              info.kv_cache_dtype, audit["speculative"]["method"].get<std::string>(),
              audit["identity_digest"].get<std::string>(),
              o.audit_manifest.empty() ? "" : ", manifest " + o.audit_manifest + " matched");
    std::printf("TANDEM_RUNTIME_AUDIT_PASS\n");
  }
  TLOG_INFO("serve", "model {} ready: device {}, max_model_len {}, KV capacity {} tokens, serving as '{}'", o.model,
            info.device, info.max_model_len, info.kv_capacity_tokens, o.served_model_names.front());
  http.set_engine(engine.get());
  // Machine-readable readiness line for scripts (tools/e2e.sh).
  std::printf("tandem serve: ready on http://%s:%d\n", o.host.c_str(), http.port());
  std::fflush(stdout);

  while (g_signal == 0 && engine->healthy()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (g_signal == 0) {
    // A lost tensor-parallel rank, the watchdog or the integrity check made the engine unhealthy:
    // /health already answers 503 and the requests in flight failed with the reason. Exit non-zero
    // so the supervisor (systemd Restart=on-failure) restarts the whole group. _Exit, not return:
    // the engine's thread may still be inside the model or blocked on the lost group.
    TLOG_ERROR("serve", "engine unhealthy: {}; exiting for a restart", engine->unhealthy_reason());
    http.begin_drain();
    for (int i = 0; i < 100 && http.in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    http.stop();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(3);
  }
  TLOG_INFO("serve", "signal {}: draining (deadline {} s)", g_signal.load(), o.shutdown_timeout_s);
  http.begin_drain();
  engine->shutdown(o.shutdown_timeout_s);
  // Let the streams write their final frames before the listener goes away.
  for (int i = 0; i < 200 && http.in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http.stop();
  engine.reset();
  TLOG_INFO("serve", "stopped");
  return 0;
}

}  // namespace

TANDEM_REGISTER_COMMAND(serve, "serve", "OpenAI-compatible HTTP server (tandem serve --model DIR)", run_serve);
