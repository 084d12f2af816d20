// LSE merge and sink application (contract and math: kernels/attention_merge.h):
//   merge:  LSE = logaddexp(a, b),  O = e^{a−LSE}·O_a + e^{b−LSE}·O_b
//   sinks:  LSE' = logaddexp(LSE, sink),  O' = O·e^{LSE−LSE'}
// One warp per (row, head): every lane reads the row's LSEs, the lanes stride over head_dim,
// and lane 0 writes the new LSE after the warp has read the old one. The per-row weights are
// computed in double, as on the CPU. -inf LSE = no visible key: weight 0, never −inf − −inf.
#include "slope/cuda/attention_merge.h"

#include <cmath>

#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ double logaddexp(double a, double b) {
  const double hi = fmax(a, b), lo = fmin(a, b);
  if (isinf(lo) && lo < 0) return hi;
  return hi + log1p(exp(lo - hi));
}

__global__ void merge_kernel(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t rows,
                             int64_t D) {
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= rows) return;
  const double a = lse_a[t], b = lse_b[t];
  if (isinf(b) && b < 0) return;  // b contributes nothing
  float* oa = out_a + t * D;
  const float* ob = out_b + t * D;
  if (isinf(a) && a < 0) {  // a is empty: take b
    for (int64_t d = lane; d < D; d += 32) oa[d] = ob[d];
  } else {
    const double lse = logaddexp(a, b);
    const float wa = float(exp(a - lse)), wb = float(exp(b - lse));
    for (int64_t d = lane; d < D; d += 32) oa[d] = wa * oa[d] + wb * ob[d];
  }
  __syncwarp();
  if (lane == 0) lse_a[t] = (isinf(a) && a < 0) ? float(b) : float(logaddexp(a, b));
}

__global__ void sinks_kernel(float* out, float* lse, const float* sinks, int64_t rows, int64_t H, int64_t D) {
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= rows) return;
  const double l = lse[t];
  const double l2 = logaddexp(l, sinks[t % H]);
  if (isinf(l2) && l2 < 0) return;  // both -inf: the row stays empty
  const float f = float(exp(l - l2));
  float* o = out + t * D;
  for (int64_t d = lane; d < D; d += 32) o[d] *= f;
  __syncwarp();
  if (lane == 0) lse[t] = float(l2);
}

unsigned blocks_for(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n, int64_t H,
                     int64_t D, Stream stream) {
  const int64_t rows = n * H;
  if (rows <= 0 || D <= 0) return;
  SLOPE_CHECK(out_a && lse_a && out_b && lse_b, "cuda::attention_merge: null device pointer");
  merge_kernel<<<blocks_for(rows), 32 * kWarpsPerBlock, 0, stream>>>(out_a, lse_a, out_b, lse_b, rows, D);
  SLOPE_CUDA_CHECK_LAUNCH("merge_kernel");
}

void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H, int64_t D,
                           Stream stream) {
  const int64_t rows = n * H;
  if (rows <= 0 || D <= 0) return;
  SLOPE_CHECK(out && lse && sinks, "cuda::attention_apply_sinks: null device pointer");
  sinks_kernel<<<blocks_for(rows), 32 * kWarpsPerBlock, 0, stream>>>(out, lse, sinks, rows, H, D);
  SLOPE_CUDA_CHECK_LAUNCH("sinks_kernel");
}

}  // namespace slope::cuda
