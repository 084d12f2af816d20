// Sliding-window attention under context parallelism: a halo exchange instead of the ring.
//
// With window W, query p sees keys (p-W, p]. A query segment [s, e) therefore needs, besides
// its own rows, only keys [s-W+1, s). Each rank computes, for every rank, that need minus what
// the rank already holds, intersects it with its own tokens, and sends exactly those K/V rows;
// when shards are shorter than W the halo spans several ranks and all of them send their part.
// Every shard is known to every rank (zigzag layout), so no sizes are exchanged.
//
// Runs on all heads over the whole world (no Ulysses all-to-all): the halo moves at most
// 2·(W-1) K/V rows per segment, far less than the all-to-all of Q, K, V and the output.
// Attention over own keys runs while the halo travels; the halo block is merged in by LSE.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/parallel/block_attention.h"
#include "slope/parallel/comm.h"

namespace slope::parallel {

// Positions in [s-W+1, s) for every segment s of `shard`, minus the positions it holds;
// sorted, disjoint.
std::vector<model::Segment> halo_needed(const model::SequenceShard& shard, int64_t window);

class HaloExchange {
 public:
  HaloExchange(Communicator& comm, int64_t slice_rows, int progress_tests = 16)
      : comm_(comm), block_(slice_rows), progress_tests_(progress_tests) {}

  // shards: every rank's tokens, indexed by rank in `comm`. q [rows, Hq, D], k/v [rows, Hkv, D]:
  // this rank's rows (shards[comm.rank()]). out [rows, Hq, D], lse [rows, Hq]: attention over
  // all visible keys, without sinks. spec.mask.window must be > 0.
  void attend(const model::LayerAttention& spec, const std::vector<model::SequenceShard>& shards,
              const float* q, const float* k, const float* v, float* out, float* lse,
              CpStats& stats);

 private:
  Communicator& comm_;
  BlockAttention block_;
  int progress_tests_;
  std::vector<float> halo_k_, halo_v_;
  std::vector<std::vector<float>> send_;
};

}  // namespace slope::parallel
