// Linear and gemm_f32 against a naive double-precision reference.
//
// Tolerance (both compute types): |y − ref| <= kRelTol · Σ_k |x_k·w_k| (+ |b| + |y0|), i.e.
// relative to the magnitude of the terms summed, which bounds f32 accumulation error
// independently of cancellation. For BF16 the reference is computed from the bf16-rounded
// inputs, so only the f32 accumulation error remains and the same tolerance applies. Each BF16
// case runs on both units a BF16 Linear can compute on (kernels/bf16_units.h): oneDNN's bf16
// matmul where it has one, and the f32 units, so both are checked on every machine that has them
// whichever of them bf16 mode would choose there.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/kernels/cpu/amx.h"
#include "slope/kernels/gemm.h"

namespace slope::kernels {
namespace {

constexpr double kRelTol = 1e-5;

// Sets the units BF16 Linears constructed in its scope compute on; restores Auto.
struct UseBf16Units {
  explicit UseBf16Units(Bf16Units u) { set_bf16_units(u); }
  ~UseBf16Units() { set_bf16_units(Bf16Units::Auto); }
  UseBf16Units(const UseBf16Units&) = delete;
  UseBf16Units& operator=(const UseBf16Units&) = delete;
};
// The units a BF16 Linear can run on here: the bf16 matmul where oneDNN has one, and the f32 units.
std::vector<Bf16Units> units_here() {
  if (native_bf16_matmul_supported()) return {Bf16Units::Bf16, Bf16Units::F32};
  return {Bf16Units::F32};
}
std::string units_name(Bf16Units u) { return u == Bf16Units::F32 ? " f32-units" : " bf16-units"; }

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Random normal fp16 bit patterns with magnitudes in about [2^-5, 2^2).
std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& h : v) {
    uint32_t r = rng();
    uint16_t sign = uint16_t((r & 1u) << 15);
    uint16_t exp = uint16_t(10 + (r >> 1) % 7);
    uint16_t man = uint16_t((r >> 4) & 0x3ffu);
    h = uint16_t(sign | exp << 10 | man);
  }
  return v;
}

struct Weights {
  std::vector<float> f32;      // source values as f32 (exact for every source dtype)
  std::vector<uint16_t> bits;  // BF16 / F16 source bits
  const void* data(DType t) const { return t == DType::F32 ? (const void*)f32.data() : bits.data(); }
};

Weights make_weights(int64_t n, DType t, uint32_t seed) {
  Weights w;
  if (t == DType::F16) {
    w.bits = random_f16(n, seed);
    for (auto h : w.bits) w.f32.push_back(f16_to_f32(h));
  } else {
    w.f32 = random_floats(n, seed);
    if (t == DType::BF16) {
      for (auto& x : w.f32) {
        w.bits.push_back(f32_to_bf16(x));
        x = bf16_to_f32(w.bits.back());
      }
    }
  }
  return w;
}

// y_ref[i,j] = Σ_k x[i,k]·W(j,k) + b[j] (+ y0), and the magnitude Σ|terms| for the tolerance.
void reference(const std::vector<float>& x, const std::vector<float>& w, WeightLayout layout,
               const float* bias, const std::vector<float>* y0, int64_t M, int64_t N, int64_t K,
               bool round_bf16_inputs, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(M * N, 0.0);
  mag.assign(M * N, 0.0);
  auto rx = [&](float v) { return double(round_bf16_inputs ? round_bf16(v) : v); };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < K; ++k) {
        float wv = layout == WeightLayout::OutIn ? w[j * K + k] : w[k * N + j];
        double t = rx(x[i * K + k]) * rx(wv);
        s += t;
        m += std::abs(t);
      }
      if (bias) s += bias[j], m += std::abs(bias[j]);
      if (y0) s += (*y0)[i * N + j], m += std::abs((*y0)[i * N + j]);
      ref[i * N + j] = s;
      mag[i * N + j] = m;
    }
}

void expect_close(const std::vector<float>& y, const std::vector<double>& ref,
                  const std::vector<double>& mag, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < y.size() && bad < 5; ++i) {
    const double err = std::abs(double(y[i]) - ref[i]);
    if (!(err <= kRelTol * mag[i] + 1e-30)) {
      ADD_FAILURE() << what << " index " << i << ": got " << y[i] << " want " << ref[i]
                    << " (err " << err << ", bound " << kRelTol * mag[i] << ")";
      ++bad;
    }
  }
}

using Param = std::tuple<std::pair<int64_t, int64_t>, WeightLayout, DType, ComputeType, bool>;

class LinearTest : public ::testing::TestWithParam<Param> {};

TEST_P(LinearTest, MatchesDoubleReference) {
  const auto [nk, layout, wdtype, ct, with_bias] = GetParam();
  const auto [N, K] = nk;
  const Weights w = make_weights(N * K, wdtype, 7 + uint32_t(N * 31 + K));
  const std::vector<float> bias = random_floats(N, 99);
  const float* b = with_bias ? bias.data() : nullptr;
  const bool bf16 = ct == ComputeType::BF16;
  for (Bf16Units mm : units_here()) {
    if (!bf16 && mm != units_here().front()) continue;  // F32 does not depend on them
    const UseBf16Units use(mm);
    const Linear lin(w.data(wdtype), wdtype, layout, N, K, b, ct);
    EXPECT_EQ(lin.out_features(), N);
    EXPECT_EQ(lin.in_features(), K);
    EXPECT_EQ(lin.compute_type(), ct);
    const bool wide = !bf16 || bf16_units() == Bf16Units::F32;
    EXPECT_GE(lin.weight_bytes(), size_t(N * K) * (wide ? 4 : 2));

    // Several M on one Linear: the packed layout chosen at construction must serve them all.
    for (int64_t M : {1, 3, 17, 130}) {
      const auto x = random_floats(M * K, uint32_t(M * 1000 + K));
      for (bool acc : {false, true}) {
        const auto y0 = random_floats(M * N, uint32_t(M + 5));
        std::vector<float> y = y0;
        lin.forward(x.data(), M, y.data(), acc);
        std::vector<double> ref, mag;
        reference(x, w.f32, layout, b, acc ? &y0 : nullptr, M, N, K, bf16, ref, mag);
        expect_close(y, ref, mag, "M=" + std::to_string(M) + (acc ? " accumulate" : "") + units_name(mm));
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [nk, layout, wdtype, ct, bias] = info.param;
  return "N" + std::to_string(nk.first) + "K" + std::to_string(nk.second) +
         (layout == WeightLayout::OutIn ? "_OutIn" : "_InOut") + "_w" +
         std::string(dtype_name(wdtype)) + (ct == ComputeType::F32 ? "_f32" : "_bf16") +
         (bias ? "_bias" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearTest,
    ::testing::Combine(::testing::Values(std::pair<int64_t, int64_t>{33, 257},
                                         std::pair<int64_t, int64_t>{257, 33},
                                         std::pair<int64_t, int64_t>{1, 1}),
                       ::testing::Values(WeightLayout::OutIn, WeightLayout::InOut),
                       ::testing::Values(DType::F32, DType::BF16, DType::F16),
                       ::testing::Values(ComputeType::F32, ComputeType::BF16),
                       ::testing::Bool()),
    param_name);

// A shape large enough for oneDNN's K and N blocking to take several blocks.
TEST(Linear, LargerShapeBothComputeTypes) {
  const int64_t M = 67, N = 513, K = 1031;
  const Weights w = make_weights(N * K, DType::F32, 3);
  const auto bias = random_floats(N, 4);
  const auto x = random_floats(M * K, 5);
  for (ComputeType ct : {ComputeType::F32, ComputeType::BF16})
    for (Bf16Units mm : units_here()) {
      if (ct == ComputeType::F32 && mm != units_here().front()) continue;  // F32 does not depend on them
      const UseBf16Units use(mm);
      const Linear lin(w.data(DType::F32), DType::F32, WeightLayout::OutIn, N, K, bias.data(), ct);
      std::vector<float> y(M * N);
      lin.forward(x.data(), M, y.data());
      std::vector<double> ref, mag;
      reference(x, w.f32, WeightLayout::OutIn, bias.data(), nullptr, M, N, K,
                ct == ComputeType::BF16, ref, mag);
      expect_close(y, ref, mag, (ct == ComputeType::F32 ? "f32" : "bf16") + units_name(mm));
    }
}

TEST(Linear, ConcurrentForwardWithDistinctOutputs) {
  const int64_t N = 65, K = 129;
  const Weights w = make_weights(N * K, DType::BF16, 11);
  const Linear lin(w.data(DType::BF16), DType::BF16, WeightLayout::InOut, N, K, nullptr,
                   ComputeType::BF16);
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> xs, ys(4);
  for (int t = 0; t < 4; ++t) xs.push_back(random_floats((t + 1) * 9 * K, 100 + t));
  for (int t = 0; t < 4; ++t) {
    ys[t].resize((t + 1) * 9 * N);
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) lin.forward(xs[t].data(), (t + 1) * 9, ys[t].data());
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    std::vector<double> ref, mag;
    reference(xs[t], w.f32, WeightLayout::InOut, nullptr, nullptr, (t + 1) * 9, N, K, true, ref,
              mag);
    expect_close(ys[t], ref, mag, "thread " + std::to_string(t));
  }
}

TEST(Linear, MovedFromAndEmpty) {
  Linear a;
  EXPECT_TRUE(a.empty());
  const auto w = random_floats(6, 1);
  Linear b(w.data(), DType::F32, WeightLayout::OutIn, 2, 3, nullptr, ComputeType::F32);
  a = std::move(b);
  EXPECT_FALSE(a.empty());
  const float x[3] = {1, 2, 3};
  float y[2];
  a.forward(x, 1, y);
  EXPECT_NEAR(y[0], w[0] + 2 * w[1] + 3 * w[2], 1e-5);
  EXPECT_NEAR(y[1], w[3] + 2 * w[4] + 3 * w[5], 1e-5);
  a.forward(x, 0, y);  // M = 0 is a no-op
}

// forward_bf16 on rows the caller rounded is forward on the f32 rows, bit for bit (odd M, N, K,
// both accumulate modes), and so meets the same double reference.
TEST(Linear, ForwardBf16EqualsForwardOnRoundedRows) {
  const int64_t N = 131, K = 67;
  const Weights w = make_weights(N * K, DType::BF16, 21);
  const auto bias = random_floats(N, 22);
  for (Bf16Units mm : units_here()) {
    const UseBf16Units use(mm);
    const Linear lin(w.data(DType::BF16), DType::BF16, WeightLayout::InOut, N, K, bias.data(),
                     ComputeType::BF16);
    for (int64_t M : {1, 5, 33}) {
      const auto x = random_floats(M * K, uint32_t(40 + M));
      std::vector<uint16_t> xb(M * K);
      to_bf16(x.data(), xb.data(), M * K);
      for (bool acc : {false, true}) {
        const auto y0 = random_floats(M * N, uint32_t(M + 9));
        std::vector<float> want = y0, got = y0;
        lin.forward(x.data(), M, want.data(), acc);
        lin.forward_bf16(xb.data(), M, got.data(), acc);
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(got[i], want[i]) << "M=" << M << " acc=" << acc << " i=" << i;
        std::vector<double> ref, mag;
        reference(x, w.f32, WeightLayout::InOut, bias.data(), acc ? &y0 : nullptr, M, N, K, true, ref,
                  mag);
        expect_close(got, ref, mag, "forward_bf16 M=" + std::to_string(M) + units_name(mm));
      }
    }
  }
}

// The CPU has the AVX-512 subsets oneDNN's AVX-512 matmul (brgemm) needs.
bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// BF16 Linears run oneDNN's bf16 matmul on AMX tiles here (with the units now chosen).
bool amx_bf16_matmul() { return bf16_units() == Bf16Units::Bf16 && cpu::amx_usable(); }

// A row's result does not depend on how many rows share its call: rows of one call over M rows
// equal, bit for bit, the same rows computed one per call (oneDNN reduces each row over K in the
// same order whatever M is). The engine relies on it twice: Linear splits row counts into a
// multiple of 16 and the rest, and a MoE expert's rows come out the same whichever tokens (and
// so how many) it is given on a rank. Both compute types, with bias and accumulation, at the
// bench model's expert shape and a small odd one.
//
// That is oneDNN's AVX-512 matmul. Its AVX2 one (CPUs without AVX-512) runs tails of 1 to 3 rows
// of its 6-row blocks with another kernel, so there rows are held to the f32 accumulation bound
// instead (twice kRelTol: each side's error against the double reference). So are BF16 rows on
// oneDNN's AMX matmul (measured on a Sapphire Rapids: 15 rows in one call and one per call
// differ in the last bits).
TEST(Linear, RowResultsDoNotDependOnTheRowCount) {
  const bool kAvx512 = cpu_has_avx512();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{2048, 1024}, std::pair<int64_t, int64_t>{131, 67}}) {
    const Weights w = make_weights(N * K, DType::BF16, uint32_t(N + K));
    const auto bias = random_floats(N, 23);
    for (Bf16Units mm : units_here())
      for (ComputeType ct : {ComputeType::BF16, ComputeType::F32}) {
        const UseBf16Units use(mm);
        const bool kExactRows = kAvx512 && !(ct == ComputeType::BF16 && amx_bf16_matmul());
        const Linear lin(w.data(DType::BF16), DType::BF16, WeightLayout::OutIn, N, K, bias.data(), ct);
        for (int64_t M : {15, 16, 17, 47, 100}) {
          const auto x = random_floats(M * K, uint32_t(60 + M));
          for (bool acc : {false, true}) {
            const auto y0 = random_floats(M * N, uint32_t(M + 11));
            std::vector<float> all = y0, one = y0;
            lin.forward(x.data(), M, all.data(), acc);
            for (int64_t r = 0; r < M; ++r) lin.forward(x.data() + r * K, 1, one.data() + r * N, acc);
            std::vector<double> ref, mag;
            if (!kExactRows)
              reference(x, w.f32, WeightLayout::OutIn, bias.data(), acc ? &y0 : nullptr, M, N, K,
                        ct == ComputeType::BF16, ref, mag);
            for (int64_t i = 0; i < M * N; ++i) {
              const std::string where = "N=" + std::to_string(N) + " bf16=" +
                                        std::to_string(ct == ComputeType::BF16) + units_name(mm) +
                                        " M=" + std::to_string(M) + " acc=" + std::to_string(acc) +
                                        " row " + std::to_string(i / N);
              if (kExactRows)
                ASSERT_EQ(all[i], one[i]) << where;
              else
                ASSERT_LE(std::abs(double(all[i]) - one[i]), 2 * kRelTol * mag[i]) << where;
            }
          }
        }
      }
  }
}

// Row counts of one shape past 16 build primitives only for multiples of 16 and for the
// remainders: 48 row counts from 161 to 208 (three multiples of 16 and all 15 remainders, with
// and without accumulation) build at most 2·(4 + 15) primitives, not 2·48. On AMX (BF16 on
// oneDNN's bf16 matmul) the quantum is 64: 128 and 192, the remainders 1 to 16 and 33 to 63.
TEST(Linear, RowCountsShareFewPrimitives) {
  const int64_t N = 48, K = 40;  // a shape no other test uses, so the cache holds none of it
  const Weights w = make_weights(N * K, DType::F32, 31);
  const Linear lin(w.data(DType::F32), DType::F32, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16);
  const auto x = random_floats(208 * K, 32);
  std::vector<float> y(208 * N);
  const int64_t before = gemm_primitives_built();
  for (bool acc : {false, true})
    for (int64_t M = 161; M <= 208; ++M) lin.forward(x.data(), M, y.data(), acc);
  const int64_t distinct = amx_bf16_matmul() ? 2 + 16 + 31 : 3 + 15;  // row counts each call set builds
  EXPECT_LE(gemm_primitives_built() - before, 2 * (distinct + 1));
  EXPECT_GE(gemm_primitives_built() - before, 2 * distinct);
}

// The two units of a BF16 Linear agree to the f32 accumulation bound where this CPU has both,
// and asking for oneDNN's bf16 matmul where it has none is a clear error, not a crash.
TEST(Linear, Bf16UnitsAgree) {
  const int64_t M = 37, N = 129, K = 515;
  const Weights w = make_weights(N * K, DType::BF16, 41);
  const auto x = random_floats(M * K, 42);
  if (!native_bf16_matmul_supported()) {
    const UseBf16Units use(Bf16Units::Bf16);
    try {
      Linear(w.data(DType::BF16), DType::BF16, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16);
      ADD_FAILURE() << "bf16 units without a bf16 matmul constructed";
    } catch (const slope::Error& e) {
      EXPECT_NE(std::string(e.what()).find("no bf16 matmul on this CPU"), std::string::npos) << e.what();
    }
    // F32 Linears do not depend on the choice.
    Linear f32(w.data(DType::BF16), DType::BF16, WeightLayout::OutIn, N, K, nullptr, ComputeType::F32);
    EXPECT_EQ(f32.compute_type(), ComputeType::F32);
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU: only the f32 units can run";
  }
  std::vector<float> native(M * N), units(M * N);
  {
    const UseBf16Units use(Bf16Units::Bf16);
    Linear(w.data(DType::BF16), DType::BF16, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16)
        .forward(x.data(), M, native.data());
  }
  {
    const UseBf16Units use(Bf16Units::F32);
    Linear(w.data(DType::BF16), DType::BF16, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16)
        .forward(x.data(), M, units.data());
  }
  std::vector<double> ref, mag;
  reference(x, w.f32, WeightLayout::OutIn, nullptr, nullptr, M, N, K, true, ref, mag);
  for (int64_t i = 0; i < M * N; ++i)
    ASSERT_LE(std::abs(double(native[i]) - units[i]), 2 * kRelTol * mag[i]) << "index " << i;
}

// oneDNN 2.6 packs an f32 matmul's weights once (brgemm) on AVX-512 CPUs and inside every call
// (gemm:jit) on AVX2 ones; the MoE sizes its expert calls by this answer (ops/cpu/backend_cpu.cpp).
TEST(Linear, F32MatmulPacksPerCallOnlyWithoutAvx512) {
  EXPECT_EQ(f32_matmul_packs_per_call(), !cpu_has_avx512());
}

TEST(Linear, ForwardBf16RejectsAnF32Linear) {
  const auto w = random_floats(6, 1);
  const Linear lin(w.data(), DType::F32, WeightLayout::OutIn, 2, 3, nullptr, ComputeType::F32);
  EXPECT_EQ(lin.compute_type(), ComputeType::F32);
  const uint16_t x[3] = {};
  float y[2];
  EXPECT_THROW(lin.forward_bf16(x, 1, y), slope::Error);
}

TEST(Linear, RejectsUnsupportedWeightDtype) {
  const uint8_t w[4] = {};
  EXPECT_THROW(Linear(w, DType::U8, WeightLayout::OutIn, 2, 2, nullptr, ComputeType::F32),
               slope::Error);
}

TEST(GemmF32, LeadingDimensionsTransposeAlphaBeta) {
  for (bool tb : {false, true})
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 33, 257},
                           {17, 257, 33}, {130, 65, 129}}) {
      const int64_t lda = K + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      const auto A = random_floats(M * lda, 1), B = random_floats((tb ? N : K) * ldb, 2);
      const auto C0 = random_floats(M * ldc, 3);
      const float alpha = 0.75f, beta = -1.25f;
      auto C = C0;
      gemm_f32(M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc, tb);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0, m = 0;
          for (int64_t k = 0; k < K; ++k) {
            double t = double(A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            s += t;
            m += std::abs(t);
          }
          const double want = alpha * s + beta * double(C0[i * ldc + j]);
          const double bound = kRelTol * (std::abs(alpha) * m + std::abs(beta * C0[i * ldc + j]));
          ASSERT_NEAR(C[i * ldc + j], want, bound) << "M=" << M << " N=" << N << " K=" << K
                                                   << " tb=" << tb << " at " << i << "," << j;
        }
        for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);  // padding
      }
    }
}

}  // namespace
}  // namespace slope::kernels
