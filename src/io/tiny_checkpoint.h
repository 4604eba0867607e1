// Tiny DeepSeek-V4 checkpoints in the exact official file layout (config.json with official keys,
// generation_config.json, tokenizer.json + tokenizer_config.json, model.safetensors.index.json and
// shards with official tensor names and formats), for tests and golden comparisons against the
// official reference. Deterministic: the same preset, seed and tokenizer give byte-identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"

namespace tandem {

// The presets: "default" (6 layers + 3 DSpark stages), "small" (a second, different DSpark
// configuration), "preview" (like default, one classic MTP stage, no dspark keys), "tp8"
// (4 layers, shardable over 1, 2, 4 or 8 tensor-parallel ranks) and "long" (like default without
// CSA layers: cheap enough for 64K-token prompts in tests).
const std::vector<std::string>& tiny_preset_names();

// Vocabulary facts taken from a tokenizer.json: vocab_size = highest id + 1; the DSpark noise
// token is the added token "<｜place▁holder▁no▁799｜>" (id 128799 in the real file).
struct TinyVocab {
  int64_t vocab_size = 0;
  int64_t noise_token_id = -1;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
};
Result<TinyVocab> tiny_vocab_from_tokenizer_json(const std::string& tokenizer_json);

// ModelConfig of a preset for the given vocabulary.
Result<ModelConfig> tiny_preset_config(const std::string& preset, const TinyVocab& vocab);

struct TinyCheckpointOptions {
  std::string preset = "default";
  uint64_t seed = 0;
  int num_shards = 2;
  std::string revision;        // if set, also writes a REVISION file with this text
  bool write_manifest = false; // also writes SHA256SUMS over every file written
};

// Writes the checkpoint into `out_dir` (created if needed). `tokenizer_json` is the tokenizer.json
// text (make-tiny passes train_tiny_tokenizer_json(seed)); it fixes vocab_size and the noise id.
Status write_tiny_checkpoint(const std::string& out_dir, const TinyCheckpointOptions& options,
                             const std::string& tokenizer_json);

}  // namespace tandem
