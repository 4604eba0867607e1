// `tandem version`: prints the build's version string.
#include <cstdio>

#include "cli/command.h"
#include "common/version.h"

namespace {
int run_version(int, char**) {
  std::printf("tandem %s\n", tandem::version_string());
  return 0;
}
}  // namespace

TANDEM_REGISTER_COMMAND(version, "version", "print the version", run_version);
