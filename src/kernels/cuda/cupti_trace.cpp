// CuptiTrace (cupti_trace.h): the CUPTI activity API through dlsym. Records arrive in buffers CUPTI
// asks for and hands back (callbacks on its own thread), collected under a lock until the flush.
#include "kernels/cuda/cupti_trace.h"

#include <cupti.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda {

struct CuptiTrace::Api {
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

// The records of the current record() call (CUPTI's callbacks are plain functions).
std::mutex g_mu;
std::vector<ActivityRecord>* g_sink = nullptr;
CuptiTrace::Api* g_api = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (g_api && g_sink && g_api->next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    ActivityRecord r;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        r.kernel = true;
        r.name = k->name ? k->name : "?";
        r.start_ns = k->start;
        r.end_ns = k->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        r.kernel = false;
        r.name = "memcpy";
        r.start_ns = m->start;
        r.end_ns = m->end;
        r.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        r.kernel = false;
        r.name = "memset";
        r.start_ns = m->start;
        r.end_ns = m->end;
        r.bytes = m->bytes;
        break;
      }
      default:
        continue;
    }
    g_sink->push_back(std::move(r));
  }
  std::free(buffer);
}

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace

std::unique_ptr<CuptiTrace> CuptiTrace::open(const std::string& path, std::string* why) {
  std::vector<std::string> tries;
  if (!path.empty()) tries.push_back(path);
  tries.push_back("libcupti.so.13");
  tries.push_back(exe_dir() + "/libcupti.so.13");
  tries.push_back("/usr/local/cuda/lib64/libcupti.so.13");
  tries.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13");
  std::unique_ptr<CuptiTrace> t(new CuptiTrace());
  std::string errors;
  for (const std::string& p : tries) {
    t->handle_ = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (t->handle_) {
      t->library_ = p;
      break;
    }
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : p);
  }
  if (!t->handle_) {
    if (why) *why = "libcupti not loaded (" + errors + ")";
    return nullptr;
  }
  t->api_ = std::make_unique<Api>();
  Api& a = *t->api_;
  auto sym = [&](const char* name, auto& fn) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(t->handle_, name));
    return fn != nullptr;
  };
  if (!sym("cuptiActivityEnable", a.enable) || !sym("cuptiActivityDisable", a.disable) ||
      !sym("cuptiActivityRegisterCallbacks", a.register_callbacks) || !sym("cuptiActivityFlushAll", a.flush_all) ||
      !sym("cuptiActivityGetNextRecord", a.next_record) || !sym("cuptiGetResultString", a.result_string)) {
    if (why) *why = t->library_ + " lacks the activity API";
    return nullptr;
  }
  if (a.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    if (why) *why = "cuptiActivityRegisterCallbacks failed";
    return nullptr;
  }
  return t;
}

CuptiTrace::~CuptiTrace() {
  // The library stays loaded: CUPTI keeps threads and callbacks for the process's lifetime.
}

std::vector<ActivityRecord> CuptiTrace::record(const std::function<void()>& fn, std::string* why) {
  std::vector<ActivityRecord> out;
  Api& a = *api_;
  auto check = [&](CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return true;
    const char* s = nullptr;
    a.result_string(r, &s);
    if (why) *why = std::string(what) + ": " + (s ? s : "CUPTI error");
    return false;
  };
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sink = &out;
    g_api = &a;
  }
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                      CUPTI_ACTIVITY_KIND_MEMSET};
  bool ok = true;
  for (CUpti_ActivityKind k : kinds) ok = ok && check(a.enable(k), "cuptiActivityEnable");
  if (ok) {
    fn();
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  for (CUpti_ActivityKind k : kinds) a.disable(k);
  ok = check(a.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll") && ok;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sink = nullptr;
  }
  if (!ok) return {};
  std::sort(out.begin(), out.end(), [](const ActivityRecord& x, const ActivityRecord& y) { return x.start_ns < y.start_ns; });
  return out;
}

}  // namespace tandem::kernels::cuda
