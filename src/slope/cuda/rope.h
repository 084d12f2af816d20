// Rotary position embedding on the GPU with the contract of kernels/rope.h (NeoX "rotate half",
// HF's default, llama3 and yarn frequencies, yarn's attention scaling), on device pointers.
// The frequencies come from kernels::Rope, so both backends share one definition of them.
// No CUDA headers. Not yet run on a GPU.
#pragma once

#include <cstdint>

#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"
#include "slope/kernels/rope.h"

namespace slope::cuda {

class Rope {
 public:
  Rope() = default;
  explicit Rope(const kernels::RopeConfig& cfg);  // throws as kernels::Rope does for bad configs
  explicit Rope(const kernels::Rope& host);       // the same frequencies as a host Rope

  // Rotates x [n, H, head_dim] in place; row i at global position pos0 + i.
  void apply(float* x, int64_t n, int64_t H, int64_t pos0, Stream stream = nullptr) const;
  // Rows at arbitrary positions pos[n] (a device array).
  void apply(float* x, int64_t n, int64_t H, const int64_t* pos, Stream stream = nullptr) const;
  // bf16 activations (raw bits), rotated in f32 and rounded back once.
  void apply_bf16(uint16_t* x, int64_t n, int64_t H, int64_t pos0, Stream stream = nullptr) const;

  int64_t head_dim() const { return head_dim_; }

 private:
  DeviceBuffer inv_freq_;  // [head_dim / 2] f64
  double attention_scaling_ = 1.0;
  int64_t head_dim_ = 0;
};

}  // namespace slope::cuda
