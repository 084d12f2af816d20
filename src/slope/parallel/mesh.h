// The device mesh for context parallelism: world = ring × ulysses.
//
// Rank order: ring outer, Ulysses inner, so a Ulysses group is U consecutive world ranks (one
// node when ranks are placed by slot):
//   world rank w  ->  ring_rank = w / U,  ulysses_rank = w % U
//   ulysses_comm: the U ranks with the same ring_rank    (all-to-all over heads)
//   ring_comm:    the R ranks with the same ulysses_rank (K/V passed around; same heads)
// The shape is the one mesh type (model::MeshShape); a Mesh is the context-parallel group, so
// only its ring and ulysses degrees are used here (pp and tp must be 1).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slope/model/parallel_shape.h"
#include "slope/parallel/comm.h"
#include "slope/parallel/data_plane.h"

namespace slope::parallel {

using model::MeshShape;

// Throws slope::Error, naming the valid alternatives, if the mesh cannot run this model:
//  - world_size != U × R (lists every (U,R) that fits world_size and the heads);
//  - U does not divide num_q_heads, or U and num_kv_heads don't nest (U must divide Hkv, or
//    Hkv divide U, so that each rank's query heads map onto whole KV heads; lists valid U);
//  - num_tokens < 1.
// Pass 0 for heads not known yet to skip the head checks. A prompt shorter than
// 2·R·U tokens is valid: some ranks then hold no tokens and only relay (correct, wasteful).
void validate_mesh(const MeshShape& shape, int world_size, int64_t num_q_heads,
                   int64_t num_kv_heads, int64_t num_tokens);

// U values that divide num_q_heads and nest with num_kv_heads (see validate_mesh).
using model::valid_ulysses_degrees;

class Mesh {
 public:
  // Collective over `world`: every rank must call it with the same shape. `world` must outlive
  // the mesh. Throws if world.size() != ring × ulysses, or if shape.pp or shape.tp is not 1.
  // The payload moves over data planes made by `data_plane` (default: host memory over the
  // communicators) on each of the three communicators.
  Mesh(Communicator& world, MeshShape shape, const DataPlaneFactory& data_plane = {});

  const MeshShape& shape() const { return shape_; }
  Communicator& world() const { return *world_; }
  Communicator& ring_comm() const { return *ring_; }
  Communicator& ulysses_comm() const { return *ulysses_; }
  // The data planes over the same ranks: what the attention algorithms move payload through.
  DataPlane& world_data() const { return *world_data_; }
  DataPlane& ring_data() const { return *ring_data_; }
  DataPlane& ulysses_data() const { return *ulysses_data_; }
  int ring_rank() const { return ring_->rank(); }
  int ulysses_rank() const { return ulysses_->rank(); }
  int world_rank() const { return world_->rank(); }
  // World rank of mesh coordinate (ring r, ulysses u).
  int world_rank_of(int r, int u) const { return r * shape_.ulysses + u; }
  // Sets the wait deadline on all three communicators.
  void set_timeout(double seconds);

 private:
  MeshShape shape_;
  Communicator* world_;
  std::unique_ptr<Communicator> ring_;
  std::unique_ptr<Communicator> ulysses_;
  std::unique_ptr<DataPlane> world_data_, ring_data_, ulysses_data_;
};

}  // namespace slope::parallel
