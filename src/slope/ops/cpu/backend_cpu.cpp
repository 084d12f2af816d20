// The host backend: each op is the kernel of the same name in kernels/ (the contracts are
// theirs), on host memory.
#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include <omp.h>

#include "slope/core/error.h"
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
  const kernels::Linear& kernel() const { return lin_; }

 private:
  kernels::Linear lin_;
};

// The kernels::Linear behind a Linear this backend made.
const kernels::Linear& cpu_kernel(const Linear& lin) {
  const auto* impl = dynamic_cast<const CpuLinear*>(lin.impl());
  SLOPE_CHECK(impl != nullptr, "a Linear made by another backend was passed to the CPU backend");
  return impl->kernel();
}

// A grow-only array kept on the calling thread across calls (its pages stay mapped).
template <typename T>
T* thread_scratch(std::vector<T>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

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
  // bf16: the norm writes the GEMM's bf16 input rows itself (no f32 rows and conversion pass),
  // into a per-thread buffer that persists across calls.
  void rmsnorm_linear(const float* x, const float* w, int64_t rows, int64_t dim, float eps, kernels::NormOrder order,
                      DType act_dtype, const Linear& lin, float* normed, bool keep_normed, float* y,
                      bool accumulate) const override {
    SLOPE_CHECK(lin.in_features() == dim, "rmsnorm_linear: the norm's rows have ", dim,
                " columns but the linear layer takes ", lin.in_features());
    const kernels::Linear& kernel = cpu_kernel(lin);
    if (act_dtype != DType::BF16 || kernel.compute_type() != kernels::ComputeType::BF16)
      return Backend::rmsnorm_linear(x, w, rows, dim, eps, order, act_dtype, lin, normed, keep_normed, y,
                                     accumulate);
    thread_local std::vector<uint16_t> xb_buf;
    uint16_t* xb = thread_scratch(xb_buf, rows * dim);
    kernels::rmsnorm_bf16(x, w, xb, keep_normed ? normed : nullptr, rows, dim, eps, order);
    kernel.forward_bf16(xb, rows, y, accumulate);
  }
  void rope(const kernels::Rope& rope, float* x, int64_t n, int64_t H, const int64_t* pos) const override {
    rope.apply(x, n, H, pos);
  }
  void split_qkv_rope(const kernels::Rope& rope, const float* qkv, int64_t n, int64_t Hq, int64_t Hkv,
                      const int64_t* pos, float* q, float* k, float* v) const override {
    rope.split_apply(qkv, n, Hq, Hkv, pos, q, k, v);
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
  // bf16 experts: the gather and the activation write the bf16 rows their GEMM reads (no f32
  // copy and conversion pass), into per-thread buffers that persist across calls. Each expert's
  // down GEMM writes its rows of one [n·k, H] buffer, and one combine_rows pass over the tokens
  // adds them to h (the per-expert scatter-adds' sums, bit for bit, with one pass over h).
  // With at least two routed experts per thread, each thread takes whole experts (the largest
  // first) and runs their four steps alone: one barrier per call instead of one per step of
  // every expert, where each step's threads wait for the slowest. Fewer experts split each
  // step across the threads.
  // An expert's rows go through its four steps in chunks of this many (a multiple of the GEMMs'
  // row quantum, gemm.cpp), so that one chunk's rows, gate_up output and activations stay in the
  // core's L2 from step to step (gpt-oss bench: 128 rows of 1024 bf16 in, 2048 f32 between the
  // GEMMs, 1 MiB; an expert of a 1024-token chunk has about 512 rows, 4 MiB of gate_up output).
  // On AMX the MLP phase took 11-15% less time than with whole experts (docs/performance.md,
  // tenth window); on the f32 units and on oneDNN's vdpbf16ps matmul 0-2% (the noise).
  // Where oneDNN's f32 matmul packs the weights in every call (CPUs without AVX-512,
  // kernels::f32_matmul_packs_per_call) each expert runs whole: 128-row calls there ran at half
  // the rate of 512-row ones, and whole experts took the gpt-oss bench prefill 1.65-1.75x faster
  // at 4K and 1.45x at 16K on a Zen 3 (docs/performance.md, nineteenth window).
  static constexpr int64_t kExpertRows = 128;
  void moe_experts(const std::vector<Linear>& gate_up, const std::vector<Linear>& down, const ExpertRouting& g,
                   const float* x, int64_t H, int64_t I, float alpha, float limit, float* h) const override {
    const int64_t E = int64_t(g.offsets.size()) - 1;
    SLOPE_CHECK(int64_t(gate_up.size()) >= E && int64_t(down.size()) >= E, "moe_experts: ", E,
                " experts routed but ", gate_up.size(), " gate_up and ", down.size(), " down weights");
    bool bf16 = true;
    for (int64_t e = 0; e < E; ++e)
      bf16 = bf16 && cpu_kernel(gate_up[e]).compute_type() == kernels::ComputeType::BF16 &&
             cpu_kernel(down[e]).compute_type() == kernels::ComputeType::BF16;
    if (!bf16) return Backend::moe_experts(gate_up, down, g, x, H, I, alpha, limit, h);
    const int64_t* token = g.token.data<int64_t>();
    const float* weight = g.weight.data<float>();
    const int64_t total = g.offsets[E];
    thread_local std::vector<float> y_buf;
    float* y = thread_scratch(y_buf, total * H);
    // Expert e's rows of y: gather, gate_up, SwiGLU, down, on this thread's buffers, max_rows
    // rows at a time.
    const int64_t max_rows = kernels::f32_matmul_packs_per_call() ? total : kExpertRows;
    auto run_expert = [&](int64_t e) {
      const int64_t r0 = g.offsets[e], rows = g.offsets[e + 1] - r0, chunk = std::min(rows, max_rows);
      thread_local std::vector<uint16_t> xin_buf, act_buf;
      thread_local std::vector<float> gu_buf;
      uint16_t* xin = thread_scratch(xin_buf, chunk * H);
      uint16_t* act = thread_scratch(act_buf, chunk * I);
      float* gu = thread_scratch(gu_buf, chunk * 2 * I);
      for (int64_t c0 = r0; c0 < r0 + rows; c0 += chunk) {
        const int64_t m = std::min(chunk, r0 + rows - c0);
        kernels::gather_rows_bf16(x, token + c0, m, H, xin);
        cpu_kernel(gate_up[e]).forward_bf16(xin, m, gu);
        kernels::swiglu_oai_bf16(gu, m, I, alpha, limit, act);
        cpu_kernel(down[e]).forward_bf16(act, m, y + c0 * H);
      }
    };
    std::vector<int64_t> routed;
    for (int64_t e = 0; e < E; ++e)
      if (g.offsets[e + 1] > g.offsets[e]) routed.push_back(e);
    const int threads = omp_get_max_threads();
    if (threads > 1 && int64_t(routed.size()) >= 2 * threads) {
      std::stable_sort(routed.begin(), routed.end(), [&](int64_t a, int64_t b) {
        return g.offsets[a + 1] - g.offsets[a] > g.offsets[b + 1] - g.offsets[b];
      });
      std::exception_ptr failed;  // an error leaves the region as an exception on this thread
#pragma omp parallel num_threads(threads)
      {
        // This thread's GEMMs and loops run on it alone (the GEMM primitives are built for one
        // thread: gemm.cpp's PrimKey); the setting ends with the region.
        omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < routed.size(); ++i) {
          try {
            run_expert(routed[i]);
          } catch (...) {
#pragma omp critical(slope_moe_failed)
            if (!failed) failed = std::current_exception();
          }
        }
      }
      if (failed) std::rethrow_exception(failed);
    } else {
      for (int64_t e : routed) run_expert(e);
    }
    kernels::combine_rows(y, token, weight, total, H, h);
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
