// The SwiGLU variants of kernels/moe.h on device pointers (f32): gpt-oss's clamped SwiGLU on
// interleaved gate/up and llama/qwen's silu(gate)·up on [gate | up] halves. No CUDA headers.
// Not yet run on a GPU.
#pragma once

#include <cstdint>

#include "slope/cuda/device.h"

namespace slope::cuda {

// gu [m, 2I] interleaved (gate = gu[:, 0::2], up = gu[:, 1::2]) -> out [m, I] =
// (clamp(up, −limit, limit) + 1) · g · sigmoid(alpha · g), g = min(gate, limit).
void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out,
                Stream stream = nullptr);

// gate_up [m, 2I] = [gate | up] -> out [m, I] = silu(gate) · up.
void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out, Stream stream = nullptr);

}  // namespace slope::cuda
