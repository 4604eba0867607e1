// FakeEngine for server tests: the EchoEngine (src/server/echo_engine.h, deterministic replies,
// configurable step delay / queue size) behind the plain Engine interface, plus an in-process
// server fixture on an ephemeral loopback port.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>

#include "server/echo_engine.h"
#include "server/server.h"

namespace tandem::server::testing {

using FakeEngine = EchoEngine;
using FakeEngineOptions = EchoEngineOptions;

struct ServerHarness {
  std::unique_ptr<FakeEngine> engine;
  std::unique_ptr<HttpServer> server;
  int port = 0;

  explicit ServerHarness(FakeEngineOptions eo = {}, ServerConfig cfg = {}, bool attach = true) {
    if (cfg.served_model_names == std::vector<std::string>{"tandem"}) cfg.served_model_names = {"tandem", "alias"};
    cfg.http_threads = std::max(cfg.http_threads, 16);
    engine = std::make_unique<FakeEngine>(eo);
    server = std::make_unique<HttpServer>(cfg);
    Status st = server->bind("127.0.0.1", 0);
    if (!st.ok()) throw std::runtime_error(st.message());
    port = server->port();
    if (attach) server->set_engine(engine.get());
    (void)server->start();
  }
  ~ServerHarness() {
    server->stop();
    engine->shutdown(0);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
};

}  // namespace tandem::server::testing
