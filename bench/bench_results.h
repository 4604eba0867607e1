// Shared by the benchmarks: what every result file records (date, commit, CPU, cores, load) and
// where it goes (bench/results/<name>-<date><suffix>.json).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::bench {

// First line of a shell command's output, trailing whitespace removed ("" when it fails).
inline std::string shell_line(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[512];
    if (fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

inline std::string today_utc() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return date;
}

// date, commit (TANDEM_COMMIT when set: a tree exported without .git), cpu, cpu_cores, loadavg (the
// build machine is shared: how busy it was explains slow runs).
inline nlohmann::json run_info() {
  nlohmann::json j;
  j["date"] = today_utc();
  const char* commit = std::getenv("TANDEM_COMMIT");
  // A run from a tree with uncommitted changes says so: its figures belong to no commit.
  j["commit"] = commit && *commit
                    ? std::string(commit)
                    : shell_line("git -C " TANDEM_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null") +
                          shell_line("git -C " TANDEM_SOURCE_DIR " diff --quiet HEAD -- src bench 2>/dev/null || "
                                     "echo +uncommitted");
  j["cpu"] = shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
  j["cpu_cores"] = shell_line("nproc");
  j["loadavg"] = shell_line("cut -d' ' -f1-3 /proc/loadavg");
  return j;
}

inline std::string result_path(const std::string& name, const std::string& suffix = "") {
  return std::string(TANDEM_SOURCE_DIR) + "/bench/results/" + name + "-" + today_utc() + suffix + ".json";
}

inline void write_result(const nlohmann::json& j, const std::string& path) {
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace tandem::bench
