// Mixture-of-experts building blocks: routing, grouping tokens by expert so each expert runs
// one GEMM over all its tokens, activations, and the weighted scatter-add back to tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace slope::kernels {

// gpt-oss routing: per token take the top-k router logits, then softmax over those k only.
// logits [n, E] -> ids [n, k] (descending logit), weights [n, k].
void route_topk_softmax(const float* logits, int64_t n, int64_t E, int k, int32_t* ids,
                        float* weights);

// Tokens grouped by expert. Slot s = t·k + j is token t's j-th choice.
struct ExpertGroups {
  std::vector<int64_t> offsets;  // [E + 1]: expert e owns rows offsets[e] .. offsets[e+1]-1
  std::vector<int64_t> token;    // [n·k] token index of each grouped row
  std::vector<float> weight;     // [n·k] routing weight of each grouped row
};
ExpertGroups group_by_expert(const int32_t* ids, const float* weights, int64_t n, int k,
                             int64_t E);

// dst[r, :] = src[rows[r], :] for r in [0, m): src [*, dim], dst [m, dim].
void gather_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst);
// The same with each element rounded to bf16 (nearest even): the input rows of a bf16 expert
// GEMM (gemm.h Linear::forward_bf16) in one pass rather than a gather and a conversion.
void gather_rows_bf16(const float* src, const int64_t* rows, int64_t m, int64_t dim, uint16_t* dst);
// dst[rows[r], :] += w[r] · src[r, :]. Serial over r within a call (rows may repeat).
void scatter_add_rows(const float* src, const int64_t* rows, const float* w, int64_t m,
                      int64_t dim, float* dst);

// The same sum over all grouped rows at once, parallel over the tokens rather than the columns:
// dst[t, :] += Σ w[r] · src[r, :] over the rows r with rows[r] == t, added in ascending r. Equal
// bit for bit to scatter_add_rows(src, rows, w, m, dim, dst) (the same additions in the same
// order per element), so one call after all experts (src [n·k, dim] in ExpertGroups order) equals
// a scatter_add_rows per expert in expert order, with one pass over dst instead of k.
void combine_rows(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim, float* dst);

// gpt-oss clamped SwiGLU on interleaved gate/up: gu [m, 2I] with gate = gu[:, 0::2],
// up = gu[:, 1::2]; gate = min(gate, limit); up = clamp(up, -limit, limit);
// out [m, I] = (up + 1) · gate · sigmoid(alpha · gate).
void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out);
// The same with out rounded to bf16 (nearest even): equal to to_bf16(swiglu_oai(...)), the input
// of a bf16 down GEMM, in one pass.
void swiglu_oai_bf16(const float* gu, int64_t m, int64_t I, float alpha, float limit, uint16_t* out);

// Llama/Qwen SwiGLU: out [m, I] = silu(gate) · up, with gate_up [m, 2I] = [gate | up] halves.
void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out);

}  // namespace slope::kernels
