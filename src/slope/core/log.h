// Minimal levelled logging to stderr. The level comes from the CLI (--verbose/--quiet).
#pragma once

#include <iostream>

#include "slope/core/error.h"

namespace slope {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void log(LogLevel level, const Args&... args) {
  if (level > log_level()) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::cerr << "[slope " << names[int(level)] << "] " << str_cat(args...) << "\n";
}

}  // namespace slope
