// OpenAI-style error objects: every failure a request can cause becomes one of these, with the
// HTTP status the OpenAI API uses for it, and is serialized as {"error": {...}}.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/status.h"

namespace tandem::server {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";  // invalid_request_error | authentication_error | ...
  std::string message;
  std::string param;  // offending field, "" = null
  std::string code;   // "" = null
  int retry_after_s = 0;  // > 0: sent as Retry-After (429, 503)
};

ApiError bad_request(std::string message, std::string param = "");
ApiError not_found_error(std::string message, std::string param = "");
// Maps an engine/encoder Status to the closest OpenAI error (kResourceExhausted -> 429, ...).
ApiError error_from_status(const Status& status);

nlohmann::json api_error_json(const ApiError& e);
std::string api_error_body(const ApiError& e);

// nlohmann's dump() throws on invalid UTF-8; model text can be anything, so every serialization in
// the server goes through this (invalid bytes become U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace tandem::server
