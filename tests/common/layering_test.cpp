// Layering: every folder of src/ includes only the components below it (docs/ARCHITECTURE.md:
// cli -> server -> engine -> model -> kernels -> common, with io and text beside model; loadgen,
// the `tandem bench` client, sees nothing of the engine), and the benchmarks (bench/) and fuzzers
// (fuzz/) see src/ through the same component names. The engine's headers name no backend
// (kernels/cpu, kernels/cuda, model/cuda): those stay behind the runner's .cpp files. No include
// climbs out of its folder with "../". A new src/ folder needs a rule here; a header that reaches
// upward fails, naming file, line and include.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::set<std::string> kEverySrc = {"common", "io", "text", "kernels", "model", "engine", "server", "loadgen", "cli"};

// Folder (relative to the source root) -> the components its files may include.
const std::map<std::string, std::set<std::string>> kAllowed = {
    {"src/common", {"common"}},
    {"src/io", {"common", "io"}},
    {"src/text", {"common", "text"}},
    {"src/kernels", {"common", "kernels"}},
    {"src/model", {"common", "io", "text", "kernels", "model"}},
    {"src/engine", {"common", "io", "text", "kernels", "model", "engine"}},
    {"src/server", {"common", "io", "text", "kernels", "model", "engine", "server"}},
    {"src/loadgen", {"common", "loadgen"}},
    {"src/cli", kEverySrc},
    {"bench", [] {
       auto s = kEverySrc;
       s.erase("cli");
       s.insert("bench");  // bench/bench_results.h
       return s;
     }()},
    {"fuzz", [] {
       auto s = kEverySrc;
       s.erase("cli");
       return s;
     }()},
};

// Backend folders: only the backends themselves, the model, and .cpp files elsewhere include them.
const std::set<std::string> kBackends = {"kernels/cpu/", "kernels/cuda/", "model/cuda/"};

bool source_file(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".h" || e == ".cpp" || e == ".cu" || e == ".cuh";
}

TEST(Layering, EverySrcFolderHasARule) {
  const fs::path root(TANDEM_SOURCE_DIR);
  for (const auto& e : fs::directory_iterator(root / "src")) {
    if (!e.is_directory()) continue;
    EXPECT_TRUE(kAllowed.count("src/" + e.path().filename().string()))
        << "src/" << e.path().filename().string() << " has no layering rule in tests/common/layering_test.cpp";
  }
}

TEST(Layering, IncludesFlowDownward) {
  const fs::path root(TANDEM_SOURCE_DIR);
  ASSERT_TRUE(fs::is_directory(root / "src"));
  const std::regex inc(R"re(^\s*#\s*include\s+"([^"]+)")re");
  int checked = 0;
  for (const auto& [folder, allowed] : kAllowed) {
    ASSERT_TRUE(fs::is_directory(root / folder)) << folder;
    for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
      if (!e.is_regular_file() || !source_file(e.path())) continue;
      const std::string file = e.path().lexically_relative(root).string();
      const bool header = e.path().extension() == ".h" || e.path().extension() == ".cuh";
      std::ifstream f(e.path());
      std::string line;
      int n = 0;
      while (std::getline(f, line)) {
        ++n;
        std::smatch m;
        if (!std::regex_search(line, m, inc)) continue;
        const std::string path = m[1].str();
        ++checked;
        EXPECT_EQ(path.find(".."), std::string::npos) << file << ":" << n << " climbs out of its folder: " << line;
        const size_t slash = path.find('/');
        if (slash == std::string::npos) continue;  // a file of its own folder ("cuda_test_util.h")
        const std::string component = path.substr(0, slash);
        EXPECT_TRUE(allowed.count(component)) << file << ":" << n << " (" << folder << ") includes " << component
                                              << "/: " << line;
        if (header && folder == "src/engine") {
          for (const std::string& b : kBackends) {
            EXPECT_NE(path.rfind(b, 0), 0u) << file << ":" << n << " (an engine header) names a backend: " << line;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 400);
}

}  // namespace
