// Levelled logging tagged with a component (and optionally a request id). Nothing per token above
// debug. The level comes from TANDEM_LOG_LEVEL (read once, in config) or set_log_level().
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view component, std::string_view message);

template <typename... Args>
void log_at(LogLevel level, std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, component, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tandem

#define TLOG_DEBUG(comp, ...) ::tandem::log_at(::tandem::LogLevel::kDebug, comp, __VA_ARGS__)
#define TLOG_INFO(comp, ...) ::tandem::log_at(::tandem::LogLevel::kInfo, comp, __VA_ARGS__)
#define TLOG_WARN(comp, ...) ::tandem::log_at(::tandem::LogLevel::kWarn, comp, __VA_ARGS__)
#define TLOG_ERROR(comp, ...) ::tandem::log_at(::tandem::LogLevel::kError, comp, __VA_ARGS__)
