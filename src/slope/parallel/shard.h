// Zigzag sequence sharding over a ring × ulysses mesh.
//
// The N prompt tokens are cut into 2R chunks, chunk c = [⌊c·N/2R⌋, ⌊(c+1)·N/2R⌋). Ring rank i
// holds chunks i and 2R-1-i: under a causal mask chunk c costs ∝ c+½, so every ring rank gets
// the same work (i + 2R-1-i = 2R-1) — a plain contiguous split would leave the last rank with
// 2R-1 times the first one's work. Chunks that touch (R-1 and R, so all of [0, N) when R = 1)
// form one segment.
// Inside a Ulysses group each of those segments is split evenly over the U ranks: rank u holds
// [s + ⌊u·L/U⌋, s + ⌊(u+1)·L/U⌋) of a segment [s, s+L). After the Ulysses all-to-all the group
// again sees its ring shard, in ring-shard order (segment 0 then segment 1).
//
// Uneven lengths: when N is not a multiple of 2R·U, chunk and piece sizes differ by at most one
// token. We split unevenly instead of padding to a multiple and masking the pad: every buffer
// then holds only real tokens, padding never enters the math (no masked rows, no pad K/V to
// ship), and all per-rank sizes are computable by every rank from (N, R, U) alone. Prompts
// shorter than 2·R·U leave some ranks with no tokens; they still take part in every exchange.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/ops/attention_runner.h"
#include "slope/parallel/mesh.h"

namespace slope::parallel {

using ops::Segment;
using ops::SequenceShard;

class ZigzagLayout {
 public:
  ZigzagLayout(int64_t num_tokens, MeshShape shape);

  int64_t num_tokens() const { return n_; }
  const MeshShape& shape() const { return shape_; }
  // Chunk c of the 2R chunks.
  Segment chunk(int c) const;
  // Ring rank r's segments in buffer order: 2, or 1 where the chunks touch; may be empty.
  const std::vector<Segment>& ring_segments(int r) const { return ring_segments_.at(r); }
  // The part of ring_segments(r)[s] held by Ulysses rank u.
  Segment piece(int r, int s, int u) const;
  // Tokens of ring rank r's Ulysses group (what each of its ranks sees after the all-to-all).
  SequenceShard ring_shard(int r) const;
  // Tokens held by mesh coordinate (r, u) in buffer order; empty segments dropped.
  SequenceShard shard(int r, int u) const;
  // Same, by world rank (w = r·U + u).
  SequenceShard shard_of_world_rank(int w) const;
  // Every rank's shard, indexed by world rank.
  std::vector<SequenceShard> all_shards() const;

 private:
  int64_t n_;
  MeshShape shape_;
  std::vector<std::vector<Segment>> ring_segments_;
};

// This rank's tokens under the zigzag layout (a convenience over ZigzagLayout).
SequenceShard zigzag_shard(int64_t num_tokens, const MeshShape& shape, int ring_rank,
                           int ulysses_rank);
SequenceShard my_shard(const Mesh& mesh, int64_t num_tokens);
// Chunked prefill: this rank's zigzag shard of the chunk [chunk.start, chunk.end()) (the chunk's
// own layout, positions offset by chunk.start) of a prompt of total_tokens tokens.
SequenceShard my_chunk_shard(const Mesh& mesh, ops::Segment chunk, int64_t total_tokens);

}  // namespace slope::parallel
