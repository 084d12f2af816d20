#include "slope/engine/topology.h"

#include <algorithm>
#include <sstream>

#include "slope/core/error.h"
#include "slope/kernels/attention.h"
#include "slope/model/flops.h"
#include "slope/model/layers.h"
#include "slope/parallel/shard.h"

namespace slope::engine {

namespace {

std::string flags(const ParallelShape& s) {
  std::string out;
  if (s.pp > 1) out += str_cat(" --pp ", s.pp);
  if (s.ring > 1) out += str_cat(" --ring ", s.ring);
  if (s.ulysses > 1) out += str_cat(" --ulysses ", s.ulysses);
  if (s.tp > 1) out += str_cat(" --tp ", s.tp);
  return out.empty() ? " (no flags: one rank)" : out;
}

}  // namespace

std::vector<ParallelShape> all_shapes(int world_size, const model::ModelConfig& cfg,
                                      int64_t num_tokens) {
  std::vector<ParallelShape> out;
  for (int pp = 1; pp <= world_size; ++pp)
    for (int ring = 1; pp * ring <= world_size; ++ring)
      for (int u = 1; pp * ring * u <= world_size; ++u)
        for (int tp = 1; pp * ring * u * tp <= world_size; ++tp) {
          ParallelShape s{pp, ring, u, tp};
          if (s.size() == world_size && model::mesh_problem(s, cfg).empty()) out.push_back(s);
        }
  return out;
}

void validate_shape(const ParallelShape& s, int world_size, const model::ModelConfig& cfg,
                    int64_t num_tokens) {
  SLOPE_CHECK(num_tokens >= 1, "the prompt is empty");
  auto ranks = [](int n) { return str_cat(n, n == 1 ? " rank" : " ranks"); };
  auto alternatives = [&] {
    std::string valid;
    for (const ParallelShape& v : all_shapes(world_size, cfg, num_tokens)) valid += "\n  " + flags(v).substr(1);
    return valid;
  };
  const std::string problem = model::mesh_problem(s, cfg);
  if (!problem.empty()) fail(problem, "; with ", ranks(world_size), " use one of:", alternatives());
  if (s.size() != world_size)
    fail(flags(s).substr(1), " needs ", ranks(s.size()), ", but ", ranks(world_size), (world_size == 1 ? " was" : " were"),
         " started; launch it with `mpirun -np ", s.size(), " slope run ...` (add --dry-run to see its memory ",
         "from one process), or with ", ranks(world_size), " use one of:", alternatives());
}

RankPlace place_of(int rank, const ParallelShape& shape) {
  RankPlace p;
  p.stage = rank / shape.stage_size();
  p.local = rank % shape.stage_size();
  p.cp_rank = p.local / shape.tp;
  p.tp_rank = p.local % shape.tp;
  return p;
}

Topology::Topology(parallel::Communicator& world, const ParallelShape& shape,
                   const parallel::DataPlaneFactory& data_plane)
    : world_(world), shape_(shape) {
  const parallel::DataPlaneFactory make = data_plane ? data_plane : parallel::host_data_plane();
  SLOPE_CHECK(world.size() == shape.size(), shape.str(), " needs ", shape.size(), " ranks, got ", world.size());
  const RankPlace place = place_of(world.rank(), shape);
  stage_ = place.stage;
  local_ = place.local;
  tp_rank_ = place.tp_rank;
  stage_comm_ = world.split(stage_, local_, "stage");
  const int T = shape.tp, cp_rank = place.cp_rank;
  world_data_ = make(world);
  if (T > 1) {
    tp_comm_ = stage_comm_->split(cp_rank, tp_rank_, "tensor");
    tp_data_ = make(*tp_comm_);
  }
  if (context_parallel()) {
    parallel::Communicator* cp = stage_comm_.get();
    if (T > 1) {
      cp_comm_ = stage_comm_->split(tp_rank_, cp_rank, "context");
      cp = cp_comm_.get();
    }
    cp_mesh_ = std::make_unique<parallel::Mesh>(*cp, model::MeshShape{.ring = shape.ring, .ulysses = shape.ulysses},
                                                data_plane);
  }
}

StagePlan Topology::stage_plan() const {
  StagePlan p;
  const int S = shape_.stage_size();
  p.stage = stage_;
  p.num_stages = shape_.pp;
  p.pipe = world_data_.get();
  p.world = &world_;
  p.prev_rank = stage_ > 0 ? world_.rank() - S : -1;
  p.next_rank = stage_ < shape_.pp - 1 ? world_.rank() + S : -1;
  if (cp_mesh_) {
    // Each chunk is sharded zigzag over the stage's ring x ulysses group, positions global.
    const parallel::Mesh* mesh = cp_mesh_.get();
    p.rows_of_chunk = [mesh](ops::Segment chunk, int64_t total) {
      return parallel::my_chunk_shard(*mesh, chunk, total);
    };
  }
  if (shape_.tp > 1) {
    parallel::DataPlane* tp = tp_data_.get();
    std::shared_ptr<int64_t> bytes = tp_bytes_;
    p.tp_allreduce = [tp, bytes](float* data, int64_t count) {
      tp->allreduce_sum(data, size_t(count));
      *bytes += count * int64_t(sizeof(float));
    };
    p.may_report_logits = tp_rank_ == 0;
  }
  return p;
}

std::vector<RankMemory> estimate_memory(const model::ModelConfig& c, const MemoryQuery& q) {
  const ParallelShape& s = q.shape;
  const std::vector<int> bounds = balance_stages(c, s.pp, q.balance_tokens > 0 ? q.balance_tokens : q.num_tokens);
  const int64_t wsz = q.bf16_weights ? 2 : 4;  // packed weight element
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  std::vector<RankMemory> out;
  for (int rank = 0; rank < s.size(); ++rank) {
    RankMemory m;
    m.rank = rank;
    m.stage = rank / s.stage_size();
    const int local = place_of(rank, s).tp_rank;
    m.first_layer = bounds[m.stage];
    m.last_layer = bounds[m.stage + 1];
    const model::TensorSlice sl = s.tp > 1 ? model::TensorSlice::of(c, local, s.tp) : model::TensorSlice::whole(c);
    const int64_t Hq = sl.q_heads, Hkv = sl.kv_heads, I = sl.inter;
    // Rows: under context parallelism about 1/(R·U) of every chunk.
    const int64_t cp = int64_t(s.ring) * s.ulysses;
    m.tokens = int64_t(q.batch) * ((q.num_tokens + cp - 1) / cp);
    // Weights, as Model::load counts them: packed linear weights, f32 norms/biases/sinks.
    // Parameter counts from model/flops.h, shared with the planner.
    const int64_t attn = int64_t(model::attention_weight_params(c, Hq, Hkv));
    const int64_t mlp = int64_t(model::mlp_weight_params(c, I));  // one expert, or the dense MLP
    int64_t per_layer = attn * wsz + (Hq + 2 * Hkv) * D * 4 + H * 4 + 2 * H * 4;
    if (c.is_moe())
      per_layer += int64_t(model::router_weight_params(c)) * wsz + c.num_experts * 4 +
                   c.num_experts * (mlp * wsz + 2 * I * 4 + H * 4) + c.num_experts * (2 * c.intermediate_size + H) * 4 +
                   c.num_heads * 4;
    else
      per_layer += mlp * wsz + (c.qk_norm ? 2 * D * 4 : 0);
    m.weights = per_layer * (m.last_layer - m.first_layer);
    if (m.stage == 0) m.weights += V * H * int64_t(dtype_size(q.checkpoint_dtype));
    if (m.stage == s.pp - 1 && local == 0) m.weights += V * H * wsz + H * 4;  // lm_head: tensor rank 0 only
    m.kv = m.tokens * (m.last_layer - m.first_layer) * int64_t(model::kv_elements_per_token_layer(c, Hkv)) * 4;  // f32
    // Activations of one chunk in one layer: residual, q, attention output, GEMM temporaries,
    // and the context-parallel exchange buffers (about the group's rows of the local heads).
    const int64_t rows = q.pp_chunk > 0 ? std::min(m.tokens / q.batch, (q.pp_chunk + cp - 1) / cp) : m.tokens / q.batch;
    const int64_t gc = std::min(q.gemm_chunk, std::max<int64_t>(rows, 1));
    // o_proj and the MLP pass over a MoE call's rows (at least the chunk, at most the shard):
    // the norm output and TP partial sums are that many rows.
    const int64_t mc = model::mlp_pass_rows(c, q.gemm_chunk, q.moe_chunk, rows);
    int64_t act = rows * H * 4 * 2 + rows * Hq * D * 4 * 2 + gc * (Hq + 2 * Hkv) * D * 4 + mc * 2 * H * 4;
    act += c.is_moe() ? mc * c.experts_per_token * (2 * H + 3 * I) * 4 + mc * c.num_experts * 4
                      : gc * 3 * I * 4;
    if (cp > 1) act += rows * s.ulysses * (Hq / s.ulysses + 2 * Hkv) * D * 4 * 2 + 2 * 2 * rows * Hkv * D * 4;
    // The attention kernel's K/V copies, kept between calls: a call sees at most one ring block's
    // keys (a prompt's tokens / R) of the KV heads left after the all-to-all.
    const int64_t call_keys = (q.num_tokens + s.ring - 1) / s.ring;
    m.attention_kept = kernels::attention_kept_bytes_bound(call_keys, s.ulysses <= Hkv ? Hkv / s.ulysses : 1, D);
    m.activations = act + m.attention_kept;
    out.push_back(m);
  }
  return out;
}

}  // namespace slope::engine
