// The op interface's host backend and the device buffer: each op is its kernel (checked here
// for the ops that are more than a forward: routing and the buffer's growth), and the buffer
// keeps std::vector's size semantics.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "slope/kernels/moe.h"
#include "slope/ops/backend.h"

using namespace slope;

TEST(DeviceBuffer, ResizeKeepsThePrefixAndGrows) {
  ops::DeviceBuffer b(ops::cpu());
  EXPECT_TRUE(b.empty());
  b.resize(1);  // a single element must get storage (an empty tensor's numel is 1)
  ASSERT_NE(b.data(), nullptr);
  b.data()[0] = 7;
  b.resize(1000);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(b.data()[0], 7);
  std::iota(b.data(), b.data() + 1000, 0.f);
  b.resize(10);  // shrinking keeps storage and the prefix
  b.resize(1500);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.data()[i], float(i));
  b.clear();
  EXPECT_TRUE(b.empty());
}

TEST(CpuBackend, RouteExpertsIsTheKernelsRoutingAndGrouping) {
  const int64_t n = 37, E = 8;
  const int k = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> logits(size_t(n * E));
  for (float& x : logits) x = d(rng);
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<float> w(size_t(n * k));
  kernels::route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  const kernels::ExpertGroups want = kernels::group_by_expert(ids.data(), w.data(), n, k, E);
  const ops::ExpertRouting got = ops::cpu().route_experts(logits.data(), n, E, k);
  EXPECT_EQ(got.offsets, want.offsets);
  ASSERT_EQ(got.token.numel(), int64_t(want.token.size()));
  for (size_t i = 0; i < want.token.size(); ++i) {
    EXPECT_EQ(got.token.data<int64_t>()[i], want.token[i]);
    EXPECT_EQ(got.weight.data<float>()[i], want.weight[i]);
  }
}

TEST(CpuBackend, AllocIsZeroedOnTheHost) {
  Tensor t = ops::cpu().alloc({3, 5}, DType::F32);
  EXPECT_EQ(t.device(), Device::CPU);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.f);
}
