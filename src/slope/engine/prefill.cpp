#include "slope/engine/prefill.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/engine/executor.h"
#include "slope/kernels/attention.h"

namespace slope::engine {

PrefillResult prefill(const model::Model& model, const std::vector<int32_t>& tokens,
                      const ops::SequenceShard& shard, ops::AttentionRunner& runner,
                      const PrefillOptions& opts) {
  SLOPE_CHECK(shard.total_tokens == int64_t(tokens.size()), "shard covers ", shard.total_tokens,
              " tokens but the prompt has ", tokens.size());
  StagePlan plan;  // one stage, one chunk: this rank's rows are `shard`
  plan.rows_of_chunk = [&](ops::Segment, int64_t) { return shard; };
  return std::move(run_prefill(model, {tokens}, 0, plan, runner, opts)[0]);
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

}  // namespace slope::engine
