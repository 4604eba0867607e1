// What a measurement records about where it ran: date, commit (with a mark when the tree had
// uncommitted changes), CPU, cores and load. The benchmarks' result files (bench/bench_results.h)
// and the serving benchmark client (`tandem bench`) write the same fields.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tandem {

// First line of a shell command's output, trailing whitespace removed ("" when it fails).
std::string shell_line(const std::string& cmd);
// Today's date in UTC, "YYYY-MM-DD".
std::string today_utc();
// date, commit (TANDEM_COMMIT when set: a tree exported without .git; else the git commit of
// source_dir, "+uncommitted" when src/ or bench/ differ from it), cpu, cpu_cores, loadavg (the
// build machine is shared: how busy it was explains slow runs).
nlohmann::json run_info(const std::string& source_dir);

}  // namespace tandem
