#include "slope/parallel/shard.h"

#include "slope/core/error.h"

namespace slope::parallel {

namespace {
// [⌊i·n/parts⌋, ⌊(i+1)·n/parts⌋): part sizes differ by at most one.
Segment even_part(int64_t start, int64_t n, int i, int parts) {
  const int64_t a = i * n / parts, b = (i + 1) * n / parts;
  return {start + a, b - a};
}
}  // namespace

ZigzagLayout::ZigzagLayout(int64_t num_tokens, MeshShape shape) : n_(num_tokens), shape_(shape) {
  SLOPE_CHECK(num_tokens >= 0, "zigzag layout: negative token count ", num_tokens);
  SLOPE_CHECK(shape.ring >= 1 && shape.ulysses >= 1, "zigzag layout: bad mesh ", shape.str());
  const int R = shape.ring;
  ring_segments_.resize(R);
  for (int r = 0; r < R; ++r) {
    const Segment lo = chunk(r), hi = chunk(2 * R - 1 - r);
    if (lo.end() == hi.start)  // R == 1: the two chunks touch; keep one segment
      ring_segments_[r] = {{lo.start, lo.length + hi.length}};
    else
      ring_segments_[r] = {lo, hi};
  }
}

Segment ZigzagLayout::chunk(int c) const { return even_part(0, n_, c, 2 * shape_.ring); }

Segment ZigzagLayout::piece(int r, int s, int u) const {
  const Segment seg = ring_segments_.at(r).at(s);
  return even_part(seg.start, seg.length, u, shape_.ulysses);
}

SequenceShard ZigzagLayout::ring_shard(int r) const {
  SequenceShard out{n_, {}};
  for (const Segment& s : ring_segments_.at(r))
    if (s.length > 0) out.segments.push_back(s);
  return out;
}

SequenceShard ZigzagLayout::shard(int r, int u) const {
  SequenceShard out{n_, {}};
  for (int s = 0; s < int(ring_segments_.at(r).size()); ++s) {
    const Segment p = piece(r, s, u);
    if (p.length > 0) out.segments.push_back(p);
  }
  return out;
}

SequenceShard ZigzagLayout::shard_of_world_rank(int w) const {
  return shard(w / shape_.ulysses, w % shape_.ulysses);
}

std::vector<SequenceShard> ZigzagLayout::all_shards() const {
  std::vector<SequenceShard> out;
  for (int w = 0; w < shape_.cp_size(); ++w) out.push_back(shard_of_world_rank(w));
  return out;
}

SequenceShard zigzag_shard(int64_t num_tokens, const MeshShape& shape, int ring_rank,
                           int ulysses_rank) {
  return ZigzagLayout(num_tokens, shape).shard(ring_rank, ulysses_rank);
}

SequenceShard my_shard(const Mesh& mesh, int64_t num_tokens) {
  return zigzag_shard(num_tokens, mesh.shape(), mesh.ring_rank(), mesh.ulysses_rank());
}

SequenceShard my_chunk_shard(const Mesh& mesh, Segment chunk, int64_t total_tokens) {
  SequenceShard s = my_shard(mesh, chunk.length);
  for (Segment& g : s.segments) g.start += chunk.start;
  s.total_tokens = total_tokens;
  return s;
}

}  // namespace slope::parallel
