// Kernel and copy activity records of a stretch of device work, through CUPTI loaded at run time
// (dlopen: the binary does not link libcupti, and runs without it). bench-model uses it to split a
// step's graph replay into kernel time, gaps and op classes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem::kernels::cuda {

struct ActivityRecord {
  bool kernel = true;       // else a memcpy / memset
  std::string name;         // kernel name (mangled), "memcpy" or "memset"
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t bytes = 0;       // copies
};

class CuptiTrace {
 public:
  // Loads libcupti: `path` when given, else libcupti.so.13 from the loader's search path, next to
  // this executable, and the CUDA toolkit's lib64. Null with the reason in *why when none loads.
  static std::unique_ptr<CuptiTrace> open(const std::string& path, std::string* why);
  ~CuptiTrace();
  CuptiTrace(const CuptiTrace&) = delete;
  CuptiTrace& operator=(const CuptiTrace&) = delete;

  const std::string& library() const { return library_; }
  // Runs `fn` (which must finish its device work, e.g. synchronize) with kernel, memcpy and
  // memset records on; returns them sorted by start time. Empty with *why on a CUPTI error.
  std::vector<ActivityRecord> record(const std::function<void()>& fn, std::string* why);

  struct Api;

 private:
  CuptiTrace() = default;
  void* handle_ = nullptr;
  std::string library_;
  std::unique_ptr<Api> api_;
};

}  // namespace tandem::kernels::cuda
