// RMSNorm (each order and activation dtype), RoPE (default, llama3, yarn; positions from pos0
// and arbitrary), the SwiGLU variants and the cuBLAS Linear against the CPU kernels.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "slope/core/error.h"
#include "slope/cuda/activation.h"
#include "slope/cuda/gemm.h"
#include "slope/cuda/norm.h"
#include "slope/cuda/rope.h"
#include "slope/kernels/gemm.h"
#include "slope/kernels/moe.h"
#include "slope/kernels/norm.h"
#include "slope/kernels/rope.h"

namespace slope::gpu_test {
namespace {

using kernels::NormOrder;

// Elements of two bf16-rounded results may differ by a bf16 ulp where a different summation
// order moves a value across a rounding boundary: allow that for a few elements, relative to
// the element, and require the rest to be equal (a wrong rounding order would differ in many).
void expect_within_bf16_ulp(const std::vector<float>& got, const std::vector<float>& want) {
  size_t equal = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], std::abs(want[i]) * (1.0 / 64) + 1e-30) << "element " << i;
    equal += got[i] == want[i];
  }
  EXPECT_GE(double(equal), 0.98 * double(want.size())) << "elements equal to the CPU's";
}

TEST(GpuRmsNorm, MatchesCpuForEveryOrderAndDtype) {
  SLOPE_REQUIRE_GPU();
  const int64_t rows = 13, dim = 2883;  // odd: not a multiple of the block or a vector width
  std::mt19937 rng(3);
  const auto x = random_floats(rng, rows * dim, -3.f, 3.f), w = random_floats(rng, dim, 0.5f, 1.5f);
  auto dx = cuda::DeviceBuffer::from(x), dw = cuda::DeviceBuffer::from(w);
  for (const auto& [order, dt] : {std::pair{NormOrder::WeightThenCast, DType::F32},
                                 std::pair{NormOrder::WeightThenCast, DType::BF16},
                                 std::pair{NormOrder::CastThenWeight, DType::BF16}}) {
    std::vector<float> ref(rows * dim);
    kernels::rmsnorm(x.data(), w.data(), ref.data(), rows, dim, 1e-5f, order, dt);
    auto dy = poisoned(ref.size());
    cuda::rmsnorm(dx.as<float>(), dw.as<float>(), dy.as<float>(), rows, dim, 1e-5f, order, dt);
    cuda::synchronize();
    const auto got = dy.to_host<float>();
    if (dt == DType::F32) {
      EXPECT_LT(rel_l2(got, ref), kF32Tol);
    } else {
      expect_within_bf16_ulp(got, ref);
      // The bf16-output variant stores the same values.
      auto db = poisoned(ref.size(), 2);
      cuda::rmsnorm_to_bf16(dx.as<float>(), dw.as<float>(), db.as<uint16_t>(), rows, dim, 1e-5f, order);
      cuda::synchronize();
      const auto bits = db.to_host<uint16_t>();
      std::vector<float> as_f32(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) as_f32[i] = bf16_to_f32(bits[i]);
      EXPECT_EQ(as_f32, got);
    }
  }
  // In place (y aliases x).
  std::vector<float> ref(rows * dim);
  kernels::rmsnorm(x.data(), w.data(), ref.data(), rows, dim, 1e-6f, NormOrder::WeightThenCast);
  cuda::rmsnorm(dx.as<float>(), dw.as<float>(), dx.as<float>(), rows, dim, 1e-6f, NormOrder::WeightThenCast);
  cuda::synchronize();
  EXPECT_LT(rel_l2(dx.to_host<float>(), ref), kF32Tol);
}

kernels::RopeConfig rope_config(const std::string& type, int64_t D) {
  kernels::RopeConfig c;
  c.type = type;
  c.head_dim = D;
  if (type == "llama3") {
    c.theta = 500000, c.factor = 8, c.low_freq_factor = 1, c.high_freq_factor = 4,
    c.original_max_position_embeddings = 8192;
  } else if (type == "yarn") {  // gpt-oss
    c.theta = 150000, c.factor = 32, c.original_max_position_embeddings = 4096, c.beta_fast = 32, c.beta_slow = 1,
    c.truncate = false;
  }
  return c;
}

TEST(GpuRope, MatchesCpuForEveryType) {
  SLOPE_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (const std::string type : {"default", "llama3", "yarn"}) {
    SCOPED_TRACE(type);
    const int64_t n = 37, H = 5, D = type == "llama3" ? 128 : 64;
    const kernels::Rope cpu(rope_config(type, D));
    const cuda::Rope gpu(rope_config(type, D));
    const auto x = random_floats(rng, n * H * D, -2.f, 2.f);
    // Rows from a large pos0 (a long-context shard) and rows at scattered positions.
    std::vector<float> ref = x;
    cpu.apply(ref.data(), n, H, 1000003);
    auto dx = cuda::DeviceBuffer::from(x);
    gpu.apply(dx.as<float>(), n, H, 1000003);
    cuda::synchronize();
    EXPECT_LT(rel_l2(dx.to_host<float>(), ref), kF32Tol);

    std::vector<int64_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = (i * 7919) % 131072;
    ref = x;
    cpu.apply(ref.data(), n, H, pos.data());
    auto dpos = cuda::DeviceBuffer::from(pos);
    dx.upload(x.data(), x.size() * 4);
    gpu.apply(dx.as<float>(), n, H, dpos.as<int64_t>());
    cuda::synchronize();
    EXPECT_LT(rel_l2(dx.to_host<float>(), ref), kF32Tol);
  }
}

TEST(GpuActivations, SwigluVariantsMatchCpu) {
  SLOPE_REQUIRE_GPU();
  const int64_t m = 19, I = 333;
  std::mt19937 rng(9);
  const auto gu = random_floats(rng, m * 2 * I, -10.f, 10.f);  // past gpt-oss's limit of 7: the clamps matter
  auto dgu = cuda::DeviceBuffer::from(gu);
  std::vector<float> ref(m * I);
  kernels::swiglu_oai(gu.data(), m, I, 1.702f, 7.f, ref.data());
  auto dout = poisoned(ref.size());
  cuda::swiglu_oai(dgu.as<float>(), m, I, 1.702f, 7.f, dout.as<float>());
  cuda::synchronize();
  EXPECT_LT(rel_l2(dout.to_host<float>(), ref), kF32Tol);

  kernels::silu_mul(gu.data(), m, I, ref.data());
  dout.fill_bytes(0xff);
  cuda::silu_mul(dgu.as<float>(), m, I, dout.as<float>());
  cuda::synchronize();
  EXPECT_LT(rel_l2(dout.to_host<float>(), ref), kF32Tol);
}

TEST(GpuLinear, MatchesCpuLinearForLayoutsDtypesBiasAndAccumulate) {
  SLOPE_REQUIRE_GPU();
  const int64_t M = 45, N = 97, K = 130;
  std::mt19937 rng(11);
  const auto x = random_floats(rng, M * K), w = random_floats(rng, N * K), bias = random_floats(rng, N);
  const auto y0 = random_floats(rng, M * N);
  auto dx = cuda::DeviceBuffer::from(x);
  for (const auto layout : {kernels::WeightLayout::OutIn, kernels::WeightLayout::InOut})
    for (const auto ct : {kernels::ComputeType::F32, kernels::ComputeType::BF16})
      for (const bool with_bias : {false, true})
        for (const bool accumulate : {false, true}) {
          SCOPED_TRACE(testing::Message() << "layout " << int(layout) << " ct " << int(ct) << " bias " << with_bias
                                          << " accumulate " << accumulate);
          const float* b = with_bias ? bias.data() : nullptr;
          const kernels::Linear cpu(w.data(), DType::F32, layout, N, K, b, ct);
          const cuda::Linear gpu(w.data(), DType::F32, layout, N, K, b, ct);
          std::vector<float> ref = y0;
          cpu.forward(x.data(), M, ref.data(), accumulate);
          auto dy = cuda::DeviceBuffer::from(y0);
          gpu.forward(dx.as<float>(), M, dy.as<float>(), accumulate);
          cuda::synchronize();
          // Both round x and W to bf16 for BF16 and accumulate in f32: only the order differs.
          EXPECT_LT(rel_l2(dy.to_host<float>(), ref), ct == kernels::ComputeType::F32 ? kF32Tol : 1e-4);
        }
}

TEST(GpuLinear, Bf16InputsAndWeightsGiveTheSameResult) {
  SLOPE_REQUIRE_GPU();
  const int64_t M = 21, N = 64, K = 96;
  std::mt19937 rng(13);
  const auto x = random_bf16_exact(rng, M * K), w = random_bf16_exact(rng, N * K);
  const kernels::Linear cpu(w.data(), DType::F32, kernels::WeightLayout::OutIn, N, K, nullptr, kernels::ComputeType::BF16);
  const auto wb = to_bf16_bits(w);
  const cuda::Linear gpu(wb.data(), DType::BF16, kernels::WeightLayout::OutIn, N, K, nullptr, kernels::ComputeType::BF16);
  std::vector<float> ref(M * N);
  cpu.forward(x.data(), M, ref.data());
  auto dxb = cuda::DeviceBuffer::from(to_bf16_bits(x));
  auto dy = poisoned(ref.size());
  gpu.forward_bf16(dxb.as<uint16_t>(), M, dy.as<float>());
  cuda::synchronize();
  EXPECT_LT(rel_l2(dy.to_host<float>(), ref), 1e-4);
}

TEST(GpuGemmF32, MatchesCpuWithAndWithoutTransposedB) {
  SLOPE_REQUIRE_GPU();
  const int64_t M = 33, N = 41, K = 29;
  std::mt19937 rng(17);
  const auto A = random_floats(rng, M * K), B = random_floats(rng, K * N), C0 = random_floats(rng, M * N);
  auto dA = cuda::DeviceBuffer::from(A), dB = cuda::DeviceBuffer::from(B);
  for (const bool tb : {false, true}) {
    std::vector<float> ref = C0;
    const int64_t ldb = tb ? K : N;
    kernels::gemm_f32(M, N, K, 0.5f, A.data(), K, B.data(), ldb, 2.f, ref.data(), N, tb);
    auto dC = cuda::DeviceBuffer::from(C0);
    cuda::gemm_f32(M, N, K, 0.5f, dA.as<float>(), K, dB.as<float>(), ldb, 2.f, dC.as<float>(), N, tb);
    cuda::synchronize();
    EXPECT_LT(rel_l2(dC.to_host<float>(), ref), kF32Tol) << "transpose_b " << tb;
  }
}

TEST(GpuLinear, RejectsBadWeights) {
  // Checked before any device work: runs without a GPU.
  float w = 0;
  EXPECT_THROW(cuda::Linear(&w, DType::F32, kernels::WeightLayout::OutIn, 0, 4, nullptr, kernels::ComputeType::F32),
               Error);
  EXPECT_THROW(cuda::Linear(&w, DType::U8, kernels::WeightLayout::OutIn, 1, 1, nullptr, kernels::ComputeType::F32),
               Error);
  EXPECT_THROW(cuda::Linear().forward(nullptr, 1, nullptr), Error);
}

}  // namespace
}  // namespace slope::gpu_test
