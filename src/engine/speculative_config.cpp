// The one parser of vLLM's --speculative-config JSON, used by every command through the option
// table (src/server/options.cpp). Unknown keys are errors; K (num_speculative_tokens) is stored
// once here and reaches the planner and the draft through EngineConfig; verify_mode and
// draft_sample_method become enums here (nothing compares their strings later).
#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace tandem {

Result<SpeculativeConfig> parse_speculative_config(const std::string& json_text) {
  SpeculativeConfig c;
  if (json_text.empty()) return c;
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("--speculative-config: not a JSON object: {}", json_text);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "method") {
      if (!v.is_string()) return invalid_argument("--speculative-config: method must be a string");
      c.method = v.get<std::string>();
      if (c.method == "mtp") c.method = "dspark";  // the checkpoint's drafter, whatever vLLM calls it
      if (c.method != "dspark" && !c.method.empty())
        return invalid_argument("--speculative-config: method '{}' is not supported (only \"dspark\")", c.method);
    } else if (k == "num_speculative_tokens") {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 16)
        return invalid_argument("--speculative-config: num_speculative_tokens must be an integer in [1, 16]");
      c.num_speculative_tokens = v.get<int>();
    } else if (k == "verify_mode") {
      if (!v.is_string()) return invalid_argument("--speculative-config: verify_mode must be a string");
      auto mode = parse_verify_mode(v.get<std::string>());
      if (!mode.ok()) return mode.status().with_context("--speculative-config");
      c.verify_mode = *mode;
    } else if (k == "confidence_threshold" || k == "dspark_confidence_threshold") {
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
        return invalid_argument("--speculative-config: {} must be a number in [0, 1]", k);
      c.confidence_threshold = v.get<double>();
      if (k == "dspark_confidence_threshold" && !j.contains("verify_mode")) c.verify_mode = VerifyMode::kThreshold;
    } else if (k == "enable_adaptive_verification") {
      if (!v.is_boolean()) return invalid_argument("--speculative-config: {} must be true or false", k);
      if (v.get<bool>()) c.verify_mode = VerifyMode::kAuto;
      else if (!j.contains("verify_mode")) c.verify_mode = VerifyMode::kFixed;
    } else if (k == "draft_sample_method") {
      if (!v.is_string()) return invalid_argument("--speculative-config: draft_sample_method must be a string");
      const std::string m = v.get<std::string>();
      if (m == "greedy") c.draft_sample_method = DraftSampleMethod::kGreedy;
      else if (m == "sample" || m == "probabilistic") c.draft_sample_method = DraftSampleMethod::kSample;
      else return invalid_argument("--speculative-config: draft_sample_method '{}' is not greedy or sample", m);
    } else if (k == "model" || k == "draft_tensor_parallel_size") {
      // vLLM fields that carry no meaning here (the draft lives in the checkpoint).
    } else {
      return invalid_argument("--speculative-config: unknown key '{}'", k);
    }
  }
  if (c.method.empty() && j.size() > 0 && !j.contains("method"))
    return invalid_argument("--speculative-config: \"method\" is required (\"dspark\")");
  return c;
}

Result<VerifyMode> parse_verify_mode(const std::string& name) {
  if (name == "fixed") return VerifyMode::kFixed;
  if (name == "threshold") return VerifyMode::kThreshold;
  if (name == "auto") return VerifyMode::kAuto;
  return invalid_argument("verify_mode '{}' is not fixed, threshold or auto", name);
}

const char* verify_mode_name(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kFixed: return "fixed";
    case VerifyMode::kThreshold: return "threshold";
    case VerifyMode::kAuto: return "auto";
  }
  return "?";
}

const char* draft_sample_method_name(DraftSampleMethod method) {
  return method == DraftSampleMethod::kSample ? "sample" : "greedy";
}

}  // namespace tandem
