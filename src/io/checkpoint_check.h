// Whole-checkpoint verification behind `tandem check MODEL_DIR`: config.json -> catalog, every
// shard of the index present and valid, each catalog tensor present with the right dtype and shape,
// nothing unexpected, index weight_map consistent with the shards, optional SHA-256 manifest and
// revision marker. Collects EVERY problem instead of stopping at the first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace tandem {

struct CheckOptions {
  // sha256sum-format file ("<64 hex>  <name>" or "<64 hex> *<name>", names relative to the model
  // dir). Every listed file must match, and every shard must be listed.
  std::string manifest_path;
  // Expected revision. The marker is the first line of MODEL_DIR/REVISION; without that file, the
  // directory name when MODEL_DIR is a Hugging Face cache snapshot (.../snapshots/<revision>).
  std::string revision;
};

struct CheckReport {
  std::vector<std::string> problems;  // empty = the checkpoint is complete and consistent
  bool config_ok = false;
  ModelConfig config;
  size_t catalog_tensors = 0;
  uint64_t catalog_bytes = 0;
  size_t found_tensors = 0;           // tensors read from the shards
  uint64_t found_bytes = 0;
  size_t shards = 0;                  // shard files referenced (or the single model.safetensors)
  size_t shards_ok = 0;
  int hashed_files = 0;               // files verified against the manifest
  std::string revision_found;
  bool ok() const { return problems.empty(); }
};

CheckReport check_checkpoint(const std::string& model_dir, const CheckOptions& options);

// The revision marker of a model dir as described in CheckOptions::revision ("" if none).
std::string find_revision_marker(const std::string& model_dir);

}  // namespace tandem
