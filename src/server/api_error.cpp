// OpenAI error objects and the Status -> HTTP mapping.
#include "server/api_error.h"

namespace tandem::server {

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError not_found_error(std::string message, std::string param) {
  ApiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.code = "model_not_found";
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError error_from_status(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      e.http_status = 400;
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.retry_after_s = 1;
      break;
    case StatusCode::kPermissionDenied:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.retry_after_s = 5;
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 400;
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
      break;
  }
  return e;
}

nlohmann::json api_error_json(const ApiError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return nlohmann::json{{"error", err}};
}

std::string api_error_body(const ApiError& e) { return dump_json(api_error_json(e)); }

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tandem::server
