// The GPU tests' skip: why the CUDA tests cannot run on this machine, and the macro that skips a test
// for it (every CUDA test file, the op tests through cuda_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda_testing {

// Why the CUDA tests cannot run here, or nullptr when they can.
inline const char* no_gpu_reason() {
  static std::string why;
  if (cuda::device_count() == 0) return "no CUDA device visible (the CUDA tests run on a GPU machine: make test-gpu)";
  if (!cuda::binary_supports_device(0)) {
    why = std::string("this binary has no code for ") + cuda::device_description(0) + " (built for sm_" +
          TANDEM_CUDA_ARCHS + ")";
    return why.c_str();
  }
  return nullptr;
}
inline bool have_gpu() { return no_gpu_reason() == nullptr; }

#define TANDEM_REQUIRE_GPU()                                                                 \
  do {                                                                                       \
    if (const char* tandem_why_ = ::tandem::kernels::cuda_testing::no_gpu_reason()) {        \
      GTEST_SKIP() << tandem_why_;                                                           \
    }                                                                                        \
  } while (0)

}  // namespace tandem::kernels::cuda_testing
