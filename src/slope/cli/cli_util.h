// Conventions every `slope` subcommand shares: exit codes, flag parsing (--help shows defaults,
// --version), one spelling of compute dtypes, and progress lines on a terminal.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "slope/kernels/gemm.h"

namespace slope::parallel {
class Communicator;
}

namespace slope::cli {

// Exit codes (README, "Exit codes"):
//   0  success
//   1  an error in the input or the configuration: a bad flag value, file, model or mesh. The
//      message names the problem and the fix.
//   2  command-line usage: an unknown subcommand or flag, a missing or malformed argument.
//   3  internal error: a bug in SLOPE (please report it with the command line).
//   4  `slope run --check`: the mesh's result differs from one rank's beyond the tolerance.
enum ExitCode : int { kExitOk = 0, kExitError = 1, kExitUsage = 2, kExitInternal = 3, kExitCheckFailed = 4 };

// --help lists every flag with its default; --version prints the version.
void setup_app(CLI::App& app);
// Parses the flags. Returns -1 to go on, or the exit code to leave with: 0 after --help or
// --version, kExitUsage after a usage error. Prints only when `print` (one rank of a job).
int parse_args(CLI::App& app, int argc, char** argv, const std::string& command, bool print = true);

// Compute dtypes are spelled f32 and bf16 everywhere (fp32, float32 and bfloat16 are accepted).
kernels::ComputeType parse_compute_dtype(const std::string& value, const std::string& flag = "--dtype");
const char* compute_dtype_name(kernels::ComputeType t);
inline constexpr const char* kDefaultComputeDtype = "bf16";

// Runs `step` on every rank of `world`. When it throws slope::Error on any rank, rank 0 prints
// the message of the lowest such rank once and false is returned on every rank, so a user's
// mistake is reported once instead of by every rank, and no rank is left waiting. `step` must
// not itself communicate (a rank may throw before reaching a collective). On one rank the error
// is rethrown.
bool on_every_rank(parallel::Communicator& world, const std::string& command, const std::function<void()>& step);

// One updating status line on stderr ("loading layer 12/36"), shown only when stderr is a
// terminal and `enabled` (one rank, no --quiet); nothing at all otherwise. Redrawn at most ten
// times a second; the line is cleared when done() is called or the object goes away.
class TerminalProgress {
 public:
  explicit TerminalProgress(bool enabled);
  ~TerminalProgress();
  TerminalProgress(const TerminalProgress&) = delete;
  TerminalProgress& operator=(const TerminalProgress&) = delete;

  bool active() const { return active_; }
  void update(const std::string& text, bool force = false);
  void done();

 private:
  bool active_ = false;
  bool shown_ = false;
  double last_ = 0;
};

}  // namespace slope::cli
