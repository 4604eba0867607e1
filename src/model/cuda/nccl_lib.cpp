// NcclLib: dlopen of libnccl.so.2 and the function table (nccl_lib.h).
#include "model/cuda/nccl_lib.h"

#if TANDEM_HAVE_NCCL_HEADER

#include <dlfcn.h>
#include <glob.h>

#include <mutex>
#include <vector>

#include "common/log.h"

namespace tandem::devcomm {
namespace {

// Where pip puts the library (PyTorch depends on the nvidia-nccl-cu* wheel): tried after the
// loader's own search, so LD_LIBRARY_PATH and an explicit path always win.
std::vector<std::string> wheel_candidates() {
  static const char* kPatterns[] = {
      "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
      "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
      "/usr/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
      "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
      "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
      "/root/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
  };
  std::vector<std::string> out;
  for (const char* p : kPatterns) {
    glob_t g{};
    if (glob(p, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return out;
}

template <typename F>
bool bind(void* h, const char* name, F& fn, bool required, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn && required) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

Result<NcclLib> open_at(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return make_error(StatusCode::kNotFound, "{}", e ? e : "dlopen failed");
  }
  NcclLib lib;
  std::string missing;
  bind(h, "ncclGetVersion", lib.GetVersion, true, missing);
  bind(h, "ncclGetErrorString", lib.GetErrorString, true, missing);
  bind(h, "ncclGetLastError", lib.GetLastError, true, missing);
  bind(h, "ncclGetUniqueId", lib.GetUniqueId, true, missing);
  bind(h, "ncclCommInitRankConfig", lib.CommInitRankConfig, true, missing);
  bind(h, "ncclCommGetAsyncError", lib.CommGetAsyncError, true, missing);
  bind(h, "ncclCommAbort", lib.CommAbort, true, missing);
  bind(h, "ncclAllReduce", lib.AllReduce, true, missing);
  bind(h, "ncclAllGather", lib.AllGather, true, missing);
  bind(h, "ncclBroadcast", lib.Broadcast, true, missing);
  bind(h, "ncclMemAlloc", lib.MemAlloc, false, missing);
  bind(h, "ncclMemFree", lib.MemFree, false, missing);
  bind(h, "ncclCommWindowRegister", lib.CommWindowRegister, false, missing);
  bind(h, "ncclCommWindowDeregister", lib.CommWindowDeregister, false, missing);
  if (!missing.empty()) {
    dlclose(h);
    return make_error(StatusCode::kFailedPrecondition, "{} lacks {} (NCCL 2.19 or newer is needed)", path, missing);
  }
  if (lib.GetVersion(&lib.version) != ncclSuccess) {
    dlclose(h);
    return make_error(StatusCode::kFailedPrecondition, "{}: ncclGetVersion failed", path);
  }
  // Non-blocking communicators (abortable start-up) and ncclCommGetAsyncError's progress
  // reporting need 2.19; older libraries are refused rather than half supported.
  if (lib.version < 21900) {
    dlclose(h);
    return make_error(StatusCode::kFailedPrecondition, "{} is NCCL {} (2.19 or newer is needed)", path,
                      lib.version_string());
  }
  // Report the file actually mapped (the loader may have resolved a bare name).
  Dl_info info{};
  lib.path = (dladdr(reinterpret_cast<void*>(lib.GetVersion), &info) && info.dli_fname) ? info.dli_fname : path;
  return lib;
}

}  // namespace

std::string NcclLib::version_string() const {
  // NCCL >= 2.9 encodes MAJOR * 10000 + MINOR * 100 + PATCH.
  return fmt::format("{}.{}.{}", version / 10000, (version / 100) % 100, version % 100);
}

std::string NcclLib::error_text(ncclResult_t r, ncclComm_t comm) const {
  std::string s = GetErrorString ? GetErrorString(r) : fmt::format("NCCL error {}", static_cast<int>(r));
  const char* last = GetLastError ? GetLastError(comm) : nullptr;
  if (last && *last) s += fmt::format(" ({})", last);
  return s;
}

Result<const NcclLib*> load_nccl(const std::string& explicit_path) {
  static std::mutex mu;
  static NcclLib* loaded = nullptr;  // loaded once; dlclose never runs (NCCL's threads outlive us)
  std::lock_guard<std::mutex> lock(mu);
  if (loaded) {
    if (!explicit_path.empty() && explicit_path != loaded->path)
      TLOG_WARN("comm", "NCCL already loaded from {}; ignoring {}", loaded->path, explicit_path);
    return static_cast<const NcclLib*>(loaded);
  }
  std::vector<std::string> tries;
  if (!explicit_path.empty()) {
    tries.push_back(explicit_path);
  } else {
    tries.push_back("libnccl.so.2");
    for (auto& p : wheel_candidates()) tries.push_back(p);
  }
  std::string why;
  for (const auto& p : tries) {
    auto lib = open_at(p);
    if (lib.ok()) {
      loaded = new NcclLib(std::move(lib).value());
      TLOG_INFO("comm", "NCCL {} loaded from {}", loaded->version_string(), loaded->path);
      return static_cast<const NcclLib*>(loaded);
    }
    why += fmt::format("\n  {}: {}", p, lib.status().message());
  }
  return make_error(StatusCode::kFailedPrecondition,
                    "tensor parallelism on GPUs needs NCCL (libnccl.so.2): {} (put its directory on LD_LIBRARY_PATH, "
                    "or pass --nccl-library PATH / TANDEM_NCCL_LIBRARY){}",
                    explicit_path.empty() ? "not found" : "cannot load " + explicit_path, why);
}

}  // namespace tandem::devcomm

#endif  // TANDEM_HAVE_NCCL_HEADER
