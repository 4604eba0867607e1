// The CUDA runner's side of the one greedy predicate (is_greedy, kernels/sampling.h): on the
// built-in checkpoint, a DSpark draft at temperature 1e-6 is greedy on the device as on the CPU
// (tests/engine/dsv4_runner_test.cpp runs the same check there): the temperature-0 tokens and
// confidences, not a sampled proposal; at temperature 1 it samples.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cuda_test_util.h"
#include "engine/dsv4_runner.h"
#include "engine/greedy_draft_check.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

TEST(CudaDraft, TinyTemperatureIsGreedy) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no data/builtin";
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = 1;
  ec.max_cudagraph_capture_size = 0;  // eager: the draft kernel itself, not a replay
  auto runner = create_cuda_runner(ec);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto prompt = (*tok)->encode("Count from one to twenty: one, two, three, four, five, six,");
  ASSERT_GT(prompt.size(), 4u);
  testing::expect_tiny_temperature_drafts_greedily(**runner, prompt);
}

}  // namespace
}  // namespace tandem
