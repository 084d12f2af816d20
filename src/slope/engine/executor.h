// The general prefill executor: one or more prompts, each cut into chunks, flowing through the
// pipeline stages (layers split over ranks), with context or tensor parallelism inside a stage.
//
// Per rank, work items are (prompt b, chunk c) in order b-major. For each item the rank
//   1. takes its rows of the chunk (all of them; or its zigzag shard under context parallelism),
//   2. gets their hidden state: the embedding on the first stage, else a receive from the rank
//      at the same position of the previous stage (every stage lays rows out the same way),
//   3. runs its stage's layers; attention for chunk c reads the KV of chunks 0..c of prompt b
//      that this rank holds (AttentionRunner does the rest),
//   4. sends the hidden state on to the next stage without waiting (non-blocking), or, on the
//      last stage, produces the logits if it holds the prompt's last position.
// Stage s works on item i while stage s+1 works on item i-1: chunked pipelining. With one stage
// and one chunk this is a plain prefill.
#pragma once

#include <functional>
#include <vector>

#include "slope/engine/prefill.h"
#include "slope/parallel/comm.h"
#include "slope/parallel/data_plane.h"

namespace slope::engine {

struct StagePlan {
  int stage = 0;
  int num_stages = 1;
  // Neighbours on the pipeline's data plane (-1 at the ends): activations move over it.
  parallel::DataPlane* pipe = nullptr;
  int prev_rank = -1;
  int next_rank = -1;
  // This rank's rows of a chunk [start, start + length) of a prompt of total_tokens tokens.
  // Default: the whole chunk.
  std::function<ops::SequenceShard(ops::Segment chunk, int64_t total_tokens)> rows_of_chunk;
  // Tensor parallelism: sum partial results over the tensor group (empty: none).
  model::AllReduceFn tp_allreduce;
  // False on ranks whose logits would duplicate another's (tensor ranks other than 0).
  bool may_report_logits = true;
  // Every rank of the prefill (null: this rank computes it alone). The check for non-finite
  // values is combined over it, so that all ranks fail together, naming the same layer.
  parallel::Communicator* world = nullptr;
};

// Runs every prompt through this rank's layers (model.first_layer() .. last_layer()).
// chunk_tokens <= 0 means one chunk per prompt. Results are per prompt; `shard` in each is this
// rank's rows of that prompt in buffer order (chunk by chunk).
//
// A non-finite result is never returned: the hidden state after the embedding and after every
// layer, each layer's K/V and the logits are scanned for NaN and Inf (one pass each, cheap next
// to the layer), and if any holds one, every rank of plan.world throws slope::Error naming the
// first place (embedding, layer l, or final norm / lm_head) where it appeared.
//
// `pipeline` (if given) gets the stage-to-stage waits (PipeRecvWait, PipeSendWait) and the
// activation bytes sent and received; each prompt's own phases are in its result's ledger.
std::vector<PrefillResult> run_prefill(const model::Model& model,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       int64_t chunk_tokens, const StagePlan& plan,
                                       ops::AttentionRunner& runner, const PrefillOptions& opts,
                                       Ledger* pipeline = nullptr);

// The pipeline's stage split (model/flops.h), the one the planner predicts with.
using model::balance_stages;

}  // namespace slope::engine
