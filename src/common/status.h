// Status and Result<T>: errors that input (requests, files, flags) can cause are values, never
// exceptions or aborts. Programmer invariants use TANDEM_CHECK (check.h) instead.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tandem {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad flag, bad request field, bad schema
  kNotFound,          // missing file, tensor, model
  kOutOfRange,        // context too long, index past end
  kDataLoss,          // corrupt or truncated file
  kFailedPrecondition,
  kResourceExhausted, // KV pool full, queue full
  kCancelled,
  kUnimplemented,
  kInternal,
  kUnavailable,       // draining, rank lost
  kPermissionDenied,  // bad API key
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // Adds context in front of the message: "loading shard 3: <message>".
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status data_loss(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tandem

// Propagate an error Status from an expression returning Status.
#define TANDEM_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::tandem::Status _st = (expr);                \
    if (!_st.ok()) return _st;                    \
  } while (0)

#define TANDEM_CONCAT_INNER(a, b) a##b
#define TANDEM_CONCAT(a, b) TANDEM_CONCAT_INNER(a, b)
// auto x = TANDEM_TRY(expr_returning_Result<T>);  (GCC/Clang statement expression)
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr)                              \
  auto TANDEM_CONCAT(_res_, __LINE__) = (expr);                         \
  if (!TANDEM_CONCAT(_res_, __LINE__).ok())                             \
    return TANDEM_CONCAT(_res_, __LINE__).status();                     \
  lhs = std::move(TANDEM_CONCAT(_res_, __LINE__)).value()
