// `tandem make-tiny OUT_DIR [--seed N] [--preset NAME]`: writes a tiny DeepSeek-V4 checkpoint in
// the official layout (tokenizer trained by the built-in BPE trainer with the same seed).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/command.h"
#include "io/tiny_checkpoint.h"
#include "text/bpe_trainer.h"

namespace {

int run_make_tiny(int argc, char** argv) {
  CLI::App app{"Write a tiny DeepSeek-V4 checkpoint (official file layout) for tests."};
  std::string out_dir;
  tandem::TinyCheckpointOptions options;
  app.add_option("OUT_DIR", out_dir, "output directory (created if needed)")->required();
  app.add_option("--seed", options.seed, "seed for weights and tokenizer corpus")->default_val(0);
  app.add_option("--preset", options.preset, "default | small | preview | tp8 | long")
      ->default_val("default")
      ->check(CLI::IsMember(tandem::tiny_preset_names()));
  app.add_option("--shards", options.num_shards, "number of safetensors shards")
      ->default_val(2)
      ->check(CLI::Range(1, 64));
  app.add_option("--revision", options.revision, "also write a REVISION file with this text");
  app.add_flag("--manifest", options.write_manifest, "also write SHA256SUMS over the files written");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::string tokenizer_json = tandem::train_tiny_tokenizer_json(options.seed);
  tandem::Status st = tandem::write_tiny_checkpoint(out_dir, options, tokenizer_json);
  if (!st.ok()) {
    std::fprintf(stderr, "tandem make-tiny: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote tiny checkpoint (preset %s, seed %llu) to %s\n", options.preset.c_str(),
              static_cast<unsigned long long>(options.seed), out_dir.c_str());
  return 0;
}

}  // namespace

TANDEM_REGISTER_COMMAND(make_tiny, "make-tiny", "write a tiny checkpoint in the official layout",
                        run_make_tiny);
