// parse_serve_options over an argument list and a fake environment (the option and profile tests).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/options.h"

namespace tandem::server::testing {

inline Result<ServeOptions> parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  return parse_serve_options(args, [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

}  // namespace tandem::server::testing
