// Subcommand registry for the one `tandem` binary. Each src/cli/<name>.cpp defines one subcommand
// and registers it with TANDEM_REGISTER_COMMAND; main.cpp dispatches on argv[1].
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tandem::cli {

struct Command {
  std::string name;
  std::string summary;
  // argv[0] is "tandem <name>"; returns the process exit code.
  std::function<int(int argc, char** argv)> run;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { command_registry().push_back(std::move(c)); }
};

}  // namespace tandem::cli

#define TANDEM_REGISTER_COMMAND(ident, name, summary, fn) \
  static ::tandem::cli::CommandRegistrar ident##_registrar({name, summary, fn})
