#include "slope/parallel/block_attention.h"

#include <algorithm>
#include <limits>

#include "slope/core/sys.h"

namespace slope::parallel {

using ops::Segment;

void reset_attention_state(const ops::Backend& ops, float* out, float* lse, int64_t n, int64_t H, int64_t D) {
  ops.fill(out, n * H * D, 0.f);
  ops.fill(lse, n * H, -std::numeric_limits<float>::infinity());
}

bool BlockAttention::accumulate(const ops::LayerAttention& spec, const float* q, Segment q_seg,
                                const float* k, const float* v,
                                const std::vector<Segment>& kv_segments, float* acc_out,
                                float* acc_lse, const std::function<void()>& progress,
                                CpStats& stats) {
  bool any = false;
  for (const Segment& s : kv_segments) any = any || any_visible(spec.mask, q_seg, s);
  if (!any) return false;

  const int64_t Hq = spec.shape.num_q_heads, D = spec.shape.head_dim;
  // Without a transfer to drive, one call over all rows is best for the kernel.
  const int64_t step = slice_rows_ > 0 && progress ? slice_rows_ : std::max<int64_t>(q_seg.length, 1);
  part_out_.resize(size_t(std::min(step, q_seg.length) * Hq * D));
  part_lse_.resize(size_t(std::min(step, q_seg.length) * Hq));
  for (int64_t r0 = 0; r0 < q_seg.length; r0 += step) {
    const int64_t n = std::min(step, q_seg.length - r0);
    const Segment slice{q_seg.start + r0, n};
    bool visible = false;
    for (const Segment& s : kv_segments) visible = visible || any_visible(spec.mask, slice, s);
    if (visible) {
      auto timed = stats.ledger.time(Phase::AttnCompute);
      ops::attend_segments(ops_, spec, q + r0 * Hq * D, slice, k, v, kv_segments, part_out_.data(),
                             part_lse_.data());
      ops_.attention_merge(acc_out + r0 * Hq * D, acc_lse + r0 * Hq, part_out_.data(), part_lse_.data(), n, Hq, D);
    }
    if (progress) progress();
  }
  return true;
}

}  // namespace slope::parallel
