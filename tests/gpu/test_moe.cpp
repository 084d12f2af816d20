// MoE on the GPU against the CPU kernels: routing, grouping (the same order exactly), the
// grouped expert GEMM with bf16 and MXFP4 weights, the combine, and the whole expert block
// chained as model/layers.cpp's moe_mlp runs it on the CPU.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu_test_util.h"
#include "slope/core/error.h"
#include "slope/cuda/activation.h"
#include "slope/cuda/moe.h"
#include "slope/kernels/gemm.h"
#include "slope/kernels/moe.h"
#include "slope/kernels/mxfp4.h"

namespace slope::gpu_test {
namespace {

// Random MXFP4 weights for E experts of [N, K]: any nibbles, scales around 2^0 (and a few
// extreme ones, which dequantise to tiny values).
struct Mxfp4 {
  std::vector<uint8_t> blocks, scales;
};
Mxfp4 random_mxfp4(std::mt19937& rng, int64_t E, int64_t N, int64_t K) {
  Mxfp4 m;
  m.blocks.resize(E * N * K / 2);
  m.scales.resize(E * N * K / 32);
  std::uniform_int_distribution<int> byte(0, 255), sc(120, 130);
  for (auto& b : m.blocks) b = uint8_t(byte(rng));
  for (auto& s : m.scales) s = uint8_t(sc(rng));
  m.scales[0] = 1;
  return m;
}

// Expert e's weight [N, K] as f32 on the host (the CPU model's expert_weight_f32).
std::vector<float> dequant_expert(const Mxfp4& m, int64_t e, int64_t N, int64_t K) {
  std::vector<float> w(N * K);
  const int64_t nb = K / 32;
  kernels::mxfp4_dequantize(m.blocks.data() + e * N * nb * 16, m.scales.data() + e * N * nb, N, nb, w.data());
  return w;
}

TEST(GpuMoe, RoutingAndGroupingMatchCpuExactly) {
  SLOPE_REQUIRE_GPU();
  const int64_t n = 301, E = 32;
  const int k = 4;
  std::mt19937 rng(21);
  const auto logits = random_floats(rng, n * E, -4.f, 4.f);  // continuous: no ties
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  kernels::route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  const kernels::ExpertGroups ref = kernels::group_by_expert(ids.data(), w.data(), n, k, E);

  auto dl = cuda::DeviceBuffer::from(logits);
  auto dids = poisoned(n * k, 4), dw = poisoned(n * k);
  cuda::route_topk_softmax(dl.as<float>(), n, E, k, dids.as<int32_t>(), dw.as<float>());
  cuda::ExpertGroups g(n * k, E);
  cuda::group_by_expert(dids.as<int32_t>(), dw.as<float>(), n, k, g);
  g.check();
  EXPECT_EQ(dids.to_host<int32_t>(), ids);
  const auto gw = dw.to_host<float>();
  for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(gw[i], w[i], 1e-6) << i;

  std::vector<int32_t> off(E + 1), tok(n * k), slot_row(n * k);
  std::vector<float> wt(n * k);
  cuda::copy_to_host(off.data(), g.offsets(), off.size() * 4);
  cuda::copy_to_host(tok.data(), g.token(), tok.size() * 4);
  cuda::copy_to_host(wt.data(), g.weight(), wt.size() * 4);
  cuda::copy_to_host(slot_row.data(), g.slot_row(), slot_row.size() * 4);
  for (int64_t e = 0; e <= E; ++e) ASSERT_EQ(off[e], ref.offsets[e]) << "offset of expert " << e;
  for (int64_t r = 0; r < n * k; ++r) {
    ASSERT_EQ(tok[r], ref.token[r]) << "grouped row " << r;
    ASSERT_NEAR(wt[r], ref.weight[r], 1e-6) << "grouped row " << r;
  }
  // slot_row inverts the grouping: slot s = t·k + j sits at a row of expert ids[s] holding token t.
  for (int64_t s = 0; s < n * k; ++s) {
    const int32_t r = slot_row[s];
    ASSERT_GE(r, off[ids[s]]);
    ASSERT_LT(r, off[ids[s] + 1]);
    ASSERT_EQ(tok[r], s / k);
  }
}

TEST(GpuMoe, GroupingReportsOutOfRangeIds) {
  SLOPE_REQUIRE_GPU();
  const std::vector<int32_t> ids = {0, 3, 1, 7};  // 7 is outside [0, 4)
  const std::vector<float> w = {1, 1, 1, 1};
  auto dids = cuda::DeviceBuffer::from(ids), dw = cuda::DeviceBuffer::from(w);
  cuda::ExpertGroups g(4, 4);
  cuda::group_by_expert(dids.as<int32_t>(), dw.as<float>(), 2, 2, g);
  EXPECT_THROW(g.check(), Error);
}

// The grouped GEMM against one CPU BF16 Linear per expert (weights dequantised on the host for
// MXFP4), with the A rows gathered by token, a bias per expert, and experts with no rows.
void check_grouped_gemm(bool mxfp4) {
  const int64_t n = 150, E = 8, N = 200, K = 96;
  const int k = 2;
  std::mt19937 rng(mxfp4 ? 31 : 37);
  const auto x = random_floats(rng, n * K);
  auto logits = random_floats(rng, n * E);
  for (int64_t t = 0; t < n; ++t) logits[t * E + 5] = -100.f;  // expert 5 gets no tokens
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  kernels::route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  const kernels::ExpertGroups ref_g = kernels::group_by_expert(ids.data(), w.data(), n, k, E);
  const auto bias = random_floats(rng, E * N);
  const Mxfp4 mx = random_mxfp4(rng, E, N, K);
  const auto wbf = random_bf16_exact(rng, E * N * K);

  std::vector<float> ref(n * k * N);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = ref_g.offsets[e], rows = ref_g.offsets[e + 1] - r0;
    if (rows == 0) continue;
    const std::vector<float> we = mxfp4 ? dequant_expert(mx, e, N, K)
                                        : std::vector<float>(wbf.begin() + e * N * K, wbf.begin() + (e + 1) * N * K);
    const kernels::Linear lin(we.data(), DType::F32, kernels::WeightLayout::OutIn, N, K, bias.data() + e * N,
                              kernels::ComputeType::BF16);
    std::vector<float> xin(rows * K);
    std::vector<int64_t> tok(ref_g.token.begin() + r0, ref_g.token.begin() + r0 + rows);
    kernels::gather_rows(x.data(), tok.data(), rows, K, xin.data());
    lin.forward(xin.data(), rows, ref.data() + r0 * N);
  }

  auto dx = cuda::DeviceBuffer::from(x), dids = cuda::DeviceBuffer::from(ids), dw = cuda::DeviceBuffer::from(w);
  cuda::ExpertGroups g(n * k, E);
  cuda::group_by_expert(dids.as<int32_t>(), dw.as<float>(), n, k, g);
  auto dbias = cuda::DeviceBuffer::from(bias), dblocks = cuda::DeviceBuffer::from(mx.blocks),
       dscales = cuda::DeviceBuffer::from(mx.scales), dwbf = cuda::DeviceBuffer::from(to_bf16_bits(wbf));
  auto dy = poisoned(ref.size());
  cuda::GroupedGemmArgs a{.a = dx.as<float>(), .a_rows = g.token(), .K = K, .offsets = g.offsets(), .E = E,
                          .rows = n * k, .N = N, .bias = dbias.as<float>(), .y = dy.as<float>()};
  if (mxfp4) a.w_blocks = dblocks.as<uint8_t>(), a.w_scales = dscales.as<uint8_t>();
  else a.w_bf16 = dwbf.as<uint16_t>();
  cuda::grouped_gemm(a);
  cuda::synchronize();
  const auto got = dy.to_host<float>();
  ASSERT_EQ(count_nan(got), 0u) << "unwritten output rows";
  EXPECT_LT(rel_l2(got, ref), 1e-4);
}

TEST(GpuMoe, GroupedGemmBf16MatchesPerExpertLinear) {
  SLOPE_REQUIRE_GPU();
  check_grouped_gemm(false);
}

TEST(GpuMoe, GroupedGemmMxfp4MatchesDequantisedPerExpertLinear) {
  SLOPE_REQUIRE_GPU();
  check_grouped_gemm(true);
}

TEST(GpuMoe, Mxfp4DequantiseIsBitExact) {
  SLOPE_REQUIRE_GPU();
  std::mt19937 rng(41);
  const int64_t rows = 7, nb = 5;
  std::vector<uint8_t> blocks(rows * nb * 16), scales(rows * nb);
  for (auto& b : blocks) b = uint8_t(rng());
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i * 37 % 256);  // every range, 0 and 255 too
  std::vector<float> ref(rows * nb * 32);
  kernels::mxfp4_dequantize(blocks.data(), scales.data(), rows, nb, ref.data());
  auto db = cuda::DeviceBuffer::from(blocks), ds = cuda::DeviceBuffer::from(scales);
  auto dout = poisoned(ref.size());
  cuda::mxfp4_dequantize(db.as<uint8_t>(), ds.as<uint8_t>(), rows, nb, dout.as<float>());
  cuda::synchronize();
  const auto got = dout.to_host<float>();
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << "element " << i;
}

// The expert block end to end, as moe_mlp on the CPU: group, gate_up (MXFP4, gathered rows),
// clamped SwiGLU, down (MXFP4), weighted combine into the residual.
TEST(GpuMoe, ExpertBlockMatchesCpuMoe) {
  SLOPE_REQUIRE_GPU();
  const int64_t n = 97, E = 8, H = 64, I = 96;
  const int k = 4;
  std::mt19937 rng(43);
  const auto x = random_floats(rng, n * H), h0 = random_floats(rng, n * H);
  const auto logits = random_floats(rng, n * E, -3.f, 3.f);
  const Mxfp4 gu = random_mxfp4(rng, E, 2 * I, H), dn = random_mxfp4(rng, E, H, I);
  const auto gu_bias = random_floats(rng, E * 2 * I), dn_bias = random_floats(rng, E * H);

  // CPU: layers.cpp's moe_mlp with the router output given.
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  kernels::route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  const kernels::ExpertGroups cg = kernels::group_by_expert(ids.data(), w.data(), n, k, E);
  std::vector<float> ref = h0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = cg.offsets[e], rows = cg.offsets[e + 1] - r0;
    if (rows == 0) continue;
    const auto wgu = dequant_expert(gu, e, 2 * I, H), wdn = dequant_expert(dn, e, H, I);
    const kernels::Linear lgu(wgu.data(), DType::F32, kernels::WeightLayout::OutIn, 2 * I, H, gu_bias.data() + e * 2 * I,
                              kernels::ComputeType::BF16);
    const kernels::Linear ldn(wdn.data(), DType::F32, kernels::WeightLayout::OutIn, H, I, dn_bias.data() + e * H,
                              kernels::ComputeType::BF16);
    std::vector<float> xin(rows * H), g(rows * 2 * I), act(rows * I), y(rows * H);
    kernels::gather_rows(x.data(), cg.token.data() + r0, rows, H, xin.data());
    lgu.forward(xin.data(), rows, g.data());
    kernels::swiglu_oai(g.data(), rows, I, 1.702f, 7.f, act.data());
    ldn.forward(act.data(), rows, y.data());
    kernels::scatter_add_rows(y.data(), cg.token.data() + r0, cg.weight.data() + r0, rows, H, ref.data());
  }

  // GPU: the same from the logits on.
  auto dl = cuda::DeviceBuffer::from(logits), dx = cuda::DeviceBuffer::from(x), dh = cuda::DeviceBuffer::from(h0);
  auto dguB = cuda::DeviceBuffer::from(gu.blocks), dguS = cuda::DeviceBuffer::from(gu.scales);
  auto ddnB = cuda::DeviceBuffer::from(dn.blocks), ddnS = cuda::DeviceBuffer::from(dn.scales);
  auto dgub = cuda::DeviceBuffer::from(gu_bias), ddnb = cuda::DeviceBuffer::from(dn_bias);
  cuda::DeviceBuffer dids(n * k * 4), dw(n * k * 4), dgu(n * k * 2 * I * 4), dact(n * k * I * 4), dy(n * k * H * 4);
  cuda::route_topk_softmax(dl.as<float>(), n, E, k, dids.as<int32_t>(), dw.as<float>());
  cuda::ExpertGroups g(n * k, E);
  cuda::group_by_expert(dids.as<int32_t>(), dw.as<float>(), n, k, g);
  cuda::grouped_gemm({.a = dx.as<float>(), .a_rows = g.token(), .K = H, .offsets = g.offsets(), .E = E, .rows = n * k,
                      .N = 2 * I, .w_blocks = dguB.as<uint8_t>(), .w_scales = dguS.as<uint8_t>(),
                      .bias = dgub.as<float>(), .y = dgu.as<float>()});
  cuda::swiglu_oai(dgu.as<float>(), n * k, I, 1.702f, 7.f, dact.as<float>());
  cuda::grouped_gemm({.a = dact.as<float>(), .K = I, .offsets = g.offsets(), .E = E, .rows = n * k, .N = H,
                      .w_blocks = ddnB.as<uint8_t>(), .w_scales = ddnS.as<uint8_t>(), .bias = ddnb.as<float>(),
                      .y = dy.as<float>()});
  cuda::moe_combine(dy.as<float>(), g, n, k, H, dh.as<float>());
  g.check();
  EXPECT_LT(rel_l2(dh.to_host<float>(), ref), 1e-4);
}

TEST(GpuMoe, ScatterAddAndGatherMatchCpu) {
  SLOPE_REQUIRE_GPU();
  const int64_t m = 50, dim = 33, n = 20;
  std::mt19937 rng(47);
  const auto src = random_floats(rng, m * dim), w = random_floats(rng, m), base = random_floats(rng, n * dim);
  std::vector<int64_t> rows64(m);
  std::vector<int32_t> rows(m);
  for (int64_t r = 0; r < m; ++r) rows[r] = int32_t(rows64[r] = int64_t(rng() % n));  // repeats
  std::vector<float> ref = base;
  kernels::scatter_add_rows(src.data(), rows64.data(), w.data(), m, dim, ref.data());
  auto ds = cuda::DeviceBuffer::from(src), dr = cuda::DeviceBuffer::from(rows), dw = cuda::DeviceBuffer::from(w),
       dd = cuda::DeviceBuffer::from(base);
  cuda::scatter_add_rows(ds.as<float>(), dr.as<int32_t>(), dw.as<float>(), m, dim, dd.as<float>());
  cuda::synchronize();
  EXPECT_LT(rel_l2(dd.to_host<float>(), ref), kF32Tol);

  std::vector<float> gref(m * dim);
  kernels::gather_rows(base.data(), rows64.data(), m, dim, gref.data());
  auto dbase = cuda::DeviceBuffer::from(base);
  auto dg = poisoned(gref.size());
  cuda::gather_rows(dbase.as<float>(), dr.as<int32_t>(), m, dim, dg.as<float>());
  cuda::synchronize();
  EXPECT_EQ(dg.to_host<float>(), gref);
}

TEST(GpuMoe, RejectsBadArguments) {
  // Checked before any device work: runs without a GPU.
  EXPECT_THROW(cuda::route_topk_softmax(nullptr, 4, 8, 9, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::route_topk_softmax(nullptr, 4, 64, 33, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::grouped_gemm({.K = 48, .E = 4, .rows = 8, .N = 16, .w_blocks = reinterpret_cast<const uint8_t*>(1),
                                   .w_scales = reinterpret_cast<const uint8_t*>(1)}),
               Error);  // MXFP4 with K not a multiple of 32
}

}  // namespace
}  // namespace slope::gpu_test
