// `tandem audit [--manifest FILE] [--output FILE] [serve options]`: prints the runtime contract as
// JSON (runtime_audit.h). With --model it starts the engine exactly as `serve` would (same option
// table, profile and memory plan) to report what that start-up chose; without, the build and CUDA
// facts only. Exit 0 on pass, 1 on any problem or manifest mismatch (each named), 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cli/command.h"
#include "common/log.h"
#include "engine/engine.h"
#include "server/options.h"
#include "server/runtime_audit.h"

namespace {

int run_audit(int argc, char** argv) {
  using namespace tandem;
  std::vector<std::string> args;
  std::string manifest_path, output_path;
  bool has_model = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: tandem audit [--manifest FILE] [--output FILE] [--model DIR [serve options]]\n"
                  "Prints the runtime contract as JSON; fails (exit 1) on a problem or a manifest mismatch.\n");
      return 0;
    }
    if ((a == "--manifest" || a == "--output") && i + 1 < argc) {
      (a == "--manifest" ? manifest_path : output_path) = argv[++i];
      continue;
    }
    if (a == "--manifest" || a == "--output") {
      std::fprintf(stderr, "tandem audit: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--model" || a.rfind("--model=", 0) == 0) has_model = true;
    args.push_back(a);
  }
  if (!has_model) {
    args.push_back("--model");
    args.push_back("echo:");
  }
  auto opts = server::parse_serve_options(args, [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
  if (!opts.ok()) {
    std::fprintf(stderr, "tandem audit: %s\n", opts.status().message().c_str());
    return 2;
  }
  nlohmann::json manifest;
  if (!manifest_path.empty()) {
    auto m = server::load_audit_manifest(manifest_path);
    if (!m.ok()) {
      std::fprintf(stderr, "tandem audit: --manifest: %s\n", m.status().message().c_str());
      return 1;  // fail closed: an unreadable contract is a failed audit
    }
    manifest = *m;
  }
  std::unique_ptr<Engine> engine;
  if (has_model && opts->model.rfind("echo:", 0) != 0) {
    auto e = Engine::create(opts->engine);
    if (!e.ok()) {
      std::fprintf(stderr, "tandem audit: starting the engine for %s: %s\n", opts->model.c_str(),
                   e.status().message().c_str());
      return 1;
    }
    engine = std::move(*e);
  }
  nlohmann::json audit = server::build_runtime_audit(*opts, engine ? &engine->model_info() : nullptr);
  bool pass = server::finish_audit(audit, manifest_path.empty() ? nullptr : &manifest);
  if (engine) engine->shutdown(0);
  std::string text = audit.dump(2);
  if (!output_path.empty()) std::ofstream(output_path) << text << "\n";
  std::printf("%s\n", text.c_str());
  for (const auto& p : audit["problems"]) std::fprintf(stderr, "problem: %s\n", p.get<std::string>().c_str());
  for (const auto& p : audit["mismatches"]) std::fprintf(stderr, "mismatch: %s\n", p.get<std::string>().c_str());
  std::fprintf(stderr, pass ? "TANDEM_RUNTIME_AUDIT_PASS\n" : "TANDEM_RUNTIME_AUDIT_FAIL\n");
  return pass ? 0 : 1;
}

}  // namespace

TANDEM_REGISTER_COMMAND(audit, "audit", "print the runtime contract as JSON; fail closed against --manifest", run_audit);
