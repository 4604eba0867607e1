// `tandem check`: verifies a checkpoint directory against the catalog derived from its config.json
// (shards, tensors, dtypes, shapes, index, optional SHA-256 manifest and revision), or with
// --catalog prints the catalog a config implies (tensor count, bytes, per-dtype census).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/command.h"
#include "io/catalog.h"
#include "io/checkpoint_check.h"

namespace {

using tandem::with_thousands;

const char* draft_kind_name(tandem::DraftKind k) {
  switch (k) {
    case tandem::DraftKind::kNone: return "none";
    case tandem::DraftKind::kMtp: return "MTP";
    case tandem::DraftKind::kDSpark: return "DSpark";
  }
  return "?";
}

void print_census(const tandem::Catalog& cat) {
  std::printf("  %-9s %10s %20s\n", "dtype", "tensors", "bytes");
  for (const auto& [dtype, c] : cat.census()) {
    std::printf("  %-9s %10s %20s\n", tandem::dtype_name(dtype), with_thousands(c.tensors).c_str(),
                with_thousands(c.bytes).c_str());
  }
}

int print_catalog(const std::string& config_path, bool list) {
  auto config = tandem::load_model_config(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "tandem check: %s\n", config.status().message().c_str());
    return 1;
  }
  auto cat = tandem::build_catalog(*config);
  if (!cat.ok()) {
    std::fprintf(stderr, "tandem check: %s\n", cat.status().message().c_str());
    return 1;
  }
  if (list) {
    for (const auto& t : cat->tensors) {
      std::string shape;
      for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
      std::printf("%s\t%s\t[%s]\n", t.name.c_str(), tandem::dtype_name(t.dtype), shape.c_str());
    }
  }
  std::printf("catalog for %s: %s tensors, %s bytes (%d layers, %d %s draft stages)\n",
              config_path.c_str(), with_thousands(cat->tensors.size()).c_str(),
              with_thousands(cat->total_bytes()).c_str(), config->num_hidden_layers,
              config->num_draft_stages, draft_kind_name(config->draft_kind));
  print_census(*cat);
  return 0;
}

int run_check(int argc, char** argv) {
  CLI::App app{"Verify a DeepSeek-V4 checkpoint directory, or print the tensor catalog of a config."};
  std::string model_dir, config_path;
  bool catalog = false, list = false;
  tandem::CheckOptions options;
  app.add_option("MODEL_DIR", model_dir, "checkpoint directory (config.json + safetensors)");
  app.add_flag("--catalog", catalog, "print the catalog implied by --config instead of checking a dir");
  app.add_option("--config", config_path, "config.json for --catalog");
  app.add_flag("--list", list, "with --catalog: also list every tensor (name, dtype, shape)");
  app.add_option("--manifest", options.manifest_path,
                 "sha256sum-format file (names relative to MODEL_DIR) to verify");
  app.add_option("--revision", options.revision,
                 "expected revision: first line of MODEL_DIR/REVISION, or the HF snapshot dir name");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (catalog) {
    if (config_path.empty()) {
      if (model_dir.empty()) {
        std::fprintf(stderr, "tandem check: --catalog needs --config CONFIG.json\n");
        return 2;
      }
      config_path = model_dir + "/config.json";
    }
    return print_catalog(config_path, list);
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "tandem check: MODEL_DIR is required (or --catalog --config FILE)\n%s",
                 app.help().c_str());
    return 2;
  }
  tandem::CheckReport r = tandem::check_checkpoint(model_dir, options);
  std::printf("checkpoint %s\n", model_dir.c_str());
  if (r.config_ok) {
    std::printf("  config:       %d layers, hidden %lld, vocab %lld, %d %s draft stages\n",
                r.config.num_hidden_layers, static_cast<long long>(r.config.hidden_size),
                static_cast<long long>(r.config.vocab_size), r.config.num_draft_stages,
                draft_kind_name(r.config.draft_kind));
    std::printf("  catalog:      %s tensors, %s bytes\n", with_thousands(r.catalog_tensors).c_str(),
                with_thousands(r.catalog_bytes).c_str());
  }
  std::printf("  shards:       %zu/%zu readable\n", r.shards_ok, r.shards);
  std::printf("  found:        %s tensors, %s bytes\n", with_thousands(r.found_tensors).c_str(),
              with_thousands(r.found_bytes).c_str());
  if (!options.manifest_path.empty()) std::printf("  manifest:     %d files hashed\n", r.hashed_files);
  if (!options.revision.empty()) {
    std::printf("  revision:     %s\n", r.revision_found.empty() ? "(none)" : r.revision_found.c_str());
  }
  if (r.ok()) {
    std::printf("OK\n");
    return 0;
  }
  constexpr size_t kMaxPrinted = 1000;
  std::printf("FAILED: %zu problem%s\n", r.problems.size(), r.problems.size() == 1 ? "" : "s");
  for (size_t i = 0; i < r.problems.size() && i < kMaxPrinted; ++i) {
    std::printf("  - %s\n", r.problems[i].c_str());
  }
  if (r.problems.size() > kMaxPrinted) {
    std::printf("  ... and %zu more\n", r.problems.size() - kMaxPrinted);
  }
  return 1;
}

}  // namespace

TANDEM_REGISTER_COMMAND(check, "check", "verify a checkpoint dir, or print a config's tensor catalog",
                        run_check);
