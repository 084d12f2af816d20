// The planner's string inputs: "CONTEXTS\nMESH" as given to `slope plan --predict --context
// CONTEXTS --mesh MESH`. Accepted values are predicted on a small model and a round profile.
#include <string>

#include "../tests/unit/planner/planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slope::planner;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string contexts = text.substr(0, nl), mesh = nl == std::string::npos ? "1,1,1,1" : text.substr(nl + 1);
  static const slope::model::ModelConfig cfg = testing::tiny_dense();
  static const HardwareProfile hw = testing::round_profile();
  try {
    volatile double sink = 0;
    for (int64_t n : parse_contexts(contexts)) {
      const Mesh m = parse_mesh(mesh, n);
      if (mesh_problem(cfg, hw, m).empty()) sink = sink + predict(cfg, hw, m, n).ttft_s;
    }
  } catch (const slope::Error&) {
  }
  return 0;
}
