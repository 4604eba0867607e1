// The CUDA model tests' options (model_test.cpp, snapshot_test.cpp): 4 slots of 4 blocks of 256
// tokens, rollback 8, steps of up to 512 tokens.
#pragma once

#include "model/model.h"

namespace tandem::testing {

inline ModelOptions model_options(KvDtype dtype = KvDtype::kFp8) {
  ModelOptions o;
  o.max_slots = 4;
  o.num_blocks = 16;
  o.block_size = 256;
  o.max_rollback = 8;
  o.max_tokens_per_step = 512;
  o.num_threads = 0;
  o.kv_dtype = dtype;
  return o;
}

}  // namespace tandem::testing
