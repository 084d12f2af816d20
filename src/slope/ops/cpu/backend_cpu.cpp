// The host backend: each op is the kernel of the same name in kernels/ (the contracts are
// theirs), on host memory.
#include <algorithm>
#include <cstring>

#include "slope/core/finite.h"
#include "slope/kernels/attention_merge.h"
#include "slope/kernels/copy.h"
#include "slope/kernels/moe.h"
#include "slope/ops/backend.h"

namespace slope::ops {
namespace {

class CpuLinear final : public LinearImpl {
 public:
  explicit CpuLinear(kernels::Linear lin) : lin_(std::move(lin)) {}
  void forward(const float* x, int64_t M, float* y, bool accumulate) const override { lin_.forward(x, M, y, accumulate); }
  int64_t in_features() const override { return lin_.in_features(); }
  int64_t out_features() const override { return lin_.out_features(); }
  size_t weight_bytes() const override { return lin_.weight_bytes(); }

 private:
  kernels::Linear lin_;
};

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }

  Tensor alloc(Shape shape, DType dtype) const override { return Tensor(std::move(shape), dtype); }
  Tensor upload(const Tensor& host) const override { return host; }
  void to_host(const float* src, int64_t n, float* dst) const override {
    if (src != dst) std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
  void fill(float* x, int64_t n, float value) const override { std::fill(x, x + n, value); }
  void copy(float* dst, const float* src, int64_t n) const override {
    if (n > 0) std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
  bool all_finite(const float* x, int64_t n) const override { return slope::all_finite(x, n); }

  void copy_columns(const float* src, int64_t rows, int64_t src_cols, int64_t col0, int64_t cols, float* dst,
                    int64_t dst_stride) const override {
    kernels::copy_columns(src, rows, src_cols, col0, cols, dst, dst_stride);
  }
  void add_inplace(float* y, const float* x, int64_t n) const override { kernels::add_inplace(y, x, n); }
  void embed(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n,
             float* out) const override {
    kernels::gather_rows_f32(table, dtype, width, ids, n, out);
  }

  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
               kernels::NormOrder order, DType act_dtype) const override {
    kernels::rmsnorm(x, w, y, rows, dim, eps, order, act_dtype);
  }
  void rope(const kernels::Rope& rope, float* x, int64_t n, int64_t H, const int64_t* pos) const override {
    rope.apply(x, n, H, pos);
  }
  void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out) const override {
    kernels::silu_mul(gate_up, m, I, out);
  }
  void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out) const override {
    kernels::swiglu_oai(gu, m, I, alpha, limit, out);
  }

  ExpertRouting route_experts(const float* logits, int64_t n, int64_t E, int k) const override {
    std::vector<int32_t> ids(size_t(n * k));
    std::vector<float> weights(size_t(n * k));
    kernels::route_topk_softmax(logits, n, E, k, ids.data(), weights.data());
    kernels::ExpertGroups g = kernels::group_by_expert(ids.data(), weights.data(), n, k, E);
    ExpertRouting r;
    r.offsets = std::move(g.offsets);
    r.token = Tensor({int64_t(g.token.size())}, DType::I64);
    r.weight = Tensor({int64_t(g.weight.size())}, DType::F32);
    std::memcpy(r.token.raw(), g.token.data(), g.token.size() * sizeof(int64_t));
    std::memcpy(r.weight.raw(), g.weight.data(), g.weight.size() * sizeof(float));
    return r;
  }
  void gather_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) const override {
    kernels::gather_rows(src, rows, m, dim, dst);
  }
  void scatter_add_rows(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim,
                        float* dst) const override {
    kernels::scatter_add_rows(src, rows, w, m, dim, dst);
  }

  void flash_attention(const kernels::AttentionArgs& args) const override { kernels::flash_attention(args); }
  void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n, int64_t H,
                       int64_t D) const override {
    kernels::attention_merge(out_a, lse_a, out_b, lse_b, n, H, D);
  }
  void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H,
                             int64_t D) const override {
    kernels::attention_apply_sinks(out, lse, sinks, n, H, D);
  }

  Linear linear(const void* weight, DType wdtype, kernels::WeightLayout layout, int64_t out_features,
                int64_t in_features, const float* bias, kernels::ComputeType ct) const override {
    return Linear(std::make_shared<CpuLinear>(
        kernels::Linear(weight, wdtype, layout, out_features, in_features, bias, ct)));
  }
};

}  // namespace

const Backend& cpu() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace slope::ops
