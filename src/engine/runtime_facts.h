// What a model runner says about itself for operations: the device facts and the kernel path it
// chose per op class (`tandem audit`, the start-up audit of `tandem serve`), and the memory plan
// (named pools per memory domain, checked against a headroom floor before anything is allocated).
// Shared by the runner interface (model_runner.h) and the engine's public header (engine.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem {

// The op classes an audit names a kernel path for. A runner reports every one it runs; a CUDA
// runner that lacks a kernel for this GPU or dtype must fail at start-up instead of reporting an
// emulation here.
inline const std::vector<std::string>& audit_op_classes() {
  static const std::vector<std::string> k = {
      "gemm_fp8",        "moe_experts_mxfp4", "moe_routing", "sparse_attention", "lightning_indexer",
      "kv_compressor",   "kv_cache_quant",    "mhc",         "norm_rope",        "lm_head",
      "sampling",        "dspark_draft",      "all_reduce"};
  return k;
}

struct KernelPath {
  std::string op_class;  // one of audit_op_classes()
  std::string path;      // e.g. "cpu-reference", "cuda:flashmla-sm90", "none (tensor_parallel_size 1)"
};

// How a tensor-parallel rank's collectives travel (src/model/cuda/device_comm.h); empty for one
// rank and on the CPU (ZeroMQ, rank-order sums).
struct CollectiveFacts {
  std::string topology;                  // the facts the routing was decided from
  std::vector<std::string> routes;       // "all_reduce <= 1 MiB: peer-oneshot", "all_reduce: nccl", ...
  std::vector<std::string> unavailable;  // "nccl-symmetric: <why not>"
};

// One rank's device, as its runner sees it.
struct DeviceFacts {
  int rank = 0;
  std::string device;              // "cpu" | "cuda:0" ...
  std::string name;                // CPU model name or GPU name
  std::string compute_capability;  // "9.0", "12.1"; "" on the CPU
  std::vector<KernelPath> kernels;
  std::vector<int> cudagraph_capture_sizes;  // empty: no graph capture (eager)
  CollectiveFacts collectives;
};

// Standard pool names, so reports from different runners read alike.
inline constexpr const char* kPoolWeights = "weights";
inline constexpr const char* kPoolKv = "kv_pool";
inline constexpr const char* kPoolSlotState = "per_slot_state";
inline constexpr const char* kPoolPrefixSnapshots = "prefix_snapshots";
inline constexpr const char* kPoolActivations = "activations";  // largest step and graph shape
inline constexpr const char* kPoolWorkspace = "workspaces";
inline constexpr const char* kPoolComm = "comm_buffers";

struct MemoryPool {
  std::string name;    // kPool* or a runner-specific name
  std::string domain;  // "host" or a device ("cuda:0"); on unified memory a device pool is host memory too
  int64_t bytes = 0;
  // Already reflected in the domain's available bytes when the plan is checked (e.g. mapped
  // weights, or pools the runner allocated before reporting); not subtracted again.
  bool already_counted = false;
  std::string note;    // why, for the report ("file-backed mmap", "fp32 whatever the KV dtype")
};

struct MemoryDomain {
  std::string domain;            // "host" | "cuda:0" ...
  int64_t available_bytes = -1;  // host: MemAvailable; device: free memory the runner reports; -1 unknown
  int64_t total_bytes = -1;
  std::string source;            // "/proc/meminfo MemAvailable", "cudaMemGetInfo"
};

struct MemoryPlan {
  std::vector<MemoryPool> pools;
  std::vector<MemoryDomain> domains;
  int64_t headroom_floor_bytes = 0;  // --memory-headroom-floor
  // Set by a GPU runner (add_gpu_domain): the domain its pools count against ("cuda:0"; "host" on
  // an integrated GPU, whose memory is the host's) and the bytes --gpu-memory-utilization is a
  // fraction of. Empty / -1 on the CPU.
  std::string gpu_domain;
  int64_t gpu_total_bytes = -1;
  bool gpu_unified = false;

  void add(std::string name, std::string domain, int64_t bytes, std::string note = "", bool already_counted = false) {
    pools.push_back({std::move(name), std::move(domain), bytes, already_counted, std::move(note)});
  }
  int64_t planned_bytes(const std::string& domain) const;   // every pool of the domain
  int64_t to_allocate_bytes(const std::string& domain) const;  // pools not already counted
  const MemoryDomain* find_domain(const std::string& domain) const;
};

// The host's MemAvailable (bytes) from /proc/meminfo, or an error where there is none.
Result<int64_t> read_host_mem_available(const std::string& meminfo_path = "/proc/meminfo");

// The host's memory as /proc/meminfo reports it (-1 where unreadable).
struct HostMemoryReport {
  int64_t available_bytes = -1;  // MemAvailable: free plus what the kernel can reclaim (page cache)
  int64_t total_bytes = -1;      // MemTotal
  std::string source;            // the file read
};
HostMemoryReport read_host_memory(const std::string& meminfo_path = "/proc/meminfo");

// What a GPU runner measures about its device's memory at start-up (cudaMemGetInfo and
// cudaDevAttrIntegrated), or what a test simulates.
struct GpuMemoryReport {
  std::string device;        // "cuda:0"
  bool integrated = false;   // the GPU's memory is the host's (GB10, Jetson): one pool for both
  int64_t free_bytes = -1;   // cudaMemGetInfo free
  int64_t total_bytes = -1;  // cudaMemGetInfo total
};

// Adds the GPU's memory domain to `plan` and returns the domain the runner's pools belong to.
// Discrete GPU: its own domain (the device name), available = the free bytes the driver reports.
// Integrated GPU (unified memory): the GPU's pools are host memory, so they go in the "host"
// domain, checked against MemAvailable together with the host's own pools; cudaMemGetInfo's free
// is not used there, since it leaves out the page cache the kernel would reclaim (vLLM on GB10
// uses the host's available memory for the same reason). Sets plan.gpu_domain/gpu_total_bytes.
std::string add_gpu_domain(MemoryPlan& plan, const GpuMemoryReport& gpu, const HostMemoryReport& host);

// The KV pool's budget under --gpu-memory-utilization U, with vLLM's meaning (which the seeds'
// GB10 forks keep): the process may hold U x the GPU's total memory (on unified memory, U x the
// one pool); the KV pool (and the prefix-cache snapshots sized with it) gets what the plan's other
// pools in the GPU's domain leave of that. An error with the numbers when they leave nothing.
Result<int64_t> kv_budget_from_utilization(const MemoryPlan& plan, double utilization);

// OK when every domain with a known availability keeps at least the floor after its pools are
// allocated; otherwise an error (kResourceExhausted) that gives the numbers of each short domain.
Status check_memory_headroom(const MemoryPlan& plan);

// Multi-line start-up report: one line per pool, then per domain planned / available / left.
std::string format_memory_report(const MemoryPlan& plan);

std::string format_bytes(int64_t bytes);  // "1.50 GiB", "12.0 MiB", "512 B"

}  // namespace tandem
