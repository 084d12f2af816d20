// The full mesh of a prefill: pipeline stages outermost, then either a ring × ulysses
// context-parallel group or a tensor-parallel group inside each stage.
//
//   world rank w:  stage = w / S,  local = w % S,  S = ring · ulysses · tp
//   inside a stage: local = ring_rank · U + ulysses_rank (context parallel), or tensor rank.
//
// A rank exchanges activations only with the rank at the same local position of the next and
// previous stage, since every stage lays out a chunk's rows the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slope/engine/executor.h"
#include "slope/kernels/gemm.h"
#include "slope/model/config.h"
#include "slope/model/parallel_shape.h"
#include "slope/parallel/comm.h"
#include "slope/parallel/mesh.h"

namespace slope::engine {

// The engine's name for the one mesh type (model::MeshShape); str() is "pp=2 ring=1 ulysses=2 tp=1".
using ParallelShape = model::MeshShape;

// Throws slope::Error naming the problem and valid alternatives: world size != product, or any
// problem model::mesh_problem finds (tp not fitting the heads or the MLP, ulysses not fitting
// the heads of a tensor rank, more stages than layers).
void validate_shape(const ParallelShape& shape, int world_size, const model::ModelConfig& cfg,
                    int64_t num_tokens);

// Every valid shape for a world of `world_size` ranks (for suggestions).
std::vector<ParallelShape> all_shapes(int world_size, const model::ModelConfig& cfg,
                                      int64_t num_tokens);

// Where world rank `rank` sits in `shape` (the rank order below), computed without
// communication: what a rank needs to load its weights before the mesh is built.
struct RankPlace {
  int stage = 0;    // pipeline stage
  int local = 0;    // rank inside the stage
  int cp_rank = 0;  // context-parallel rank inside the stage
  int tp_rank = 0;  // rank inside the tensor group
};
RankPlace place_of(int rank, const ParallelShape& shape);

// This rank's place in the mesh, with the communicators it needs. Collective constructor.
class Topology {
 public:
  // Rank order inside a stage: context-parallel rank outer, tensor rank inner, so a tensor group
  // is `tp` consecutive ranks (one node's fast links) and each tensor rank t has its own
  // ring x ulysses mesh over the ranks with tensor rank t, running attention on its heads.
  // Payload (activations, tensor all-reduces, attention traffic) moves over data planes made by
  // `data_plane` (default: host memory over the communicators).
  Topology(parallel::Communicator& world, const ParallelShape& shape, const parallel::DataPlaneFactory& data_plane = {});

  const ParallelShape& shape() const { return shape_; }
  int stage() const { return stage_; }
  int local_rank() const { return local_; }
  int tp_rank() const { return tp_rank_; }
  bool context_parallel() const { return shape_.ring * shape_.ulysses > 1; }
  parallel::Communicator& world() const { return world_; }
  parallel::Communicator& stage_comm() const { return *stage_comm_; }
  parallel::Mesh* cp_mesh() const { return cp_mesh_.get(); }

  // The StagePlan for run_prefill (rows per chunk, neighbours, tensor all-reduce).
  StagePlan stage_plan() const;
  // Bytes this rank handed to tensor-parallel all-reduces (the payload; what MPI moves inside
  // the collective depends on its algorithm, about 2(T-1)/T of it for a ring all-reduce).
  int64_t tp_payload_bytes() const { return *tp_bytes_; }

 private:
  parallel::Communicator& world_;
  ParallelShape shape_;
  int stage_ = 0, local_ = 0, tp_rank_ = 0;
  std::unique_ptr<parallel::Communicator> stage_comm_;
  std::unique_ptr<parallel::Communicator> tp_comm_;  // the tensor group (tp > 1)
  std::unique_ptr<parallel::Communicator> cp_comm_;  // same tensor rank across the stage (tp > 1, CP)
  std::unique_ptr<parallel::Mesh> cp_mesh_;
  std::unique_ptr<parallel::DataPlane> world_data_;  // pipeline activations
  std::unique_ptr<parallel::DataPlane> tp_data_;     // tensor all-reduces (tp > 1)
  std::shared_ptr<int64_t> tp_bytes_ = std::make_shared<int64_t>(0);
};

// Memory one rank needs, in bytes, predicted from the configuration alone (no weights read):
// what `--dry-run` prints and `--max-memory` checks.
struct RankMemory {
  int rank = 0;
  int stage = 0;
  int first_layer = 0, last_layer = 0;
  int64_t tokens = 0;        // rows of all prompts this rank computes
  int64_t weights = 0;       // packed weights, norms, biases, embedding and head where held
  int64_t kv = 0;            // KV cache of its rows for its layers, all prompts
  int64_t activations = 0;   // largest live working set of one chunk in one layer, with:
  int64_t attention_kept = 0;  // of activations: the attention kernel's K/V copies kept between
                               // calls (kernels/attention.h attention_kept_bytes_bound)
  int64_t total() const { return weights + kv + activations; }
};

struct MemoryQuery {
  ParallelShape shape;
  int64_t num_tokens = 0;
  int64_t balance_tokens = 0;  // the length the stages were balanced for (0: num_tokens)
  int batch = 1;
  int64_t pp_chunk = 0;  // tokens per pipeline chunk (0: whole prompt)
  int64_t gemm_chunk = 1024;
  int64_t moe_chunk = model::kDefaultMoeChunk;  // rows per MoE call (at least gemm_chunk)
  // Linear weights packed in bf16: a BF16 engine on the bf16 units. A BF16 engine on the f32
  // units (kernels/bf16_units.h) holds f32 copies, as an F32 one does.
  bool bf16_weights = false;
  DType checkpoint_dtype = DType::BF16;  // of the embedding (kept mmap'd in that dtype)
};
std::vector<RankMemory> estimate_memory(const model::ModelConfig& cfg, const MemoryQuery& q);
// MemoryQuery::bf16_weights of an engine of compute type `compute` on `units` (resolved: Bf16 or
// F32, kernels::bf16_units()).
inline bool bf16_weights(kernels::ComputeType compute, kernels::Bf16Units units) {
  return compute == kernels::ComputeType::BF16 && units == kernels::Bf16Units::Bf16;
}

}  // namespace slope::engine
