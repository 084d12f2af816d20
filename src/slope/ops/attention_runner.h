// How a decoder layer gets attention computed over the tokens a rank holds. The model code
// computes Q, K, V for its own tokens and hands them here; where the other tokens' K/V come
// from (nowhere on one rank; other ranks under context parallelism; earlier chunks under
// chunked pipelining) is the runner's business.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/kernels/attention.h"
#include "slope/ops/backend.h"

namespace slope::ops {

// A contiguous run of global token positions [start, start + length).
struct Segment {
  int64_t start = 0;
  int64_t length = 0;
  int64_t end() const { return start + length; }
};

// The tokens a buffer holds, in buffer order: the rows of the buffer are the segments' tokens
// concatenated. total_tokens is the whole prompt's length (for the last-position logic).
struct SequenceShard {
  int64_t total_tokens = 0;
  std::vector<Segment> segments;
  int64_t local_tokens() const;
  // Global position of every local row, in buffer order.
  std::vector<int64_t> positions() const;
  bool holds(int64_t position) const;
  int64_t local_index(int64_t position) const;  // -1 if not held
  static SequenceShard whole(int64_t n) { return {n, {{0, n}}}; }
};

// What one layer's attention needs besides the tensors.
struct LayerAttention {
  int layer = 0;
  kernels::AttentionShape shape;
  kernels::AttentionMask mask;   // causal always; window > 0 on sliding layers
  float scale = 1.f;
  const float* sinks = nullptr;  // [num_q_heads] or nullptr
  // The kernel's arithmetic (kernels/attention.h AttentionArgs::compute): BF16 in the engine's
  // bf16 mode.
  kernels::ComputeType compute = kernels::ComputeType::F32;
};

class AttentionRunner {
 public:
  virtual ~AttentionRunner() = default;
  // q:   [q_rows, Hq, D]   rows = q_shard's tokens
  // k,v: [kv_rows, Hkv, D] rows = kv_shard's tokens (K already rotated)
  // out: [q_rows, Hq, D]   the final attention output (sinks applied once)
  virtual void attend(const LayerAttention& spec, const float* q, const SequenceShard& q_shard,
                      const float* k, const float* v, const SequenceShard& kv_shard,
                      float* out) = 0;
};

// All needed keys are in the given K/V: runs flash_attention for every (query segment,
// key segment) pair that the mask allows, merges by LSE, applies sinks once.
class LocalAttention : public AttentionRunner {
 public:
  explicit LocalAttention(const ops::Backend& ops = ops::cpu()) : ops_(ops) {}
  void attend(const LayerAttention& spec, const float* q, const SequenceShard& q_shard,
              const float* k, const float* v, const SequenceShard& kv_shard, float* out) override;

 private:
  const ops::Backend& ops_;
};

// True if some query in q_seg can see some key in kv_seg under the mask (causal: a key not in
// the future of the last query; window: a key not older than the first query's window).
bool any_visible(const kernels::AttentionMask& mask, Segment q_seg, Segment kv_seg);

// Attention over explicit segments, the building block of LocalAttention and of the
// context-parallel runners: out/lse for q rows (one segment) against k/v rows (several
// segments), no sinks applied; lse = -inf where no key is visible.
void attend_segments(const ops::Backend& ops, const LayerAttention& spec, const float* q, Segment q_seg, const float* k,
                     const float* v, const std::vector<Segment>& kv_segments, float* out,
                     float* lse);

}  // namespace slope::ops
