// build_info.h. The facts come from two generated headers: build_config.h (configure time:
// flags, architectures) and build_commit.h (regenerated at every build by tools/build-info.cmake,
// so the commit is never stale). CUDA is queried only when the toolkit was present at build time.
#include "common/build_info.h"

#include <fmt/format.h>

#include "build_commit.h"
#include "build_config.h"
#include "common/version.h"

#if TANDEM_BUILD_WITH_CUDART
#include <cuda_runtime_api.h>
#endif
#if TANDEM_BUILD_WITH_NCCL_HEADER
#include <nccl.h>
#endif

namespace tandem {
#if TANDEM_BUILD_WITH_CUDART
namespace {
std::string cuda_version_text(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : ""; }
}  // namespace
#endif

const BuildInfo& build_info() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.version = version_string();
    b.commit = TANDEM_BUILD_COMMIT;
    b.commit_dirty = TANDEM_BUILD_COMMIT_DIRTY;
    b.build_type = TANDEM_BUILD_TYPE;
    b.compiler = TANDEM_BUILD_COMPILER;
    b.cxx_flags = TANDEM_BUILD_CXX_FLAGS;
#if TANDEM_BUILD_WITH_CUDART
    b.cuda_built = true;
    b.cuda_architectures = TANDEM_BUILD_CUDA_GENCODE;
    b.cuda_runtime_built = cuda_version_text(CUDART_VERSION);
#endif
#if TANDEM_BUILD_WITH_NCCL_HEADER
    b.nccl_built = fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
    return b;
  }();
  return info;
}

CudaRuntimeInfo probe_cuda_runtime() {
  CudaRuntimeInfo r;
#if !TANDEM_BUILD_WITH_CUDART
  r.status = "not built with CUDA";
#else
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) r.runtime_version = cuda_version_text(v);
  int d = 0;
  if (cudaDriverGetVersion(&d) != cudaSuccess || d == 0) {
    r.status = "no CUDA driver";
    return r;
  }
  r.driver_version = cuda_version_text(d);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    r.status = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    r.devices.push_back({i, p.name, fmt::format("{}.{}", p.major, p.minor), static_cast<long long>(p.totalGlobalMem)});
  }
  r.status = "ok";
#endif
  return r;
}

}  // namespace tandem
