#include "slope/parallel/shard_exchange.h"

#include <algorithm>

#include "slope/core/error.h"

namespace slope::parallel {

using ops::Segment;
using ops::SequenceShard;

namespace {

// Consecutive runs that continue each other merged, empty runs dropped: a canonical form of
// the position sequence.
std::vector<Segment> runs(const std::vector<Segment>& segments) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    if (s.length <= 0) continue;
    if (!out.empty() && out.back().end() == s.start)
      out.back().length += s.length;
    else
      out.push_back(s);
  }
  return out;
}

std::string segments_str(const std::vector<Segment>& v) {
  std::string out = "{";
  for (const Segment& g : v) out += str_cat(out.size() > 1 ? ", " : "", "[", g.start, ", ", g.end(), ")");
  return out + "}";
}

}  // namespace

std::vector<RankShards> allgather_shards(Communicator& comm, const SequenceShard& q,
                                         const SequenceShard& kv, int64_t max_segments) {
  // Per rank: [nq, nkv, (start, length) × nq, (start, length) × nkv], padded to a fixed size so
  // that one allgather does it.
  const size_t stride = size_t(2 + 2 * max_segments);
  SLOPE_CHECK(int64_t(q.segments.size() + kv.segments.size()) <= max_segments,
              "allgather_shards: ", q.segments.size() + kv.segments.size(),
              " segments exceed the agreed maximum ", max_segments);
  std::vector<int64_t> mine(stride, 0), all(stride * size_t(comm.size()));
  mine[0] = int64_t(q.segments.size());
  mine[1] = int64_t(kv.segments.size());
  size_t i = 2;
  for (const SequenceShard* s : {&q, &kv})
    for (const Segment& g : s->segments) {
      mine[i++] = g.start;
      mine[i++] = g.length;
    }
  comm.allgather_bytes(mine.data(), stride * sizeof(int64_t), all.data());
  std::vector<RankShards> out(size_t(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* p = all.data() + size_t(r) * stride;
    const int64_t n[2] = {p[0], p[1]};
    p += 2;
    for (int which = 0; which < 2; ++which) {
      SequenceShard& s = which == 0 ? out[r].q : out[r].kv;
      s.total_tokens = q.total_tokens;
      for (int64_t j = 0; j < n[which]; ++j, p += 2)
        if (p[1] != 0) s.segments.push_back({p[0], p[1]});
    }
  }
  return out;
}

void check_shards(const std::vector<RankShards>& shards) {
  int64_t max_q = -1;
  std::vector<std::pair<Segment, int>> kv;  // (segment, rank)
  for (size_t r = 0; r < shards.size(); ++r) {
    for (const SequenceShard* s : {&shards[r].q, &shards[r].kv})
      for (const Segment& g : s->segments)
        SLOPE_CHECK(g.start >= 0 && g.length >= 0, "context-parallel attention: rank ", r,
                    " has a bad segment [", g.start, ", ", g.end(), ")");
    // Queries inside the rank's own K/V (sorted runs of it).
    std::vector<Segment> own = shards[r].kv.segments;
    std::sort(own.begin(), own.end(), [](const Segment& a, const Segment& b) { return a.start < b.start; });
    own = runs(own);
    for (const Segment& g : shards[r].q.segments) {
      const auto it = std::upper_bound(own.begin(), own.end(), g.start,
                                       [](int64_t p, const Segment& s) { return p < s.start; });
      SLOPE_CHECK(it != own.begin() && std::prev(it)->end() >= g.end(),
                  "context-parallel attention: rank ", r, " has queries [", g.start, ", ", g.end(),
                  ") that are not among its keys ", segments_str(shards[r].kv.segments),
                  "; each rank's K/V must include its own queries' rows");
      max_q = std::max(max_q, g.end() - 1);
    }
    for (const Segment& g : shards[r].kv.segments) kv.push_back({g, int(r)});
  }
  std::sort(kv.begin(), kv.end(),
            [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
  int64_t covered = 0;  // [0, covered) is held (when no gap was found)
  int owner = -1;       // the rank whose segment reaches `covered`
  for (const auto& [g, r] : kv) {
    SLOPE_CHECK(g.start >= covered, "context-parallel attention: position ", g.start,
                " is held by ranks ", owner, " and ", r,
                "; K/V shards of different ranks must not overlap");
    SLOPE_CHECK(g.start == covered || covered > max_q, "context-parallel attention: positions [",
                covered, ", ", std::min(g.start, max_q + 1), ") are held by no rank's K/V but ",
                "queries up to ", max_q, " need them");
    covered = g.end();
    owner = r;
  }
  SLOPE_CHECK(covered > max_q, "context-parallel attention: positions [", covered, ", ",
              max_q + 1, ") are held by no rank's K/V but queries up to ", max_q, " need them");
}

int64_t total_length(const std::vector<Segment>& segments) {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.length;
  return n;
}

bool same_positions(const std::vector<Segment>& a, const std::vector<Segment>& b) {
  const std::vector<Segment> x = runs(a), y = runs(b);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].start != y[i].start || x[i].length != y[i].length) return false;
  return true;
}

std::vector<Segment> first_rows(const std::vector<Segment>& segments, int64_t rows) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    if (rows <= 0) break;
    const int64_t n = std::min(rows, s.length);
    if (n > 0) out.push_back({s.start, n});
    rows -= n;
  }
  return out;
}

std::vector<Segment> rows_from(const std::vector<Segment>& segments, int64_t rows) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    const int64_t skip = std::min(rows, s.length);
    rows -= skip;
    if (s.length > skip) out.push_back({s.start + skip, s.length - skip});
  }
  return out;
}

int64_t appended_rows(const SequenceShard& old, const SequenceShard& now, const SequenceShard& q) {
  const int64_t n_old = old.local_tokens();
  if (now.local_tokens() != n_old + q.local_tokens()) return -1;
  if (!same_positions(first_rows(now.segments, n_old), old.segments)) return -1;
  if (!same_positions(rows_from(now.segments, n_old), q.segments)) return -1;
  return n_old;
}

}  // namespace slope::parallel
