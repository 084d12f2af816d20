// Mixture-of-experts on the GPU (contracts: kernels/moe.h, kernels/mxfp4.h), on device
// pointers, without a host round trip between the steps:
//   route_topk_softmax     top-k logits per token, softmax over those k (the CPU's tie rule)
//   group_by_expert        slots grouped by expert, stable by token (the CPU's order), plus the
//                          inverse map slot -> grouped row
//   grouped_gemm           every expert's GEMM in one launch over a device-built tile list; the
//                          A rows gathered by token on the fly; weights bf16, or MXFP4 kept as
//                          MXFP4 in memory and dequantised per 32-wide K tile into shared memory
//   moe_combine            out[t] += Σ_j w_tj · Y[row of slot (t, j)], no atomics (deterministic)
// Row indices are int32 on the device (n·k < 2^31 is checked). No CUDA headers here.
// Not yet run on a GPU (docs/cuda.md).
#pragma once

#include <cstdint>

#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"

namespace slope::cuda {

// logits [n, E] -> ids [n, k] (descending logit; equal logits keep the lower index first),
// weights [n, k]. Throws unless 1 <= k <= min(E, 32).
void route_topk_softmax(const float* logits, int64_t n, int64_t E, int k, int32_t* ids, float* weights,
                        Stream stream = nullptr);

// Device buffers of a grouping; sized once for (n·k slots, E experts) and reusable.
class ExpertGroups {
 public:
  ExpertGroups(int64_t slots, int64_t E);
  int32_t* offsets() { return offsets_.as<int32_t>(); }  // [E + 1]
  int32_t* token() { return token_.as<int32_t>(); }      // [slots] token of each grouped row
  float* weight() { return weight_.as<float>(); }        // [slots] routing weight of each grouped row
  int32_t* slot_row() { return slot_row_.as<int32_t>(); }  // [slots] grouped row of slot s = t·k + j
  int64_t slots() const { return slots_; }
  int64_t experts() const { return E_; }
  // Synchronises `stream` and throws slope::Error if group_by_expert saw an expert id outside
  // [0, E) (those slots were dropped). Routing output is always in range; call this for ids from
  // elsewhere.
  void check(Stream stream = nullptr) const;
  int32_t* bad_ids() { return bad_.as<int32_t>(); }

 private:
  DeviceBuffer offsets_, token_, weight_, slot_row_, bad_;
  int64_t slots_ = 0, E_ = 0;
};

// ids [n, k], weights [n, k] -> g (g.slots() must be n·k, g.experts() E).
void group_by_expert(const int32_t* ids, const float* weights, int64_t n, int k, ExpertGroups& g,
                     Stream stream = nullptr);

// One launch for all experts: for each expert e and each grouped row r in
// [offsets[e], offsets[e+1]):  y[r, :] = A[a_rows ? a_rows[r] : r, :] · W_eᵀ + bias[e, :].
// A is f32 [*, K] (rounded to bf16 on load); W_e is [N, K] (torch's Linear orientation), given
// either as bf16 [E, N, K] or as MXFP4 blocks [E, N, K/32, 16] + scales [E, N, K/32] (then K %
// 32 == 0). Accumulation in f32; y is f32 [rows, N].
struct GroupedGemmArgs {
  const float* a = nullptr;
  const int32_t* a_rows = nullptr;  // [rows] or nullptr (A already grouped)
  int64_t K = 0;
  const int32_t* offsets = nullptr;  // [E + 1] on the device
  int64_t E = 0;
  int64_t rows = 0;  // offsets[E] or an upper bound of it (n·k): sizes the launch, host-known
  int64_t N = 0;
  const uint16_t* w_bf16 = nullptr;    // [E, N, K] bf16, or
  const uint8_t* w_blocks = nullptr;   // [E, N, K/32, 16] MXFP4 e2m1 pairs
  const uint8_t* w_scales = nullptr;   // [E, N, K/32] e8m0
  const float* bias = nullptr;         // [E, N] or nullptr
  float* y = nullptr;                  // [rows, N]
};
void grouped_gemm(const GroupedGemmArgs& args, Stream stream = nullptr);

// out [n, dim] += Σ_j weight(t, j) · y[slot_row[t·k + j], :] for each token t, with the weights
// taken from the grouping (g.weight at the slot's row). y: [n·k, dim] grouped rows.
void moe_combine(const float* y, ExpertGroups& g, int64_t n, int k, int64_t dim, float* out,
                 Stream stream = nullptr);

// kernels::gather_rows and kernels::scatter_add_rows with int32 rows. scatter_add_rows uses
// atomics: rows may repeat, and the summation order is then not fixed (moe_combine is).
void gather_rows(const float* src, const int32_t* rows, int64_t m, int64_t dim, float* dst, Stream stream = nullptr);
void scatter_add_rows(const float* src, const int32_t* rows, const float* w, int64_t m, int64_t dim, float* dst,
                      Stream stream = nullptr);

// kernels::mxfp4_dequantize on the device (f32 out), for checks and for callers that want a
// dequantised copy; grouped_gemm does not need it.
void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t nblocks, float* out,
                      Stream stream = nullptr);

}  // namespace slope::cuda
