// Dsv4Runner placeholder: the adapter to DsV4Model (src/model/model.h) is wired in once the model's
// implementation is in the tree; until then a checkpoint directory is a clear start-up error.
#include "engine/dsv4_runner.h"

namespace tandem {

Result<std::unique_ptr<ModelRunner>> create_dsv4_runner(const EngineConfig& config) {
  return make_error(StatusCode::kUnimplemented,
                    "--model {}: the DeepSeek-V4 CPU model runner is not built into this engine yet",
                    config.model_dir);
}

}  // namespace tandem
