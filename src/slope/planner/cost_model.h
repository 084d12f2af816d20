// The cost model: for a model config, a mesh, a prompt length and a hardware profile, predict
// the time to first token of one prefill, its per-phase breakdown, and the peak memory of a
// rank. Equations and assumptions are in docs/planner.md; every formula here has its line
// there. Times are seconds, sizes bytes, FLOPs counted as 2 per multiply-add.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slope/model/config.h"
#include "slope/model/flops.h"
#include "slope/model/parallel_shape.h"
#include "slope/planner/hardware_profile.h"

namespace slope::planner {

// Limits of what the model is asked to predict, checked before any arithmetic. Prompts up to
// 2^31 tokens (2048m): pair counts (~N^2/2 = 2^61) and byte counts stay far inside a double's
// range and int64 token arithmetic cannot overflow. Degrees up to 4096 and 2^16 ranks per
// instance; at most 2^16 pipeline chunks (the flow shop keeps a cost per stage and chunk).
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 31;
inline constexpr int64_t kMaxMeshDegree = 4096;
inline constexpr int64_t kMaxMeshRanks = int64_t{1} << 16;
inline constexpr int64_t kMaxPipelineChunks = int64_t{1} << 16;

// One engine instance's parallel layout: the one mesh type (model::MeshShape). Rank order:
// pipeline stage outermost, ring next, Ulysses, then tensor parallelism innermost; U·TP ranks
// share a node.
using Mesh = model::MeshShape;
// The planner's name of a mesh: "U8 R2 P2 chunk 16384", "TP8", "1 rank".
std::string mesh_name(const Mesh& mesh);

// ---- Pure arithmetic on the model (no hardware) --------------------------------------------

// Per token and layer, lm_head per token, per (query, key) pair, and the exact pair count of a
// causal (windowed) mask: the engine's counts (model/flops.h), one definition for both.
using model::attention_flops_per_pair;
using model::attention_pairs;
using model::linear_flops_per_token_layer;
using model::lm_head_flops_per_token;

struct FlopCount {
  double linear = 0;             // all layers, all tokens
  double attention_full = 0;     // full causal layers
  double attention_sliding = 0;  // sliding-window layers
  double lm_head = 0;            // last token only
  double total() const { return linear + attention_full + attention_sliding + lm_head; }
};
// model::prefill_flops(cfg, tokens), split by kind.
FlopCount prefill_flop_count(const model::ModelConfig& cfg, int64_t tokens);

// Parameter bytes as SLOPE stores them on a device: bf16 everything except norms (fp32) and,
// when the checkpoint is MXFP4, expert matrices at 4.25 bits per parameter (4-bit values plus
// one e8m0 scale per 32); expert biases stay bf16.
struct WeightBytes {
  double attention_per_layer = 0;  // q, k, v, o weights and biases, sinks
  double router_per_layer = 0;
  double mlp_per_layer = 0;        // all experts (or the dense MLP)
  double expert_bytes = 0;         // one expert (0 for dense models)
  double norms_per_layer = 0;
  double embedding = 0;
  double lm_head = 0;              // 0 when tied to the embedding
  double final_norm = 0;
  double per_layer() const { return attention_per_layer + router_per_layer + mlp_per_layer + norms_per_layer; }
  double total(int64_t layers) const { return per_layer() * layers + embedding + lm_head + final_norm; }
};
WeightBytes weight_bytes(const model::ModelConfig& cfg);

// K and V bytes of one token in one layer (bf16): 2·kv_heads·head_dim·2.
double kv_bytes_per_token_layer(const model::ModelConfig& cfg);

// Element-wise bytes per token and layer on one rank of a TP group of `tp` (norms, RoPE, the
// q/k/v split, bf16 copies of GEMM inputs, SwiGLU, MoE gather and scatter-add, residual adds):
// fused kernels, or `unfused` as SLOPE's CPU engine runs them (docs/planner.md section 1).
// `slope calibrate` times the engine's kernels and divides this count by the time, so the
// profile's element-wise rate and the model count the same bytes.
double elementwise_bytes_per_token(const model::ModelConfig& cfg, int tp, const std::string& compute_dtype,
                                   bool unfused);

// Key-equivalents a flash-attention kernel with tiles of bq query rows and bk keys executes for
// queries at global positions [q0, q1) against keys [k0, k1) under a causal mask with window
// W (0 = full): every tile with at least one visible pair is computed in full (query tiles
// start at q0, key tiles at k0), plus `row_overhead` per query row that sees any key (softmax
// and output work that does not scale with keys). With bq = 0 it is the exact pair count.
// Windows shorter than kernels::kAttentionWindowBlockMaxW take the kernel's window blocks
// whatever bq and bk: each kernels::kAttentionWindowVectorQ-row query vector (from q0)
// computes the keys from the first any row of it sees to the last (kernels/attention.h).
double attention_tile_work(int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t window, int64_t bq,
                           int64_t bk, double row_overhead);

// The engine's default pipeline chunk, max(256, ceil(N / (4P))) for P > 1, else 0: one
// definition for both (model/parallel_shape.h).
using model::default_pipeline_chunk;

// ---- The prediction -------------------------------------------------------------------------

struct CostOptions {
  std::string compute_dtype = "bf16";  // matmul and attention rates used from the profile
  double wire_bytes = 2;               // bytes per element on the wire, unless the profile's engine says
  // The profile's engine object (attention dtype, wire bytes, GEMM row blocks, unfused
  // element-wise work, attention tiles) is used unless this is false.
  bool use_engine_spec = true;
};

// Seconds on the critical path of one request; they add up to ttft_s.
struct PhaseTimes {
  double linear = 0;           // projections, router, experts / MLP
  double elementwise = 0;      // norms, RoPE, SwiGLU, residuals (memory-bound)
  double attention = 0;        // attention kernels (full and sliding layers)
  double ulysses = 0;          // all-to-alls before and after attention
  double ring_exposed = 0;     // ring transfer time not hidden behind block attention
  double halo = 0;             // sliding-window K/V halo exchange
  double tp_allreduce = 0;
  double overhead = 0;         // kernel launches
  double lm_head = 0;
  double pipeline_fill = 0;    // bubble + stage-to-stage activation transfers
  double total() const;
};

struct MemoryUse {
  double weights = 0;      // this rank's parameters
  double kv_cache = 0;     // K/V kept for the decode engine (full layers; last W for sliding)
  double attention_workspace = 0;  // gathered K/V of one layer and the ring's two buffers
  double activations = 0;  // the largest layer's working set for one chunk
  double total() const { return weights + kv_cache + attention_workspace + activations; }
};

struct Prediction {
  Mesh mesh;
  int64_t tokens = 0;
  int64_t chunks = 1;
  double ttft_s = 0;     // one request on an idle instance
  double service_s = 0;  // how long the busiest stage is occupied per request (throughput bound)
  PhaseTimes phases;     // ttft_s broken down (the busiest stage, plus pipeline fill)
  double flops_per_rank = 0;  // over the whole prefill, the busiest stage's rank
  double flops_total = 0;     // all ranks: the model's FLOPs, plus the router replicated on every TP rank
  // Bytes one rank sends over the whole prefill, per kind.
  double ulysses_bytes = 0, ring_bytes = 0, halo_bytes = 0, pipeline_bytes = 0, allreduce_bytes = 0;
  MemoryUse memory;           // the fullest rank
  double memory_capacity = 0; // usable bytes per device
  bool fits = false;
};

// Empty when the mesh can run the model on this hardware; otherwise why not: first what the
// engine itself refuses (model::mesh_problem: heads or MLP not divisible, more stages than
// layers, ...), then the hardware (Ulysses and TP group not dividing a node).
std::string mesh_problem(const model::ModelConfig& cfg, const HardwareProfile& hw, const Mesh& mesh);

// Predicts one prefill of `tokens` tokens. Throws slope::Error if mesh_problem() is non-empty,
// tokens is outside [1, kMaxContextTokens] or the chunk splits it into more than
// kMaxPipelineChunks chunks.
Prediction predict(const model::ModelConfig& cfg, const HardwareProfile& hw, const Mesh& mesh,
                   int64_t tokens, const CostOptions& opt = {});

}  // namespace slope::planner
