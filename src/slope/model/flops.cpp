#include "slope/model/flops.h"

#include <algorithm>
#include <limits>

#include "slope/core/error.h"

namespace slope::model {

double attention_weight_params(const ModelConfig& c, int64_t q_heads, int64_t kv_heads) {
  const double h = double(c.hidden_size), d = double(c.head_dim);
  return h * double(q_heads + 2 * kv_heads) * d + double(q_heads) * d * h;
}

double mlp_weight_params(const ModelConfig& c, int64_t inter) { return 3.0 * double(c.hidden_size) * double(inter); }

double router_weight_params(const ModelConfig& c) {
  return c.is_moe() ? double(c.num_experts) * double(c.hidden_size) : 0.0;
}

double kv_elements_per_token_layer(const ModelConfig& c, int64_t kv_heads) {
  return 2.0 * double(kv_heads) * double(c.head_dim);
}

double router_flops_per_token_layer(const ModelConfig& c) { return 2 * router_weight_params(c); }

double linear_flops_per_token_layer(const ModelConfig& c) {
  const double experts = c.is_moe() ? double(c.experts_per_token) : 1.0;
  return 2 * attention_weight_params(c, c.num_heads, c.num_kv_heads) + router_flops_per_token_layer(c) +
         experts * 2 * mlp_weight_params(c, c.intermediate_size);
}

double lm_head_flops_per_token(const ModelConfig& c) { return 2.0 * double(c.hidden_size) * double(c.vocab_size); }

double attention_flops_per_pair(const ModelConfig& c) { return 4.0 * double(c.num_heads) * double(c.head_dim); }

double attention_pairs(int64_t q0, int64_t q1, int64_t window) {
  if (q1 <= q0) return 0;
  // Full causal: query q sees q+1 keys, Σ_{q=q0}^{q1-1} (q+1) = (q1(q1+1) - q0(q0+1)) / 2.
  auto tri = [](double n) { return n * (n + 1) / 2; };
  if (window <= 0) return tri(double(q1)) - tri(double(q0));
  // Window W: query q sees min(q+1, W) keys; queries below W-1 see q+1, the rest W.
  const int64_t split = std::clamp<int64_t>(window - 1, q0, q1);  // first q with q+1 >= W
  return (tri(double(split)) - tri(double(q0))) + double(window) * double(q1 - split);
}

int64_t layer_window(const ModelConfig& c, int64_t layer) {
  if (c.layer_window.empty()) return 0;
  return c.layer_window.at(size_t(layer));
}

double layer_flops(const ModelConfig& c, int64_t layer, int64_t n) {
  return linear_flops_per_token_layer(c) * double(n) +
         attention_flops_per_pair(c) * attention_pairs(0, n, layer_window(c, layer));
}

double prefill_flops(const ModelConfig& c, int64_t n) {
  double total = lm_head_flops_per_token(c);  // the last position only
  for (int64_t l = 0; l < c.num_layers; ++l) total += layer_flops(c, l, n);
  return total;
}

std::vector<int> balance_stages(const model::ModelConfig& cfg, int stages, int64_t num_tokens) {
  const int L = int(cfg.num_layers);
  SLOPE_CHECK(stages >= 1 && stages <= L, "--pp ", stages, " needs between 1 and ", L,
              " stages (the model has ", L, " layers)");
  std::vector<double> cost(L);
  for (int l = 0; l < L; ++l) cost[l] = layer_flops(cfg, l, num_tokens);
  std::vector<double> prefix(L + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + cost[l];
  // best[s][l]: minimal max-stage cost of the first l layers in s stages (each stage >= 1 layer).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int l = s; l <= L; ++l)
      for (int j = s - 1; j < l; ++j) {
        const double v = std::max(best[s - 1][j], prefix[l] - prefix[j]);
        if (v < best[s][l]) {
          best[s][l] = v;
          cut[s][l] = j;
        }
      }
  std::vector<int> bounds(stages + 1);
  bounds[stages] = L;
  for (int s = stages; s > 0; --s) bounds[s - 1] = cut[s][bounds[s]];
  return bounds;
}

}  // namespace slope::model
