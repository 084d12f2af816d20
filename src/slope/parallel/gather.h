// Collecting per-rank results in sequence order: the engine's last step (logits of the last
// position, KV written by one rank, results compared in tests).
#pragma once

#include <cstdint>
#include <vector>

#include "slope/ops/attention_runner.h"
#include "slope/parallel/comm.h"

namespace slope::parallel {

// The rank (index into shards) holding global position p; -1 if none does.
int rank_holding(const std::vector<ops::SequenceShard>& shards, int64_t position);

// Rows of every rank (shards[i] = rank i's tokens in buffer order; `mine` = this rank's rows,
// row_elems floats each) gathered on `root` in global position order: [N, row_elems] there,
// empty elsewhere. Collective over comm.
std::vector<float> gather_sequence(Communicator& comm,
                                   const std::vector<ops::SequenceShard>& shards,
                                   const float* mine, int64_t row_elems, int root);

}  // namespace slope::parallel
