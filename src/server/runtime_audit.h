// The runtime contract as JSON (`tandem audit`, and `tandem serve` at start-up): build facts, what
// the CUDA runtime sees, each rank's device and kernel path per op class, checkpoint revision and
// shard digest, KV dtype, speculative method and K, graph capture sizes, the effective options.
// Fail-closed: any problem (an op class without a kernel, an emulated or fallback path) or any
// mismatch with a manifest is an error; nothing is quietly substituted.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "server/options.h"

namespace tandem::server {

// `info` may be null (no model loaded: build and CUDA facts only).
nlohmann::json build_runtime_audit(const ServeOptions& options, const ModelInfo* info);

// Problems the audit found on its own (no manifest needed): missing or non-native kernel paths.
std::vector<std::string> audit_problems(const nlohmann::json& audit);

// Reads a manifest: a JSON object whose every leaf (nested objects are paths; arrays compare whole)
// must equal the audit's value at the same path. Unreadable, malformed or empty is an error.
Result<nlohmann::json> load_audit_manifest(const std::string& path);

// One line per mismatch: "kv_cache_dtype: manifest \"nvfp4\", runtime \"fp8\"" (absent paths too).
std::vector<std::string> compare_audit(const nlohmann::json& audit, const nlohmann::json& manifest);

// Adds "problems", "mismatches" and "pass" to the audit; returns pass.
bool finish_audit(nlohmann::json& audit, const nlohmann::json* manifest);

}  // namespace tandem::server
