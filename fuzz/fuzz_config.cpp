// A HF config.json, parsed from memory as Model::load and the planner do.
#include <string>

#include "slope/core/error.h"
#include "slope/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const slope::model::ModelConfig c =
        slope::model::parse_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz config.json");
    volatile int64_t sink = c.num_parameters() + c.num_active_parameters();
    (void)sink;
  } catch (const slope::Error&) {
  }
  return 0;
}
