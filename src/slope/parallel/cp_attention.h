// Context-parallel attention: the AttentionRunner that the model calls on every rank of a
// ring × ulysses mesh, in place of LocalAttention.
//
//   MpiRuntime mpi(&argc, &argv);
//   auto world = mpi.world();
//   Mesh mesh(*world, {.ring = R, .ulysses = U});
//   SequenceShard shard = my_shard(mesh, num_tokens);          // the rows this rank computes
//   ContextParallelAttention cp(mesh);
//   model.forward(..., shard, cp);   // calls cp.attend(spec, q, shard, k, v, shard, out)
//
// Chunked (engine/executor.h): chunk c's queries are my_chunk_shard(mesh, chunk_c, N); its K/V
// are this rank's rows of chunks 0..c in that order:
//   cp.attend(spec, q, my_chunk_shard(..), k, v, concat(my_chunk_shard of chunks 0..c), out)
//
// Per layer, on this rank's zigzag shard (q_shard == kv_shard == my_shard):
//  - full attention: Ulysses all-to-all to [group tokens, my heads] if U > 1; ring attention
//    over R if R > 1 (else local attention over the group's tokens); merge by LSE; sinks of my
//    heads applied once to the merged result:
//        LSE' = logaddexp(LSE, sink_h),  O' = O · e^{LSE - LSE'}
//    (adding e^{sink} per block would count it R times); all-to-all of the output back.
//  - sliding window (spec.mask.window > 0): halo exchange over all ranks, all heads, no
//    all-to-all (halo_exchange.h); sinks once at the end.
//
// Chunked prefill (any other q_shard / kv_shard): rank w's queries are some rows Q_w (e.g. its
// zigzag shard of one chunk), its keys K_w ⊇ Q_w (e.g. its rows of chunks 0..c, the current
// chunk's last). Requirements, checked on every rank: Q_w ⊆ K_w; the K_w are disjoint; their
// union covers [0, max query position]. The segment lists are exchanged first (an allgather of
// 16 bytes per segment). Then, per layer:
//  - full attention: if U > 1, an all-to-all moves the group's queries and K/V to head-sharded
//    form (group rows = rank 0's, then rank 1's, ...). With CpOptions::cache_kv each layer
//    keeps the group's head-sharded K/V between calls, so a call whose K_w are the previous
//    call's K_w followed by its Q_w (the next chunk) sends only the new rows; any other call
//    starts the cache afresh. Then the ring passes each group's whole K/V block (all chunks so
//    far, its rows and positions) around; masks use global positions, so blocks can hold any
//    positions. LSE merge, sinks once, all-to-all of the output back.
//  - sliding window: the halo exchange with separate query and K/V shards: each query segment
//    [s, e) fetches [s-W+1, s) minus its own K/V rows from the ranks that hold them.
// Communication per full layer and rank for chunk c of C tokens (T = (c+1)·C tokens so far,
// P = U·R ranks, nkv = max(Hkv/U, 1) KV heads per rank after the all-to-all), in floats:
//    all-to-all (U > 1): C/P rows · [(U-1)/U · 2·Hq·D (queries out, output back)
//                                    + (U-1) · 2·nkv·D (the new K/V rows; T/P rows instead of
//                                      C/P with cache_kv off)]
//    ring (R > 1): blocks of ≈ T/R rows · 2·nkv·D. This grows with c: pass-KV sends the
//      earlier chunks' K/V around the ring again on every chunk.
// Sliding layer: at most (W-1) rows · 2·Hkv·D floats per query segment, independent of c.
//
// Which path runs is decided collectively (a 16-byte allgather per call when there is more than
// one rank): the whole-prompt path only when every rank passes its zigzag shard as both shards.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "slope/ops/attention_runner.h"
#include "slope/parallel/block_attention.h"
#include "slope/parallel/halo_exchange.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/ring_attention.h"
#include "slope/parallel/shard.h"
#include "slope/parallel/shard_exchange.h"
#include "slope/parallel/ulysses.h"

namespace slope::parallel {

struct CpOptions {
  // Query rows per attention call between MPI progress polls (MPI_Test) while K/V blocks are
  // in flight. Smaller: transfers advance more often; larger: fewer, bigger kernel calls.
  int64_t progress_rows = 64;
  // Chunked calls under U > 1: keep each layer's head-sharded K/V of the Ulysses group between
  // calls so that only the rows added since the last call are sent. Memory: per full-attention
  // layer, the group's K/V rows of this rank's KV heads (≈ this rank's own KV cache; U/Hkv times
  // that when KV heads are replicated). Valid only while the caller leaves earlier rows of its
  // K/V unchanged between calls (a prefill's KV cache); release_kv_cache() frees it.
  bool cache_kv = true;
  // MPI_Test calls per poll. A transfer split into fragments (shared memory without CMA, TCP)
  // moves a few fragments per call, so one call per slice can leave most of it for the final
  // wait; a short burst keeps it moving. With CMA single-copy one call finishes the transfer.
  int progress_tests = 16;
  // While K/V blocks or halos are in flight, a helper thread tests them (BackgroundProgress,
  // comm.h) instead of the polls between slices, where the data plane allows it (MPI
  // initialised with MPI_THREAD_SERIALIZED or better). Needed where the transport moves a large
  // message only while the host is inside MPI: shared memory without CMA, TCP.
  bool progress_thread = true;
  // The device's ops the attention kernels and the packing run on, and where the staging
  // buffers live (null: ops::cpu()); the mesh's data planes must be on the same device.
  const ops::Backend* ops = nullptr;
};

class ContextParallelAttention : public ops::AttentionRunner {
 public:
  // The mesh must outlive the runner. Not thread-safe: one runner per rank, called from the
  // thread that initialised MPI.
  explicit ContextParallelAttention(Mesh& mesh, CpOptions options = {});

  // Collective: every rank of the mesh calls it for the same layer. Either every rank passes
  // its zigzag shard of a prompt of q_shard.total_tokens tokens (my_shard) as both shards, or
  // the shards meet the chunked requirements above; throws slope::Error (on every rank) if not.
  void attend(const ops::LayerAttention& spec, const float* q,
              const ops::SequenceShard& q_shard, const float* k, const float* v,
              const ops::SequenceShard& kv_shard, float* out) override;

  const CpStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  const Mesh& mesh() const { return mesh_; }
  // Frees the K/V kept for chunked calls (CpOptions::cache_kv), e.g. after a prompt.
  void release_kv_cache() { kv_cache_.clear(); }
  // Rows of K/V kept for chunked calls, summed over layers (for tests and reports).
  int64_t cached_kv_rows() const;

 private:
  // Head-sharded K/V of this rank's Ulysses group for one full-attention layer, kept between
  // chunked calls.
  struct KvCache {
    explicit KvCache(const ops::Backend& ops) : k(ops), v(ops) {}
    std::vector<ops::SequenceShard> kv;      // every rank's K/V shard at the last call
    std::vector<std::vector<Segment>> blocks;  // per group (ring rank): positions of its rows
    int64_t row_elems = 0;                     // nkv · D
    ops::DeviceBuffer k, v;                    // [rows of blocks[my ring rank], nkv, D]
  };
  void attend_chunked_full(const ops::LayerAttention& spec,
                           const std::vector<RankShards>& shards, const float* q, const float* k,
                           const float* v, float* out);
  void attend_chunked_sliding(const ops::LayerAttention& spec,
                              const std::vector<RankShards>& shards, const float* q,
                              const float* k, const float* v, float* out);

  const ZigzagLayout& layout(int64_t num_tokens);
  void attend_full(const ops::LayerAttention& spec, const ZigzagLayout& layout, const float* q,
                   const float* k, const float* v, float* out);
  void attend_sliding(const ops::LayerAttention& spec, const ZigzagLayout& layout,
                      const float* q, const float* k, const float* v, float* out);

  Mesh& mesh_;
  CpOptions options_;
  const ops::Backend& ops_;
  CpStats stats_;
  std::unique_ptr<ZigzagLayout> layout_;
  std::vector<ops::SequenceShard> all_shards_;
  RingAttention ring_;
  HaloExchange halo_;
  ops::DeviceBuffer q_g_, k_g_, v_g_, out_g_, lse_;
  UlyssesBuffers ulysses_buffers_;  // all-to-all staging, reused by every layer and prefill
  std::map<int, KvCache> kv_cache_;  // by layer
};

}  // namespace slope::parallel
