// The rules the kernel-limits check applies to the cubins of a build (cubin.h), apart from where
// the cubins come from, so they can be tested on made-up cubins too:
// - per block, a kernel's static shared memory plus the most dynamic shared memory its launcher
//   asks for (kernels::cuda::SmemBound) fits the target's limit;
// - every cubin was compiled by ptxas for the SM its fatbin entry claims (ptxas refuses wgmma,
//   tcgen05 and TMEM instructions for sm_120/sm_121, so such a cubin cannot contain them);
// - no kernel is empty (or trap-only) on one target while it has a body on another: an
//   architecture guard without a portable path;
// - every bound names a kernel that exists, and every kernel declaring `extern __shared__` in the
//   sources has a bound (where bounds name instantiations, every instantiation has its own);
// - a bound gated to other targets (only_sms) or to more opt-in shared memory than this target
//   has (needs_optin) is a launch never made here: neither its size nor an empty body counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_limits/cubin.h"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::cubin {

// An empty kernel body (or a lone __trap()) compiles to 256 bytes of code for sm_90a and sm_120
// (nvcc 13.0: EXIT, BRA and alignment NOPs); a kernel that does anything is larger.
inline constexpr int64_t kEmptyKernelCodeBytes = 256;

struct KernelRow {
  int sm = 0;
  std::string kernel;       // mangled
  int64_t static_smem = 0;
  int64_t dynamic_smem = 0; // the bound's bytes, 0 without one
  std::string bound;        // the bound's kernel, shape and note ("" without one)
  std::string not_launched; // why the launcher never runs it on this target ("" when it may)
  int64_t limit = 0;
  int64_t total() const { return static_smem + dynamic_smem; }
};

struct LimitsReport {
  std::vector<KernelRow> rows;        // one per (checked SM, kernel)
  std::vector<std::string> failures;  // each a full sentence with the numbers
};

// Whether a bound's kernel ("name" for every instantiation, or "name<args>" as the demangler
// spells one) names this mangled kernel.
bool bound_matches(const std::string& mangled, const std::string& kernel);
std::string bound_base(const std::string& kernel);  // "name<args>" -> "name"
std::string demangle(const std::string& mangled);  // the C++ spelling (the input when it is not mangled)

// Applies the rules to the cubins of the SMs in `check_sms` (the empty-kernel rule compares
// against every cubin given).
LimitsReport check_limits(const std::vector<Cubin>& cubins, const std::vector<kernels::cuda::SmemBound>& bounds,
                          const std::vector<int>& check_sms);

struct SourceKernel {
  std::string kernel;  // the __global__ function's name
  std::string where;   // file:line of its `extern __shared__`
};
// Kernels whose body declares `extern __shared__`, found in the .cu/.cuh files under `src_dir`.
std::vector<SourceKernel> kernels_with_dynamic_smem(const std::string& src_dir);
// The same for one file's text (tests).
std::vector<SourceKernel> kernels_with_dynamic_smem_in(const std::string& text, const std::string& file);

}  // namespace tandem::cubin
