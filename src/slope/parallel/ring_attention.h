// Ring attention (pass-KV) over the ring communicator, for full-attention layers.
//
// Ring rank r keeps its queries; the K/V blocks travel: at step t = 0..R-1 it holds the block
// of ring rank (r - t) mod R, sends it on to r+1 and receives the next from r-1 (double
// buffered, non-blocking), and meanwhile computes attention of its queries against the block
// it holds. Blocks that no query can see (entirely above the causal diagonal) are skipped but
// still forwarded. With the zigzag layout (shard.h) every rank skips about the same work.
// Partial results merge by LSE (block_attention.h); the caller applies sinks once after.
//
// Progress (measured with bench/cp_overlap.cpp, 2 ranks, 4-34 MB blocks): polling MPI_Test
// between query slices hides the whole transfer over shared memory with Open MPI's default
// CMA single-copy path (the receiver copies the block in one call) and over TCP; without the
// polls the transfer is exposed. With `btl_vader_single_copy_mechanism none` the block moves
// as small fragments that need both ranks inside MPI at the same time, and polling does not
// hide it: run the ring with CMA (the default) when timing.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/parallel/block_attention.h"
#include "slope/parallel/data_plane.h"
#include "slope/parallel/shard.h"

namespace slope::parallel {

class RingAttention {
 public:
  // ring: size R, ranks ordered by ring rank; the K/V blocks are its buffers. slice_rows: query
  // rows between progress polls. progress_tests: MPI_Test rounds per poll (see CpOptions).
  // Kernels run on `ops`, the data plane's device.
  RingAttention(DataPlane& ring, int64_t slice_rows, int progress_tests = 16, const ops::Backend& ops = ops::cpu(),
                             bool progress_thread = true)
      : ring_(ring), ops_(ops), block_(slice_rows, ops), progress_tests_(progress_tests), progress_thread_(progress_thread), buf_{ops::DeviceBuffer(ops), ops::DeviceBuffer(ops)} {}

  // spec: the heads this rank computes (after Ulysses, its slice).
  // q [rows, Hq, D], k/v [rows, Hkv, D]: the rows of layout.ring_shard(my ring rank).
  // out [rows, Hq, D], lse [rows, Hq]: attention over all keys of the prompt, without sinks.
  void attend(const ops::LayerAttention& spec, const ZigzagLayout& layout, const float* q,
              const float* k, const float* v, float* out, float* lse, CpStats& stats);

  // General form (chunked prefill): q [Σ q_segments, Hq, D] this rank's query rows;
  // blocks[s]: the positions of ring rank s's K/V rows in its buffer order (known to every
  // rank); k/v [Σ blocks[my rank], Hkv, D] this rank's block. The blocks of all ring ranks
  // together must hold every key the queries see, each key once.
  // out [q rows, Hq, D], lse [q rows, Hq]: attention over all blocks, without sinks.
  void attend(const ops::LayerAttention& spec, const std::vector<Segment>& q_segments,
              const float* q, const std::vector<std::vector<Segment>>& blocks, const float* k,
              const float* v, float* out, float* lse, CpStats& stats);

 private:
  DataPlane& ring_;
  const ops::Backend& ops_;
  BlockAttention block_;
  int progress_tests_;
  bool progress_thread_;  // BackgroundProgress where the plane allows it
  ops::DeviceBuffer buf_[2];  // [K rows·Hkv·D | V rows·Hkv·D] of the block in flight
};

}  // namespace slope::parallel
