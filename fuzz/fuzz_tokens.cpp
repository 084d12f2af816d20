// A --tokens file: integer ids separated by whitespace or commas.
#include "fuzz_input.h"
#include "slope/core/error.h"
#include "slope/model/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = slope::fuzz::write_file("tokens.txt", data, size);
  try {
    volatile size_t n = slope::model::read_token_file(path).size();
    (void)n;
  } catch (const slope::Error&) {
  }
  return 0;
}
