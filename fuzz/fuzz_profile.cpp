// A hardware profile (profiles/*.json), parsed from memory; a profile that parses is used for
// predictions of a small model on a few meshes, as `slope plan` would.
#include <string>

#include "../tests/unit/planner/planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/hardware_profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slope::planner;
  try {
    const HardwareProfile hw = parse_profile(std::string(reinterpret_cast<const char*>(data), size), "fuzz profile");
    static const slope::model::ModelConfig cfg = testing::tiny_moe();
    volatile double sink = 0;
    for (const Mesh& m : {Mesh{.pp_chunk = 0}, Mesh{.ring = 2, .ulysses = 2, .pp_chunk = 0}, Mesh{.pp = 2, .tp = 2, .pp_chunk = 1024}}) {
      if (!mesh_problem(cfg, hw, m).empty()) continue;
      sink = sink + predict(cfg, hw, m, 5000).ttft_s;
    }
  } catch (const slope::Error&) {
  }
  return 0;
}
