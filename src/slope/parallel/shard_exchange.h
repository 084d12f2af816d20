// Every rank's query and K/V shards, for attention calls whose rows are not the zigzag shard of
// the whole prompt (chunked prefill: queries are the zigzag shard of one chunk, keys the
// rank's rows of all chunks so far). Each rank knows only its own shards, so they are
// exchanged (an allgather of segment lists: 16 bytes per segment, small next to any row of
// K/V) and checked the same way on every rank, so that all ranks throw together.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/ops/attention_runner.h"
#include "slope/parallel/comm.h"

namespace slope::parallel {

struct RankShards {
  ops::SequenceShard q;   // query rows, buffer order
  ops::SequenceShard kv;  // K/V rows, buffer order
};

// Collective over comm: every rank's (q, kv), indexed by rank; empty segments dropped.
// max_segments: the largest q.segments.size() + kv.segments.size() over ranks (the caller has
// exchanged counts already).
std::vector<RankShards> allgather_shards(Communicator& comm, const ops::SequenceShard& q,
                                         const ops::SequenceShard& kv, int64_t max_segments);

// Throws slope::Error unless: every rank's query positions are among its K/V positions; no
// position is held by two ranks' K/V; and the K/V of all ranks covers [0, p] for the largest
// query position p.
void check_shards(const std::vector<RankShards>& shards);

// --- segment lists as sequences of positions (buffer order) ---------------------------------
int64_t total_length(const std::vector<ops::Segment>& segments);
// True if a and b list the same positions in the same order (however the runs are cut).
bool same_positions(const std::vector<ops::Segment>& a, const std::vector<ops::Segment>& b);
// The first `rows` rows of `segments` / the rows from `rows` on, as segments.
std::vector<ops::Segment> first_rows(const std::vector<ops::Segment>& segments, int64_t rows);
std::vector<ops::Segment> rows_from(const std::vector<ops::Segment>& segments, int64_t rows);
// If now = old followed by q (as position sequences), old's row count; else -1. This is how a
// chunked caller grows a rank's K/V: the new chunk's rows (its queries) appended to the old.
int64_t appended_rows(const ops::SequenceShard& old, const ops::SequenceShard& now,
                      const ops::SequenceShard& q);

}  // namespace slope::parallel
