// Teacher-forced layer-by-layer comparison of the CUDA model with the CPU oracle (layer_harness.h
// says what is compared, layer_compare.h which limits and why): every layer half of the SWA, CSA
// and HCA layers and every DSpark draft stage gets the CPU's inputs and state, and its outputs and
// the state it wrote are compared piece by piece. Steps: two prefill chunks, a decode step, a
// verify step and a batch of a decode and a prefill in two slots; each KV dtype; the in-memory tiny
// model with and without the draft, every make-tiny preset and the built-in model. Every piece
// prints one line starting with `[cuda-layer]`. Skips without a GPU.
// Limits (derived in layer_compare.h): each piece at most twice the CPU's own spread of that piece
// (the same teacher-forced half-layer with the CPU's GEMM instruction set changed), but not below
// the size of one rounding flip: residual streams max rel 2^-6 per row, mean rel 2^-9, at most 1/64
// of the elements not bit-identical, or the largest CPU spread of that kind of half on any layer of
// the step where that is more (a flip's measured reach in the model); fp32 rows (compressor rows,
// gate logits, logits) 2^-8 / 2^-12;
// at most 1/16 of the records a step writes. An indexer top-k or MoE routing may differ only on a
// row where the CPU's own choice was within twice the measured score change (a near tie); the
// uploaded state must decode to the CPU's values and every byte the step does not write must stay.
// Steps whose GEMMs take the tensor cores (the prefill chunks of 131 rows, the draft's context
// insertion of 150 rows): their pieces ("[tensor cores]") are also held to the limits derived the
// same way from a CPU run of the step with the tensor cores' accumulation emulated
// (tests/cuda/tc_emulation.h) where those are more (the line names the rule that applied:
// "rule: 2 x cpu tc-emulated spread" or "rule: cpu-derived"). The step runs a second time on the
// same model pinned to the GEMV/decode kernels: its pieces ("[gemv path]") are held to the
// CPU-derived limits, and its distance to the tensor-core run is printed, not used as a limit.
// Records are compared by the values they decode to (layer_compare.h says why).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cuda/layer_harness.h"
#include "cuda/require_gpu.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
namespace mt = model_testing;
using layer_harness::Subject;


// The CUDA model through its test hooks.
class CudaDevice : public layer_harness::Device {
 public:
  CudaDevice(std::unique_ptr<CudaModel> m, int64_t tc_min_rows) : m_(std::move(m)), tc_min_rows_(tc_min_rows) {}
  CudaModel& model() { return *m_; }
  bool has_draft() override { return m_->has_draft(); }
  int64_t draft_tokens() override { return m_->draft_tokens(); }
  void reset(int slot) override { m_->reset(slot); }
  Status draft_insert_context(int slot, int64_t start_pos, std::span<const float> taps) override {
    return m_->draft_insert_context(slot, start_pos, taps);
  }
  void read_slot(int slot, std::vector<uint8_t>& out) override { mt::cuda_read_slot(*m_, slot, out); }
  void write_slot(int slot, std::span<const uint8_t> in) override { mt::cuda_write_slot(*m_, slot, in); }
  void read_pool(std::vector<uint8_t>& out) override { mt::cuda_read_pool(*m_, out); }
  void write_pool(std::span<const uint8_t> in) override { mt::cuda_write_pool(*m_, in); }
  int64_t draft_ring_rows() override { return mt::cuda_state_layout(*m_).draft_ring; }
  void read_draft_context(int slot, std::vector<uint8_t>& out) override { mt::cuda_read_draft_context(*m_, slot, out); }
  void write_draft_context(int slot, std::span<const uint8_t> in) override {
    mt::cuda_write_draft_context(*m_, slot, in);
  }
  void set_slot_length(int slot, int64_t length) override { mt::cuda_set_slot_length(*m_, slot, length); }
  void encode_kv(const float* rows, int64_t n, std::vector<uint8_t>& out) override {
    mt::cuda_encode_kv(*m_, rows, n, out);
  }
  void encode_index_keys(const float* rows, int64_t n, std::vector<uint8_t>& out) override {
    mt::cuda_encode_index_keys(*m_, rows, n, out);
  }
  Status begin_step(const StepBatch& batch) override { return mt::cuda_begin_step(*m_, batch); }
  bool tensor_core_step() override { return mt::cuda_step_tensor_cores(*m_); }
  int64_t tc_min_rows() override { return tc_min_rows_; }
  void set_h(const float* h, int64_t rows) override { mt::cuda_set_h(*m_, h, rows); }
  void get_h(float* h, int64_t rows) override { mt::cuda_get_h(*m_, h, rows); }
  void attention_half(int layer, const StepBatch& batch) override { mt::cuda_attention_half(*m_, layer, batch); }
  void ffn_half(int layer, const StepBatch& batch) override { mt::cuda_ffn_half(*m_, layer, batch); }
  void end_step() override { mt::cuda_end_step(*m_); }
  void logits(const float* h, int64_t rows, std::vector<float>& out) override { mt::cuda_logits(*m_, h, rows, out); }
  bool last_indexer(int64_t rows, int64_t cols, std::vector<float>& scores, std::vector<int32_t>& topk) override {
    return mt::cuda_last_indexer(*m_, rows, cols, scores, topk);
  }
  void last_routing(int64_t rows, std::vector<float>& gate_logits, std::vector<int32_t>& experts) override {
    mt::cuda_last_routing(*m_, rows, gate_logits, experts);
  }
  Status draft_begin(std::span<const CudaModel::DraftQueryDev> requests) override {
    return mt::cuda_draft_begin(*m_, requests);
  }
  void draft_stage_attention(int stage, int64_t requests) override {
    mt::cuda_draft_stage_attention(*m_, stage, requests);
  }
  void draft_stage_ffn(int stage, int64_t requests) override { mt::cuda_draft_stage_ffn(*m_, stage, requests); }
  void draft_finish(int64_t requests, std::vector<DraftResult>& results) override {
    mt::cuda_draft_finish(*m_, requests, results);
  }

 private:
  std::unique_ptr<CudaModel> m_;
  int64_t tc_min_rows_;
};

// cfg != nullptr: the in-memory tiny weights for it (seed 7, as model_test.cpp); else the
// checkpoint in `dir`. Two CUDA models of the same weights: the default one (prefill chunks of
// more than tc_min_rows rows on the tensor cores) and one pinned to the GEMV/decode kernels, the
// GPU's own second accumulation path (its tensor-core steps' pieces compared with the CPU's too).
std::unique_ptr<Subject> make_subject(const std::string& name, KvDtype d, const ModelConfig* cfg,
                                      const std::string& dir) {
  auto s = std::make_unique<Subject>();
  s->name = name + ", kv " + kv_dtype_name(d);
  s->opt = layer_harness::layer_options(d);
  CudaModelOptions co;
  co.model = s->opt;
  CudaModelOptions cg = co;
  cg.tc_min_rows = int64_t{1} << 40;
  std::unique_ptr<CudaModel> gpu, gemv;
  auto make = [&](const CudaModelOptions& o) -> std::unique_ptr<CudaModel> {
    auto g = cfg ? CudaModel::from_tensors(s->cfg, s->tw.ptrs(), o) : CudaModel::load(dir, o);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(g).value() : nullptr;
  };
  if (cfg) {
    s->cfg = *cfg;
    s->tw = testing::tiny_weights(s->cfg, 7);
    auto c = DsV4Model::from_tensors(s->cfg, s->tw.ptrs(), s->opt);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    s->cpu = std::move(c).value();
  } else {
    auto c = DsV4Model::load(dir, s->opt);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    s->cpu = std::move(c).value();
    s->cfg = s->cpu->config();
  }
  gpu = make(co);
  gemv = make(cg);
  if (!gpu || !gemv) return nullptr;
  s->lay = mt::cuda_state_layout(*gpu);
  s->dev = std::make_unique<CudaDevice>(std::move(gpu), co.tc_min_rows);
  s->gemv = std::make_unique<CudaDevice>(std::move(gemv), cg.tc_min_rows);
  return s;
}

void run_case(const std::string& name, KvDtype d, const ModelConfig* cfg, const std::string& dir) {
  auto s = make_subject(name, d, cfg, dir);
  ASSERT_TRUE(s) << name;
  layer_harness::run_subject(*s);
  if (::testing::Test::HasFatalFailure()) return;
  layer_harness::check_subject(*s);
}

std::string run_cmd(const std::string& cmd) {
  const std::string log = (fs::temp_directory_path() / ("tandem_layer_cmd_" + std::to_string(getpid()) + ".log")).string();
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return rc == 0 ? std::string() : "command failed: " + cmd + "\n" + ss.str();
}

TEST(CudaLayers, TinyModelEachKvDtype) {
  TANDEM_REQUIRE_GPU();
  const ModelConfig cfg = testing::tiny_config(true);
  for (KvDtype d : {KvDtype::kFp8, KvDtype::kBf16, KvDtype::kNvfp4}) {
    run_case("tiny in-memory", d, &cfg, "");
    if (HasFatalFailure()) return;
  }
}

// The configuration of the whole-model gap this comparison was built to explain (max rel 0.366 with
// fp8 KV, 0.258 with bf16 KV, against CPU spreads of 3.5e-7 and 0.020).
TEST(CudaLayers, TinyNoDraftModel) {
  TANDEM_REQUIRE_GPU();
  const ModelConfig cfg = testing::tiny_config(false);
  for (KvDtype d : {KvDtype::kFp8, KvDtype::kBf16}) {
    run_case("tiny in-memory no-draft", d, &cfg, "");
    if (HasFatalFailure()) return;
  }
}

TEST(CudaLayers, EveryTinyPresetFromDisk) {
  TANDEM_REQUIRE_GPU();
  const fs::path tmp = fs::temp_directory_path() / ("tandem_layer_presets_" + std::to_string(getpid()));
  for (const char* preset : {"default", "small", "preview"}) {
    const fs::path dir = tmp / preset;
    ASSERT_EQ(run_cmd(std::string(TANDEM_BINARY) + " make-tiny " + dir.string() + " --preset " + preset + " --seed 4"),
              "");
    // fp8 for every preset; the other cache dtypes on the default preset (the in-memory and the
    // built-in cases run all three).
    const bool all = std::string(preset) == "default";
    for (KvDtype d : {KvDtype::kFp8, KvDtype::kBf16, KvDtype::kNvfp4}) {
      if (d != KvDtype::kFp8 && !all) continue;
      run_case(std::string("preset ") + preset, d, nullptr, dir.string());
      if (HasFatalFailure()) return;
    }
  }
  fs::remove_all(tmp);
}

TEST(CudaLayers, BuiltinModelEachKvDtype) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/data/builtin";
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << "data/builtin is part of the repository: " << dir;
  for (KvDtype d : {KvDtype::kFp8, KvDtype::kBf16, KvDtype::kNvfp4}) {
    run_case("builtin", d, nullptr, dir);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tandem
