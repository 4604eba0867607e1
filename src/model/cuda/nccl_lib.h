// NCCL loaded at run time: the library (hundreds of MB) is not linked into tandem, so a build
// runs anywhere and finds NCCL where the host has it (LD_LIBRARY_PATH, the loader cache, an
// explicit path, or the `nvidia-nccl` Python wheel that PyTorch installs). This file owns the
// small function table of the NCCL calls tandem makes; nothing else calls dlopen/dlsym for NCCL.
// The types come from nccl.h (headers only; NCCL 2.28 at build time). A library older than the
// header still loads; calls it lacks (windows before 2.27) are null in the table.
#pragma once

#if TANDEM_HAVE_NCCL_HEADER
#include <nccl.h>

#include <string>

#include "common/status.h"

namespace tandem::devcomm {

struct NcclLib {
  std::string path;  // the file dlopen found
  int version = 0;   // ncclGetVersion (e.g. 22809 for 2.28.9)

  ncclResult_t (*GetVersion)(int*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  // NCCL >= 2.27 (symmetric windows); null when the library predates them.
  ncclResult_t (*MemAlloc)(void**, size_t) = nullptr;
  ncclResult_t (*MemFree)(void*) = nullptr;
  ncclResult_t (*CommWindowRegister)(ncclComm_t, void*, size_t, ncclWindow_t*, int) = nullptr;
  ncclResult_t (*CommWindowDeregister)(ncclComm_t, ncclWindow_t) = nullptr;

  bool has_windows() const { return MemAlloc && MemFree && CommWindowRegister && CommWindowDeregister; }
  std::string version_string() const;  // "2.28.9"
  // "ncclRemoteError: ... (last error: ...)" for a failed call on `comm` (may be null).
  std::string error_text(ncclResult_t r, ncclComm_t comm) const;
};

// Loads NCCL once per process and returns the table (it stays loaded). `explicit_path` (the
// --nccl-library flag / TANDEM_NCCL_LIBRARY) is tried alone when set; otherwise "libnccl.so.2" by
// the loader's search, then the Python wheel's nvidia/nccl/lib under the usual site-packages. The
// error says "tensor parallelism on GPUs needs NCCL (libnccl.so.2)" and what was tried.
Result<const NcclLib*> load_nccl(const std::string& explicit_path);

}  // namespace tandem::devcomm

#endif  // TANDEM_HAVE_NCCL_HEADER
