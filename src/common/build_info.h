// What this binary is: version, commit, build type and flags, the CUDA architectures compiled, the
// CUDA runtime and NCCL versions it was built against (when the toolkit was present at build time),
// and what the CUDA runtime finds on this machine now. For `tandem audit` and the start-up audit;
// every rank of a multi-node run must report the same build facts.
#pragma once

#include <string>
#include <vector>

namespace tandem {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  std::string compute_capability;  // "9.0"
  long long total_memory_bytes = 0;
};

struct BuildInfo {
  std::string version;
  std::string commit;           // git commit at build time ("unknown" outside a git tree)
  bool commit_dirty = false;    // uncommitted changes were present at build time
  std::string build_type;       // Release ...
  std::string compiler;         // "GNU 12.2.0"
  std::string cxx_flags;        // the flags of this build type
  bool cuda_built = false;      // compiled with the CUDA toolkit
  std::string cuda_architectures;  // the -gencode list ("" without CUDA)
  std::string cuda_runtime_built;  // CUDART_VERSION at build time, "13.0"
  std::string nccl_built;          // NCCL version at build time ("" when nccl.h was absent)
};

// What the CUDA runtime reports now. Never fails: without CUDA in the build, a driver or a device
// it says so in `status`.
struct CudaRuntimeInfo {
  std::string status;             // "ok" | "not built with CUDA" | "no CUDA driver" | "no CUDA device: ..."
  std::string runtime_version;    // "13.0" ("" when unknown)
  std::string driver_version;     // "13.0" ("" when no driver)
  std::vector<CudaDeviceInfo> devices;
};

const BuildInfo& build_info();
CudaRuntimeInfo probe_cuda_runtime();

}  // namespace tandem
