// What a multi-rank prefill does after the forward pass: bring the first token and logits to
// every rank, gather per-rank reports to rank 0, and (for checks) assemble the whole KV cache
// on one rank. Works for any layout of positions over ranks (context parallel shards, pipeline
// stages holding different layers).
#pragma once

#include <cstdint>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/engine/prefill.h"
#include "slope/model/config.h"
#include "slope/parallel/comm.h"

namespace slope::engine {

// Copies logits, first token and top logprobs from the rank whose result has_logits to every
// rank of `comm` (exactly one rank must hold them).
void share_logits(PrefillResult& r, parallel::Communicator& comm, int top_k);

// Per-rank figures for the report.
struct RankReport {
  int rank = 0;
  int stage = 0;
  int64_t tokens = 0;
  double prefill_seconds = 0;
  double attention_seconds = 0;      // whole attention phase (compute + communication)
  double cp_compute_seconds = 0;     // attention kernels inside the CP runner
  double cp_comm_seconds = 0;        // transfer lifetimes (overlapped or not)
  double cp_wait_seconds = 0;        // blocked waiting on communication
  double other_compute_seconds = 0;  // embed, qkv, o_proj, mlp, lm_head
  double pipe_wait_seconds = 0;      // blocked on pipeline activations (receive, final sends)
  double tp_seconds = 0;             // tensor-parallel all-reduces
  int64_t bytes_sent = 0;            // all parallel traffic: CP, pipeline, tensor parallel
  int64_t bytes_received = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t activation_bytes = 0;  // predicted (engine::estimate_memory)
  int64_t peak_rss_bytes = 0;
  int64_t rss_bytes = 0;  // resident memory at the end of the prefill
};
// All ranks' reports on root (in rank order), empty elsewhere.
std::vector<RankReport> gather_reports(const RankReport& mine, parallel::Communicator& comm,
                                       int root = 0);

// The whole KV cache assembled in global order on root: k[l], v[l] = [N, Hkv, D] for every
// layer of the model. Each rank contributes its rows (r.shard) of its layers (from first_layer)
// and its KV heads [kv_head0, kv_head0 + heads) (tensor parallelism); replicated heads are
// written more than once with equal values. Other ranks get empty vectors.
void gather_kv(const PrefillResult& r, int first_layer, int64_t kv_head0,
               const model::ModelConfig& cfg, parallel::Communicator& comm, std::vector<Tensor>& k,
               std::vector<Tensor>& v, int root = 0);

// Relative error max|a - b| / max|b| (norm-wise), used by every "same as one rank" check.
double relative_error(const float* a, const float* b, int64_t n);

}  // namespace slope::engine
