// The OpenAI-compatible HTTP server: routes, auth, request -> engine Request translation, SSE
// streaming, /health, /version, /metrics, drain on shutdown. It sees only the Engine interface.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"
#include "text/json_schema_grammar.h"

namespace httplib {
class Server;
}

namespace tandem::server {

struct ServerConfig {
  std::vector<std::string> served_model_names = {"tandem"};
  std::string api_key;                 // "" = no auth
  int64_t max_body_bytes = 32 << 20;
  int http_threads = 64;
  int max_pending_requests = 1024;
  // Sampling defaults from generation_config.json (applied where the request is silent).
  std::optional<double> default_temperature, default_top_p;
  std::optional<int> default_top_k;
  // Whitespace constrained JSON may contain (--json-whitespace).
  json_grammar::JsonWhitespace json_whitespace = json_grammar::JsonWhitespace::kFormatted;
  double request_timeout_s = 0.0;      // --request-timeout: default deadline per request (0 = none)
  double idle_probe_s = 1.0;           // SSE comment after this long without events (disconnect probe)
};

class HttpServer {
 public:
  explicit HttpServer(ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The engine may be attached after bind (the model loads while /health answers 503).
  void set_engine(Engine* engine);
  Status bind(const std::string& host, int port);  // port 0 = ephemeral
  int port() const { return port_; }
  void serve();                  // blocks until stop()
  Status start();                // serve() on a background thread
  // Stops taking generation requests (503) and marks /health 503; in-flight ones continue.
  void begin_drain();
  bool draining() const { return draining_; }
  void stop();                   // closes the listener; returns after serve() has returned
  int64_t in_flight() const { return in_flight_; }

  struct Impl;

 private:
  ServerConfig config_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<Engine*> engine_{nullptr};
  std::shared_ptr<const json_grammar::TokenTrie> trie_;
  std::mutex trie_mu_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_id_{1};
  int port_ = 0;
  std::thread thread_;
  MetricsRegistry metrics_;
  friend struct Impl;
};

}  // namespace tandem::server
