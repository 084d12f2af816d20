// Shell commands for the tests that run the `slope` binary end to end: exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace slope::testing {

struct CommandResult {
  int code = 0;
  std::string out;  // stdout, and stderr too unless left out
};

// Runs `cmd` with /bin/sh and collects its output.
inline CommandResult run_command(const std::string& cmd, bool with_stderr = true) {
  CommandResult r;
  FILE* p = popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (p == nullptr) return {127, "popen failed: " + cmd};
  std::array<char, 4096> buf;
  while (fgets(buf.data(), int(buf.size()), p)) r.out += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

// `slope ARGS` from the repository root, so paths in ARGS are relative to it.
inline CommandResult run_slope(const std::string& args, bool with_stderr = true) {
  return run_command("cd " + std::string(SLOPE_REFERENCE_DIR) + "/../.. && " + SLOPE_BINARY + " " + args,
                     with_stderr);
}

}  // namespace slope::testing
