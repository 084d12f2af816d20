// Sliding-window attention under context parallelism: a halo exchange instead of the ring.
//
// With window W, query p sees keys (p-W, p]. A query segment [s, e) therefore needs, besides
// its own rows, only keys [s-W+1, s). Each rank computes, for every rank, that need minus what
// the rank already holds, intersects it with its own tokens, and sends exactly those K/V rows;
// when shards are shorter than W the halo spans several ranks and all of them send their part.
// Every shard is known to every rank (zigzag layout, or exchanged by the caller), so no sizes
// are exchanged here.
//
// Queries and keys may differ (chunked prefill): a rank's query rows are a subset of its K/V
// rows, and its K/V rows may include earlier chunks. The halo of a query segment [s, e) is
// then [s-W+1, s) minus the rank's K/V rows, fetched from whichever ranks hold it; K/V shards
// of different ranks must not overlap.
//
// Runs on all heads over the whole world (no Ulysses all-to-all): the halo moves at most
// 2·(W-1) K/V rows per segment, far less than the all-to-all of Q, K, V and the output.
// Attention over own keys runs while the halo travels; the halo block is merged in by LSE.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/parallel/block_attention.h"
#include "slope/parallel/data_plane.h"

namespace slope::parallel {

// Positions in [s-W+1, s) for every segment s of `q`, minus the positions `kv` holds; sorted,
// disjoint.
std::vector<ops::Segment> halo_needed(const ops::SequenceShard& q,
                                        const ops::SequenceShard& kv, int64_t window);
// Same with queries = keys = shard.
inline std::vector<ops::Segment> halo_needed(const ops::SequenceShard& shard, int64_t window) {
  return halo_needed(shard, shard, window);
}

class HaloExchange {
 public:
  // Buffers on the data plane's device; kernels and packing run on `ops` (the same device).
  HaloExchange(DataPlane& comm, int64_t slice_rows, int progress_tests = 16, const ops::Backend& ops = ops::cpu(),
                            bool progress_thread = true)
      : comm_(comm), ops_(ops), block_(slice_rows, ops), progress_tests_(progress_tests), progress_thread_(progress_thread), halo_k_(ops), halo_v_(ops) {}

  // shards: every rank's tokens, indexed by rank in `comm`. q [rows, Hq, D], k/v [rows, Hkv, D]:
  // this rank's rows (shards[comm.rank()]). out [rows, Hq, D], lse [rows, Hq]: attention over
  // all visible keys, without sinks. spec.mask.window must be > 0.
  void attend(const ops::LayerAttention& spec, const std::vector<ops::SequenceShard>& shards,
              const float* q, const float* k, const float* v, float* out, float* lse,
              CpStats& stats) {
    attend(spec, shards, shards, q, k, v, out, lse, stats);
  }
  // General form: q_shards / kv_shards: every rank's query / K/V rows (q ⊆ kv on each rank,
  // K/V shards disjoint over ranks). q [q rows, Hq, D], k/v [kv rows, Hkv, D]: this rank's;
  // out [q rows, Hq, D], lse [q rows, Hq].
  void attend(const ops::LayerAttention& spec, const std::vector<ops::SequenceShard>& q_shards,
              const std::vector<ops::SequenceShard>& kv_shards, const float* q, const float* k,
              const float* v, float* out, float* lse, CpStats& stats);

 private:
  DataPlane& comm_;
  const ops::Backend& ops_;
  BlockAttention block_;
  int progress_tests_;
  bool progress_thread_;  // BackgroundProgress where the plane allows it
  ops::DeviceBuffer halo_k_, halo_v_;
  std::vector<ops::DeviceBuffer> send_;
};

}  // namespace slope::parallel
