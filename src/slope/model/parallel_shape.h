// Facts about a parallel layout that the engine and the planner must agree on, kept below both:
// the mesh shape, which meshes a model can run, and the one default pipeline chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "slope/model/config.h"

namespace slope::model {

// One prefill instance's layout. Rank order: pipeline stage outermost, then ring, Ulysses, and
// tensor parallelism innermost (a tensor group is `tp` consecutive ranks inside each
// context-parallel rank):
//   world rank w:  stage = w / S,  local = w % S,  S = ring · ulysses · tp
//   local = (ring_rank · ulysses + ulysses_rank) · tp + tp_rank
struct MeshShape {
  int pp = 1;            // pipeline stages (layers split; chunks flow stage to stage)
  int ring = 1;          // ring-attention degree inside a stage (K/V passed around)
  int ulysses = 1;       // Ulysses degree inside a stage (all-to-all over a tensor rank's heads)
  int tp = 1;            // tensor-parallel degree (heads and MLP columns split)
  int64_t pp_chunk = -1;  // tokens per pipeline chunk; 0 = whole prompt; -1 = default_pipeline_chunk

  int cp_size() const { return ring * ulysses; }  // ranks a chunk's rows are sharded over
  int stage_size() const { return ring * ulysses * tp; }
  int size() const { return pp * stage_size(); }
  std::string str() const;  // "pp=2 ring=1 ulysses=2 tp=1"
  // Tokens per pipeline chunk for a prompt of `tokens` (0: whole prompt): pp_chunk if given,
  // else default_pipeline_chunk(pp, tokens).
  int64_t pipeline_chunk(int64_t tokens) const;
};

// The first reason `mesh` cannot run a model of `cfg`, or "" if it can (world size and hardware
// aside): a degree below 1, pp_chunk below -1, more stages than layers, tp not fitting the
// heads or the MLP (TensorSlice::of), or ulysses not fitting a tensor rank's heads. The engine's
// validate_shape and the planner's mesh_problem both start here, so they cannot disagree.
std::string mesh_problem(const MeshShape& mesh, const ModelConfig& cfg);

// Ulysses degrees that divide num_q_heads and nest with num_kv_heads (U divides the KV heads,
// or the KV heads divide U so that they are replicated); num_kv_heads 0 skips the KV check.
std::vector<int> valid_ulysses_degrees(int64_t num_q_heads, int64_t num_kv_heads);

// Tokens per pipeline chunk when none is given: about four chunks per stage keeps the bubble
// near (P-1)/(4P+P-1) while chunks stay large enough for efficient GEMMs; 0 (whole prompt)
// without pipeline stages.
inline int64_t default_pipeline_chunk(int stages, int64_t tokens) {
  if (stages <= 1) return 0;
  return std::max<int64_t>(256, (tokens + 4 * int64_t(stages) - 1) / (4 * int64_t(stages)));
}

}  // namespace slope::model
