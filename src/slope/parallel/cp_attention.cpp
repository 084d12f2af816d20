#include "slope/parallel/cp_attention.h"

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/kernels/attention_merge.h"
#include "slope/parallel/ulysses.h"

namespace slope::parallel {

using model::LayerAttention;
using model::Segment;
using model::SequenceShard;

namespace {

bool same_segments(const SequenceShard& a, const SequenceShard& b) {
  if (a.total_tokens != b.total_tokens || a.segments.size() != b.segments.size()) return false;
  for (size_t i = 0; i < a.segments.size(); ++i)
    if (a.segments[i].start != b.segments[i].start || a.segments[i].length != b.segments[i].length)
      return false;
  return true;
}

std::string shard_str(const SequenceShard& s) {
  std::string out = "{";
  for (const Segment& g : s.segments)
    out += str_cat(out.size() > 1 ? ", " : "", "[", g.start, ", ", g.end(), ")");
  return out + "}";
}

// Sum of the three communicators' counters (a snapshot, to take per-layer differences).
CommStats snapshot(const Mesh& mesh) {
  CommStats s;
  for (const Communicator* c : {&mesh.world(), &mesh.ring_comm(), &mesh.ulysses_comm()}) {
    s.bytes_sent += c->stats().bytes_sent;
    s.bytes_received += c->stats().bytes_received;
    s.wait_seconds += c->stats().wait_seconds;
  }
  return s;
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(Mesh& mesh, CpOptions options)
    : mesh_(mesh),
      options_(options),
      ring_(mesh.ring_comm(), options.progress_rows, options.progress_tests),
      halo_(mesh.world(), options.progress_rows, options.progress_tests) {}

const ZigzagLayout& ContextParallelAttention::layout(int64_t num_tokens) {
  if (!layout_ || layout_->num_tokens() != num_tokens) {
    layout_ = std::make_unique<ZigzagLayout>(num_tokens, mesh_.shape());
    all_shards_ = layout_->all_shards();
  }
  return *layout_;
}

void ContextParallelAttention::attend(const LayerAttention& spec, const float* q,
                                      const SequenceShard& q_shard, const float* k, const float* v,
                                      const SequenceShard& kv_shard, float* out) {
  const ZigzagLayout& lay = layout(q_shard.total_tokens);
  const SequenceShard& expected = all_shards_[mesh_.world_rank()];
  SLOPE_CHECK(same_segments(q_shard, expected) && same_segments(kv_shard, expected),
              "context-parallel attention: rank ", mesh_.world_rank(), " (", mesh_.shape().str(),
              ") must be given its zigzag shard ", shard_str(expected), " of ",
              q_shard.total_tokens, " tokens for both queries and keys; got queries ",
              shard_str(q_shard), ", keys ", shard_str(kv_shard), " (use parallel::my_shard)");
  const CommStats before = snapshot(mesh_);
  if (spec.mask.window > 0)
    attend_sliding(spec, lay, q, k, v, out);
  else
    attend_full(spec, lay, q, k, v, out);
  const CommStats after = snapshot(mesh_);
  stats_.bytes_sent += after.bytes_sent - before.bytes_sent;
  stats_.bytes_received += after.bytes_received - before.bytes_received;
  stats_.wait_seconds += after.wait_seconds - before.wait_seconds;
  ++stats_.layers;
}

void ContextParallelAttention::attend_full(const LayerAttention& spec, const ZigzagLayout& lay,
                                           const float* q, const float* k, const float* v,
                                           float* out) {
  const int U = mesh_.shape().ulysses;
  const int64_t D = spec.shape.head_dim;
  LayerAttention local = spec;  // the heads this rank computes
  const float *qp = q, *kp = k, *vp = v;
  float* op = out;
  std::unique_ptr<UlyssesExchange> ulysses;
  if (U > 1) {
    // [my tokens, all heads] -> [group tokens (= ring shard), my heads], sinks of my heads.
    ulysses = std::make_unique<UlyssesExchange>(mesh_.ulysses_comm(), lay, mesh_.ring_rank(),
                                                spec.shape);
    const HeadSlice& h = ulysses->my_heads();
    ulysses->scatter_heads(q, k, v, q_g_, k_g_, v_g_, stats_);
    local.shape = {h.nq, h.nkv, D};
    if (spec.sinks) local.sinks = spec.sinks + h.q0;
    out_g_.resize(size_t(ulysses->group_rows() * h.nq * D));
    qp = q_g_.data();
    kp = k_g_.data();
    vp = v_g_.data();
    op = out_g_.data();
  }
  const int64_t rows = lay.ring_shard(mesh_.ring_rank()).local_tokens();
  lse_.resize(size_t(rows * local.shape.num_q_heads));
  ring_.attend(local, lay, qp, kp, vp, op, lse_.data(), stats_);  // R = 1: local blocks only
  if (local.sinks) {
    const double t0 = now_seconds();
    kernels::attention_apply_sinks(op, lse_.data(), local.sinks, rows, local.shape.num_q_heads, D);
    stats_.compute_seconds += now_seconds() - t0;
  }
  if (ulysses) ulysses->gather_heads(out_g_.data(), out, stats_);
}

void ContextParallelAttention::attend_sliding(const LayerAttention& spec, const ZigzagLayout& lay,
                                              const float* q, const float* k, const float* v,
                                              float* out) {
  const int64_t rows = all_shards_[mesh_.world_rank()].local_tokens();
  lse_.resize(size_t(rows * spec.shape.num_q_heads));
  halo_.attend(spec, all_shards_, q, k, v, out, lse_.data(), stats_);
  if (spec.sinks) {
    const double t0 = now_seconds();
    kernels::attention_apply_sinks(out, lse_.data(), spec.sinks, rows, spec.shape.num_q_heads,
                                   spec.shape.head_dim);
    stats_.compute_seconds += now_seconds() - t0;
  }
}

}  // namespace slope::parallel
