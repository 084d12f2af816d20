// `slope <subcommand> [flags]`. Errors end here as a message and an exit code (cli_util.h):
// 1 for a mistake in the input, 2 for command-line usage, 3 for an internal error.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/core/sys.h"

namespace {

struct Subcommand {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"run", slope::cli::cmd_run, "prefill one prompt: first token, logits, KV cache"},
    {"make-model", slope::cli::cmd_make_model, "write a random-weight HF model (tiny or bench)"},
    {"kv-merge", slope::cli::cmd_kv_merge, "assemble per-rank KV shards into one KV cache"},
    {"plan", slope::cli::cmd_plan, "pick parallel configurations that meet a TTFT SLO"},
    {"calibrate", slope::cli::cmd_calibrate, "measure this machine into a hardware profile"},
    {"tokenize", slope::cli::cmd_tokenize, "text to token ids and back with a tokenizer.json"},
    {"serve", slope::cli::cmd_serve, "HTTP prefill server: OpenAI-style API, SLO scheduler, instances"},
    {"instance", slope::cli::cmd_instance, nullptr},  // started by `slope serve`; not listed
};

void usage(std::ostream& os) {
  os << "SLOPE: SLO-driven long-context prefill engine\n\nusage: slope <subcommand> [flags]\n\n";
  for (const auto& s : kSubcommands)
    if (s.help) os << "  " << s.name << std::string(12 - std::strlen(s.name), ' ') << s.help << "\n";
  os << "\n`slope <subcommand> --help` lists a subcommand's flags and their defaults; `slope --version`.\n"
     << "exit codes: 0 ok, 1 error in the input or configuration, 2 usage, 3 internal error, 4 --check failed\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace slope::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "slope " << slope::version_string() << "\n";
    return kExitOk;
  }
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    try {
      return s.fn(argc - 1, argv + 1);
    } catch (const slope::Error& e) {
      std::cerr << "slope " << s.name << ": error: " << e.what() << "\n";
      return kExitError;
    } catch (const std::exception& e) {
      std::cerr << "slope " << s.name << ": internal error (a bug; please report it with the command line): "
                << e.what() << "\n";
      return kExitInternal;
    }
  }
  std::cerr << "slope: unknown subcommand '" << argv[1] << "'\n\n";
  usage(std::cerr);
  return kExitUsage;
}
