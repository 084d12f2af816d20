#include "slope/cli/cli_util.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <iostream>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/parallel/agreement.h"

namespace slope::cli {

void setup_app(CLI::App& app) {
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", version_string());
}

int parse_args(CLI::App& app, int argc, char** argv, const std::string& command, bool print) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp&) {
    if (print) std::cout << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    if (print) std::cout << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion&) {
    if (print) std::cout << "slope " << version_string() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    if (print)
      std::cerr << "slope " << command << ": usage error: " << e.what() << "\n"
                << "run `slope " << command << " --help` for the flags\n";
    return kExitUsage;
  }
}

kernels::ComputeType parse_compute_dtype(const std::string& value, const std::string& flag) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (v == "f32" || v == "fp32" || v == "float32") return kernels::ComputeType::F32;
  if (v == "bf16" || v == "bfloat16") return kernels::ComputeType::BF16;
  fail(flag, " must be f32 or bf16 (bf16 weights and activations with f32 accumulation), got '", value, "'");
}

const char* compute_dtype_name(kernels::ComputeType t) { return t == kernels::ComputeType::BF16 ? "bf16" : "f32"; }

bool on_every_rank(parallel::Communicator& world, const std::string& command, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const Error& e) {
    error = e.what();
  }
  if (world.size() == 1) {
    if (!error.empty()) throw Error(error);
    return true;
  }
  const parallel::AgreedError agreed = parallel::agree_on_error(world, error);
  if (!agreed.failed()) return true;
  if (world.rank() == 0)
    std::cerr << "slope " << command << ": error" << (agreed.rank == 0 ? "" : str_cat(" (rank ", agreed.rank, ")"))
              << ": " << agreed.message << "\n";
  return false;
}

TerminalProgress::TerminalProgress(bool enabled) : active_(enabled && isatty(STDERR_FILENO)) {}

TerminalProgress::~TerminalProgress() { done(); }

void TerminalProgress::update(const std::string& text, bool force) {
  if (!active_) return;
  const double t = now_seconds();
  if (!force && shown_ && t - last_ < 0.1) return;
  last_ = t;
  shown_ = true;
  std::cerr << "\r\033[K" << text << std::flush;
}

void TerminalProgress::done() {
  if (!active_ || !shown_) return;
  std::cerr << "\r\033[K" << std::flush;
  shown_ = false;
}

}  // namespace slope::cli
