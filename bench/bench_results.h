// Shared by the benchmarks: what every result file records (date, commit, CPU, cores, load) and
// where it goes (bench/results/<name>-<date><suffix>.json).
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_info.h"

namespace tandem::bench {

using tandem::shell_line;
using tandem::today_utc;
// date, commit, cpu, cpu_cores, loadavg of this run (common/run_info.h).
inline nlohmann::json run_info() { return tandem::run_info(TANDEM_SOURCE_DIR); }

inline std::string result_path(const std::string& name, const std::string& suffix = "") {
  return std::string(TANDEM_SOURCE_DIR) + "/bench/results/" + name + "-" + today_utc() + suffix + ".json";
}

inline void write_result(const nlohmann::json& j, const std::string& path) {
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace tandem::bench
