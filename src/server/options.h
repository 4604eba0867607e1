// The command-line options of `tandem serve`, `run` and `logits`: one declarative table (flag, env
// name, type, default, help, validator, commands) that parses argv (and the environment) into
// ServeOptions. Flag names follow vLLM's so existing deployment profiles carry over; an invalid
// value or a flag the command does not take fails at start-up with a message naming the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "text/json_schema_grammar.h"

namespace tandem::server {

// `tandem run`: one prompt streamed to the terminal.
struct RunOptions {
  std::string prompt;                         // --prompt (required)
  bool chat = false;
  int max_tokens = 128;
  double temperature = 1.0, top_p = 1.0;
  bool verbose = false;
};

// `tandem logits`: every position's logits of fixed token ids (docs/LOGITS.md).
struct LogitsOptions {
  std::string tokens_file, out;               // both required
  bool every_rank = false;                    // tensor parallelism: rank R > 0 writes OUT.rankR too
};

struct ServeOptions {
  std::string model;                          // --model DIR (default: the built-in model)
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
  double request_timeout_s = 0.0;             // --request-timeout: default per-request deadline (0 = none)
  json_grammar::JsonWhitespace json_whitespace = json_grammar::JsonWhitespace::kFormatted;
  EngineConfig engine;
  RunOptions run;
  LogitsOptions logits;
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
// Which commands take an option (a bit set).
enum Command : unsigned { kServe = 1, kRun = 2, kLogits = 4 };

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
  unsigned commands = kServe;           // Command bits
};

// Every option of every command (filter by OptionSpec::commands).
const std::vector<OptionSpec>& option_table();

// The built-in model's directory: models/builtin (made by `make builtin-model`) when it exists,
// else the source tree's data/builtin. Used when --model is not given.
std::string builtin_model_dir();

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// args excludes the program name. Returns an error naming the flag for unknown flags (or flags the
// command does not take), missing or invalid values; "--help" yields kCancelled (the caller prints
// command_help()).
Result<ServeOptions> parse_options(Command command, const std::vector<std::string>& args, const EnvLookup& env);
Result<ServeOptions> parse_serve_options(const std::vector<std::string>& args, const EnvLookup& env);
std::string command_help(Command command);
std::string serve_help();
// The process environment (std::getenv), for the commands.
std::optional<std::string> process_env(const std::string& name);

// "16G", "512MiB", "1000000" -> bytes.
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace tandem::server
