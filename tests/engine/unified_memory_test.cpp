// The start-up memory plan on an integrated GPU (GB10: one LPDDR5x pool for CPU and GPU), with a
// simulated device report and /proc/meminfo, no GPU needed: the GPU's pools count against the
// host's MemAvailable, --gpu-memory-utilization sizes the KV pool as vLLM does (a fraction of the
// total memory for the whole process), and start-up refuses below the headroom floor with the
// numbers. A discrete GPU with the same numbers is planned against its own free memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/engine_core.h"
#include "engine/fake_model.h"

namespace tandem {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::string write_meminfo(int64_t total, int64_t available, int64_t free) {
  namespace fs = std::filesystem;
  static int n = 0;
  const std::string p =
      (fs::temp_directory_path() / ("tandem-meminfo-" + std::to_string(getpid()) + "-" + std::to_string(n++))).string();
  std::ofstream(p) << "MemTotal:       " << total / 1024 << " kB\nMemFree:        " << free / 1024
                   << " kB\nMemAvailable:   " << available / 1024 << " kB\nBuffers:           0 kB\n";
  return p;
}

// The fake model behind a simulated GPU: its weights, KV pool, slot states and prefix-cache
// snapshots are the device's pools, planned through the same add_gpu_domain as the CUDA runner's.
class SimulatedGpuRunner : public FakeModelRunner {
 public:
  SimulatedGpuRunner(FakeModelConfig c, GpuMemoryReport gpu, std::string meminfo, int64_t weights)
      : FakeModelRunner(c), gpu_(std::move(gpu)), meminfo_(std::move(meminfo)), weights_(weights) {}
  void plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const override {
    const std::string d = add_gpu_domain(plan, gpu_, read_host_memory(meminfo_));
    plan.add(kPoolWeights, d, weights_);
    plan.add(kPoolKv, d, int64_t{alloc.num_blocks} * kv_bytes_per_block(alloc.block_size, alloc.kv_cache_dtype));
    plan.add(kPoolSlotState, d, int64_t{alloc.max_slots} * slot_state_bytes());
    if (alloc.num_snapshots > 0) plan.add(kPoolPrefixSnapshots, d, int64_t{alloc.num_snapshots} * slot_state_bytes());
  }

 private:
  GpuMemoryReport gpu_;
  std::string meminfo_;
  int64_t weights_;
};

// A GB10-like report scaled down: cudaMemGetInfo's free is MemFree (page cache counted as used),
// far below what the kernel would give back.
GpuMemoryReport unified(int64_t total) { return {"cuda:0", true, 40 * kMiB, total}; }

EngineConfig config(double util, int64_t floor) {
  EngineConfig ec;
  ec.max_num_seqs = 4;
  ec.block_size = 16;
  ec.gpu_memory_utilization = util;
  ec.memory_headroom_floor = floor;
  return ec;
}

// A model whose sequences could take far more KV than any budget here (16M tokens each).
FakeModelConfig long_model() {
  FakeModelConfig fc;
  fc.max_model_len = int64_t{1} << 24;
  return fc;
}

Result<std::unique_ptr<EngineCore>> start(GpuMemoryReport gpu, int64_t host_avail, double util, int64_t floor,
                                          FakeModelConfig fc = long_model()) {
  CoreOptions co;
  co.log_startup = false;
  const std::string mi = write_meminfo(1024 * kMiB, host_avail, 40 * kMiB);
  auto r = EngineCore::create(std::make_unique<SimulatedGpuRunner>(fc, gpu, mi, 448 * kMiB), config(util, floor), co);
  std::filesystem::remove(mi);
  return r;
}

int64_t pool(const MemoryPlan& p, const std::string& name) {
  int64_t n = 0;
  for (const auto& x : p.pools)
    if (x.name == name) n += x.bytes;
  return n;
}

TEST(UnifiedMemory, ReadsMemTotalAndMemAvailable) {
  const std::string p = write_meminfo(1000 * kMiB, 600 * kMiB, 40 * kMiB);
  HostMemoryReport h = read_host_memory(p);
  EXPECT_EQ(h.total_bytes, 1000 * kMiB);
  EXPECT_EQ(h.available_bytes, 600 * kMiB);
  std::filesystem::remove(p);
  h = read_host_memory(p);
  EXPECT_EQ(h.available_bytes, -1);
  EXPECT_EQ(h.total_bytes, -1);
}

TEST(UnifiedMemory, GpuPoolsCountAgainstMemAvailableAndUtilizationSizesTheKvPool) {
  // 1 GiB of unified memory, --gpu-memory-utilization 0.5: the process may hold 512 MiB, of which
  // the weights take 448 MiB, so the KV pool (with the prefix-cache snapshots) gets about 64 MiB.
  auto core = start(unified(1024 * kMiB), /*host_avail=*/900 * kMiB, 0.5, /*floor=*/256 * kMiB);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const MemoryPlan& plan = (*core)->model_info().memory;
  EXPECT_EQ(plan.gpu_domain, "host");
  EXPECT_TRUE(plan.gpu_unified);
  for (const auto& p : plan.pools) EXPECT_EQ(p.domain, "host") << p.name;
  ASSERT_NE(plan.find_domain("host"), nullptr);
  EXPECT_EQ(plan.find_domain("host")->available_bytes, 900 * kMiB);  // MemAvailable, not the GPU's 40 MiB "free"
  EXPECT_EQ(plan.find_domain("cuda:0"), nullptr);                     // one pool, one domain
  const int64_t kv = pool(plan, kPoolKv) + pool(plan, kPoolPrefixSnapshots);
  const int64_t total = plan.planned_bytes("host");
  FakeModelRunner probe{FakeModelConfig{}};
  const int64_t block = probe.kv_bytes_per_block(16, (*core)->kv_cache_dtype());
  EXPECT_LE(total, 512 * kMiB);                                         // within U x total ...
  EXPECT_GT(total, 512 * kMiB - block - probe.slot_state_bytes() - 1);  // ... to the last block
  EXPECT_GT(kv, 60 * kMiB);
  EXPECT_EQ((*core)->model_info().kv_capacity_tokens, int64_t{(*core)->num_kv_blocks()} * 16);
}

TEST(UnifiedMemory, RefusesUnderTheFloorWithTheNumbers) {
  // The same plan (512 MiB) with 700 MiB available leaves 188 MiB, under a 256 MiB floor.
  auto refused = start(unified(1024 * kMiB), 700 * kMiB, 0.5, 256 * kMiB);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string m = refused.status().message();
  EXPECT_NE(m.find("host: 700.0 MiB available"), std::string::npos) << m;
  EXPECT_NE(m.find("unified with cuda:0"), std::string::npos) << m;
  EXPECT_NE(m.find("under the floor of 256.0 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("--gpu-memory-utilization"), std::string::npos) << m;  // what to lower

  // A utilization that does not even cover the weights.
  auto none = start(unified(1024 * kMiB), 900 * kMiB, 0.4, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--gpu-memory-utilization 0.4 of the unified memory's 1.00 GiB"),
            std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("leaves no KV cache"), std::string::npos) << none.status().message();
}

TEST(UnifiedMemory, DiscreteGpuIsPlannedAgainstItsOwnFreeMemory) {
  // Same numbers on a discrete GPU: its pools count against the 600 MiB it reports free, not the
  // host's 900 MiB: 600 - 512 = 88 MiB left, under the floor.
  GpuMemoryReport discrete{"cuda:0", false, 600 * kMiB, 1024 * kMiB};
  auto refused = start(discrete, 900 * kMiB, 0.5, 256 * kMiB);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cuda:0: 600.0 MiB available (cudaMemGetInfo)"), std::string::npos)
      << refused.status().message();
  discrete.free_bytes = 900 * kMiB;
  auto core = start(discrete, 900 * kMiB, 0.5, 256 * kMiB);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const MemoryPlan& plan = (*core)->model_info().memory;
  EXPECT_EQ(plan.gpu_domain, "cuda:0");
  EXPECT_EQ(pool(plan, kPoolWeights), 448 * kMiB);
  ASSERT_NE(plan.find_domain("cuda:0"), nullptr);
  ASSERT_NE(plan.find_domain("host"), nullptr);  // the host's own pools are still checked
  // The prefix-cache snapshots are the runner's, on its device, inside the utilization's budget:
  // every pool the plan holds is on cuda:0 and they add up to at most 0.5 x 1 GiB.
  const int64_t snaps = pool(plan, kPoolPrefixSnapshots);
  EXPECT_GT(snaps, 0);
  EXPECT_EQ(snaps, int64_t{(*core)->kv().num_snapshots()} * FakeModelRunner(long_model()).slot_state_bytes());
  for (const auto& p : plan.pools) EXPECT_EQ(p.domain, "cuda:0") << p.name;
  EXPECT_LE(plan.planned_bytes("cuda:0"), 512 * kMiB);
  EXPECT_EQ(plan.planned_bytes("host"), 0);
}

TEST(UnifiedMemory, KvPoolNeverExceedsEverySequenceAtFullLength) {
  // 4 sequences of 8,192 tokens need far less than the 64 MiB the utilization would give: the pool
  // holds them (and the snapshots), and the rest stays with the host.
  FakeModelConfig fc;
  fc.max_model_len = 8192;
  auto core = start(unified(1024 * kMiB), 900 * kMiB, 0.5, 256 * kMiB, fc);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const int64_t blocks = (*core)->num_kv_blocks();
  EXPECT_GE(int64_t{blocks} * 16, 4 * 8192);
  EXPECT_LE(blocks, 4 * (8192 / 16 + 1));
  EXPECT_LT(pool((*core)->model_info().memory, kPoolKv), 2 * kMiB);
}

TEST(UnifiedMemory, KvCacheMemoryOverridesUtilization) {
  // --kv-cache-memory sizes the pool itself (vLLM: kv_cache_memory_bytes ignores the utilization).
  CoreOptions co;
  co.log_startup = false;
  EngineConfig ec = config(0.1, 0);
  ec.kv_cache_memory = 8 * kMiB;
  ec.enable_prefix_caching = false;
  const std::string mi = write_meminfo(1024 * kMiB, 900 * kMiB, 40 * kMiB);
  auto core = EngineCore::create(
      std::make_unique<SimulatedGpuRunner>(long_model(), unified(1024 * kMiB), mi, 448 * kMiB), ec, co);
  std::filesystem::remove(mi);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  EXPECT_LE(pool((*core)->model_info().memory, kPoolKv), 8 * kMiB);
  EXPECT_GT(pool((*core)->model_info().memory, kPoolKv), 7 * kMiB);
}

}  // namespace
}  // namespace tandem
