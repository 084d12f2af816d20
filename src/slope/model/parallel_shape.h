// Facts about a parallel layout that the engine and the planner must agree on, kept below both.
#pragma once

#include <algorithm>
#include <cstdint>

namespace slope::model {

// Tokens per pipeline chunk when none is given: about four chunks per stage keeps the bubble
// near (P-1)/(4P+P-1) while chunks stay large enough for efficient GEMMs; 0 (whole prompt)
// without pipeline stages.
inline int64_t default_pipeline_chunk(int stages, int64_t tokens) {
  if (stages <= 1) return 0;
  return std::max<int64_t>(256, (tokens + 4 * int64_t(stages) - 1) / (4 * int64_t(stages)));
}

}  // namespace slope::model
