// The AVX2 panel GEMM (gemm_panels.h).
//
// Blocking, for a core's 32 KiB L1 and 512 KiB L2 (Zen 3), as in BLIS: K is taken kDepth at a
// time and the rows kBlockRows at a time. A block of rows x kDepth of x is packed k-major in
// groups of kRows (ap[(g·kDepth + k)·6 + r], zeros past the last row: 192 KiB, in L2), and each
// panel's kDepth x 16 slice of W (16 KiB, in L1) is swept over the block's groups. Per k the
// micro-kernel loads one 64-byte row of the slice and broadcasts six packed values of x into 12
// FMAs on 12 accumulators (6 rows x 16 outputs), 15 of the 16 ymm registers. The first slice
// starts each output from the bias (and the old y with accumulate), later ones from y.
#include "slope/kernels/cpu/gemm_panels.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "slope/core/error.h"

namespace slope::kernels::cpu {

void PanelWeights::Free::operator()(float* p) const { std::free(p); }

#if defined(__AVX2__) && defined(__FMA__)

namespace {

constexpr int64_t kRows = 6;                    // rows per micro-kernel call
constexpr int64_t kCols = PanelWeights::kCols;  // outputs per panel
constexpr int64_t kDepth = 256;                 // k per slice: 16 KiB of a panel
constexpr int64_t kBlockRows = 192;             // rows per packed block of x: 192 KiB at kDepth

// Below this many multiply-adds a call runs on the calling thread (a parallel region costs more).
constexpr int64_t kParallelMacs = int64_t{1} << 21;

// How a micro-kernel call starts its accumulators.
enum class Start { Bias, BiasAndY, Y };

// y[r, 0..cols) = start + Σ_k ap[k·6 + r] · bp[k·16 + 0..16) for r < MR, k < depth.
template <int MR>
void micro(const float* ap, const float* bp, int64_t depth, const float* bias, Start start, float* y, int64_t ldy,
           int64_t cols) {
  // Lanes of the last panel past N are neither read nor written (masked); full panels use plain
  // loads and stores.
  const bool full = cols == kCols;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(cols)), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(cols) - 8), lane);
  auto load = [&](const float* p, const __m256i& m) { return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m); };
  __m256 acc[MR][2];
  if (start == Start::Y) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) acc[r][0] = load(y + r * ldy, m0), acc[r][1] = load(y + r * ldy + 8, m1);
  } else {
    const __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) acc[r][0] = b0, acc[r][1] = b1;
    if (start == Start::BiasAndY) {
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        acc[r][0] = _mm256_add_ps(load(y + r * ldy, m0), acc[r][0]);
        acc[r][1] = _mm256_add_ps(load(y + r * ldy + 8, m1), acc[r][1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < depth; ++k) {
    const __m256 w0 = _mm256_load_ps(bp + k * kCols), w1 = _mm256_load_ps(bp + k * kCols + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(ap + k * kRows + r);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    float* yr = y + r * ldy;
    if (full) {
      _mm256_storeu_ps(yr, acc[r][0]);
      _mm256_storeu_ps(yr + 8, acc[r][1]);
    } else {
      _mm256_maskstore_ps(yr, m0, acc[r][0]);
      _mm256_maskstore_ps(yr + 8, m1, acc[r][1]);
    }
  }
}

using Micro = void (*)(const float*, const float*, int64_t, const float*, Start, float*, int64_t, int64_t);
constexpr Micro kMicro[kRows + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};

// x[r0..r1, k0..k0+depth) packed k-major in groups of kRows: ap[(g·depth + k)·kRows + r], zeros
// past r1. x is [*, K].
void pack_rows(const float* x, int64_t K, int64_t r0, int64_t r1, int64_t k0, int64_t depth, float* ap) {
  for (int64_t g0 = r0; g0 < r1; g0 += kRows) {
    const int64_t rows = std::min(kRows, r1 - g0);
    float* dst = ap + (g0 - r0) * depth;
    for (int64_t r = 0; r < kRows; ++r) {
      const float* src = x + (g0 + r) * K + k0;
      for (int64_t k = 0; k < depth; ++k) dst[k * kRows + r] = r < rows ? src[k] : 0.f;
    }
  }
}

}  // namespace

bool panel_gemm_built() { return true; }

PanelWeights::PanelWeights(const float* w, bool out_in, int64_t N, int64_t K, const float* bias)
    : N_(N), K_(K), panels_((N + kCols - 1) / kCols) {
  SLOPE_CHECK(N > 0 && K > 0, "PanelWeights: empty weight [", N, ", ", K, "]");
  const size_t floats = size_t(panels_ * (K + 1) * kCols);
  w_.reset(static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64)));
  SLOPE_CHECK(w_ != nullptr, "out of memory packing a ", N, " x ", K, " weight");
  float* pw = w_.get();
  float* pb = pw + panels_ * K * kCols;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels_; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < kCols; ++j) {
        const int64_t n = p * kCols + j;
        pw[(p * K + k) * kCols + j] = n >= N ? 0.f : out_in ? w[n * K + k] : w[k * N + n];
      }
  for (int64_t n = 0; n < panels_ * kCols; ++n) pb[n] = bias != nullptr && n < N ? bias[n] : 0.f;
}

void PanelWeights::run(const float* x, int64_t r0, int64_t r1, int64_t p0, int64_t p1, float* y,
                       bool accumulate) const {
  const int64_t K = K_;
  thread_local std::vector<float> ap_buf;
  if (ap_buf.size() < size_t(kBlockRows * kDepth)) ap_buf.resize(size_t(kBlockRows * kDepth));
  float* ap = ap_buf.data();
  const float* bias = w_.get() + panels_ * K * kCols;
  for (int64_t m0 = r0; m0 < r1; m0 += kBlockRows) {
    const int64_t m1 = std::min(r1, m0 + kBlockRows);
    for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, K - k0);
      const Start start = k0 > 0 ? Start::Y : accumulate ? Start::BiasAndY : Start::Bias;
      pack_rows(x, K, m0, m1, k0, depth, ap);
      for (int64_t p = p0; p < p1; ++p) {
        const float* bp = w_.get() + (p * K + k0) * kCols;
        const int64_t cols = std::min(kCols, N_ - p * kCols);
        for (int64_t g0 = m0; g0 < m1; g0 += kRows)
          kMicro[std::min(kRows, m1 - g0)](ap + (g0 - m0) * depth, bp, depth, bias + p * kCols, start,
                                           y + g0 * N_ + p * kCols, N_, cols);
      }
    }
  }
}

void PanelWeights::forward(const float* x, int64_t M, float* y, bool accumulate) const {
  SLOPE_CHECK(w_ != nullptr, "PanelWeights::forward on empty weights");
  if (M <= 0) return;
  // Threads split the panels where each gets several (every thread then reads all of x), else
  // the row groups.
  const int64_t groups = (M + kRows - 1) / kRows;
  const int max_threads = M * N_ * K_ < kParallelMacs ? 1 : omp_get_max_threads();
  const bool by_panels = panels_ >= 4 * max_threads;
  const int64_t items = by_panels ? panels_ : groups;
  const int threads = int(std::min<int64_t>(max_threads, items));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t lo = items * t / T, hi = items * (t + 1) / T;
    if (by_panels)
      run(x, 0, M, lo, hi, y, accumulate);
    else
      run(x, lo * kRows, std::min(M, hi * kRows), 0, panels_, y, accumulate);
  }
}

#else  // no AVX2 + FMA in this build: Linear keeps oneDNN's matmul (gemm.cpp)

bool panel_gemm_built() { return false; }

PanelWeights::PanelWeights(const float*, bool, int64_t, int64_t, const float*) {
  fail("the AVX2 panel GEMM is not in this build (it needs AVX2 and FMA)");
}

void PanelWeights::run(const float*, int64_t, int64_t, int64_t, int64_t, float*, bool) const {}

void PanelWeights::forward(const float*, int64_t, float*, bool) const {
  fail("the AVX2 panel GEMM is not in this build (it needs AVX2 and FMA)");
}

#endif

}  // namespace slope::kernels::cpu
