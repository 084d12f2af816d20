#include "slope/parallel/cp_attention.h"

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/parallel/ulysses.h"

namespace slope::parallel {

using ops::LayerAttention;
using ops::Segment;
using ops::SequenceShard;

namespace {

bool same_segments(const SequenceShard& a, const SequenceShard& b) {
  if (a.total_tokens != b.total_tokens || a.segments.size() != b.segments.size()) return false;
  for (size_t i = 0; i < a.segments.size(); ++i)
    if (a.segments[i].start != b.segments[i].start || a.segments[i].length != b.segments[i].length)
      return false;
  return true;
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
      ops_(options.ops ? *options.ops : ops::cpu()),
      ring_(mesh.ring_data(), options.progress_rows, options.progress_tests, ops_, options.progress_thread),
      halo_(mesh.world_data(), options.progress_rows, options.progress_tests, ops_, options.progress_thread),
      q_g_(ops_),
      k_g_(ops_),
      v_g_(ops_),
      out_g_(ops_),
      lse_(ops_),
      ulysses_buffers_(ops_) {}

const ZigzagLayout& ContextParallelAttention::layout(int64_t num_tokens) {
  if (!layout_ || layout_->num_tokens() != num_tokens) {
    layout_ = std::make_unique<ZigzagLayout>(num_tokens, mesh_.shape());
    all_shards_ = layout_->all_shards();
  }
  return *layout_;
}

int64_t ContextParallelAttention::cached_kv_rows() const {
  int64_t rows = 0;
  for (const auto& [layer, c] : kv_cache_)
    if (c.row_elems > 0) rows += int64_t(c.k.size()) / c.row_elems;
  return rows;
}

void ContextParallelAttention::attend(const LayerAttention& spec, const float* q,
                                      const SequenceShard& q_shard, const float* k, const float* v,
                                      const SequenceShard& kv_shard, float* out) {
  const CommStats before = snapshot(mesh_);
  const ZigzagLayout& lay = layout(std::max<int64_t>(q_shard.total_tokens, 0));
  const SequenceShard& expected = all_shards_[mesh_.world_rank()];
  // The whole-prompt path needs every rank on it; a rank cannot tell alone (a rank whose zigzag
  // shard is empty sees the same empty shards in a chunked call), so the ranks agree first,
  // exchanging the segment counts for the chunked path at the same time.
  struct Header {
    int64_t whole, segments;
  };
  const Header mine{same_segments(q_shard, expected) && same_segments(kv_shard, expected) ? 1 : 0,
                    int64_t(q_shard.segments.size() + kv_shard.segments.size())};
  Header all{mine.whole, mine.segments};
  if (mesh_.world().size() > 1) {
    const std::vector<Header> h = mesh_.world().allgather(mine);
    for (const Header& x : h) {
      all.whole = std::min(all.whole, x.whole);
      all.segments = std::max(all.segments, x.segments);
    }
  }
  if (all.whole) {
    kv_cache_.clear();
    if (spec.mask.window > 0)
      attend_sliding(spec, lay, q, k, v, out);
    else
      attend_full(spec, lay, q, k, v, out);
  } else {
    const std::vector<RankShards> shards =
        allgather_shards(mesh_.world(), q_shard, kv_shard, all.segments);
    check_shards(shards);
    if (spec.mask.window > 0)
      attend_chunked_sliding(spec, shards, q, k, v, out);
    else
      attend_chunked_full(spec, shards, q, k, v, out);
  }
  const CommStats after = snapshot(mesh_);
  stats_.ledger.count_sent(after.bytes_sent - before.bytes_sent);
  stats_.ledger.count_received(after.bytes_received - before.bytes_received);
  stats_.ledger.add(Phase::AttnWait, after.wait_seconds - before.wait_seconds);
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
    ulysses = std::make_unique<UlyssesExchange>(mesh_.ulysses_data(), lay, mesh_.ring_rank(),
                                                spec.shape, ulysses_buffers_);
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
    auto timed = stats_.ledger.time(Phase::AttnCompute);
    ops_.attention_apply_sinks(op, lse_.data(), local.sinks, rows, local.shape.num_q_heads, D);
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
    auto timed = stats_.ledger.time(Phase::AttnCompute);
    ops_.attention_apply_sinks(out, lse_.data(), spec.sinks, rows, spec.shape.num_q_heads, spec.shape.head_dim);
  }
}

void ContextParallelAttention::attend_chunked_full(const LayerAttention& spec,
                                                   const std::vector<RankShards>& shards,
                                                   const float* q, const float* k, const float* v,
                                                   float* out) {
  const int U = mesh_.shape().ulysses, R = mesh_.shape().ring, P = U * R;
  const int me = mesh_.world_rank(), r = mesh_.ring_rank();
  const int64_t D = spec.shape.head_dim;
  const int64_t my_q_rows = shards[me].q.local_tokens();

  if (U == 1) {  // ring rank = world rank; each rank's block is its own K/V
    std::vector<std::vector<Segment>> blocks;
    for (const RankShards& s : shards) blocks.push_back(s.kv.segments);
    lse_.resize(size_t(my_q_rows * spec.shape.num_q_heads));
    ring_.attend(spec, shards[me].q.segments, q, blocks, k, v, out, lse_.data(), stats_);
    if (spec.sinks) {
      auto timed = stats_.ledger.time(Phase::AttnCompute);
      ops_.attention_apply_sinks(out, lse_.data(), spec.sinks, my_q_rows, spec.shape.num_q_heads, D);
    }
    return;
  }

  UlyssesRows ulysses(mesh_.ulysses_data(), spec.shape, ulysses_buffers_);
  const HeadSlice& h = ulysses.my_heads();
  KvCache scratch(ops_);
  KvCache& cache = options_.cache_kv ? kv_cache_.try_emplace(spec.layer, ops_).first->second : scratch;
  const int64_t row_elems = h.nkv * D;
  // Taken out while the call runs: a call that throws leaves the cache empty (fresh next time).
  const std::vector<SequenceShard> old_kv = std::move(cache.kv);
  cache.kv.clear();
  const bool fresh = int(old_kv.size()) != P || cache.row_elems != row_elems ||
                     int(cache.blocks.size()) != R;

  // Every group's block (its rows, in buffer order) and, for my group, the first K/V row each
  // rank sends. A group extends its cached block when each of its ranks' K/V is the previous
  // call's followed by its queries (the next chunk); every rank decides this for every group
  // from the same exchanged shards, so all agree on every block's order.
  std::vector<std::vector<Segment>> blocks(R);
  std::vector<int64_t> send_from(U, 0), q_rows(U), kv_rows(U);
  bool my_group_extends = false;
  for (int g = 0; g < R; ++g) {
    std::vector<int64_t> old(U, -1);
    bool extends = !fresh;
    for (int j = 0; j < U && extends; ++j) {
      const int w = mesh_.world_rank_of(g, j);
      old[j] = appended_rows(old_kv[w], shards[w].kv, shards[w].q);
      extends = old[j] >= 0;
    }
    if (extends) blocks[g] = cache.blocks[g];
    for (int j = 0; j < U; ++j) {
      const int w = mesh_.world_rank_of(g, j);
      const int64_t from = extends ? old[j] : 0;
      for (const Segment& s : rows_from(shards[w].kv.segments, from)) blocks[g].push_back(s);
      if (g == r) {
        send_from[j] = from;
        q_rows[j] = shards[w].q.local_tokens();
        kv_rows[j] = shards[w].kv.local_tokens() - from;
      }
    }
    if (g == r) my_group_extends = extends;
  }
  if (!my_group_extends) {
    cache.k.clear();
    cache.v.clear();
  }
  const int64_t old_rows = int64_t(cache.k.size()) / std::max<int64_t>(row_elems, 1);
  int64_t group_q_rows = 0, new_rows = 0;
  std::vector<Segment> group_q;  // the group's queries: rank 0's, then rank 1's, ...
  for (int j = 0; j < U; ++j) {
    group_q_rows += q_rows[j];
    new_rows += kv_rows[j];
    const auto& segs = shards[mesh_.world_rank_of(r, j)].q.segments;
    group_q.insert(group_q.end(), segs.begin(), segs.end());
  }
  SLOPE_CHECK(total_length(blocks[r]) == old_rows + new_rows,
              "context-parallel attention: K/V cache of layer ", spec.layer, " out of step");
  cache.k.resize(size_t((old_rows + new_rows) * row_elems));
  cache.v.resize(size_t((old_rows + new_rows) * row_elems));
  q_g_.resize(size_t(group_q_rows * h.nq * D));

  // [my rows, all heads] -> [group rows, my heads]; new K/V rows appended to the block.
  const int64_t src_elems = spec.shape.num_kv_heads * D;
  const int64_t skip = send_from[mesh_.ulysses_rank()] * src_elems;
  ulysses.scatter_heads(q, q_rows, k + skip, v + skip, kv_rows, q_g_.data(),
                        cache.k.data() + old_rows * row_elems,
                        cache.v.data() + old_rows * row_elems, stats_);

  LayerAttention local = spec;  // the heads this rank computes
  local.shape = {h.nq, h.nkv, D};
  if (spec.sinks) local.sinks = spec.sinks + h.q0;
  out_g_.resize(size_t(group_q_rows * h.nq * D));
  lse_.resize(size_t(group_q_rows * h.nq));
  ring_.attend(local, group_q, q_g_.data(), blocks, cache.k.data(), cache.v.data(),
               out_g_.data(), lse_.data(), stats_);
  if (local.sinks) {
    auto timed = stats_.ledger.time(Phase::AttnCompute);
    ops_.attention_apply_sinks(out_g_.data(), lse_.data(), local.sinks, group_q_rows, h.nq, D);
  }
  ulysses.gather_heads(out_g_.data(), q_rows, out, stats_);

  if (options_.cache_kv) {
    cache.kv.clear();
    for (const RankShards& s : shards) cache.kv.push_back(s.kv);
    cache.blocks = std::move(blocks);
    cache.row_elems = row_elems;
  }
}

void ContextParallelAttention::attend_chunked_sliding(const LayerAttention& spec,
                                                      const std::vector<RankShards>& shards,
                                                      const float* q, const float* k,
                                                      const float* v, float* out) {
  std::vector<SequenceShard> q_shards, kv_shards;
  for (const RankShards& s : shards) {
    q_shards.push_back(s.q);
    kv_shards.push_back(s.kv);
  }
  const int64_t rows = shards[mesh_.world_rank()].q.local_tokens();
  lse_.resize(size_t(rows * spec.shape.num_q_heads));
  halo_.attend(spec, q_shards, kv_shards, q, k, v, out, lse_.data(), stats_);
  if (spec.sinks) {
    auto timed = stats_.ledger.time(Phase::AttnCompute);
    ops_.attention_apply_sinks(out, lse_.data(), spec.sinks, rows, spec.shape.num_q_heads, spec.shape.head_dim);
  }
}

}  // namespace slope::parallel
