// The planner's inputs as users write them: prompt lengths ("32k,64k,100000") and meshes
// ("U,R,P,TP[,chunk]"). Every size is range-checked before any arithmetic, so absurd values get
// a message, never an overflow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slope/planner/cost_model.h"

namespace slope::planner {

// "32k" = 32768, "1m" = 1048576 (binary multiples, as context windows are usually quoted);
// plain integers are exact, so "100000" is 100,000 tokens. Comma-separated, spaces ignored.
// Throws slope::Error for empty entries, non-numbers, zero and lengths above kMaxContextTokens
// (cost_model.h).
std::vector<int64_t> parse_contexts(const std::string& text);

// "U,R,P,TP[,chunk]" -> Mesh; chunk absent or -1: the engine's default for P > 1
// (default_pipeline_chunk(P, tokens)). Throws slope::Error for anything else, and for degrees
// above kMaxMeshDegree or more than kMaxMeshRanks ranks.
Mesh parse_mesh(const std::string& text, int64_t tokens);

}  // namespace slope::planner
