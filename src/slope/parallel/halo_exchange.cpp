#include "slope/parallel/halo_exchange.h"

#include <algorithm>
#include <cstring>

#include "slope/core/error.h"
#include "slope/core/sys.h"

namespace slope::parallel {

using ops::Segment;
using ops::SequenceShard;

namespace {

// Sorts and merges overlapping or touching intervals.
std::vector<Segment> normalise(std::vector<Segment> v) {
  std::sort(v.begin(), v.end(), [](const Segment& a, const Segment& b) { return a.start < b.start; });
  std::vector<Segment> out;
  for (const Segment& s : v) {
    if (s.length <= 0) continue;
    if (!out.empty() && s.start <= out.back().end())
      out.back().length = std::max(out.back().end(), s.end()) - out.back().start;
    else
      out.push_back(s);
  }
  return out;
}

// Parts of the (sorted, disjoint) intervals `a` that lie inside segment b, in position order.
void intersect_into(const std::vector<Segment>& a, Segment b, std::vector<Segment>& out) {
  for (const Segment& s : a) {
    const int64_t lo = std::max(s.start, b.start), hi = std::min(s.end(), b.end());
    if (lo < hi) out.push_back({lo, hi - lo});
  }
}

// a minus b, both sorted and disjoint.
std::vector<Segment> subtract(const std::vector<Segment>& a, const std::vector<Segment>& b) {
  std::vector<Segment> out;
  for (Segment s : a) {
    int64_t cur = s.start;
    for (const Segment& h : b) {
      if (h.end() <= cur || h.start >= s.end()) continue;
      if (h.start > cur) out.push_back({cur, h.start - cur});
      cur = std::max(cur, h.end());
    }
    if (cur < s.end()) out.push_back({cur, s.end() - cur});
  }
  return out;
}

// A run of rows a holder sends: global positions `seg`, starting at local row `row` of its
// K/V buffer.
struct HeldPiece {
  Segment seg;
  int64_t row;
};

// Rows of `need` (sorted, disjoint) that `holder` has, in the holder's buffer order. Each
// piece lies inside one buffer segment, so its rows are contiguous in the holder's buffer
// (segments that touch in position need not be neighbours in the buffer).
std::vector<HeldPiece> held_part(const std::vector<Segment>& need, const SequenceShard& holder) {
  std::vector<HeldPiece> out;
  std::vector<Segment> parts;
  int64_t row = 0;
  for (const Segment& b : holder.segments) {
    parts.clear();
    intersect_into(need, b, parts);
    for (const Segment& p : parts) out.push_back({p, row + p.start - b.start});
    row += b.length;
  }
  return out;
}

int64_t total_length(const std::vector<HeldPiece>& v) {
  int64_t n = 0;
  for (const HeldPiece& p : v) n += p.seg.length;
  return n;
}

}  // namespace

std::vector<Segment> halo_needed(const SequenceShard& q, const SequenceShard& kv, int64_t window) {
  std::vector<Segment> need;
  for (const Segment& s : q.segments) {
    if (s.length <= 0) continue;
    const int64_t lo = std::max<int64_t>(0, s.start - (window - 1));
    need.push_back({lo, s.start - lo});
  }
  return subtract(normalise(need), normalise(kv.segments));
}

void HaloExchange::attend(const ops::LayerAttention& spec,
                          const std::vector<SequenceShard>& q_shards,
                          const std::vector<SequenceShard>& kv_shards, const float* q,
                          const float* k, const float* v, float* out, float* lse, CpStats& stats) {
  SLOPE_CHECK(spec.mask.window > 0, "halo exchange needs a sliding window");
  SLOPE_CHECK(int(q_shards.size()) == comm_.size() && int(kv_shards.size()) == comm_.size(),
              "halo exchange: ", q_shards.size(), " query and ", kv_shards.size(),
              " key shards for ", comm_.size(), " ranks");
  const int P = comm_.size(), me = comm_.rank();
  const int64_t Hq = spec.shape.num_q_heads, Hkv = spec.shape.num_kv_heads, D = spec.shape.head_dim;
  const int64_t row_elems = Hkv * D;
  const SequenceShard& my_q = q_shards[me];
  const SequenceShard& my_kv = kv_shards[me];
  const double posted = now_seconds();
  auto packing = stats.ledger.time(Phase::AttnCompute);

  // Receives: from each holder, the rows of my need that it has, K then V (two messages; MPI
  // keeps their order). The halo buffer is the holders' parts one after another.
  const std::vector<Segment> need = halo_needed(my_q, my_kv, spec.mask.window);
  std::vector<Segment> halo_segments;
  std::vector<Request> reqs;
  std::vector<std::pair<int, std::vector<HeldPiece>>> from;
  int64_t halo_rows = 0;
  for (int j = 0; j < P; ++j) {
    if (j == me || need.empty()) continue;
    std::vector<HeldPiece> part = held_part(need, kv_shards[j]);
    if (part.empty()) continue;
    halo_rows += total_length(part);
    from.emplace_back(j, std::move(part));
  }
  halo_k_.resize(size_t(halo_rows * row_elems));
  halo_v_.resize(size_t(halo_rows * row_elems));
  int64_t row = 0;
  for (auto& [j, part] : from) {
    const int64_t n = total_length(part);
    reqs.push_back(comm_.irecv(halo_k_.data() + row * row_elems, size_t(n * row_elems), j, Tag::Halo));
    reqs.push_back(comm_.irecv(halo_v_.data() + row * row_elems, size_t(n * row_elems), j, Tag::Halo));
    for (const HeldPiece& p : part) halo_segments.push_back(p.seg);
    row += n;
  }

  // Sends: for every other rank, the rows of its need that I hold, packed [K rows | V rows].
  while (int(send_.size()) < P) send_.emplace_back(ops_);
  for (int j = 0; j < P; ++j) {
    if (j == me) continue;
    const std::vector<HeldPiece> part =
        held_part(halo_needed(q_shards[j], kv_shards[j], spec.mask.window), my_kv);
    if (part.empty()) continue;
    const int64_t n = total_length(part);
    ops::DeviceBuffer& buf = send_[j];
    buf.resize(size_t(2 * n * row_elems));
    int64_t r = 0;
    for (const HeldPiece& p : part) {
      const int64_t elems = p.seg.length * row_elems;
      ops_.copy(buf.data() + r * row_elems, k + p.row * row_elems, elems);
      ops_.copy(buf.data() + (n + r) * row_elems, v + p.row * row_elems, elems);
      r += p.seg.length;
    }
    reqs.push_back(comm_.isend(buf.data(), size_t(n * row_elems), j, Tag::Halo));
    reqs.push_back(comm_.isend(buf.data() + n * row_elems, size_t(n * row_elems), j, Tag::Halo));
  }
  packing.stop();

  // Own keys while the halo travels.
  double completed = 0;
  auto progress = [&] {
    for (int i = 0; i < progress_tests_ && !reqs.empty() && completed == 0; ++i)
        if (test_all(reqs)) completed = now_seconds();
  };
  BackgroundProgress background(reqs, progress_thread_ && comm_.progress_from_helper_thread());
  const std::function<void()> poll = background.active() ? std::function<void()>() : progress;
  reset_attention_state(ops_, out, lse, my_q.local_tokens(), Hq, D);
  row = 0;
  for (const Segment& qs : my_q.segments) {
    block_.accumulate(spec, q + row * Hq * D, qs, k, v, my_kv.segments, out + row * Hq * D,
                      lse + row * Hq, poll, stats);
    row += qs.length;
  }
  if (!reqs.empty()) {
    if (completed == 0) completed = background.finish();
    if (completed == 0) {
      wait_all(reqs);
      completed = now_seconds();
    }
    stats.ledger.add(Phase::AttnComm, completed - posted);
  }

  // The halo block.
  if (halo_rows > 0) {
    row = 0;
    for (const Segment& qs : my_q.segments) {
      block_.accumulate(spec, q + row * Hq * D, qs, halo_k_.data(), halo_v_.data(), halo_segments,
                        out + row * Hq * D, lse + row * Hq, nullptr, stats);
      row += qs.length;
    }
  }
}

}  // namespace slope::parallel
