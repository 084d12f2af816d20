#include "slope/engine/prefill.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/kernels/attention.h"

namespace slope::engine {

PrefillResult prefill(const model::Model& model, const std::vector<int32_t>& tokens,
                      const model::SequenceShard& shard, model::AttentionRunner& runner,
                      const PrefillOptions& opts) {
  const model::ModelConfig& c = model.config();
  const double t0 = now_seconds();
  PrefillResult r;
  r.shard = shard;
  const int64_t n = shard.local_tokens();
  const int64_t H = c.hidden_size, kvw = c.num_kv_heads * c.head_dim;
  SLOPE_CHECK(shard.total_tokens == int64_t(tokens.size()), "shard covers ", shard.total_tokens,
              " tokens but the prompt has ", tokens.size());

  // h [n, H]: the residual stream of this rank's rows.
  Tensor h({n, H}, DType::F32);
  {
    double te = now_seconds();
    std::vector<int32_t> local;
    local.reserve(n);
    for (int64_t p : shard.positions()) local.push_back(tokens[p]);
    model.embed(local.data(), n, h.data<float>());
    r.times.embed += now_seconds() - te;
  }

  const model::LayerContext ctx = model.layer_context(opts.chunk_tokens, &r.times);
  Tensor k_buf, v_buf;
  for (int i = model.first_layer(); i < model.last_layer(); ++i) {
    if (opts.keep_kv || k_buf.empty()) {
      k_buf = Tensor({n, c.num_kv_heads, c.head_dim}, DType::F32);
      v_buf = Tensor({n, c.num_kv_heads, c.head_dim}, DType::F32);
    }
    model::decoder_layer_forward(ctx, i, model.layer(i), h.data<float>(), shard, runner,
                                 k_buf.data<float>(), v_buf.data<float>(), 0, shard);
    if (opts.keep_kv) {
      r.k.push_back(k_buf);
      r.v.push_back(v_buf);
    }
  }
  (void)kvw;

  const int64_t last = shard.local_index(shard.total_tokens - 1);
  if (last >= 0) {
    const double tl = now_seconds();
    r.has_logits = true;
    r.logits.resize(c.vocab_size);
    model.logits(h.data<float>() + last * H, r.logits.data());
    r.top_logprobs = top_logprobs(r.logits.data(), c.vocab_size, std::max(1, opts.top_k));
    r.first_token = r.top_logprobs[0].token;
    r.times.lm_head += now_seconds() - tl;
  }
  r.seconds = now_seconds() - t0;
  return r;
}

std::vector<TopLogprob> top_logprobs(const float* logits, int64_t vocab, int k) {
  k = int(std::min<int64_t>(k, vocab));
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  // Highest logit first; ties to the lower id (as argmax does).
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<TopLogprob> out(k);
  for (int i = 0; i < k; ++i) out[i] = {idx[i], float(double(logits[idx[i]]) - lse)};
  return out;
}

double prefill_flops(const model::ModelConfig& c, int64_t n) {
  const double H = double(c.hidden_size), D = double(c.head_dim);
  const double qw = double(c.num_heads) * D, kw = double(c.num_kv_heads) * D;
  const double I = double(c.intermediate_size);
  double per_token = 2 * H * (qw + 2 * kw) + 2 * qw * H;  // qkv + o
  if (c.is_moe())
    per_token += 2 * H * c.num_experts + c.experts_per_token * (2 * H * 2 * I + 2 * I * H);
  else
    per_token += 2 * H * 2 * I + 2 * I * H;
  double total = per_token * double(n) * double(c.num_layers);
  kernels::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    kernels::AttentionMask mask{true, c.layer_window[i]};
    total += kernels::attention_flops(n, 0, n, 0, shape, mask);
  }
  total += 2 * H * double(c.vocab_size);  // lm_head, last position only
  return total;
}

}  // namespace slope::engine
