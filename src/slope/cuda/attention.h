// Flash-style prefill attention on the GPU, with the contract of kernels/attention.h: out and
// lse for a block of queries at global positions against a block of keys, causal, sliding
// window, sinks and GQA, so the context-parallel steps call it as they call the CPU kernel.
// All pointers are device pointers. No CUDA headers here: the CPU side can include this.
//
// Precision: q, k, v and the probabilities enter the tensor cores as bf16 (mma.sync m16n8k16,
// sm_80 and sm_90), scores, the softmax and the output accumulate in f32. So even the f32 entry
// point matches the CPU kernel only within the bf16 bound, not the f32 one.
//
// Status: compiled for sm_80 and sm_90 and tested against the CPU kernel by tests/gpu, but not
// yet run on a GPU (docs/cuda.md).
#pragma once

#include <cstdint>

#include "slope/cuda/device.h"
#include "slope/kernels/attention.h"

namespace slope::cuda {

// The CPU contract on device pointers: q, k, v f32, out f32, lse f32, sinks f32 or nullptr.
// Throws slope::Error for shapes the kernel does not take (head_dim > 256, Hq % Hkv != 0).
void flash_attention(const kernels::AttentionArgs& args, Stream stream = nullptr);

// The same with bf16 q, k, v (raw bf16 bits); out and lse stay f32 so partial results merge
// exactly as on the CPU (attention_merge.h).
struct AttentionArgsBf16 {
  const uint16_t* q = nullptr;  // [nq, Hq, D]
  int64_t nq = 0;
  int64_t q_pos0 = 0;
  const uint16_t* k = nullptr;  // [nk, Hkv, D]
  const uint16_t* v = nullptr;  // [nk, Hkv, D]
  int64_t nk = 0;
  int64_t kv_pos0 = 0;
  kernels::AttentionShape shape;
  kernels::AttentionMask mask;
  float scale = 1.f;
  const float* sinks = nullptr;  // [Hq] or nullptr
  float* out = nullptr;          // [nq, Hq, D]
  float* lse = nullptr;          // [nq, Hq]
};
void flash_attention(const AttentionArgsBf16& args, Stream stream = nullptr);

// The largest head_dim the kernel takes (it pads head_dim up to 32, 64, 128 or 256).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

}  // namespace slope::cuda
