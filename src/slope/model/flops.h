// The arithmetic of a prefill that the engine (--dry-run, stage balancing, reported GFLOP/s)
// and the planner (cost model) must count the same way: FLOPs (2 per multiply-add) and the
// sizes of weights and K/V, from the model config alone. Biases, norms and activations are not
// counted as FLOPs.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/model/config.h"

namespace slope::model {

// ---- Sizes (element counts; callers multiply by their element size) -------------------------

// q, k, v and o projection weights of one layer for a rank holding q_heads query and kv_heads
// KV heads: hidden·(q_heads + 2·kv_heads)·head_dim + q_heads·head_dim·hidden.
double attention_weight_params(const ModelConfig& cfg, int64_t q_heads, int64_t kv_heads);
// gate, up and down weights of one expert (or of the dense MLP) over `inter` intermediate
// columns: 3·hidden·inter.
double mlp_weight_params(const ModelConfig& cfg, int64_t inter);
// Router weight of one layer: experts·hidden (0 for dense models).
double router_weight_params(const ModelConfig& cfg);
// K and V of one token in one layer for kv_heads heads: 2·kv_heads·head_dim.
double kv_elements_per_token_layer(const ModelConfig& cfg, int64_t kv_heads);

// ---- FLOPs ------------------------------------------------------------------------------------

// Per token and layer, the whole model: attention projections, router and the top-k experts, or
// the dense SwiGLU MLP.
double linear_flops_per_token_layer(const ModelConfig& cfg);
// Router part of linear_flops_per_token_layer (0 for dense models).
double router_flops_per_token_layer(const ModelConfig& cfg);
// lm_head for one token: 2·hidden·vocab.
double lm_head_flops_per_token(const ModelConfig& cfg);
// FLOPs of one (query, key) pair in one layer, QK and PV over all query heads: 4·heads·head_dim.
double attention_flops_per_pair(const ModelConfig& cfg);
// Exact number of (query, key) pairs a causal mask with window W (0 = full) keeps for the
// queries at global positions [q0, q1): Σ_q min(q + 1, W).
double attention_pairs(int64_t q0, int64_t q1, int64_t window);
// Window of layer `layer` (0 = full causal).
int64_t layer_window(const ModelConfig& cfg, int64_t layer);

// Layer `layer` over a prompt of n tokens: its linear layers (active experts only) and its
// attention under the layer's mask.
double layer_flops(const ModelConfig& cfg, int64_t layer, int64_t n);

// Contiguous layer ranges for `stages` pipeline stages that balance the predicted cost of a
// prompt of num_tokens tokens (linear layers plus attention under each layer's mask): returns
// stages + 1 boundaries, first 0, last num_layers. The embedding lives on the first stage and
// the final norm + lm_head on the last (their compute is one lookup and one row).
// Throws slope::Error unless 1 <= stages <= layers. The engine splits its pipeline this way and
// the planner predicts the same split.
std::vector<int> balance_stages(const ModelConfig& cfg, int stages, int64_t num_tokens);
// A whole prefill of n tokens: every layer, and lm_head for the last position only.
double prefill_flops(const ModelConfig& cfg, int64_t n);

}  // namespace slope::model
