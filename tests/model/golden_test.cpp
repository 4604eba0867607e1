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

// Every limit below is derived from the golden's own record of the reference's spread between its
// prefill path and its one-token decode path (`reference_self_consistency`, written by
// tools/golden/make_golden.py), as tools/golden/README.md explains: both we and the reference's
// second path differ from its first path only by fp32 summation order amplified through bf16/FP8
// rounding flips, so our spread is held to kSpreadFactor times the reference's.
constexpr double kSpreadFactor = 2.0;

struct GoldenCase {
  const char* name;
  // Rows before the first rounding flip agree to the F16 storage precision of the golden file (a
  // formula error shows up here, on the first rows, long before any aggregate limit moves).
  int64_t min_exact_prefix;
};

struct Limits {
  double max_rel;           // kSpreadFactor x the reference's own max rel (per row, to the row max)
  double disagree_rate;     // top-1 disagreements per row: kSpreadFactor x the reference's own rate
};

// Top-1 disagreements are rare events (rows where a rounding flip meets a near tie): a count over
// `rows` rows at `rate` per row is Poisson; the limit is its 99% quantile, so a handful of rows
// (the reference itself disagrees on 2 of 172 built-in rows) does not make the limit a coin toss.
int64_t disagree_limit(double rate, int64_t rows) {
  const double mean = rate * static_cast<double>(rows);
  double pk = std::exp(-mean), cdf = pk;
  int64_t k = 0;
  while (cdf < 0.99) {
    ++k;
    pk *= mean / static_cast<double>(k);
    cdf += pk;
  }
  return k;
}

// The limits of a golden from its reference_self_consistency record (fields required).
::testing::AssertionResult limits_from_spread(const nlohmann::json& info, Limits* out) {
  if (!info.contains("reference_self_consistency"))
    return ::testing::AssertionFailure() << "golden lacks reference_self_consistency: regenerate it (tools/golden)";
  const auto& self = info["reference_self_consistency"];
  for (const char* f : {"max_rel_to_row_max", "top1_agreement"})
    if (!self.contains(f) || !self[f].is_number())
      return ::testing::AssertionFailure() << "reference_self_consistency lacks " << f;
  out->max_rel = kSpreadFactor * self["max_rel_to_row_max"].get<double>();
  out->disagree_rate = kSpreadFactor * (1.0 - self["top1_agreement"].get<double>());
  return ::testing::AssertionSuccess();
}

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
  }
  // The golden was computed on this exact checkpoint: a changed make-tiny or a retrained built-in
  // model must be noticed as such, not as a numeric failure.
  ASSERT_TRUE(info.contains("checkpoint_sha256") && !info["checkpoint_sha256"].empty())
      << gc.name << ": golden lacks checkpoint_sha256";
  for (const auto& [file, want] : info["checkpoint_sha256"].items()) {
    std::string err = run_cmd("(sha256sum " + (model_dir / file).string() + " > " + (tmp / "sum.txt").string() + ")");
    ASSERT_TRUE(err.empty()) << err;
    std::ifstream sf(tmp / "sum.txt");
    std::string got;
    sf >> got;
    ASSERT_EQ(got, want.get<std::string>()) << "checkpoint changed (" << file
                                            << "): regenerate data/golden as tools/golden/README.md says";
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
  Limits lim;
  ASSERT_TRUE(limits_from_spread(info, &lim));
  const auto& self = info["reference_self_consistency"];
  const int64_t disagree = std::llround((1.0 - s.top1) * static_cast<double>(rows));
  const int64_t max_disagree = disagree_limit(lim.disagree_rate, rows);
  std::printf("[golden %s] reference vs itself (prefill vs decode path): max abs %.4g, max rel %.4g, top-1 %.4f; "
              "limits: max rel %.4g, top-1 disagreements %lld (ours %lld)\n",
              gc.name, self["max_abs"].get<double>(), self["max_rel_to_row_max"].get<double>(),
              self["top1_agreement"].get<double>(), lim.max_rel, static_cast<long long>(max_disagree),
              static_cast<long long>(disagree));
  EXPECT_LE(s.max_rel, lim.max_rel);
  EXPECT_LE(disagree, max_disagree);

  // The draft: required (both presets carry DSpark). Golden row i = our draft step i+1 (the
  // reference cannot draft right after its prefill). Position k of a step is conditioned on the
  // draft's own greedy tokens 0..k-1; where those differ from the reference's, the two rows answer
  // different questions, so a position is compared only while the tokens before it agree. Compared
  // rows differ from the reference only through the target's taps and the draft's own fp32 order,
  // the same mechanism as the target rows, and get the same limit.
  const TensorView* gdl = (*gold)->find("draft_logits");
  const TensorView* mdl = (*mine)->find("draft_logits");
  ASSERT_TRUE(gdl && mdl) << "draft logits missing";
  const TensorView* gdt = (*gold)->find("draft_tokens");
  const TensorView* mdt = (*mine)->find("draft_tokens");
  const TensorView* gdc = (*gold)->find("draft_confidence");
  const TensorView* mdc = (*mine)->find("draft_confidence");
  ASSERT_TRUE(gdt && mdt && gdc && mdc) << "draft tokens or confidence missing";
  const int64_t steps = gdl->shape[0], K = gdl->shape[1];
  ASSERT_EQ(mdl->shape[0], steps + 1);
  auto gd = as_float(*gdl), md = as_float(*mdl);
  auto gc_conf = as_float(*gdc), mc_conf = as_float(*mdc);
  std::vector<int32_t> gtok(steps * K), mtok((steps + 1) * K);
  std::memcpy(gtok.data(), gdt->data, gtok.size() * 4);
  std::memcpy(mtok.data(), mdt->data, mtok.size() * 4);
  Stats d;
  int64_t compared = 0, d_disagree = 0;
  double conf_rel = 0, conf_scale = 0;
  for (int64_t i = 0; i < steps * K; ++i) conf_scale = std::max(conf_scale, std::fabs(double(gc_conf[i])));
  for (int64_t st = 0; st < steps; ++st)
    for (int64_t k = 0; k < K; ++k) {
      if (k > 0 && mtok[(st + 1) * K + k - 1] != gtok[st * K + k - 1]) break;
      Stats r = compare(md.data() + ((st + 1) * K + k) * V, gd.data() + (st * K + k) * V, 1, V);
      d.max_abs = std::max(d.max_abs, r.max_abs);
      d.max_rel = std::max(d.max_rel, r.max_rel);
      d.mean_rel += r.mean_rel;
      d_disagree += r.top1 < 1.0;
      ++compared;
      // The confidence head reads the same hidden state: its error relative to the largest
      // confidence magnitude gets the same limit.
      conf_rel = std::max(conf_rel, std::fabs(double(mc_conf[(st + 1) * K + k]) - gc_conf[st * K + k]) / conf_scale);
    }
  d.mean_rel /= std::max<int64_t>(compared, 1);
  std::printf("[golden %s] draft: %lld of %lld rows compared (same tokens before them), max abs %.4g, max rel %.4g, "
              "mean rel %.4g, top-1 disagreements %lld (limit %lld); confidence max abs / max |conf| %.4g\n",
              gc.name, static_cast<long long>(compared), static_cast<long long>(steps * K), d.max_abs, d.max_rel,
              d.mean_rel, static_cast<long long>(d_disagree),
              static_cast<long long>(disagree_limit(lim.disagree_rate, compared)), conf_rel);
  EXPECT_GE(compared, steps) << "every step's first position is conditioned on the same tokens";
  EXPECT_LE(d.max_rel, lim.max_rel);
  EXPECT_LE(conf_rel, lim.max_rel);
  EXPECT_LE(d_disagree, disagree_limit(lim.disagree_rate, compared));
  fs::remove_all(tmp);
}

TEST(ModelGolden, DefaultPresetSeed1Prompt300) {
  // First compressed entries visible at row 3; the first rounding flip at row 15.
  run_case({"default-s1", 15});
}

TEST(ModelGolden, BuiltinTrainedModel) {
  // A trained model amplifies rounding flips more: the first one at row 7 (AVX-512); changing only the
  // GEMM ISA moved it between 4 and 7, hence 4.
  run_case({"builtin", 4});
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
