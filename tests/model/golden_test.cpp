// Golden comparison: `tandem logits` (the CPU forward) against logits of the official reference
// model.py (tools/golden/make_golden.py, run in PyTorch on a GPU), on checkpoints from
// `tandem make-tiny` (regenerated here from preset + seed) and on the built-in trained model.
// Tolerances and the reference's own prefill-vs-decode disagreement are discussed in
// tools/golden/README.md.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/numeric.h"
#include "io/safetensors.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::vector<float> as_float(const TensorView& t) {
  std::vector<float> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], t.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = t.dtype == DType::kF16 ? num::f16_to_f32(h) : num::bf16_to_f32(h);
    }
  }
  return out;
}

struct Stats {
  double max_abs = 0, max_rel = 0, mean_rel = 0;  // rel: per row, max|a-b| / max|b|
  double top1 = 0;
  int64_t rows = 0;
};

Stats compare(const float* a, const float* b, int64_t rows, int64_t V) {
  Stats s;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = 0, mb = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double x = a[r * V + v], y = b[r * V + v];
      mx = std::max(mx, std::fabs(x - y));
      mb = std::max(mb, std::fabs(y));
      if (a[r * V + v] > a[r * V + ia]) ia = v;
      if (b[r * V + v] > b[r * V + ib]) ib = v;
    }
    s.max_abs = std::max(s.max_abs, mx);
    const double rel = mx / std::max(mb, 1e-6);
    s.max_rel = std::max(s.max_rel, rel);
    s.mean_rel += rel;
    agree += ia == ib;
  }
  s.rows = rows;
  s.mean_rel /= std::max<int64_t>(rows, 1);
  s.top1 = static_cast<double>(agree) / std::max<int64_t>(rows, 1);
  return s;
}

std::string run_cmd(const std::string& cmd) {
  const std::string log = (fs::temp_directory_path() / ("tandem_model_cmd_" + std::to_string(getpid()) + ".log")).string();
  int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return rc == 0 ? std::string() : "command failed: " + cmd + "\n" + ss.str();
}

struct GoldenCase {
  const char* name;
  // Tolerances (see tools/golden/README.md): per-row relative error of the target logits (max over
  // rows and mean), top-1 agreement, and the same for the draft logits.
  double max_rel, mean_rel, min_top1;
  double draft_max_rel, draft_min_top1, conf_max_abs;
  int64_t min_exact_prefix;
};

void run_case(const GoldenCase& gc) {
  const fs::path root = TANDEM_SOURCE_DIR;
  std::ifstream jf(root / "data/golden" / (std::string(gc.name) + ".json"));
  ASSERT_TRUE(jf) << gc.name;
  std::stringstream ss;
  ss << jf.rdbuf();
  auto info = nlohmann::json::parse(ss.str(), nullptr, false);
  ASSERT_FALSE(info.is_discarded());
  const std::string preset = info["preset"];
  const fs::path tmp = fs::temp_directory_path() / ("tandem_golden_" + std::string(gc.name) + "_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  fs::path model_dir = root / "data/builtin";
  if (preset != "builtin") {
    model_dir = tmp / "ckpt";
    std::string err = run_cmd(std::string(TANDEM_BINARY) + " make-tiny " + model_dir.string() + " --preset " + preset +
                              " --seed " + std::to_string(info["seed"].get<int>()));
    ASSERT_TRUE(err.empty()) << err;
    // The golden was computed on this exact checkpoint: a changed make-tiny must be noticed as such.
    if (info.contains("checkpoint_sha256"))
      for (const auto& [file, want] : info["checkpoint_sha256"].items()) {
        err = run_cmd("(sha256sum " + (model_dir / file).string() + " > " + (tmp / "sum.txt").string() + ")");
        ASSERT_TRUE(err.empty()) << err;
        std::ifstream sf(tmp / "sum.txt");
        std::string got;
        sf >> got;
        ASSERT_EQ(got, want.get<std::string>()) << "make-tiny output changed (" << file
                                                << "): regenerate data/golden as tools/golden/README.md says";
      }
  }
  nlohmann::json tokens = {{"prompt", info["prompt"]}, {"decode", info["decode"]}};
  {
    std::ofstream tf(tmp / "tokens.json");
    tf << tokens.dump();
  }
  const fs::path out = tmp / "out.safetensors";
  std::string err = run_cmd(std::string(TANDEM_BINARY) + " logits --model " + model_dir.string() + " --tokens-file " +
                            (tmp / "tokens.json").string() + " --out " + out.string());
  ASSERT_TRUE(err.empty()) << err;

  auto gold = SafetensorsFile::open((root / "data/golden" / (std::string(gc.name) + ".safetensors")).string());
  ASSERT_TRUE(gold.ok()) << gold.status().to_string();
  auto mine = SafetensorsFile::open(out.string());
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  const TensorView* gl = (*gold)->find("logits");
  const TensorView* ml = (*mine)->find("logits");
  ASSERT_TRUE(gl && ml);
  ASSERT_EQ(gl->shape, ml->shape);
  const int64_t rows = gl->shape[0], V = gl->shape[1];
  auto g = as_float(*gl), m = as_float(*ml);
  Stats s = compare(m.data(), g.data(), rows, V);
  std::printf("[golden %s] target logits: %lld rows x %lld, max abs %.4g, max rel %.4g, mean rel %.4g, top-1 %.4f\n",
              gc.name, static_cast<long long>(rows), static_cast<long long>(V), s.max_abs, s.max_rel, s.mean_rel,
              s.top1);
  // Rows before the first rounding flip (an FP8/bf16 rounding that goes the other way and is then
  // amplified) agree to the F16 storage precision of the golden file.
  int64_t exact_prefix = 0;
  while (exact_prefix < rows && compare(m.data() + exact_prefix * V, g.data() + exact_prefix * V, 1, V).max_rel <= 1e-3)
    ++exact_prefix;
  std::printf("[golden %s] leading rows within 1e-3 relative: %lld\n", gc.name, static_cast<long long>(exact_prefix));
  EXPECT_GE(exact_prefix, gc.min_exact_prefix);
  auto self = info["reference_self_consistency"];
  std::printf("[golden %s] reference vs itself (prefill vs decode path): max abs %.4g, max rel %.4g, top-1 %.4f\n",
              gc.name, self["max_abs"].get<double>(), self["max_rel_to_row_max"].get<double>(),
              self["top1_agreement"].get<double>());
  EXPECT_LE(s.max_rel, gc.max_rel);
  EXPECT_LE(s.mean_rel, gc.mean_rel);
  EXPECT_GE(s.top1, gc.min_top1);

  const TensorView* gdl = (*gold)->find("draft_logits");
  if (gdl) {
    const TensorView* mdl = (*mine)->find("draft_logits");
    ASSERT_TRUE(mdl);
    // golden row i = our draft step i+1 (the reference cannot draft right after its prefill)
    const int64_t steps = gdl->shape[0], K = gdl->shape[1];
    ASSERT_EQ(mdl->shape[0], steps + 1);
    auto gd = as_float(*gdl), md = as_float(*mdl);
    Stats d = compare(md.data() + K * V, gd.data(), steps * K, V);
    auto gc_conf = as_float(*(*gold)->find("draft_confidence"));
    auto mc_conf = as_float(*(*mine)->find("draft_confidence"));
    double conf_abs = 0;
    for (int64_t i = 0; i < steps * K; ++i) conf_abs = std::max(conf_abs, std::fabs(mc_conf[K + i] - gc_conf[i]) * 1.0);
    std::printf("[golden %s] draft logits: %lld steps x %lld, max abs %.4g, max rel %.4g, mean rel %.4g, top-1 %.4f; "
                "confidence max abs %.4g\n",
                gc.name, static_cast<long long>(steps), static_cast<long long>(K), d.max_abs, d.max_rel, d.mean_rel,
                d.top1, conf_abs);
    EXPECT_LE(d.max_rel, gc.draft_max_rel);
    EXPECT_GE(d.top1, gc.draft_min_top1);
    EXPECT_LE(conf_abs, gc.conf_max_abs);
  }
  fs::remove_all(tmp);
}

TEST(ModelGolden, DefaultPresetSeed1Prompt300) {
  // reference vs itself: max rel 0.026, top-1 0.968. First compressed entries visible at row 3.
  run_case({"default-s1", 0.06, 0.03, 0.93, 0.05, 0.95, 0.2, 15});
}

TEST(ModelGolden, BuiltinTrainedModel) {
  // reference vs itself: max rel 0.113, top-1 0.988 (a trained model amplifies rounding flips more).
  // max_rel 0.4: the worst row is a rounding-flip cascade whose size depends on the fp32 summation
  // order alone. On the first trained model, only changing the GEMM ISA (cpu::set_gemm_isa) moved
  // target max rel between 0.146 (SSE) and 0.33 (AVX2 / AVX-512 FMA) and draft between 0.435 and
  // 0.19, with mean rel 0.028-0.031 and the exact prefix >= 4 in all three. The retrained model
  // (Python chat data): target max rel 0.219, mean 0.026, top-1 0.971, exact prefix 7; draft max
  // rel 0.37, top-1 0.873 (AVX-512 machine).
  run_case({"builtin", 0.4, 0.05, 0.93, 0.8, 0.85, 2.5, 4});
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// `tandem logits`: prefill_chunks change nothing (bit for bit); bad input is a clean error.
TEST(LogitsCli, ChunkedPrefillIsBitIdenticalAndBadInputFails) {
  const fs::path tmp = fs::temp_directory_path() / ("tandem_logits_cli_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const std::string bin = TANDEM_BINARY;
  const fs::path ckpt = tmp / "ckpt";
  ASSERT_EQ(run_cmd(bin + " make-tiny " + ckpt.string() + " --preset default --seed 5"), "");
  std::vector<int> prompt(150);
  for (int i = 0; i < 150; ++i) prompt[i] = 3 + (i * 37) % 2000;
  nlohmann::json a = {{"prompt", prompt}, {"decode", {11, 12, 13}}};
  nlohmann::json b = a;
  b["prefill_chunks"] = {5, 1, 64, 7};
  std::ofstream(tmp / "a.json") << a.dump();
  std::ofstream(tmp / "b.json") << b.dump();
  for (const char* n : {"a", "b"})
    ASSERT_EQ(run_cmd(bin + " logits --model " + ckpt.string() + " --tokens-file " + (tmp / (std::string(n) + ".json")).string() +
                      " --out " + (tmp / (std::string(n) + ".safetensors")).string()),
              "");
  auto fa = SafetensorsFile::open((tmp / "a.safetensors").string());
  auto fb = SafetensorsFile::open((tmp / "b.safetensors").string());
  ASSERT_TRUE(fa.ok() && fb.ok());
  for (const char* name : {"logits", "draft_logits", "draft_confidence", "draft_tokens"}) {
    const TensorView* x = (*fa)->find(name);
    const TensorView* y = (*fb)->find(name);
    ASSERT_TRUE(x && y) << name;
    EXPECT_EQ(x->shape, y->shape) << name;
    ASSERT_EQ(x->nbytes, y->nbytes);
    EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes), 0) << name;
  }
  EXPECT_EQ((*fa)->find("logits")->shape, (std::vector<int64_t>{153, 3280}));
  EXPECT_EQ((*fa)->find("draft_logits")->shape, (std::vector<int64_t>{3, 5, 3280}));

  std::ofstream(tmp / "bad.json") << R"({"prompt": [1, 2, 99999]})";
  std::string err = run_cmd(bin + " logits --model " + ckpt.string() + " --tokens-file " + (tmp / "bad.json").string() +
                            " --out " + (tmp / "bad.safetensors").string());
  EXPECT_NE(err.find("99999"), std::string::npos) << err;
  std::ofstream(tmp / "bad2.json") << R"({"prompt": "text"})";
  err = run_cmd(bin + " logits --model " + ckpt.string() + " --tokens-file " + (tmp / "bad2.json").string() + " --out " +
                (tmp / "bad.safetensors").string());
  EXPECT_NE(err.find("prompt"), std::string::npos) << err;
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace tandem
