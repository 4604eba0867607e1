// Layering: every src/<component> includes only the components below it (docs/ARCHITECTURE.md:
// cli -> server -> engine -> model -> kernels -> common, with io and text beside model). A header
// that reaches upward (the grammar including engine/engine.h) fails here, naming file and include.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::map<std::string, std::set<std::string>> kAllowed = {
    {"common", {"common"}},
    {"io", {"common", "io"}},
    {"text", {"common", "text"}},
    {"kernels", {"common", "kernels"}},
    {"model", {"common", "io", "text", "kernels", "model"}},
    {"engine", {"common", "io", "text", "kernels", "model", "engine"}},
    {"server", {"common", "io", "text", "kernels", "model", "engine", "server"}},
};

TEST(Layering, IncludesFlowDownward) {
  const fs::path src = fs::path(TANDEM_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(src));
  const std::regex inc(R"re(^\s*#\s*include\s+"([a-z_]+)/)re");
  int checked = 0;
  for (const auto& [component, allowed] : kAllowed) {
    for (const auto& e : fs::recursive_directory_iterator(src / component)) {
      if (!e.is_regular_file()) continue;
      std::ifstream f(e.path());
      std::string line;
      int n = 0;
      while (std::getline(f, line)) {
        ++n;
        std::smatch m;
        if (!std::regex_search(line, m, inc)) continue;
        ++checked;
        EXPECT_TRUE(allowed.count(m[1].str()))
            << e.path().lexically_relative(src).string() << ":" << n << " (" << component << ") includes "
            << m[1].str() << "/: " << line;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
