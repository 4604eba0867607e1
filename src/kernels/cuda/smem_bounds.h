// The most dynamic shared memory each kernel's launcher asks for, at the largest shape the project
// supports. tests/cuda_limits adds each kernel's static shared memory (read from the compiled
// cubins) and checks the sum against every GPU target's per-block limit (99 KB on sm_120/sm_121).
// A launcher that passes dynamic shared memory computes it with a named function of its arguments
// and reports that same function's value at its largest shape here; a kernel that declares
// `extern __shared__` without an entry fails the check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::kernels::cuda {

struct SmemBound {
  std::string kernel;  // the kernel function's name in the source (matched in the cubins' symbols)
  int64_t bytes = 0;   // dynamic shared memory its launcher asks for at `shape`
  std::string shape;   // that shape, in words ("dim 1024, block 1024 (the launcher's limits)")
  std::string note;    // why the bound grows, where it matters (may be empty)
};

// The generic ops' kernels (src/kernels/cuda), at the limits their launchers enforce. The model's
// own kernels report theirs in src/model/cuda/model_kernels.h (they depend on the config).
std::vector<SmemBound> dynamic_smem_bounds();

// One per op file that launches with dynamic shared memory (defined next to its launcher).
SmemBound sparse_attn_smem_bound();
SmemBound hadamard_smem_bound();

}  // namespace tandem::kernels::cuda
