// `slope <subcommand> [flags]`. Errors a user can cause end here as a message and exit code 1.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "slope/cli/commands.h"
#include "slope/core/error.h"

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
};

void usage(std::ostream& os) {
  os << "SLOPE: SLO-driven long-context prefill engine\n\nusage: slope <subcommand> [flags]\n\n";
  for (const auto& s : kSubcommands) os << "  " << s.name << std::string(12 - std::strlen(s.name), ' ') << s.help << "\n";
  os << "\n`slope <subcommand> --help` lists a subcommand's flags.\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    try {
      return s.fn(argc - 1, argv + 1);
    } catch (const slope::Error& e) {
      std::cerr << "slope " << s.name << ": error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "slope " << s.name << ": internal error: " << e.what() << "\n";
      return 3;
    }
  }
  std::cerr << "slope: unknown subcommand '" << argv[1] << "'\n\n";
  usage(std::cerr);
  return 2;
}
