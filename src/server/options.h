// `tandem serve` options: one declarative table (flag, env name, type, default, help, validator)
// that parses argv (and the environment) into ServeOptions. Flag names follow vLLM's so existing
// deployment profiles carry over; an invalid value fails at start-up with a message naming the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/engine.h"

namespace tandem::server {

struct ServeOptions {
  std::string model;                          // --model DIR (required)
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;  // empty = basename of --model
  std::string api_key;                        // "" = no auth
  std::string generation_config = "auto";     // "auto" (model dir) | "vllm" (built-in) | DIR
  int http_threads = 256;                     // connection threads (each stream holds one)
  int64_t max_body_bytes = 32 << 20;          // 413 above this
  int max_pending_requests = 1024;            // server-side cap on in-flight requests -> 429
  double shutdown_timeout_s = 30.0;           // SIGTERM drain deadline
  std::string profile;                        // "" | "production" | "1m" (serve_profiles())
  bool allow_experimental_profile = false;    // flags may contradict the profile
  std::string audit_manifest;                 // runtime contract to enforce at start-up ("" = none)
  EngineConfig engine;
};

// A qualified deployment profile of the seeds: flag values applied before the user's flags; a user
// flag that contradicts one is an error unless --allow-experimental-profile is given.
struct ServeProfile {
  const char* name;
  const char* description;
  std::vector<std::pair<const char*, const char*>> settings;  // {flag, value}
};
const std::vector<ServeProfile>& serve_profiles();

// The options as JSON (engine settings in canonical form: KV dtype aliases resolved, speculative
// method and K only); two option sets that run the same way give the same JSON.
nlohmann::json options_fingerprint(const ServeOptions& o);

enum class OptionType { kString, kInt, kDouble, kBool, kStringList, kBytes };

struct OptionSpec {
  const char* flag;        // "--max-num-seqs"
  const char* env;         // environment variable consulted when the flag is absent ("" = none)
  OptionType type;
  const char* default_text;  // for --help only; the default itself lives in ServeOptions
  const char* help;
  // Parses + validates one value and stores it; the error names nothing, the caller adds the flag.
  std::function<Status(ServeOptions&, const std::string& value)> apply;
  const char* negative_flag = nullptr;  // bool flags: "--no-enable-prefix-caching"
};

const std::vector<OptionSpec>& serve_option_table();

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// args excludes the program name. Returns an error naming the flag for unknown flags, missing or
// invalid values; "--help" yields kCancelled (the caller prints serve_help()).
Result<ServeOptions> parse_serve_options(const std::vector<std::string>& args, const EnvLookup& env);
std::string serve_help();

// "16G", "512MiB", "1000000" -> bytes.
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace tandem::server
