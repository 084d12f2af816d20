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
// Per layer, on this rank's zigzag shard (q_shard == kv_shard == my_shard):
//  - full attention: Ulysses all-to-all to [group tokens, my heads] if U > 1; ring attention
//    over R if R > 1 (else local attention over the group's tokens); merge by LSE; sinks of my
//    heads applied once to the merged result:
//        LSE' = logaddexp(LSE, sink_h),  O' = O · e^{LSE - LSE'}
//    (adding e^{sink} per block would count it R times); all-to-all of the output back.
//  - sliding window (spec.mask.window > 0): halo exchange over all ranks, all heads, no
//    all-to-all (halo_exchange.h); sinks once at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "slope/model/attention_runner.h"
#include "slope/parallel/block_attention.h"
#include "slope/parallel/halo_exchange.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/ring_attention.h"
#include "slope/parallel/shard.h"

namespace slope::parallel {

struct CpOptions {
  // Query rows per attention call between MPI progress polls (MPI_Test) while K/V blocks are
  // in flight. Smaller: transfers advance more often; larger: fewer, bigger kernel calls.
  int64_t progress_rows = 64;
  // MPI_Test calls per poll. A transfer split into fragments (shared memory without CMA, TCP)
  // moves a few fragments per call, so one call per slice can leave most of it for the final
  // wait; a short burst keeps it moving. With CMA single-copy one call finishes the transfer.
  int progress_tests = 16;
};

class ContextParallelAttention : public model::AttentionRunner {
 public:
  // The mesh must outlive the runner. Not thread-safe: one runner per rank, called from the
  // thread that initialised MPI.
  explicit ContextParallelAttention(Mesh& mesh, CpOptions options = {});

  // q_shard and kv_shard must both be this rank's zigzag shard of a prompt of
  // q_shard.total_tokens tokens (my_shard); throws slope::Error otherwise. Collective: every
  // rank of the mesh calls it for the same layer.
  void attend(const model::LayerAttention& spec, const float* q,
              const model::SequenceShard& q_shard, const float* k, const float* v,
              const model::SequenceShard& kv_shard, float* out) override;

  const CpStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  const Mesh& mesh() const { return mesh_; }

 private:
  const ZigzagLayout& layout(int64_t num_tokens);
  void attend_full(const model::LayerAttention& spec, const ZigzagLayout& layout, const float* q,
                   const float* k, const float* v, float* out);
  void attend_sliding(const model::LayerAttention& spec, const ZigzagLayout& layout,
                      const float* q, const float* k, const float* v, float* out);

  Mesh& mesh_;
  CpOptions options_;
  CpStats stats_;
  std::unique_ptr<ZigzagLayout> layout_;
  std::vector<model::SequenceShard> all_shards_;
  RingAttention ring_;
  HaloExchange halo_;
  std::vector<float> q_g_, k_g_, v_g_, out_g_, lse_;
};

}  // namespace slope::parallel
