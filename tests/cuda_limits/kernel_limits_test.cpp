// The compiled kernels against the GB10 (sm_121) and RTX 50 (sm_120) limits, without a GPU: reads
// the sm_120/sm_121 cubins out of this build (the tandem binary and every static library next to
// it), adds the most dynamic shared memory each launcher asks for at the largest supported shape
// (kernels::cuda::dynamic_smem_bounds, cuda_model::dynamic_smem_bounds over the full-size configs)
// and applies the rules of limits.h. Runs in `make test` (ctest); a build without sm_120/sm_121
// code (-DTANDEM_CUDA_ARCH=90a) skips it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "cuda_limits/cubin.h"
#include "cuda_limits/limits.h"
#include "io/model_config.h"
#include "kernels/cuda/smem_bounds.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cubin {
namespace {

namespace fs = std::filesystem;

std::vector<int> built_sms() {
  std::vector<int> out;
  std::stringstream ss(TANDEM_CUDA_ARCHS);  // "90a,100a,120,121"
  for (std::string a; std::getline(ss, a, ',');) out.push_back(std::atoi(a.c_str()));
  return out;
}

// Every bound, the model's at the largest of the full-size configs (the checked-in official ones).
std::vector<kernels::cuda::SmemBound> all_bounds() {
  std::vector<kernels::cuda::SmemBound> out = kernels::cuda::dynamic_smem_bounds();
  std::map<std::string, kernels::cuda::SmemBound> model;
  for (const char* name : {"deepseek-v4-flash-0731.config.json", "deepseek-v4-flash-preview.config.json"}) {
    auto cfg = load_model_config(std::string(TANDEM_SOURCE_DIR) + "/tests/io/data/" + name);
    EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
    if (!cfg.ok()) continue;
    for (auto& b : cuda_model::dynamic_smem_bounds(*cfg)) {
      b.shape = std::string(name).substr(0, std::string(name).find(".config")) + ": " + b.shape;
      auto it = model.find(b.kernel);
      if (it == model.end() || b.bytes > it->second.bytes) model[b.kernel] = b;
    }
  }
  for (auto& [k, b] : model) out.push_back(b);
  return out;
}

// "name<args>" of a mangled kernel (the name alone when it is no template).
std::string label(const std::string& mangled) {
  const std::string name = function_name(mangled), d = demangle(mangled);
  size_t at = d.find("::" + name + "<");
  if (at == std::string::npos) return name;
  at += 2;
  int depth = 0;
  for (size_t i = at + name.size(); i < d.size(); ++i) {
    if (d[i] == '<') ++depth;
    if (d[i] == '>' && --depth == 0) return d.substr(at, i + 1 - at);
  }
  return name;
}

TEST(KernelLimits, Sm12xSharedMemoryAndTargets) {
  std::vector<int> check;
  for (int sm : built_sms())
    if (sm == 120 || sm == 121) check.push_back(sm);
  if (check.empty())
    GTEST_SKIP() << "this build has no sm_120/sm_121 code (TANDEM_CUDA_ARCH=" << TANDEM_CUDA_ARCHS
                 << "); the default build (all) checks it";

  // The shipped binary and every static library of the build (kernels a binary does not link are
  // checked too).
  const fs::path binary = TANDEM_BINARY;
  std::vector<std::string> files = {binary.string()};
  for (const auto& e : fs::directory_iterator(binary.parent_path()))
    if (e.path().extension() == ".a") files.push_back(e.path().string());
  std::sort(files.begin() + 1, files.end());
  FatbinScan scan;
  for (const auto& f : files) {
    Status st = scan_file(f, scan);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  std::map<int, std::set<std::string>> kernels;
  for (const Cubin& c : scan.cubins)
    for (const Kernel& k : c.kernels) kernels[c.fatbin_sm].insert(k.name);
  for (int sm : check)
    ASSERT_GT(kernels[sm].size(), 10u) << "found only " << kernels[sm].size() << " sm_" << sm << " kernels in "
                                       << files.size() << " files (" << scan.with_fatbin << " of " << scan.host_elfs
                                       << " ELF objects with a fatbin): the reader is broken or the build lacks them";

  const auto bounds = all_bounds();
  const LimitsReport rep = check_limits(scan.cubins, bounds, check);

  // Every kernel whose source declares dynamic shared memory reports its launcher's bound.
  std::vector<std::string> failures = rep.failures;
  for (const SourceKernel& k : kernels_with_dynamic_smem(std::string(TANDEM_SOURCE_DIR) + "/src")) {
    const bool has =
        std::any_of(bounds.begin(), bounds.end(), [&](const auto& b) { return bound_base(b.kernel) == k.kernel; });
    if (!has)
      failures.push_back(fmt::format("{} ({}) takes dynamic shared memory but reports no bound: add its launcher's "
                                     "largest request to kernels::cuda::dynamic_smem_bounds() or "
                                     "cuda_model::dynamic_smem_bounds()",
                                     k.kernel, k.where));
  }

  // The table, largest first, so a passing run shows the margins too.
  std::vector<KernelRow> rows = rep.rows;
  std::sort(rows.begin(), rows.end(), [](const KernelRow& a, const KernelRow& b) {
    return a.total() != b.total() ? a.total() > b.total() : a.sm < b.sm;
  });
  std::string table = fmt::format("{:<6} {:>8} {:>8} {:>8} {:>8}  kernel\n", "target", "static", "dynamic", "total",
                                  "limit");
  int small = 0;
  std::string gated;
  for (const KernelRow& r : rows) {
    if (!r.not_launched.empty()) {
      gated += fmt::format("sm_{:<3} {}: {}\n", r.sm, label(r.kernel), r.not_launched);
      continue;
    }
    if (r.total() < 4096) {
      ++small;
      continue;
    }
    table += fmt::format("sm_{:<3} {:>8} {:>8} {:>8} {:>8}  {}{}\n", r.sm, r.static_smem, r.dynamic_smem, r.total(),
                         r.limit, label(r.kernel), r.bound.empty() ? "" : "  (" + r.bound + ")");
  }
  std::cout << "shared memory per block (bytes), largest first:\n"
            << table << "(" << small << " more under 4 KiB)\n"
            << "not launched on these targets (their launchers are gated):\n"
            << (gated.empty() ? "(none)\n" : gated)
            << scan.cubins.size() << " cubins in " << files.size() << " files; " << rows.size()
            << " (target, kernel) pairs checked against the sm_120/sm_121 limits\n";

  std::string msg;
  for (const auto& f : failures) msg += "  " + f + "\n";
  EXPECT_TRUE(failures.empty()) << failures.size() << " kernel(s) outside the sm_120/sm_121 limits:\n" << msg;
}

// ---- the rules on made-up cubins: each must be able to fail ----

Cubin made_up(int sm, std::vector<Kernel> ks) {
  Cubin c;
  c.origin = fmt::format("made-up sm_{}", sm);
  c.fatbin_sm = c.elf_sm = sm;
  c.ptxas_arch = fmt::format("sm_{}", sm);
  c.kernels = std::move(ks);
  return c;
}
Kernel k(const std::string& name, int64_t static_smem, int64_t code = 1024) {
  Kernel x;
  x.name = name;
  x.static_smem = static_smem;
  x.code_bytes = code;
  return x;
}

TEST(KernelLimits, RulesCatchEachFault) {
  const std::string attn = "_ZN6tandem10cuda_model12_GLOBAL__N_116attention_kernelENS0_8AttnArgsE";
  const std::string draft = "_ZN6tandem10cuda_model12_GLOBAL__N_122draft_attention_kernelENS0_13DraftAttnArgsE";
  std::vector<kernels::cuda::SmemBound> bounds = {{"attention_kernel", 100000, "shape", ""}};

  // Within the limit: static 1,376 + dynamic 100,000 = 101,376 = 99 KB exactly.
  auto ok = check_limits({made_up(121, {k(attn, 1376), k(draft, 0)})}, bounds, {121});
  EXPECT_TRUE(ok.failures.empty()) << ok.failures.front();
  ASSERT_EQ(ok.rows.size(), 2u);
  // "16attention_kernel" must not match inside "22draft_attention_kernel".
  for (const auto& r : ok.rows) EXPECT_EQ(r.dynamic_smem, r.kernel == attn ? 100000 : 0) << r.kernel;

  // One byte over, by the static part.
  auto over = check_limits({made_up(121, {k(attn, 1377)})}, bounds, {121});
  ASSERT_EQ(over.failures.size(), 1u);
  EXPECT_NE(over.failures[0].find("101377 B > 101376 B (99 KB)"), std::string::npos) << over.failures[0];
  // The same kernel fits sm_90's 227 KB.
  EXPECT_TRUE(check_limits({made_up(90, {k(attn, 1377)})}, bounds, {90}).failures.empty());

  // A bound that names no kernel.
  auto stale = check_limits({made_up(121, {k(draft, 0)})}, bounds, {121});
  ASSERT_EQ(stale.failures.size(), 1u);
  EXPECT_NE(stale.failures[0].find("matches no kernel"), std::string::npos);

  // A cubin ptxas compiled for another target than its entry claims.
  Cubin wrong = made_up(121, {k(attn, 0)});
  wrong.ptxas_arch = "sm_90a";
  auto w = check_limits({wrong}, bounds, {121});
  ASSERT_EQ(w.failures.size(), 1u);
  EXPECT_NE(w.failures[0].find("compiled by ptxas for 'sm_90a'"), std::string::npos) << w.failures[0];
  Cubin fam = made_up(121, {k(attn, 0)});
  fam.ptxas_arch = "sm_121a";
  EXPECT_TRUE(check_limits({fam}, bounds, {121}).failures.empty());

  // A body only on sm_90a (an architecture guard without a portable path).
  auto empty = check_limits({made_up(90, {k(attn, 0, 4096)}), made_up(121, {k(attn, 0, 256)})}, bounds, {121});
  ASSERT_EQ(empty.failures.size(), 1u);
  EXPECT_NE(empty.failures[0].find("architecture guard without a portable path"), std::string::npos);
}

TEST(KernelLimits, GatedLaunchesAndInstantiations) {
  // void ns::dense_kernel<false, 4, false>(Args) and <true, 4, false>, <false, 2, false>
  const std::string d2 = "_ZN2ns12dense_kernelILb0ELi2ELb0EEEvNS_4ArgsE";
  const std::string d4 = "_ZN2ns12dense_kernelILb0ELi4ELb0EEEvNS_4ArgsE";
  const std::string w4 = "_ZN2ns12dense_kernelILb1ELi4ELb0EEEvNS_4ArgsE";
  ASSERT_TRUE(bound_matches(d4, "dense_kernel<false, 4, false>"));
  ASSERT_FALSE(bound_matches(d4, "dense_kernel<false, 2, false>"));
  ASSERT_TRUE(bound_matches(d4, "dense_kernel"));
  std::vector<kernels::cuda::SmemBound> bounds = {
      {"dense_kernel<false, 2, false>", 67584, "2 stages", ""},
      {"dense_kernel<false, 4, false>", 134144, "4 stages", "", 134144},
      {"dense_kernel<true, 4, false>", 134144, "4 stages (wgmma)", "", 134144, {90}}};
  // The 4-stage launches exceed 99 KB but are never made on sm_121; the wgmma one may be trap-only there.
  auto ok = check_limits({made_up(90, {k(d2, 0), k(d4, 0), k(w4, 0, 8192)}),
                          made_up(121, {k(d2, 0), k(d4, 0), k(w4, 0, 256)})},
                         bounds, {121});
  EXPECT_TRUE(ok.failures.empty()) << ok.failures.front();
  int gated = 0;
  for (const auto& r : ok.rows) gated += !r.not_launched.empty();
  EXPECT_EQ(gated, 2);
  // On sm_90 (227 KB) the same launches are made and checked.
  auto on90 = check_limits({made_up(90, {k(d2, 0), k(d4, 100000), k(w4, 0)})}, bounds, {90});
  ASSERT_EQ(on90.failures.size(), 1u);
  EXPECT_NE(on90.failures[0].find("234144 B > 232448 B"), std::string::npos) << on90.failures[0];
  // Without the gate the 4-stage launch fails sm_121.
  bounds[1].needs_optin = 0;
  auto over = check_limits({made_up(121, {k(d2, 0), k(d4, 0), k(w4, 0)})}, bounds, {121});
  ASSERT_EQ(over.failures.size(), 1u);
  EXPECT_NE(over.failures[0].find("134144 B > 101376 B"), std::string::npos) << over.failures[0];
  // An instantiation without its own bound, where its siblings have one, fails.
  const std::string d8 = "_ZN2ns12dense_kernelILb0ELi8ELb0EEEvNS_4ArgsE";
  bounds[1].needs_optin = 134144;
  auto missing = check_limits({made_up(121, {k(d2, 0), k(d4, 0), k(w4, 0), k(d8, 0)})}, bounds, {121});
  ASSERT_EQ(missing.failures.size(), 1u);
  EXPECT_NE(missing.failures[0].find("an instantiation without a dynamic shared memory bound"), std::string::npos)
      << missing.failures[0];
}

TEST(KernelLimits, SourceScanFindsDynamicSharedMemoryKernels) {
  const std::string text =
      "// extern __shared__ in a comment does not count\n"
      "__global__ void __launch_bounds__(kThreads) first_kernel(Args a) {\n"
      "  extern __shared__ float smem[];\n"
      "}\n"
      "template <int N>\n"
      "__global__ void second_kernel(const float* x,\n"
      "                              int n) {\n"
      "  extern __shared__ unsigned char raw[];\n"
      "}\n"
      "__device__ float helper() { extern __shared__ float s[]; return s[0]; }\n"
      "__global__ void __cluster_dims__(8, 1, 1) __maxnreg__(kRegs)\n"
      "    third_kernel(int n) {\n"
      "  extern __shared__ float4 z[];\n"
      "}\n";
  const auto found = kernels_with_dynamic_smem_in(text, "x.cu");
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[3].kernel, "third_kernel");
  EXPECT_EQ(found[3].where, "x.cu:13");
  EXPECT_EQ(found[0].kernel, "first_kernel");
  EXPECT_EQ(found[0].where, "x.cu:3");
  EXPECT_EQ(found[1].kernel, "second_kernel");
  EXPECT_EQ(found[1].where, "x.cu:8");
  EXPECT_EQ(found[2].kernel, "(not directly in a __global__ function)");

  // The project's own: the attention kernels are among them.
  const auto ours = kernels_with_dynamic_smem(std::string(TANDEM_SOURCE_DIR) + "/src");
  EXPECT_TRUE(std::any_of(ours.begin(), ours.end(), [](const auto& s) { return s.kernel == "mqa_kernel"; }));
  EXPECT_TRUE(
      std::any_of(ours.begin(), ours.end(), [](const auto& s) { return s.kernel == "draft_attention_kernel"; }));
}

TEST(KernelLimits, MangledNameMatching) {
  EXPECT_TRUE(mangled_names("_ZN6tandem10cuda_model12_GLOBAL__N_116attention_kernelENS0_8AttnArgsE",
                            "attention_kernel"));
  EXPECT_FALSE(mangled_names("_ZN6tandem10cuda_model12_GLOBAL__N_122draft_attention_kernelENS0_13DraftAttnArgsE",
                             "attention_kernel"));
  EXPECT_TRUE(mangled_names("_Z11gemm_kernelILi1ELi4EEvPf", "gemm_kernel"));
  EXPECT_FALSE(mangled_names("_Z12gemm_kernelXILi1EEvPf", "gemm_kernel"));
  // An anonymous namespace's hash can end in a digit right before the name's length.
  EXPECT_EQ(function_name("_ZN6tandem7kernels4cuda41_GLOBAL__N__b47949ba_9_hc_pre_cu_acc111c113hc_pre_finishENS0_"
                          "11HcPreParamsEPKfi"),
            "hc_pre_finish");
  EXPECT_EQ(function_name("_ZN6tandem7kernels4cuda39_GLOBAL__N__03cf61b4_7_gemm_cu_5af3332e11gemm_kernelILNS0_"
                          "12WeightFormatE2ELi4ELi8ELi4EEEvNS2_8GemmArgsE"),
            "gemm_kernel");
  EXPECT_EQ(function_name("kernel_with_c_linkage"), "kernel_with_c_linkage");
}

}  // namespace
}  // namespace tandem::cubin
