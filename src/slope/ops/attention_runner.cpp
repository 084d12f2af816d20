#include "slope/ops/attention_runner.h"

#include <cmath>
#include <limits>

#include "slope/core/error.h"
#include "slope/core/tensor.h"

namespace slope::ops {

int64_t SequenceShard::local_tokens() const {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.length;
  return n;
}

std::vector<int64_t> SequenceShard::positions() const {
  std::vector<int64_t> pos;
  pos.reserve(local_tokens());
  for (const Segment& s : segments)
    for (int64_t p = s.start; p < s.end(); ++p) pos.push_back(p);
  return pos;
}

bool SequenceShard::holds(int64_t position) const { return local_index(position) >= 0; }

int64_t SequenceShard::local_index(int64_t position) const {
  int64_t offset = 0;
  for (const Segment& s : segments) {
    if (position >= s.start && position < s.end()) return offset + position - s.start;
    offset += s.length;
  }
  return -1;
}

bool any_visible(const kernels::AttentionMask& mask, Segment q_seg, Segment kv_seg) {
  if (q_seg.length == 0 || kv_seg.length == 0) return false;
  if (mask.causal && kv_seg.start > q_seg.end() - 1) return false;  // all keys in the future
  if (mask.window > 0 && kv_seg.end() - 1 <= q_seg.start - mask.window) return false;  // too old
  return true;
}

void attend_segments(const ops::Backend& ops, const LayerAttention& spec, const float* q, Segment q_seg, const float* k,
                     const float* v, const std::vector<Segment>& kv_segments, float* out,
                     float* lse) {
  const int64_t Hq = spec.shape.num_q_heads, Hkv = spec.shape.num_kv_heads, D = spec.shape.head_dim;
  const int64_t n = q_seg.length;
  bool first = true;
  Tensor part_out, part_lse;
  int64_t kv_row = 0;
  for (const Segment& kv_seg : kv_segments) {
    const float* kb = k + kv_row * Hkv * D;
    const float* vb = v + kv_row * Hkv * D;
    kv_row += kv_seg.length;
    if (!any_visible(spec.mask, q_seg, kv_seg)) continue;
    if (first) {
      ops.flash_attention({.q = q, .nq = n, .q_pos0 = q_seg.start, .k = kb, .v = vb,
                                .nk = kv_seg.length, .kv_pos0 = kv_seg.start, .shape = spec.shape,
                                .mask = spec.mask, .scale = spec.scale, .compute = spec.compute,
                                .sinks = nullptr, .out = out, .lse = lse});
      first = false;
      continue;
    }
    if (part_out.empty()) {
      part_out = ops.alloc({n, Hq, D}, DType::F32);
      part_lse = ops.alloc({n, Hq}, DType::F32);
    }
    ops.flash_attention({.q = q, .nq = n, .q_pos0 = q_seg.start, .k = kb, .v = vb,
                              .nk = kv_seg.length, .kv_pos0 = kv_seg.start, .shape = spec.shape,
                              .mask = spec.mask, .scale = spec.scale, .compute = spec.compute,
                              .sinks = nullptr, .out = part_out.data<float>(), .lse = part_lse.data<float>()});
    ops.attention_merge(out, lse, part_out.data<float>(), part_lse.data<float>(), n, Hq, D);
  }
  if (first) {  // no visible key at all (cannot happen for causal self-attention; kept total)
    ops.fill(out, n * Hq * D, 0.f);
    ops.fill(lse, n * Hq, -std::numeric_limits<float>::infinity());
  }
}

void LocalAttention::attend(const LayerAttention& spec, const float* q,
                            const SequenceShard& q_shard, const float* k, const float* v,
                            const SequenceShard& kv_shard, float* out) {
  const int64_t Hq = spec.shape.num_q_heads, D = spec.shape.head_dim;
  // Fast path: one query segment, one key segment -> one fused kernel call with sinks.
  if (q_shard.segments.size() == 1 && kv_shard.segments.size() == 1) {
    const Segment qs = q_shard.segments[0], ks = kv_shard.segments[0];
    Tensor lse = ops_.alloc({qs.length, Hq}, DType::F32);
    ops_.flash_attention({.q = q, .nq = qs.length, .q_pos0 = qs.start, .k = k, .v = v,
                              .nk = ks.length, .kv_pos0 = ks.start, .shape = spec.shape,
                              .mask = spec.mask, .scale = spec.scale, .compute = spec.compute,
                              .sinks = spec.sinks, .out = out, .lse = lse.data<float>()});
    return;
  }
  int64_t row = 0;
  for (const Segment& qs : q_shard.segments) {
    Tensor lse = ops_.alloc({qs.length, Hq}, DType::F32);
    float* o = out + row * Hq * D;
    attend_segments(ops_, spec, q + row * Hq * D, qs, k, v, kv_shard.segments, o, lse.data<float>());
    if (spec.sinks) ops_.attention_apply_sinks(o, lse.data<float>(), spec.sinks, qs.length, Hq, D);
    row += qs.length;
  }
}

}  // namespace slope::ops
