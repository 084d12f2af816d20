// An instance's mesh as `slope serve --instance` spells it: "pp=1,ring=2,ulysses=1,tp=1", any
// subset of the keys in any order (absent keys are 1), optionally pp_chunk=N.
#pragma once

#include <string>

#include "slope/engine/topology.h"

namespace slope::serve {

// Throws slope::Error naming the bad entry for an unknown key, a repeated key, or a degree
// that is not a positive integer (at most 4096).
engine::ParallelShape parse_mesh_spec(const std::string& text);
std::string mesh_spec(const engine::ParallelShape& mesh);  // "pp=1,ring=2,ulysses=1,tp=1"

}  // namespace slope::serve
