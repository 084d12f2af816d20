// The op interface's host backend and the device buffer: each op is its kernel (checked here
// for the ops that are more than a forward: routing and the buffer's growth), and the buffer
// keeps std::vector's size semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include <omp.h>

#include "slope/core/error.h"
#include "slope/core/half.h"
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

// moe_experts: the CPU backend's fused bf16 passes equal the default composition of the other
// ops bit for bit, and both meet a double reference (bf16-rounded inputs; the activation's bf16
// rounding bounded by 2^-8 of the magnitude of the down products). Odd sizes, one expert with
// no rows (its router logit is far below the others), h accumulated onto non-zero values. A
// second case routes 600 tokens to each of 4 experts, more rows than the fused path takes at a
// time (kExpertRows): there the bf16 GEMMs on AMX may round a row differently for another row
// count per call (gemm.cpp), so it is held to the reference only.
TEST(CpuBackend, MoeExpertsFusedEqualsComposedAndReference) {
  for (const int64_t n : {23, 600}) {
    const int64_t E = 5, H = 37, I = 19;
    const bool chunked = n > 100;  // the second case: more rows per expert than kExpertRows
    const int k = chunked ? 4 : 2;
    SCOPED_TRACE("n=" + std::to_string(n));
    const float alpha = 1.702f, limit = 7.0f;
    std::mt19937 rng(5);
    std::normal_distribution<float> d;
    std::vector<float> logits(size_t(n * E)), x(size_t(n * H)), h0(size_t(n * H));
    for (float& v : logits) v = d(rng);
    for (int64_t t = 0; t < n; ++t) logits[t * E + E - 1] = -100.f;
    for (float& v : x) v = d(rng);
    for (float& v : h0) v = d(rng);
    std::vector<std::vector<float>> wgu(E), wdn(E), bgu(E), bdn(E);  // bf16-exact values
    auto bf16_values = [&](size_t count, float scale) {
      std::vector<float> v(count);
      for (float& e : v) e = round_bf16(scale * d(rng));
      return v;
    };
    for (auto ct : {kernels::ComputeType::BF16, kernels::ComputeType::F32}) {
      std::vector<ops::Linear> gate_up, down;
      for (int64_t e = 0; e < E; ++e) {
        wgu[e] = bf16_values(size_t(H * 2 * I), 0.3f);  // InOut [H, 2I]
        wdn[e] = bf16_values(size_t(I * H), 0.3f);      // InOut [I, H]
        bgu[e] = bf16_values(size_t(2 * I), 0.1f);
        bdn[e] = bf16_values(size_t(H), 0.1f);
        gate_up.push_back(ops::cpu().linear(wgu[e].data(), DType::F32, kernels::WeightLayout::InOut, 2 * I, H,
                                            bgu[e].data(), ct));
        down.push_back(
            ops::cpu().linear(wdn[e].data(), DType::F32, kernels::WeightLayout::InOut, H, I, bdn[e].data(), ct));
      }
      const ops::ExpertRouting g = ops::cpu().route_experts(logits.data(), n, E, k);
      ASSERT_EQ(g.offsets[E] - g.offsets[E - 1], 0);
      std::vector<float> fused = h0, composed = h0;
      ops::cpu().Backend::moe_experts(gate_up, down, g, x.data(), H, I, alpha, limit, composed.data());
      const bool bf16 = ct == kernels::ComputeType::BF16;
      std::vector<double> ref(h0.begin(), h0.end()), mag(size_t(n * H), 0.0);
      for (int64_t r = 0; r < n * k; ++r) {
        const int64_t e = std::upper_bound(g.offsets.begin(), g.offsets.end(), r) - g.offsets.begin() - 1;
        const int64_t t = g.token.data<int64_t>()[r];
        const double wr = g.weight.data<float>()[r];
        std::vector<double> act(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) {
          double gate = bgu[e][2 * i], up = bgu[e][2 * i + 1];
          for (int64_t j = 0; j < H; ++j) {
            const double xv = bf16 ? round_bf16(x[t * H + j]) : x[t * H + j];
            gate += xv * wgu[e][j * 2 * I + 2 * i];
            up += xv * wgu[e][j * 2 * I + 2 * i + 1];
          }
          gate = std::min(gate, double(limit));
          up = std::clamp(up, -double(limit), double(limit));
          act[i] = (up + 1.0) * gate / (1.0 + std::exp(-double(alpha) * gate));
        }
        for (int64_t c = 0; c < H; ++c) {
          double y = bdn[e][c], m = std::abs(bdn[e][c]);
          for (int64_t i = 0; i < I; ++i) {
            y += act[i] * wdn[e][i * H + c];
            m += std::abs(act[i] * wdn[e][i * H + c]);
          }
          ref[t * H + c] += wr * y;
          mag[t * H + c] += wr * m;
        }
      }
      const double tol = bf16 ? std::ldexp(1.0, -8) + 1e-4 : 1e-4;  // f32 gate_up error reaches act too
      // 4 routed experts: 2 threads take whole experts each, 1 and 3 split every step.
      struct RestoreThreads {
        int n = omp_get_max_threads();
        ~RestoreThreads() { omp_set_num_threads(n); }
      } restore;  // also when an assertion below returns early
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        fused = h0;
        ops::cpu().moe_experts(gate_up, down, g, x.data(), H, I, alpha, limit, fused.data());
        if (!chunked) {  // braces: gtest's ASSERT macros would leave the else of an if/else dangling
          for (int64_t i = 0; i < n * H; ++i)
            ASSERT_EQ(fused[i], composed[i]) << "bf16=" << bf16 << " threads=" << threads << " i=" << i;
        }
        for (int64_t i = 0; i < n * H; ++i)
          ASSERT_NEAR(fused[i], ref[i], tol * mag[i] + 1e-3) << "bf16=" << bf16 << " threads=" << threads << " i=" << i;
      }
    }
  }
}

// rmsnorm_linear: the CPU backend's bf16 path (the norm writes the GEMM's bf16 rows) equals the
// default (rmsnorm, then Linear::forward) bit for bit, with and without the f32 rows kept and
// with accumulation, both norm orders; and the output meets a double reference of the norm's
// bf16 rows times the bf16 weight. Odd sizes. An f32 Linear takes the default path.
TEST(CpuBackend, RmsnormLinearFusedEqualsComposedAndReference) {
  const int64_t rows = 29, dim = 75, N = 41;
  const float eps = 1e-5f;
  std::mt19937 rng(9);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(rows * dim)), nw(static_cast<size_t>(dim)),
      wt(static_cast<size_t>(N * dim)), bias(static_cast<size_t>(N)), y0(static_cast<size_t>(rows * N));
  for (float& v : x) v = 2.f * d(rng);
  for (float& v : nw) v = 1.f + 0.2f * d(rng);
  for (float& v : wt) v = round_bf16(0.2f * d(rng));  // OutIn [N, dim], bf16-exact
  for (float& v : bias) v = 0.1f * d(rng);
  for (float& v : y0) v = d(rng);
  for (auto ct : {kernels::ComputeType::BF16, kernels::ComputeType::F32})
    for (auto order : {kernels::NormOrder::WeightThenCast, kernels::NormOrder::CastThenWeight})
      for (bool keep : {false, true})
        for (bool acc : {false, true}) {
          const ops::Linear lin =
              ops::cpu().linear(wt.data(), DType::F32, kernels::WeightLayout::OutIn, N, dim, bias.data(), ct);
          std::vector<float> normed_f(x.size(), -1.f), normed_c(x.size()), yf = y0, yc = y0;
          ops::cpu().rmsnorm_linear(x.data(), nw.data(), rows, dim, eps, order, DType::BF16, lin, normed_f.data(),
                                    keep, yf.data(), acc);
          ops::cpu().Backend::rmsnorm_linear(x.data(), nw.data(), rows, dim, eps, order, DType::BF16, lin,
                                             normed_c.data(), keep, yc.data(), acc);
          const std::string what = "ct=" + std::to_string(int(ct)) + " order=" + std::to_string(int(order)) +
                                   " keep=" + std::to_string(keep) + " acc=" + std::to_string(acc);
          for (size_t i = 0; i < yf.size(); ++i) ASSERT_EQ(yf[i], yc[i]) << what << " i=" << i;
          if (keep) {
            for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(normed_f[i], normed_c[i]) << what << " i=" << i;
          }
          for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t j = 0; j < dim; ++j) ss += double(x[r * dim + j]) * x[r * dim + j];
            const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
            std::vector<double> xn(static_cast<size_t>(dim));
            for (int64_t j = 0; j < dim; ++j) {
              const double v = x[r * dim + j] * inv;
              xn[j] = order == kernels::NormOrder::WeightThenCast
                          ? round_bf16(float(nw[j] * v))
                          : round_bf16(float(nw[j] * double(round_bf16(float(v)))));
            }
            for (int64_t c = 0; c < N; ++c) {
              double ref = bias[c] + (acc ? y0[r * N + c] : 0.0), mag = std::abs(bias[c]);
              for (int64_t j = 0; j < dim; ++j) {
                ref += xn[j] * wt[c * dim + j];
                mag += std::abs(xn[j] * wt[c * dim + j]);
              }
              // the norm's bf16 rounding may land on the other side of a midpoint (2 ulps)
              ASSERT_NEAR(yf[r * N + c], ref, 2.0 * std::ldexp(1.0, -7) * mag + 1e-4) << what;
            }
          }
        }
}

TEST(CpuBackend, RmsnormLinearRejectsAWidthMismatch) {
  std::vector<float> wt(6 * 8, 0.5f), x(3 * 7, 1.f), nw(7, 1.f), normed(3 * 7), y(3 * 6);
  const ops::Linear lin =
      ops::cpu().linear(wt.data(), DType::F32, kernels::WeightLayout::OutIn, 6, 8, nullptr, kernels::ComputeType::BF16);
  EXPECT_THROW(ops::cpu().rmsnorm_linear(x.data(), nw.data(), 3, 7, 1e-5f, kernels::NormOrder::WeightThenCast,
                                         DType::BF16, lin, normed.data(), false, y.data()),
               slope::Error);
}
