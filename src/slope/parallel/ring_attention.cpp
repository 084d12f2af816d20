#include "slope/parallel/ring_attention.h"

#include <algorithm>

#include "slope/core/sys.h"

namespace slope::parallel {

void RingAttention::attend(const ops::LayerAttention& spec, const ZigzagLayout& layout,
                           const float* q, const float* k, const float* v, float* out, float* lse,
                           CpStats& stats) {
  const int R = ring_.size();
  std::vector<std::vector<Segment>> blocks;  // every ring rank's K/V block (its ring shard)
  for (int s = 0; s < R; ++s) blocks.push_back(layout.ring_shard(s).segments);
  attend(spec, blocks[ring_.rank()], q, blocks, k, v, out, lse, stats);
}

void RingAttention::attend(const ops::LayerAttention& spec,
                           const std::vector<Segment>& q_segments, const float* q,
                           const std::vector<std::vector<Segment>>& blocks, const float* k,
                           const float* v, float* out, float* lse, CpStats& stats) {
  const int R = ring_.size(), r = ring_.rank();
  const int64_t Hq = spec.shape.num_q_heads, Hkv = spec.shape.num_kv_heads, D = spec.shape.head_dim;
  int64_t q_rows = 0;
  for (const Segment& s : q_segments) q_rows += s.length;
  reset_attention_state(ops_, out, lse, q_rows, Hq, D);

  std::vector<int64_t> block_rows(R, 0);
  int64_t max_rows = 0;
  for (int s = 0; s < R; ++s) {
    for (const Segment& g : blocks.at(s)) block_rows[s] += g.length;
    max_rows = std::max(max_rows, block_rows[s]);
  }
  const int64_t row_elems = Hkv * D;
  if (R > 1)
    for (auto& b : buf_) b.resize(size_t(2 * max_rows * row_elems));

  const int next = (r + 1) % R, prev = (r - 1 + R) % R;
  const float* kp = k;  // the block held at this step: [rows, Hkv, D] each
  const float* vp = v;
  for (int t = 0; t < R; ++t) {
    const int src = (r - t + R) % R;  // owner of the block held at step t
    std::vector<Request> reqs;
    int64_t n_recv = 0;
    float* next_buf = nullptr;
    const double posted = now_seconds();
    double completed = 0;
    if (t < R - 1) {
      // Pass the held block on and fetch the one the previous rank holds now. The receive
      // buffer is the other half of the double buffer, free since the last step's waits.
      const int64_t n_send = block_rows[src] * row_elems;
      n_recv = block_rows[(src - 1 + R) % R] * row_elems;
      next_buf = buf_[(t + 1) % 2].data();
      reqs.push_back(ring_.irecv(next_buf, size_t(n_recv), prev, Tag::RingKV));
      reqs.push_back(ring_.irecv(next_buf + n_recv, size_t(n_recv), prev, Tag::RingKV));
      reqs.push_back(ring_.isend(kp, size_t(n_send), next, Tag::RingKV));
      reqs.push_back(ring_.isend(vp, size_t(n_send), next, Tag::RingKV));
    }
    auto progress = [&] {
      for (int i = 0; i < progress_tests_ && !reqs.empty() && completed == 0; ++i)
        if (test_all(reqs)) completed = now_seconds();
    };
    // A helper thread moves the blocks while this one computes, where the plane allows it;
    // else MPI_Test polls between query slices do.
    BackgroundProgress background(reqs, progress_thread_ && ring_.progress_from_helper_thread());
    const std::function<void()> poll =
        reqs.empty() || background.active() ? std::function<void()>() : progress;
    bool computed = false;
    int64_t row = 0;
    for (const Segment& qs : q_segments) {
      computed |= block_.accumulate(spec, q + row * Hq * D, qs, kp, vp, blocks[src],
                                    out + row * Hq * D, lse + row * Hq, poll, stats);
      row += qs.length;
    }
    if (!computed) ++stats.blocks_skipped;
    ++stats.ring_steps;

    if (!reqs.empty()) {
      if (completed == 0) completed = background.finish();
      if (completed == 0) {
        wait_all(reqs);  // the exposed part: counted in the communicator's wait_seconds
        completed = now_seconds();
      }
      stats.ledger.add(Phase::AttnComm, completed - posted);
      kp = next_buf;
      vp = next_buf + n_recv;
    }
  }
}

}  // namespace slope::parallel
