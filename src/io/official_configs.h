// The official DeepSeek-V4-Flash model configurations, built into the binary by name: what
// `--synthetic NAME` runs (synthetic weights of the real shapes) without any file on disk.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "io/model_config.h"

namespace tandem {

// "deepseek-v4-flash-0731", "deepseek-v4-flash-preview".
const std::vector<std::string>& official_config_names();
// The parsed config.json of a release; InvalidArgument naming the known names otherwise.
Result<ModelConfig> official_config(const std::string& name);
// What `--synthetic NAME` runs: an official config, or "tiny:<preset>" (a make-tiny preset's config,
// io/tiny_checkpoint.h, with a 16,384-token vocabulary: more ids than the built-in tokenizer
// decodes, so serving paths meet ids without text).
Result<ModelConfig> synthetic_config(const std::string& name);

}  // namespace tandem
