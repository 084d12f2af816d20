// The op interface: every kernel the model and the parallel algorithms run on activations is
// reached through an ops::Backend, the implementation of the ops for one device. The CPU
// backend (ops/cpu/backend_cpu.cpp) calls the kernels of kernels/; a CUDA backend is another
// implementation of the same interface (ops/cuda/backend_cuda.cu, calling cuda/ kernels), handed
// to the engine in EngineConfig::backend. model/ and parallel/ hold a `const Backend&` and never
// name a device, so adding a device adds files and touches neither.
//
// One interface object per device rather than a switch per op: a rank runs on one device, chosen
// once when the engine is built, and injecting the backend (like the data plane,
// parallel/data_plane.h) keeps the model and the parallel code free of #ifdefs.
//
// Contracts: each op is the kernel contract of the same name in kernels/*.h (shapes, layouts,
// masks, tolerances), on pointers to memory of device(). Token ids and positions are host
// arrays (the backend copies them over if it needs them on the device). Weights arrive in host
// memory (the mmap'd checkpoint) and are packed onto the device by linear() and upload().
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/gemm.h"
#include "slope/kernels/norm.h"
#include "slope/kernels/rope.h"

namespace slope::ops {

// A weight matrix packed for one backend: y[M, N] = x[M, K] · Wᵀ (+ b).
class LinearImpl {
 public:
  virtual ~LinearImpl() = default;
  virtual void forward(const float* x, int64_t M, float* y, bool accumulate) const = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual size_t weight_bytes() const = 0;
};

// What the model holds for a linear layer, whatever the device.
class Linear {
 public:
  Linear() = default;
  explicit Linear(std::shared_ptr<const LinearImpl> impl) : impl_(std::move(impl)) {}
  // y[M, N] = x[M, K] · Wᵀ (+ bias); with accumulate, y += instead.
  void forward(const float* x, int64_t M, float* y, bool accumulate = false) const { impl_->forward(x, M, y, accumulate); }
  int64_t in_features() const { return impl_->in_features(); }
  int64_t out_features() const { return impl_->out_features(); }
  size_t weight_bytes() const { return impl_ ? impl_->weight_bytes() : 0; }
  bool empty() const { return impl_ == nullptr; }
  const LinearImpl* impl() const { return impl_.get(); }  // for the backend that made it

 private:
  std::shared_ptr<const LinearImpl> impl_;
};

// Tokens grouped by expert (kernels/moe.h ExpertGroups): the offsets drive one GEMM per expert
// from the host, so they are host data; token and weight are device arrays.
struct ExpertRouting {
  std::vector<int64_t> offsets;  // [E + 1]: expert e owns grouped rows offsets[e] .. offsets[e+1]-1
  Tensor token;                  // I64 [n·k] token of each grouped row
  Tensor weight;                 // F32 [n·k] routing weight of each grouped row

  // The most grouped rows one expert owns (the size of a per-expert buffer).
  int64_t max_rows() const {
    int64_t m = 0;
    for (size_t e = 0; e + 1 < offsets.size(); ++e) m = std::max(m, offsets[e + 1] - offsets[e]);
    return m;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // --- memory ---------------------------------------------------------------------------
  // A zero-initialised tensor on the device.
  virtual Tensor alloc(Shape shape, DType dtype) const = 0;
  // A host tensor's data on the device (the same tensor on the host backend).
  virtual Tensor upload(const Tensor& host) const = 0;
  // n floats from device memory to host memory (logits, the KV a decode engine takes).
  virtual void to_host(const float* src, int64_t n, float* dst) const = 0;
  virtual void fill(float* x, int64_t n, float value) const = 0;
  // dst[i] = src[i], i < n, both on the device (may not overlap).
  virtual void copy(float* dst, const float* src, int64_t n) const = 0;
  // False if x [n] holds a NaN or an Inf (the engine's per-layer check, core/finite.h).
  virtual bool all_finite(const float* x, int64_t n) const = 0;

  // --- data movement and element-wise (kernels/copy.h) -------------------------------------
  virtual void copy_columns(const float* src, int64_t rows, int64_t src_cols, int64_t col0, int64_t cols,
                            float* dst, int64_t dst_stride = -1) const = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n) const = 0;
  // out [n, width] f32 = table[ids[i]]: table is the embedding on the device (upload()ed; on the
  // host backend the mmap'd checkpoint itself), F32, BF16 or F16; ids are host ids the caller
  // has checked.
  virtual void embed(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n,
                     float* out) const = 0;

  // --- norms, positions, activations (kernels/norm.h, rope.h, moe.h) ------------------------
  virtual void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                       kernels::NormOrder order, DType act_dtype) const = 0;
  // y [rows, N] = lin.forward(rmsnorm(x)) (y += with accumulate): a norm feeding a linear layer.
  // normed [rows, dim] is the caller's f32 buffer: with keep_normed it holds rmsnorm(x) on return
  // (for a second reader, the MoE experts), else its contents are unspecified. This default runs
  // rmsnorm into normed, then lin.forward (ops/backend.cpp); the CPU backend writes the bf16 rows
  // a bf16 GEMM reads in the norm's pass (kernels/norm.h rmsnorm_bf16), of the same result.
  virtual void rmsnorm_linear(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                              kernels::NormOrder order, DType act_dtype, const Linear& lin, float* normed,
                              bool keep_normed, float* y, bool accumulate = false) const;
  // x [n, H, head_dim] rotated in place; row i at position pos[i] (host array).
  virtual void rope(const kernels::Rope& rope, float* x, int64_t n, int64_t H, const int64_t* pos) const = 0;
  // Fused projection rows qkv [n, (Hq + 2·Hkv)·D] = [q | k | v] split into q [n, Hq, D] and
  // k, v [n, Hkv, D], with q and k rotated (kernels/rope.h Rope::split_apply). This default runs
  // copy_columns three times and rope twice (ops/backend.cpp); a backend may do it in one pass.
  virtual void split_qkv_rope(const kernels::Rope& rope, const float* qkv, int64_t n, int64_t Hq, int64_t Hkv,
                              const int64_t* pos, float* q, float* k, float* v) const;
  virtual void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out) const = 0;
  virtual void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out) const = 0;

  // --- mixture of experts (kernels/moe.h) ----------------------------------------------------
  // Top-k of the router logits [n, E], softmax over those k, grouped by expert.
  virtual ExpertRouting route_experts(const float* logits, int64_t n, int64_t E, int k) const = 0;
  virtual void gather_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) const = 0;
  virtual void scatter_add_rows(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim,
                                float* dst) const = 0;
  // The gpt-oss experts over routed rows: for each expert e in order and each of its grouped rows r,
  //   h[token[r], :] += weight[r] · down[e](swiglu_oai(gate_up[e](x[token[r], :]), alpha, limit))
  // with x [*, H] and gate_up[e] producing 2I interleaved gate/up columns. This default runs
  // gather_rows, Linear::forward, swiglu_oai, Linear::forward and scatter_add_rows per expert
  // (ops/backend.cpp); a backend may override it with fused passes of the same result.
  virtual void moe_experts(const std::vector<Linear>& gate_up, const std::vector<Linear>& down,
                           const ExpertRouting& g, const float* x, int64_t H, int64_t I, float alpha,
                           float limit, float* h) const;

  // --- attention (kernels/attention.h, attention_merge.h) -----------------------------------
  virtual void flash_attention(const kernels::AttentionArgs& args) const = 0;
  virtual void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n,
                               int64_t H, int64_t D) const = 0;
  virtual void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H,
                                     int64_t D) const = 0;

  // --- linear layers (kernels/gemm.h) --------------------------------------------------------
  // Packs a host weight (dtype wdtype, layout `layout`) and an optional f32 bias [N].
  virtual Linear linear(const void* weight, DType wdtype, kernels::WeightLayout layout, int64_t out_features,
                        int64_t in_features, const float* bias, kernels::ComputeType ct) const = 0;
};

// The host backend (kernels/ on the CPU, OpenMP threads).
const Backend& cpu();

// A grow-only f32 array on one backend's device with std::vector's size semantics: the staging
// buffers of the parallel algorithms, kept across layers and prefills so that no layer takes
// fresh pages. resize() keeps the first min(old, new) elements; new elements are unspecified.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const Backend& ops = cpu()) : ops_(&ops) {}
  DeviceBuffer(const DeviceBuffer&) = delete;  // one owner: a copy would share the storage
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&&) = default;
  DeviceBuffer& operator=(DeviceBuffer&&) = default;
  void resize(size_t n);
  void clear() { size_ = 0; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* data() { return storage_.data<float>(); }
  const float* data() const { return storage_.data<float>(); }
  const Backend& backend() const { return *ops_; }

 private:
  const Backend* ops_;
  Tensor storage_;
  size_t size_ = 0;
};

}  // namespace slope::ops
