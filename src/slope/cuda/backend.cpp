// ops::Backend on a CUDA device. Ops are enqueued on the default stream; the ops that return
// something to the host (to_host, all_finite, route_experts' offsets) synchronise.
#include "slope/cuda/backend.h"

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "slope/core/error.h"
#include "slope/cuda/activation.h"
#include "slope/cuda/attention.h"
#include "slope/cuda/attention_merge.h"
#include "slope/cuda/gemm.h"
#include "slope/cuda/moe.h"
#include "slope/cuda/norm.h"
#include "slope/cuda/ops_kernels.h"
#include "slope/cuda/rope.h"

namespace slope::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Device memory of `bytes`, freed with the last tensor that holds it.
std::shared_ptr<void> device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

class CudaLinear final : public ops::LinearImpl {
 public:
  explicit CudaLinear(Linear lin) : lin_(std::move(lin)) {}
  void forward(const float* x, int64_t M, float* y, bool accumulate) const override { lin_.forward(x, M, y, accumulate); }
  int64_t in_features() const override { return lin_.in_features(); }
  int64_t out_features() const override { return lin_.out_features(); }
  size_t weight_bytes() const override { return lin_.weight_bytes(); }

 private:
  Linear lin_;
};

class CudaBackend final : public ops::Backend {
 public:
  Device device() const override { return Device::CUDA; }

  Tensor alloc(Shape shape, DType dtype) const override {
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
    std::shared_ptr<void> mem = device_alloc(bytes);
    check(cudaMemsetAsync(mem.get(), 0, bytes, nullptr), "cudaMemsetAsync");
    return Tensor::view(mem.get(), std::move(shape), dtype, mem, Device::CUDA);
  }
  Tensor upload(const Tensor& host) const override {
    if (host.device() == Device::CUDA) return host;
    Tensor t = alloc(host.shape(), host.dtype());
    check(cudaMemcpy(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return t;
  }
  void to_host(const float* src, int64_t n, float* dst) const override {
    if (n > 0) check(cudaMemcpy(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void fill(float* x, int64_t n, float value) const override { cuda::fill(x, n, value); }
  void copy(float* dst, const float* src, int64_t n) const override {
    if (n > 0) check(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, nullptr), "copy");
  }
  bool all_finite(const float* x, int64_t n) const override {
    if (n <= 0) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (!flag_) flag_ = device_alloc(sizeof(int));
    int* flag = static_cast<int*>(flag_.get());
    check(cudaMemsetAsync(flag, 0, sizeof(int), nullptr), "cudaMemsetAsync");
    flag_nonfinite(x, n, flag);
    int host = 0;
    check(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host == 0;
  }

  void copy_columns(const float* src, int64_t rows, int64_t src_cols, int64_t col0, int64_t cols, float* dst,
                    int64_t dst_stride) const override {
    if (rows <= 0 || cols <= 0) return;
    if (dst_stride < 0) dst_stride = cols;
    check(cudaMemcpy2DAsync(dst, size_t(dst_stride) * sizeof(float), src + col0, size_t(src_cols) * sizeof(float),
                            size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, nullptr),
          "copy_columns (cudaMemcpy2DAsync)");
  }
  void add_inplace(float* y, const float* x, int64_t n) const override { cuda::add_inplace(y, x, n); }
  void embed(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n,
             float* out) const override {
    if (n <= 0) return;
    const auto* dev_ids = static_cast<const int32_t*>(staged(ids, size_t(n) * sizeof(int32_t)));
    cuda::embed(table, dtype, width, dev_ids, n, out);
  }

  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
               kernels::NormOrder order, DType act_dtype) const override {
    cuda::rmsnorm(x, w, y, rows, dim, eps, order, act_dtype);
  }
  void rope(const kernels::Rope& rope, float* x, int64_t n, int64_t H, const int64_t* pos) const override {
    if (n <= 0) return;
    const auto* dev_pos = static_cast<const int64_t*>(staged(pos, size_t(n) * sizeof(int64_t)));
    device_rope(rope).apply(x, n, H, dev_pos);
  }
  void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out) const override {
    cuda::silu_mul(gate_up, m, I, out);
  }
  void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out) const override {
    cuda::swiglu_oai(gu, m, I, alpha, limit, out);
  }

  ops::ExpertRouting route_experts(const float* logits, int64_t n, int64_t E, int k) const override {
    const int64_t slots = n * k;
    Tensor ids = alloc({slots}, DType::I32), weights = alloc({slots}, DType::F32);
    route_topk_softmax(logits, n, E, k, ids.data<int32_t>(), weights.data<float>());
    ExpertGroups g(slots, E);
    group_by_expert(ids.data<int32_t>(), weights.data<float>(), n, k, g);
    ops::ExpertRouting r;
    std::vector<int32_t> offsets(size_t(E + 1));
    check(cudaMemcpy(offsets.data(), g.offsets(), offsets.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
          "cudaMemcpy D2H (expert offsets)");
    r.offsets.assign(offsets.begin(), offsets.end());
    r.token = alloc({slots}, DType::I64);
    widen_i32(g.token(), slots, r.token.data<int64_t>());
    r.weight = alloc({slots}, DType::F32);
    copy(r.weight.data<float>(), g.weight(), slots);
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");  // g's buffers are freed on return
    return r;
  }
  void gather_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) const override {
    gather_rows_i64(src, rows, m, dim, dst);
  }
  void scatter_add_rows(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim,
                        float* dst) const override {
    scatter_add_rows_i64(src, rows, w, m, dim, dst);
  }

  void flash_attention(const kernels::AttentionArgs& args) const override { cuda::flash_attention(args); }
  void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n, int64_t H,
                       int64_t D) const override {
    cuda::attention_merge(out_a, lse_a, out_b, lse_b, n, H, D);
  }
  void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H,
                             int64_t D) const override {
    cuda::attention_apply_sinks(out, lse, sinks, n, H, D);
  }

  ops::Linear linear(const void* weight, DType wdtype, kernels::WeightLayout layout, int64_t out_features,
                     int64_t in_features, const float* bias, kernels::ComputeType ct) const override {
    return ops::Linear(std::make_shared<CudaLinear>(Linear(weight, wdtype, layout, out_features, in_features, bias, ct)));
  }

 private:
  // Host data (ids, positions) on the device for one op, in a grow-only staging buffer. The copy
  // is ordered on the default stream after the kernels already queued there, so the buffer is
  // reused only once the op that read it last has run; growing frees the old one (cudaFree
  // waits for the device).
  const void* staged(const void* host, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > staging_bytes_) {
      staging_ = device_alloc(bytes);
      staging_bytes_ = bytes;
    }
    check(cudaMemcpyAsync(staging_.get(), host, bytes, cudaMemcpyHostToDevice, nullptr), "cudaMemcpyAsync H2D");
    return staging_.get();
  }
  const Rope& device_rope(const kernels::Rope& host) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto& r = ropes_[&host];
    if (!r) r = std::make_unique<Rope>(host);
    return *r;
  }

  mutable std::mutex mu_;
  mutable std::shared_ptr<void> flag_;
  mutable std::shared_ptr<void> staging_;  // see staged()
  mutable size_t staging_bytes_ = 0;
  mutable std::map<const kernels::Rope*, std::unique_ptr<Rope>> ropes_;
};

}  // namespace

const ops::Backend& backend() {
  static const CudaBackend b;
  return b;
}

}  // namespace slope::cuda
