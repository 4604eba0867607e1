// run_info.h: the facts of the machine and tree a measurement ran on.
#include "common/run_info.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace tandem {

std::string shell_line(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[512];
    if (fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string today_utc() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return date;
}

nlohmann::json run_info(const std::string& source_dir) {
  nlohmann::json j;
  j["date"] = today_utc();
  const char* commit = std::getenv("TANDEM_COMMIT");
  // A run from a tree with uncommitted changes says so: its figures belong to no commit.
  j["commit"] = commit && *commit ? std::string(commit)
                                  : shell_line("git -C " + source_dir + " rev-parse --short HEAD 2>/dev/null") +
                                        shell_line("git -C " + source_dir +
                                                   " diff --quiet HEAD -- src bench 2>/dev/null || echo +uncommitted");
  j["cpu"] = shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
  j["cpu_cores"] = shell_line("nproc");
  j["loadavg"] = shell_line("cut -d' ' -f1-3 /proc/loadavg");
  return j;
}

}  // namespace tandem
