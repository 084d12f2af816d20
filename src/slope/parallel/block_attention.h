// Attention of a rank's query rows against one block of keys, accumulated into a running
// (out, lse) state; the step that ring attention and the halo exchange repeat per K/V block.
//
// Merge math (kernels/attention_merge.h): partial results over disjoint key sets combine
// exactly as   LSE = logaddexp(LSE_a, LSE_b),   O = e^{LSE_a-LSE}·O_a + e^{LSE_b-LSE}·O_b.
// The running state starts at (O = 0, LSE = -inf), the identity of the merge. Sinks are NOT
// part of any block: the caller applies them once to the fully merged state.
//
// MPI progress: a rendezvous-size non-blocking transfer only advances inside MPI calls, and a
// kernel call gives MPI no chance to run. So the query rows are cut into slices of at most
// `slice_rows` and `progress()` (MPI_Test on the pending requests) runs between slices. Slicing
// along queries is exact: each slice's rows see the same keys, no extra merge is needed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "slope/core/ledger.h"
#include "slope/ops/attention_runner.h"

namespace slope::parallel {

// Seconds and counters of context-parallel attention on one rank, accumulated over layers.
// Seconds go to the ledger: AttnCompute (attention kernels, merges, sinks, packing), AttnComm
// (transfer lifetimes, posted to seen complete, overlapped or not) and AttnWait (blocked waiting
// for communication, the exposed part); bytes are the payload moved.
struct CpStats {
  Ledger ledger;
  int64_t layers = 0;
  int64_t ring_steps = 0;
  int64_t blocks_skipped = 0;  // ring K/V blocks entirely above the causal diagonal (or window)
  double compute_seconds() const { return ledger.seconds(Phase::AttnCompute); }
  double comm_seconds() const { return ledger.seconds(Phase::AttnComm); }
  double wait_seconds() const { return ledger.seconds(Phase::AttnWait); }
  // Share of communication time hidden behind compute: 1 - wait / comm (1 when no comm).
  double hidden_fraction() const {
    return comm_seconds() > 0 ? 1.0 - std::min(1.0, wait_seconds() / comm_seconds()) : 1.0;
  }
};

// True if some query in q_seg can see some key in kv_seg under the mask.
using ops::any_visible;

class BlockAttention {
 public:
  // slice_rows <= 0: one slice (no progress polls inside a block). Kernels run on `ops`.
  explicit BlockAttention(int64_t slice_rows, const ops::Backend& ops = ops::cpu())
      : ops_(ops), slice_rows_(slice_rows), part_out_(ops), part_lse_(ops) {}

  // acc_out [q_seg.length, Hq, D], acc_lse [q_seg.length, Hq] <- merge(acc, attention of
  // q [q_seg.length, Hq, D] against k, v [Σ kv_segments, Hkv, D]). Returns false (and does
  // nothing) if no key of the block is visible to any query of q_seg.
  bool accumulate(const ops::LayerAttention& spec, const float* q, ops::Segment q_seg,
                  const float* k, const float* v, const std::vector<ops::Segment>& kv_segments,
                  float* acc_out, float* acc_lse, const std::function<void()>& progress,
                  CpStats& stats);

 private:
  const ops::Backend& ops_;
  int64_t slice_rows_;
  ops::DeviceBuffer part_out_, part_lse_;
};

// (out, lse) <- (0, -inf) for n rows of H heads of dim D.
void reset_attention_state(const ops::Backend& ops, float* out, float* lse, int64_t n, int64_t H, int64_t D);

}  // namespace slope::parallel
