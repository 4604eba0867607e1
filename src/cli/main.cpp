// Entry point of `tandem`: dispatches to the registered subcommands (serve, run, check, ...).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/command.h"

namespace tandem::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}
}  // namespace tandem::cli

namespace {
void print_usage() {
  auto cmds = tandem::cli::command_registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::printf("usage: tandem <command> [options]   (tandem <command> --help for details)\n\ncommands:\n");
  for (const auto& c : cmds) std::printf("  %-12s %s\n", c.name.c_str(), c.summary.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : tandem::cli::command_registry()) {
    if (c.name == argv[1]) {
      std::string name = std::string("tandem ") + argv[1];
      argv[1] = name.data();
      return c.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
  print_usage();
  return 2;
}
