// The prefill executor: a prompt's token ids in, the first token, the last position's logits
// and every layer's KV cache out. It runs the tokens a rank holds (its SequenceShard) through
// all loaded layers, layer by layer; the AttentionRunner decides where other tokens' K/V come
// from, so the same executor serves one rank and every context-parallel mesh.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/ops/attention_runner.h"
#include "slope/model/flops.h"
#include "slope/model/model.h"

namespace slope::engine {

struct PrefillOptions {
  int64_t chunk_tokens = 1024;  // rows per GEMM chunk of the token-local work
  int64_t moe_chunk_tokens = model::kDefaultMoeChunk;  // rows per MoE call (LayerContext::moe_chunk)
  int top_k = 5;                // top logprobs reported for the last position
  bool keep_kv = true;          // keep every layer's K/V (else one reused buffer)
  // Called after each decoder layer of each chunk (run_prefill): progress on a terminal.
  std::function<void(const struct PrefillProgress&)> on_progress;
  // Per-layer buffers to reuse (a long-lived engine's); nullptr: run_prefill makes its own.
  model::LayerBuffers* buffers = nullptr;
};

// Where a prefill is: this rank's stage has run `layer` of `layers` layers of the chunk that
// ends at token `tokens_done` of prompt `prompt` (of `prompts`), which has `tokens` tokens.
struct PrefillProgress {
  int prompt = 0, prompts = 1;
  int64_t tokens_done = 0, tokens = 0;
  int layer = 0, layers = 0;
};

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct PrefillResult {
  ops::SequenceShard shard;  // the rows this rank computed
  // Set on the rank that holds the last position only.
  bool has_logits = false;
  std::vector<float> logits;  // [vocab] f32
  int32_t first_token = -1;   // greedy
  std::vector<TopLogprob> top_logprobs;
  // Per layer [local rows, Hkv, D]: K after RoPE, and V (empty unless keep_kv).
  std::vector<Tensor> k, v;
  Ledger ledger;       // this prompt's phases on this rank (the layer's, embed, lm_head)
  double seconds = 0;  // wall time of the whole prefill on this rank
};

// tokens: the whole prompt (already validated); shard: which of its positions this rank holds.
PrefillResult prefill(const model::Model& model, const std::vector<int32_t>& tokens,
                      const ops::SequenceShard& shard, ops::AttentionRunner& runner,
                      const PrefillOptions& opts = {});

// Greedy token and the top-k log-probabilities (log-softmax in double) of a logits row.
std::vector<TopLogprob> top_logprobs(const float* logits, int64_t vocab, int k);

// FLOPs of one layer and of a whole prefill of n tokens (linear layers with the experts actually
// active, the attention under its masks, lm_head for the last position only): the one count the
// planner uses too (model/flops.h).
using model::layer_flops;
using model::prefill_flops;

}  // namespace slope::engine
