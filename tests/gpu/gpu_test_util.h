// Shared pieces of the GPU tests: the skip when there is no device, random inputs, device
// copies, and the error measures. Tolerances are stated once here, per precision.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "slope/core/half.h"
#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"

// Skips the test, with the reason, where no CUDA device is usable.
#define SLOPE_REQUIRE_GPU()                                                    \
  do {                                                                         \
    std::string slope_why_;                                                    \
    if (::slope::cuda::device_count(&slope_why_) == 0)                         \
      GTEST_SKIP() << "no CUDA device: " << slope_why_;                        \
  } while (0)

namespace slope::gpu_test {

// ‖a − b‖ / ‖b‖ over the whole output. Tensor-core paths with bf16 operands (the probabilities
// in attention, activations in GEMMs) land between 1e-3 and 1e-2; f32 paths far under 1e-5.
constexpr double kBf16Tol = 1e-2;
constexpr double kMixedTol = 5e-3;  // bf16-exact inputs, only intermediate roundings differ
constexpr double kF32Tol = 1e-5;

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Values exactly representable in bf16, so the f32 and bf16 entry points see the same inputs.
inline std::vector<float> random_bf16_exact(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::vector<float> v = random_floats(rng, n, lo, hi);
  for (auto& x : v) x = round_bf16(x);
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

// A device buffer of n floats with every byte 0xff (NaN), so unwritten outputs show.
inline cuda::DeviceBuffer poisoned(size_t n, size_t elem = sizeof(float)) {
  cuda::DeviceBuffer b(n * elem);
  b.fill_bytes(0xff);
  return b;
}

inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline size_t count_nan(const std::vector<float>& v) {
  return size_t(std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); }));
}

}  // namespace slope::gpu_test
