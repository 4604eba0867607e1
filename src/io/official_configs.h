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

}  // namespace tandem
