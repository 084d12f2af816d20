// `slope run --check`: a mesh's prefill against the same prompt on one rank, with the tolerance
// of the compute type.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"

namespace slope::engine {

// Relative error (max-norm) allowed between a mesh and one rank.
//  f32: 1e-4, as for every parallel test; the results differ only by summation order.
//  bf16: activations are rounded to bf16 before every GEMM, so a change of summation order
//  anywhere (LSE merge of attention partials, GEMM blocking for another row count) can move a
//  rounded activation by one bf16 ulp (4e-3 relative); through attention that reaches every
//  later row. Measured on the bench model (4 ranks, 512 tokens): logits 6e-3, KV 8e-2.
//  A MoE router can also sit within one such rounding of a tie between two experts for some
//  token: then the two runs send it to different experts and its K/V rows differ by O(1) from
//  the next layer on, while every other row agrees (gpt-oss tiny, 96 tokens, ring 2 x Ulysses 2:
//  one row of 96, 0.30, from layer 2). So bf16 allows that many rows per layer past the KV
//  tolerance: 1, or 1% of the rows; f32 allows none.
struct CheckTolerance {
  double logits, kv;
  double kv_rows_fraction;  // of a layer's rows that may be past `kv` (at least 1 if > 0)
};
CheckTolerance check_tolerance(kernels::ComputeType ct);

struct CheckResult {
  double logits_rel_err = 0, kv_rel_err = 0;
  int64_t kv_rows_over = 0;     // the most rows of one layer's K or V past the KV tolerance
  int64_t kv_rows_allowed = 0;  // ... and how many the tolerance allows
  bool same_first_token = false;
  bool pass = false;
};

// One prompt: the mesh's logits, first token and per-layer K, V ([rows, ...], gathered over
// ranks) against one rank's. Throws when the two disagree in shape.
CheckResult compare_with_one_rank(const std::vector<float>& logits, int32_t first_token,
                                  const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                                  const std::vector<float>& one_logits, int32_t one_first_token,
                                  const std::vector<Tensor>& one_k, const std::vector<Tensor>& one_v,
                                  CheckTolerance tol);

}  // namespace slope::engine
