// An f32 Linear for CPUs with AVX2 and FMA but no AVX-512: weights packed once into panels of 16
// outputs, and a 6 x 16 register-blocked micro-kernel.
//
// Why not oneDNN there: oneDNN 2.6's matmul on AVX2 is its gemm:jit, which takes plain weights
// and packs them again inside every call. The MoE's expert GEMMs run in calls of 128 rows or
// fewer (ops/cpu/backend_cpu.cpp, kExpertRows), where that halves its rate: on a Zen 3, bench_moe
// ran the experts at 70-79 GFLOP/s on oneDNN against 147-150 for the dense MLP of the same FLOPs
// (docs/performance.md, "nineteenth window").
//
// The math: y[i, n] = (b[n] + Σ_k x[i, k]·W[n, k]) (+ y_old[i, n] with accumulate, added to the
// bias first), the sum over k in ascending order in one f32 accumulator per output. Every output
// is computed the same way whatever the row count, the rows' place in the call and the threads,
// so a row's result does not depend on the call it is in (as with oneDNN's AVX-512 matmul, and
// unlike its AVX2 one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace slope::kernels::cpu {

// Whether this build has the panel GEMM (built with AVX2 and FMA).
bool panel_gemm_built();

class PanelWeights {
 public:
  static constexpr int64_t kCols = 16;  // outputs per panel: two ymm registers

  PanelWeights() = default;
  // w: f32 weights, [N, K] row-major with out_in, else [K, N]; bias: [N] or null.
  PanelWeights(const float* w, bool out_in, int64_t N, int64_t K, const float* bias);

  // y[M, N] = x[M, K] · Wᵀ + b (y += that with accumulate): x and y contiguous row-major, on
  // omp_get_max_threads() threads. Thread-safe for concurrent calls with distinct y.
  void forward(const float* x, int64_t M, float* y, bool accumulate) const;

  size_t bytes() const { return size_t(panels_ * (K_ + 1) * kCols) * sizeof(float); }

 private:
  // Rows [r0, r1) x panels [p0, p1) on the calling thread.
  void run(const float* x, int64_t r0, int64_t r1, int64_t p0, int64_t p1, float* y, bool accumulate) const;

  struct Free {
    void operator()(float* p) const;
  };
  int64_t N_ = 0, K_ = 0, panels_ = 0;
  // [panels][K][kCols] weights (zeros past N), then [panels][kCols] bias (zeros past N or without).
  std::unique_ptr<float[], Free> w_;
};

}  // namespace slope::kernels::cpu
