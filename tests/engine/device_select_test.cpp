// --device selection without relying on a GPU: on a machine with no visible GPU (CI) `cuda` is a
// clear start-up error naming the reason and `auto` falls back to the CPU runner; with a GPU the
// CUDA runner is chosen. Also runs where the build has no CUDA runner at all.
#include <gtest/gtest.h>

#include <string>

#include "engine/dsv4_runner.h"
#include "engine/engine.h"

namespace tandem {
namespace {

EngineConfig builtin(const std::string& device) {
  EngineConfig c;
  c.model_dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  c.device = device;
  c.max_num_seqs = 1;
  c.num_threads = 1;
  c.kv_cache_memory = int64_t{64} << 20;
  return c;
}

TEST(DeviceSelect, CudaWithoutAGpuIsAClearErrorAndAutoUsesTheCpu) {
  if (cuda_runner_available()) GTEST_SKIP() << "a GPU is visible: tests/cuda covers --device cuda";
  auto r = create_cuda_runner(builtin("cuda"));
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos || msg.find("no CUDA runner") != std::string::npos)
      << msg;
  auto e = Engine::create(builtin("cuda"));
  ASSERT_FALSE(e.ok());
  auto a = Engine::create(builtin("auto"));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ((*a)->model_info().device, "cpu");
}

TEST(DeviceSelect, UnknownDeviceIsAnError) {
  EngineConfig c = builtin("tpu");
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--device 'tpu'"), std::string::npos) << e.status().message();
}

// Tensor parallelism on a GPU runs through the same rank processes as on the CPU (tests/cuda
// covers it); without a GPU --device cuda is refused before any worker starts.
TEST(DeviceSelect, GpuTensorParallelWithoutAGpuIsAClearError) {
  if (cuda_runner_available()) GTEST_SKIP() << "a GPU is visible: tests/cuda covers tensor parallelism on it";
  EngineConfig c = builtin("cuda");
  c.tensor_parallel_size = 2;
  c.master_port = 18640;
  c.worker_binary = TANDEM_BINARY;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos || msg.find("no CUDA runner") != std::string::npos)
      << msg;
}

// --synthetic on the CPU: refused at once with the bytes rank 0 would hold (no allocation is
// attempted); on a machine with less memory than that, also the bytes available.
TEST(DeviceSelect, SyntheticFullSizeOnTheCpuIsRefusedWithTheBytes) {
  for (int tp : {1, 2}) {
    EngineConfig c = builtin("cpu");
    c.synthetic = "deepseek-v4-flash-0731";
    c.tensor_parallel_size = tp;
    auto e = Engine::create(c);
    ASSERT_FALSE(e.ok());
    const std::string msg = e.status().message();
    EXPECT_NE(msg.find("--synthetic deepseek-v4-flash-0731"), std::string::npos) << msg;
    EXPECT_NE(msg.find(tp == 1 ? "155.42 GiB" : "78.88 GiB"), std::string::npos) << msg;  // the plan's bytes
    EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
    if (e.status().code() == StatusCode::kResourceExhausted)
      EXPECT_NE(msg.find("available"), std::string::npos) << msg;
    else
      EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented) << msg;
  }
}

// --synthetic with tensor parallelism: the worker ranks cannot generate synthetic weights yet, so
// start-up refuses before any rank starts (bench-model measures one rank of such a group).
TEST(DeviceSelect, SyntheticWithTensorParallelismIsRefused) {
  EngineConfig c = builtin("cuda");
  c.synthetic = "tiny:tp8";
  c.tensor_parallel_size = 2;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented) << msg;
  EXPECT_NE(msg.find("--synthetic tiny:tp8 with --tensor-parallel-size 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bench-model"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
