#include "slope/core/log.h"

namespace slope {
namespace {
LogLevel g_level = LogLevel::Warn;  // process-wide verbosity, set once by the CLI
}
LogLevel log_level() { return g_level; }
void set_log_level(LogLevel level) { g_level = level; }
}  // namespace slope
