// cuda::flash_attention (f32 and bf16 entry points), attention_merge and attention_apply_sinks
// against the CPU kernels on the same bf16-exact random inputs, over every mask and option:
// causal or not, sliding windows, sinks, GQA, global positions of a context-parallel step,
// blocks that see nothing, and head dims that need padding.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gpu_test_util.h"
#include "slope/core/error.h"
#include "slope/cuda/attention.h"
#include "slope/cuda/attention_merge.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/attention_merge.h"

namespace slope::gpu_test {
namespace {

struct Case {
  int64_t nq, q_pos0, nk, kv_pos0, Hq, Hkv, D;
  bool causal;
  int64_t window;
  bool sinks;
  bool unaligned = false;  // q, k, v one element past a 16-byte boundary: the element-wise loads
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "nq=" << c.nq << " q_pos0=" << c.q_pos0 << " nk=" << c.nk << " kv_pos0=" << c.kv_pos0 << " Hq=" << c.Hq
      << " Hkv=" << c.Hkv << " D=" << c.D << " causal=" << c.causal << " window=" << c.window << " sinks=" << c.sinks
      << (c.unaligned ? " unaligned" : "");
}

class GpuAttention : public ::testing::TestWithParam<Case> {};

TEST_P(GpuAttention, MatchesCpuKernel) {
  SLOPE_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(1234 + c.nq * 7 + c.D);
  // Scores of a few units: peaked enough that the softmax matters, in the range of real models.
  const auto q = random_bf16_exact(rng, c.nq * c.Hq * c.D, -2.f, 2.f);
  const auto k = random_bf16_exact(rng, c.nk * c.Hkv * c.D, -2.f, 2.f);
  const auto v = random_bf16_exact(rng, c.nk * c.Hkv * c.D);
  const auto sinks = random_floats(rng, c.Hq, -1.f, 2.f);
  const float scale = 1.f / std::sqrt(float(c.D));
  const kernels::AttentionShape shape{c.Hq, c.Hkv, c.D};
  const kernels::AttentionMask mask{c.causal, c.window};

  std::vector<float> ref_out(c.nq * c.Hq * c.D), ref_lse(c.nq * c.Hq);
  kernels::flash_attention({.q = q.data(), .nq = c.nq, .q_pos0 = c.q_pos0, .k = k.data(), .v = v.data(), .nk = c.nk,
                            .kv_pos0 = c.kv_pos0, .shape = shape, .mask = mask, .scale = scale,
                            .sinks = c.sinks ? sinks.data() : nullptr, .out = ref_out.data(), .lse = ref_lse.data()});

  // With `unaligned`, every input starts one element into its buffer.
  const size_t off = c.unaligned ? 1 : 0;
  auto with_offset = [off](auto host) {
    host.insert(host.begin(), off, typename decltype(host)::value_type{});
    return cuda::DeviceBuffer::from(host);
  };
  auto dq = with_offset(q), dk = with_offset(k), dv = with_offset(v);
  auto dqb = with_offset(to_bf16_bits(q)), dkb = with_offset(to_bf16_bits(k)), dvb = with_offset(to_bf16_bits(v));
  auto dsinks = cuda::DeviceBuffer::from(sinks);
  for (const bool bf16_inputs : {false, true}) {
    SCOPED_TRACE(bf16_inputs ? "bf16 inputs" : "f32 inputs");
    auto dout = poisoned(ref_out.size()), dlse = poisoned(ref_lse.size());
    const float* ds = c.sinks ? dsinks.as<float>() : nullptr;
    if (bf16_inputs) {
      cuda::flash_attention(cuda::AttentionArgsBf16{.q = dqb.as<uint16_t>() + off, .nq = c.nq, .q_pos0 = c.q_pos0,
                                                    .k = dkb.as<uint16_t>() + off, .v = dvb.as<uint16_t>() + off,
                                                    .nk = c.nk,
                                                    .kv_pos0 = c.kv_pos0, .shape = shape, .mask = mask,
                                                    .scale = scale, .sinks = ds, .out = dout.as<float>(),
                                                    .lse = dlse.as<float>()});
    } else {
      cuda::flash_attention(kernels::AttentionArgs{.q = dq.as<float>() + off, .nq = c.nq, .q_pos0 = c.q_pos0,
                                                   .k = dk.as<float>() + off, .v = dv.as<float>() + off, .nk = c.nk,
                                                   .kv_pos0 = c.kv_pos0, .shape = shape, .mask = mask,
                                                   .scale = scale, .sinks = ds, .out = dout.as<float>(),
                                                   .lse = dlse.as<float>()});
    }
    cuda::synchronize();
    const auto out = dout.to_host<float>(), lse = dlse.to_host<float>();
    ASSERT_EQ(count_nan(out), 0u) << "unwritten or NaN output elements";
    EXPECT_LT(rel_l2(out, ref_out), kMixedTol);
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        ASSERT_EQ(lse[i], ref_lse[i]) << "row/head " << i << ": a row that sees no key has lse -inf";
      } else {
        ASSERT_NEAR(lse[i], ref_lse[i], 5e-3 * std::max(1.0, std::abs(double(ref_lse[i])))) << "row/head " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Masks, GpuAttention,
    ::testing::Values(
        // whole sequence, causal, GQA 4:2, one partial query block
        Case{200, 0, 200, 0, 4, 2, 64, true, 0, false},
        // bidirectional, head_dim 128, MQA
        Case{77, 0, 131, 0, 3, 1, 128, false, 0, false},
        // sliding window with sinks (gpt-oss's alternating layers)
        Case{150, 0, 150, 0, 2, 2, 64, true, 37, true},
        // a context-parallel step: queries 300.., keys 100.., head_dim 80 padded to 128
        Case{65, 300, 190, 100, 4, 4, 80, true, 0, true},
        // a step whose queries precede every key: no visible key (lse -inf; the sink with sinks)
        Case{40, 0, 70, 500, 2, 1, 64, true, 0, false}, Case{40, 0, 70, 500, 2, 1, 64, true, 0, true},
        // window edge inside a block, global offsets, head_dim 256, GQA 8:2
        Case{33, 1000, 90, 950, 8, 2, 256, true, 20, false},
        // small odd head_dim (padded to 32), window without causal
        Case{129, 0, 129, 0, 2, 1, 20, false, 9, true},
        // no keys at all
        Case{17, 0, 0, 0, 2, 2, 64, true, 0, true},
        // inputs not 16-byte aligned (a view into a larger buffer): the element-wise tile loads
        Case{70, 10, 100, 0, 4, 2, 64, true, 0, true, true}));

// A context-parallel step sequence on the GPU: the keys in three blocks at their global
// positions, each attended without sinks, merged (attention_merge), then the sinks applied once:
// the whole-sequence CPU result with sinks, as ring attention composes it.
TEST(GpuAttention, BlockwiseMergeWithSinksEqualsWholeSequence) {
  SLOPE_REQUIRE_GPU();
  const int64_t nq = 90, q_pos0 = 210, n = 300, Hq = 4, Hkv = 2, D = 64;  // queries are rows 210..299
  std::mt19937 rng(99);
  const auto q = random_bf16_exact(rng, nq * Hq * D, -2.f, 2.f);
  const auto k = random_bf16_exact(rng, n * Hkv * D, -2.f, 2.f), v = random_bf16_exact(rng, n * Hkv * D);
  const auto sinks = random_floats(rng, Hq, -1.f, 2.f);
  const kernels::AttentionShape shape{Hq, Hkv, D};
  const kernels::AttentionMask mask{true, 100};  // causal + window: the first block is out of reach
  const float scale = 0.125f;
  std::vector<float> ref_out(nq * Hq * D), ref_lse(nq * Hq);
  kernels::flash_attention({.q = q.data(), .nq = nq, .q_pos0 = q_pos0, .k = k.data(), .v = v.data(), .nk = n,
                            .shape = shape, .mask = mask, .scale = scale, .sinks = sinks.data(),
                            .out = ref_out.data(), .lse = ref_lse.data()});

  auto dq = cuda::DeviceBuffer::from(q), dk = cuda::DeviceBuffer::from(k), dv = cuda::DeviceBuffer::from(v);
  auto ds = cuda::DeviceBuffer::from(sinks);
  auto acc_out = poisoned(ref_out.size()), acc_lse = poisoned(ref_lse.size());
  auto blk_out = poisoned(ref_out.size()), blk_lse = poisoned(ref_lse.size());
  const int64_t bounds[] = {0, 100, 220, n};
  for (int b = 0; b < 3; ++b) {
    const int64_t k0 = bounds[b], nk = bounds[b + 1] - k0;
    cuda::DeviceBuffer& o = b == 0 ? acc_out : blk_out;
    cuda::DeviceBuffer& l = b == 0 ? acc_lse : blk_lse;
    cuda::flash_attention(kernels::AttentionArgs{.q = dq.as<float>(), .nq = nq, .q_pos0 = q_pos0,
                                                 .k = dk.as<float>() + k0 * Hkv * D, .v = dv.as<float>() + k0 * Hkv * D,
                                                 .nk = nk, .kv_pos0 = k0, .shape = shape, .mask = mask, .scale = scale,
                                                 .sinks = nullptr, .out = o.as<float>(), .lse = l.as<float>()});
    if (b > 0)
      cuda::attention_merge(acc_out.as<float>(), acc_lse.as<float>(), blk_out.as<float>(), blk_lse.as<float>(), nq, Hq,
                            D);
  }
  cuda::attention_apply_sinks(acc_out.as<float>(), acc_lse.as<float>(), ds.as<float>(), nq, Hq, D);
  cuda::synchronize();
  const auto out = acc_out.to_host<float>(), lse = acc_lse.to_host<float>();
  ASSERT_EQ(count_nan(out), 0u);
  EXPECT_LT(rel_l2(out, ref_out), kMixedTol);
  for (size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lse[i], ref_lse[i], 5e-3 * std::max(1.0, std::abs(double(ref_lse[i])))) << i;
}

TEST(GpuAttentionArgs, RejectsShapesTheKernelDoesNotTake) {
  // Validation happens before any device work, so this runs without a GPU too.
  float dummy = 0;
  kernels::AttentionArgs a{.q = &dummy, .nq = 4, .k = &dummy, .v = &dummy, .nk = 4,
                           .shape = {4, 4, 512}, .mask = {}, .out = &dummy, .lse = &dummy};
  try {
    cuda::flash_attention(a);
    FAIL() << "head_dim 512 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 512"), std::string::npos) << e.what();
  }
  a.shape = {6, 4, 64};
  try {
    cuda::flash_attention(a);
    FAIL() << "6 query heads over 4 KV heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of num_kv_heads"), std::string::npos) << e.what();
  }
}

TEST(GpuAttentionMerge, MatchesCpuMergeAndSinks) {
  SLOPE_REQUIRE_GPU();
  const int64_t n = 37, H = 3, D = 72;
  std::mt19937 rng(7);
  auto oa = random_floats(rng, n * H * D), ob = random_floats(rng, n * H * D);
  auto la = random_floats(rng, n * H, -3.f, 5.f), lb = random_floats(rng, n * H, -3.f, 5.f);
  const auto sinks = random_floats(rng, H, -1.f, 2.f);
  const float inf = std::numeric_limits<float>::infinity();
  // Empty rows on either side and on both (their out rows are 0, as the kernel writes them).
  for (int64_t t : {0, 5}) la[t] = -inf, std::fill(oa.begin() + t * D, oa.begin() + (t + 1) * D, 0.f);
  for (int64_t t : {1, 5}) lb[t] = -inf, std::fill(ob.begin() + t * D, ob.begin() + (t + 1) * D, 0.f);

  auto doa = cuda::DeviceBuffer::from(oa), dla = cuda::DeviceBuffer::from(la);
  auto dob = cuda::DeviceBuffer::from(ob), dlb = cuda::DeviceBuffer::from(lb), ds = cuda::DeviceBuffer::from(sinks);
  kernels::attention_merge(oa.data(), la.data(), ob.data(), lb.data(), n, H, D);
  cuda::attention_merge(doa.as<float>(), dla.as<float>(), dob.as<float>(), dlb.as<float>(), n, H, D);
  cuda::synchronize();
  EXPECT_LT(rel_l2(doa.to_host<float>(), oa), kF32Tol);
  auto got_lse = dla.to_host<float>();
  for (int64_t t = 0; t < n * H; ++t) {
    if (std::isinf(la[t])) ASSERT_EQ(got_lse[t], la[t]) << t;
    else ASSERT_NEAR(got_lse[t], la[t], 1e-5 * std::max(1.f, std::abs(la[t]))) << t;
  }

  kernels::attention_apply_sinks(oa.data(), la.data(), sinks.data(), n, H, D);
  cuda::attention_apply_sinks(doa.as<float>(), dla.as<float>(), ds.as<float>(), n, H, D);
  cuda::synchronize();
  EXPECT_LT(rel_l2(doa.to_host<float>(), oa), kF32Tol);
  got_lse = dla.to_host<float>();
  for (int64_t t = 0; t < n * H; ++t) ASSERT_NEAR(got_lse[t], la[t], 1e-5 * std::max(1.f, std::abs(la[t]))) << t;
}

}  // namespace
}  // namespace slope::gpu_test
