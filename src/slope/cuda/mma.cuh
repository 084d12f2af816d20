// Tensor-core building blocks shared by the attention and grouped-GEMM kernels: the
// mma.sync.m16n8k16 bf16 instruction (sm_80 and later, so A100 and H100/H200 both run it) and
// its register layouts. For a warp, g = lane / 4 and t = lane % 4:
//   A (16×16, row-major):  a0 = A[g][2t..2t+1],   a1 = A[g+8][2t..],  a2 = A[g][2t+8..],  a3 = A[g+8][2t+8..]
//   B (16×8, k-major per column n):  b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
//   C (16×8, f32):  c0,c1 = C[g][2t], C[g][2t+1];   c2,c3 = C[g+8][2t], C[g+8][2t+1]
// Each 32-bit register holds two bf16, the lower index in the low half.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace slope::cuda::detail {

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one bf16 pair register, `lo` in the low half (round to nearest even).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The 32 bits at an even bf16 index of shared memory.
__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(__nv_bfloat16 x) { return x; }

}  // namespace slope::cuda::detail
