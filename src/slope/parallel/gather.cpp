#include "slope/parallel/gather.h"

#include <cstring>

#include "slope/core/error.h"

namespace slope::parallel {

int rank_holding(const std::vector<ops::SequenceShard>& shards, int64_t position) {
  for (size_t i = 0; i < shards.size(); ++i)
    if (shards[i].holds(position)) return int(i);
  return -1;
}

std::vector<float> gather_sequence(Communicator& comm,
                                   const std::vector<ops::SequenceShard>& shards,
                                   const float* mine, int64_t row_elems, int root) {
  SLOPE_CHECK(int(shards.size()) == comm.size(), "gather_sequence: ", shards.size(),
              " shards for ", comm.size(), " ranks");
  const ops::SequenceShard& me = shards[comm.rank()];
  const size_t row_bytes = size_t(row_elems) * sizeof(float);
  std::vector<uint8_t> all;
  comm.gatherv_bytes(mine, size_t(me.local_tokens()) * row_bytes, all, root);
  if (comm.rank() != root) return {};
  std::vector<float> out(size_t(me.total_tokens * row_elems));
  const uint8_t* src = all.data();
  for (const ops::SequenceShard& s : shards)
    for (const ops::Segment& seg : s.segments) {
      std::memcpy(out.data() + seg.start * row_elems, src, size_t(seg.length) * row_bytes);
      src += size_t(seg.length) * row_bytes;
    }
  return out;
}

}  // namespace slope::parallel
