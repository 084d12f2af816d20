// flash_attention, attention_flops, attention_merge and attention_apply_sinks against a naive
// double-precision reference that materialises the scores, as HF gpt-oss eager attention does:
// scores = scale·q·k + mask, the sink logit appended as an extra column, softmax, column dropped.
// The flash_attention tests run for both compute types (F32 and BF16, the suffix of the test
// name), F32 once more on the AVX2 kernel (F32Avx2) and, on a CPU with AMX, BF16 once more on
// vdpbf16ps (BF16Dot; BF16 there runs on the AMX tiles); BF16 is held to the bound derived at
// kBf16Unit below.
#include <gtest/gtest.h>

// GCC 12 reports false 'may be used uninitialized' warnings inside AVX-512 intrinsics
// (_mm512_undefined_* in the headers, GCC bug 105593), here in the kernels' vector ln and e^x.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "slope/kernels/attention.h"
#include "slope/kernels/attention_merge.h"
#include "slope/kernels/cpu/attention_common.h"
#include "slope/kernels/cpu/exp2_avx2.h"
#include "slope/kernels/cpu/exp2_avx512.h"

namespace slope::kernels {

// gtest's name for a parameter (found by argument-dependent lookup, so outside the anonymous
// namespace).
inline void PrintTo(ComputeType ct, std::ostream* os) { *os << (ct == ComputeType::F32 ? "F32" : "BF16"); }

namespace {

// f32 tolerance, relative: out rows against their largest |reference| element, lse against
// max(1, |reference|) (lse is a log, so its natural error is absolute near 0).
constexpr double kRelTol = 1e-5;
constexpr double kInf = std::numeric_limits<double>::infinity();

// bf16 tolerance. The bf16 kernel rounds q, k and v to bf16 (8 significant bits, round to nearest:
// unit roundoff u = 2^-8, reached just above a power of two), multiplies
// and accumulates in f32, and rounds each probability to bf16 for PV. Against exact attention of
// the unrounded inputs, per row:
//   scores:  |s̃_j - s_j| <= δ = (2u + u²) · scale · max_j Σ_d |q_d k_jd|   (|q̃k̃ - qk| <= (2u+u²)|q||k|)
//   weights: w̃_j / w_j in [e^{-2δ}, e^{2δ}], so Σ_j |w̃_j - w_j| |ṽ_j| <= (e^{2δ} - 1)(1 + u) V
//   values:  Σ_j w_j |ṽ_j - v_j| <= u V;  probabilities rounded: <= u (1 + u) V
//   => |out - ref| <= V ((e^{2δ} - 1)(1 + u) + 2u + u²) + f32,  |lse - ref| <= δ + f32
// with V = max |v| (the sink only adds a weight that no v multiplies, so the bound holds with
// sinks). Against exact attention of the rounded inputs, only the probability rounding and f32
// remain: |out - ref| <= u (1 + u) V + f32, and lse is f32-exact (the sum uses the unrounded
// probabilities). f32 is kRelTol in both.
constexpr double kBf16Unit = 1.0 / 256;

// x rounded to the nearest bf16 (8 significant bits), ties to even; computed with frexp/ldexp,
// independently of the kernel's bit manipulation.
float round_bf16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e = 0;
  const double m = std::frexp(double(x), &e);  // x = m · 2^e, 0.5 <= |m| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}

bool visible(int64_t qp, int64_t kp, const AttentionMask& m) {
  return (!m.causal || kp <= qp) && (m.window <= 0 || kp > qp - m.window);
}

struct Inputs {
  int64_t nq, q_pos0, nk, kv_pos0;
  AttentionShape shape;
  AttentionMask mask;
  float scale;
  bool use_sinks;
  std::vector<float> q, k, v, sinks;  // [nq,Hq,D], [nk,Hkv,D], [nk,Hkv,D], [Hq]
};

Inputs make_inputs(std::mt19937& rng, int64_t nq, int64_t q_pos0, int64_t nk, int64_t kv_pos0,
                   AttentionShape shape, AttentionMask mask, float scale, bool use_sinks) {
  Inputs in{nq, q_pos0, nk, kv_pos0, shape, mask, scale, use_sinks, {}, {}, {}, {}};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), us(-3.0f, 3.0f);
  in.q.resize(nq * shape.num_q_heads * shape.head_dim);
  in.k.resize(nk * shape.num_kv_heads * shape.head_dim);
  in.v.resize(in.k.size());
  in.sinks.resize(shape.num_q_heads);
  for (float& x : in.q) x = u(rng);
  for (float& x : in.k) x = u(rng);
  for (float& x : in.v) x = u(rng);
  for (float& x : in.sinks) x = us(rng);
  return in;
}

// Naive reference: out [nq,Hq,D], lse [nq,Hq] in double.
// dot_abs (optional), per row: max over the visible keys of scale · Σ_d |q_d k_d| (0 if none).
void reference(const Inputs& in, bool with_sinks, std::vector<double>& out,
               std::vector<double>& lse, std::vector<double>* dot_abs = nullptr) {
  const int64_t Hq = in.shape.num_q_heads, Hkv = in.shape.num_kv_heads, D = in.shape.head_dim;
  out.assign(in.nq * Hq * D, 0.0);
  lse.assign(in.nq * Hq, -kInf);
  if (dot_abs) dot_abs->assign(in.nq * Hq, 0.0);
  std::vector<double> s(in.nk);
  for (int64_t i = 0; i < in.nq; ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv);
      double mx = with_sinks ? double(in.sinks[h]) : -kInf;
      for (int64_t j = 0; j < in.nk; ++j) {
        s[j] = -kInf;
        if (!visible(in.q_pos0 + i, in.kv_pos0 + j, in.mask)) continue;
        double dot = 0, abs_dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double p = double(in.q[(i * Hq + h) * D + d]) * in.k[(j * Hkv + kvh) * D + d];
          dot += p;
          abs_dot += std::abs(p);
        }
        s[j] = in.scale * dot;
        if (dot_abs) (*dot_abs)[i * Hq + h] = std::max((*dot_abs)[i * Hq + h], in.scale * abs_dot);
        mx = std::isnan(s[j]) ? s[j] : std::max(mx, s[j]);  // a NaN score makes the row NaN
      }
      if (mx == -kInf) continue;  // nothing visible, no sink
      double denom = with_sinks ? std::exp(in.sinks[h] - mx) : 0.0;
      double* o = &out[(i * Hq + h) * D];
      for (int64_t j = 0; j < in.nk; ++j) {
        if (s[j] == -kInf) continue;
        const double p = std::exp(s[j] - mx);
        denom += p;
        for (int64_t d = 0; d < D; ++d) o[d] += p * in.v[(j * Hkv + kvh) * D + d];
      }
      for (int64_t d = 0; d < D; ++d) o[d] /= denom;
      lse[i * Hq + h] = mx + std::log(denom);
    }
}

// Absolute tolerances per row (out and lse); empty: the f32 tolerance, kRelTol.
struct RowTolerance {
  std::vector<double> out, lse;
};

// Compares results with the reference; reports the first few mismatches.
void expect_close(const std::vector<float>& out, const std::vector<float>& lse,
                  const std::vector<double>& ref_out, const std::vector<double>& ref_lse,
                  int64_t D, const RowTolerance& tol = {}) {
  int failures = 0;
  for (size_t t = 0; t < ref_lse.size() && failures < 5; ++t) {
    const double rl = ref_lse[t], gl = lse[t];
    if (rl == -kInf) {
      if (gl != -kInf) {
        ADD_FAILURE() << "row " << t << ": lse " << gl << ", expected -inf";
        ++failures;
      }
    } else if (!(std::abs(gl - rl) <=
                 (tol.lse.empty() ? kRelTol * std::max(1.0, std::abs(rl)) : tol.lse[t]))) {
      ADD_FAILURE() << "row " << t << ": lse " << gl << ", expected " << rl;
      ++failures;
    }
    double norm = 0;
    for (int64_t d = 0; d < D; ++d) norm = std::max(norm, std::abs(ref_out[t * D + d]));
    const double out_tol = tol.out.empty() ? kRelTol * norm : tol.out[t];
    for (int64_t d = 0; d < D; ++d) {
      const double r = ref_out[t * D + d], g = out[t * D + d];
      if (!(std::abs(g - r) <= out_tol)) {  // norm 0 demands an exact 0
        ADD_FAILURE() << "row " << t << " dim " << d << ": out " << g << ", expected " << r;
        ++failures;
        break;
      }
    }
  }
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::abs(v)));
  return m;
}

// A sequence split into calls and merged equals one call up to f32 summation order: every
// element within 2e-5 of the largest |v| (the first 3 misses reported).
void expect_split_equals_one_call(const std::vector<float>& split, const std::vector<float>& one, double v_max) {
  ASSERT_EQ(split.size(), one.size());
  int bad = 0;
  for (size_t i = 0; i < split.size() && bad < 3; ++i)
    if (!(std::abs(double(split[i]) - one[i]) <= 2e-5 * v_max)) {
      ADD_FAILURE() << "element " << i << ": split " << split[i] << ", one call " << one[i];
      ++bad;
    }
}

// As expect_split_equals_one_call where two bf16 results may round a few probabilities the other
// way: 2^(c·s - m) in bf16 for another row max m. c·s - m is exact near the max, but for a score
// far below it the subtraction rounds, and one time in about 2^14 the bf16 rounding of that
// probability flips (at most 2^-8 of it, 2^-7·v_max for a whole row). Some elements, at most 1 in
// 1000, may then differ by up to that; a wrong key or lane would move whole rows.
void expect_equal_but_rare_flips(const std::vector<float>& a, const std::vector<float>& b, double v_max) {
  ASSERT_EQ(a.size(), b.size());
  size_t off = 0;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - b[i]);
    if (!(d <= 2e-5 * v_max)) ++off;
    if (!(d <= v_max / 128) && bad++ < 3) ADD_FAILURE() << "element " << i << ": " << a[i] << " against " << b[i];
  }
  EXPECT_LE(off, a.size() / 1000) << "elements apart by more than 2e-5·max|v|";
}

Inputs rounded_to_bf16(Inputs in) {
  for (std::vector<float>* t : {&in.q, &in.k, &in.v})
    for (float& x : *t) x = round_bf16(x);
  return in;
}

// True where compute = BF16 runs the bf16 kernel on `in` (else it runs the f32 kernel).
bool runs_bf16_kernel(const Inputs& in) {
  return bf16_attention_supported() && bf16_units() == Bf16Units::Bf16 && in.shape.head_dim % 2 == 0 &&
         in.scale > 0;
}

// The tolerance of compute type ct against exact attention (reference()) of `in` (kBf16Unit):
// empty for F32; for BF16 the bound against the exact inputs, or, with `rounded`, against inputs
// already rounded to bf16 (then dot_abs is not used).
RowTolerance tolerance_for(const Inputs& in, ComputeType ct, const std::vector<double>& ref_lse,
                           const std::vector<double>& dot_abs, bool rounded = false) {
  RowTolerance tol;
  if (ct == ComputeType::F32) return tol;
  const double u = kBf16Unit, V = max_abs(in.v);
  for (size_t t = 0; t < ref_lse.size(); ++t) {
    const double f32_lse = kRelTol * std::max(1.0, std::abs(ref_lse[t]));
    if (rounded) {
      tol.out.push_back(V * (u * (1 + u) + kRelTol));
      tol.lse.push_back(f32_lse);
    } else {
      const double delta = (2 * u + u * u) * dot_abs[t];
      tol.out.push_back(V * (std::expm1(2 * delta) * (1 + u) + 2 * u + u * u + kRelTol));
      tol.lse.push_back(delta + f32_lse);
    }
  }
  return tol;
}

// out [nq,Hq,D] and lse [nq,Hq] of flash_attention on `in` (123 where it wrote nothing).
void run_flash(const Inputs& in, ComputeType ct, std::vector<float>& out, std::vector<float>& lse) {
  const int64_t Hq = in.shape.num_q_heads, D = in.shape.head_dim;
  out.assign(in.nq * Hq * D, 123.0f);
  lse.assign(in.nq * Hq, 123.0f);
  flash_attention({.q = in.q.data(), .nq = in.nq, .q_pos0 = in.q_pos0, .k = in.k.data(),
                   .v = in.v.data(), .nk = in.nk, .kv_pos0 = in.kv_pos0, .shape = in.shape,
                   .mask = in.mask, .scale = in.scale, .compute = ct,
                   .sinks = in.use_sinks ? in.sinks.data() : nullptr, .out = out.data(),
                   .lse = lse.data()});
}

// Results of compute type ct on `in` against the reference: for BF16 both bounds (exact inputs;
// rounded inputs where the bf16 kernel runs).
void expect_matches(const Inputs& in, ComputeType ct, const std::vector<float>& out,
                    const std::vector<float>& lse) {
  const int64_t D = in.shape.head_dim;
  std::vector<double> ref_out, ref_lse, dot_abs;
  reference(in, in.use_sinks, ref_out, ref_lse, &dot_abs);
  {
    SCOPED_TRACE("against exact attention of the inputs");
    expect_close(out, lse, ref_out, ref_lse, D, tolerance_for(in, ct, ref_lse, dot_abs));
  }
  if (ct == ComputeType::BF16 && runs_bf16_kernel(in)) {
    SCOPED_TRACE("against exact attention of the inputs rounded to bf16");
    const Inputs r = rounded_to_bf16(in);
    reference(r, in.use_sinks, ref_out, ref_lse);
    expect_close(out, lse, ref_out, ref_lse, D, tolerance_for(r, ct, ref_lse, {}, true));
  }
}

// Where compute type ct runs the bf16 kernel on `in`: its output `out` (diagonal window units,
// the default) against the same call on the key blocks: the same rounded probabilities, f32
// summation order only.
void expect_diagonals_match_blocks(const Inputs& in, ComputeType ct, const std::vector<float>& out) {
  if (ct != ComputeType::BF16 || !runs_bf16_kernel(in)) return;
  SCOPED_TRACE("diagonal units against key blocks");
  set_diagonal_window_attention(false);
  std::vector<float> block_out, block_lse;
  run_flash(in, ct, block_out, block_lse);
  set_diagonal_window_attention(true);
  expect_equal_but_rare_flips(out, block_out, max_abs(in.v));
}

void check_flash(const Inputs& in, ComputeType ct) {
  std::vector<float> out, lse;
  run_flash(in, ct, out, lse);
  expect_matches(in, ct, out, lse);
}

std::string describe(const Inputs& in) {
  return "nq=" + std::to_string(in.nq) + " q_pos0=" + std::to_string(in.q_pos0) +
         " nk=" + std::to_string(in.nk) + " kv_pos0=" + std::to_string(in.kv_pos0) +
         " Hq=" + std::to_string(in.shape.num_q_heads) +
         " Hkv=" + std::to_string(in.shape.num_kv_heads) +
         " D=" + std::to_string(in.shape.head_dim) + " causal=" + std::to_string(in.mask.causal) +
         " window=" + std::to_string(in.mask.window) + " scale=" + std::to_string(in.scale) +
         " sinks=" + std::to_string(in.use_sinks);
}

const int64_t kSizes[] = {1, 2, 7, 33, 64, 65, 130, 257};
const int64_t kDims[] = {16, 20, 64, 128};  // 20: tails past 16 and past 8 lanes
const AttentionShape kHeads[] = {{4, 4, 0}, {8, 2, 0}, {6, 1, 0}};
const int64_t kWindows[] = {0, 1, 5, 128};

// q block placed relative to the kv block: kv_pos0 - q_pos0 for the four placements
// (q after, q overlapping the end, q before / kv ahead, kv entirely in the future).
int64_t kv_offset(int which, int64_t nq, int64_t nk) {
  switch (which) {
    case 0: return -nk - 3;             // q strictly after all keys
    case 1: return -(nk - nq / 2);      // overlapping: q starts inside the kv block
    case 2: return nq / 3;              // kv starts inside the q block
    default: return nq + 5;             // kv entirely in the future of every query
  }
}

// Each flash_attention test, for each compute type, and F32 again on the AVX2 kernel
// (AttentionKernel::Avx2: the f32 kernel of CPUs without AVX-512, checked on every machine that
// can run it).
// (BF16Dot: the bf16 kernel without AMX, checked wherever the CPU has AMX.) BF16 runs on the bf16
// units wherever the CPU has them, whichever units bf16 mode would choose here
// (kernels/bf16_units.h; on the f32 units it is the f32 kernel: FlashAttentionOnF32Units).
enum class Variant { F32, BF16, F32Avx2, BF16Dot };
class FlashAttention : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    set_bf16_units(Bf16Units::Bf16);
    if (GetParam() == Variant::BF16Dot) {
      if (!amx_attention_supported()) GTEST_SKIP() << "no AMX here: BF16 already runs vdpbf16ps";
      set_amx_attention(false);
    }
    if (GetParam() != Variant::F32Avx2) return;
    if (!avx2_attention_built()) GTEST_SKIP() << "this build has no AVX2 kernel";
    set_attention_kernel(AttentionKernel::Avx2);
  }
  void TearDown() override {
    set_attention_kernel(AttentionKernel::Auto);
    set_amx_attention(true);
    set_diagonal_window_attention(true);
    set_bf16_units(Bf16Units::Auto);
  }
  ComputeType ct() const {
    return GetParam() == Variant::BF16 || GetParam() == Variant::BF16Dot ? ComputeType::BF16
                                                                        : ComputeType::F32;
  }
};

INSTANTIATE_TEST_SUITE_P(Compute, FlashAttention,
                         ::testing::Values(Variant::F32, Variant::BF16, Variant::F32Avx2,
                                           Variant::BF16Dot),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           switch (info.param) {
                             case Variant::F32: return std::string("F32");
                             case Variant::BF16: return std::string("BF16");
                             case Variant::BF16Dot: return std::string("BF16Dot");
                             default: return std::string("F32Avx2");
                           }
                         });

// Every (nq, nk) pair, the other options cycled so that all values and combinations recur.
TEST_P(FlashAttention, ShapesSweep) {
  std::mt19937 rng(1234);
  int n = 0;
  for (int64_t nq : kSizes)
    for (int64_t nk : kSizes) {
      AttentionShape shape = kHeads[n % 3];
      shape.head_dim = kDims[(n / 3) % 4];
      const AttentionMask mask{(n % 5) != 0, kWindows[(n / 2) % 4]};
      const int64_t q_pos0 = 1000 + 17 * (n % 7);
      const int64_t kv_pos0 = q_pos0 + kv_offset((n / 4) % 4, nq, nk);
      const float scale = (n % 3 == 0) ? 1.0f : 1.0f / std::sqrt(float(shape.head_dim));
      const Inputs in = make_inputs(rng, nq, q_pos0, nk, kv_pos0, shape, mask, scale, n % 2);
      SCOPED_TRACE(describe(in));
      check_flash(in, ct());
      ++n;
    }
}

// Self-attention (q_pos0 == kv_pos0, as on one rank), every mask, dim, head layout and sinks.
TEST_P(FlashAttention, SelfAttentionMasks) {
  std::mt19937 rng(99);
  int n = 0;
  for (bool causal : {true, false})
    for (int64_t window : kWindows)
      for (bool sinks : {false, true})
        for (int64_t D : kDims) {
          AttentionShape shape = kHeads[n % 3];
          shape.head_dim = D;
          const int64_t len = kSizes[4 + n % 4];  // 64, 65, 130, 257
          const Inputs in = make_inputs(rng, len, 300, len, 300, shape, {causal, window},
                                        0.125f, sinks);
          SCOPED_TRACE(describe(in));
          check_flash(in, ct());
          ++n;
        }
}

// Query and kv blocks at every relative placement, including kv wholly in the future
// (lse -inf and out 0 without sinks; lse = sink and out 0 with them).
TEST_P(FlashAttention, Placements) {
  std::mt19937 rng(7);
  int n = 0;
  for (int placement = 0; placement < 4; ++placement)
    for (int64_t window : kWindows)
      for (bool sinks : {false, true}) {
        AttentionShape shape = kHeads[n % 3];
        shape.head_dim = kDims[n % 4];
        const int64_t nq = 130, nk = 65;
        const Inputs in = make_inputs(rng, nq, 5000, nk, 5000 + kv_offset(placement, nq, nk),
                                      shape, {true, window}, 0.3f, sinks);
        SCOPED_TRACE(describe(in));
        check_flash(in, ct());
        ++n;
      }
}

// KV groups of 8 query heads (gpt-oss-120b's 64 over 8), whose AVX2 units fill all 16 (block,
// head) slots, and of 9 (two chunks of heads); 47 and 130 rows are an odd number of 16-row
// blocks, so the last unit has one block.
TEST_P(FlashAttention, GroupsOfEightAndNineHeads) {
  std::mt19937 rng(88);
  int n = 0;
  for (const AttentionShape shape :
       {AttentionShape{16, 2, 20}, AttentionShape{8, 1, 64}, AttentionShape{9, 1, 16}})
    for (int64_t len : {17, 47, 130})
      for (int64_t window : {int64_t{0}, int64_t{5}, int64_t{128}}) {
        const Inputs in = make_inputs(rng, len, 40, len, 40, shape, {true, window}, 0.2f, n++ % 2);
        SCOPED_TRACE(describe(in));
        check_flash(in, ct());
      }
}

TEST_P(FlashAttention, FutureKeysGiveEmptyRows) {
  std::mt19937 rng(3);
  const Inputs in = make_inputs(rng, 33, 0, 64, 33, {4, 2, 24}, {true, 0}, 0.2f, false);
  std::vector<float> out(33 * 4 * 24, 1.0f), lse(33 * 4, 1.0f);
  flash_attention({.q = in.q.data(), .nq = in.nq, .q_pos0 = in.q_pos0, .k = in.k.data(),
                   .v = in.v.data(), .nk = in.nk, .kv_pos0 = in.kv_pos0, .shape = in.shape,
                   .mask = in.mask, .scale = in.scale, .compute = ct(), .sinks = nullptr,
                   .out = out.data(), .lse = lse.data()});
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

// A NaN input reaches exactly the rows that see it, as in a reference softmax (and in
// transformers: a NaN in q_proj gives all-NaN logits): a NaN in key j of one KV head makes
// every row of that head's query group that sees j NaN, a NaN in one query row makes that row
// NaN, and every other row matches the reference. The exp clamp once turned NaN scores into
// weights of 0 and hid them.
TEST_P(FlashAttention, NanReachesTheRowsThatSeeIt) {
  std::mt19937 rng(77);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const AttentionMask mask : {AttentionMask{true, 0}, AttentionMask{true, 5}, AttentionMask{false, 0}})
    for (bool sinks : {false, true}) {
      Inputs in = make_inputs(rng, 70, 0, 70, 0, {4, 2, 24}, mask, 0.2f, sinks);
      SCOPED_TRACE(describe(in));
      const int64_t Hq = 4, Hkv = 2, D = 24;
      in.k[(40 * Hkv + 1) * D + 3] = nan;  // key 40, KV head 1 (query heads 2 and 3)
      in.q[(10 * Hq + 0) * D + 7] = nan;   // query row 10, head 0
      std::vector<float> out(in.nq * Hq * D, 123.0f), lse(in.nq * Hq, 123.0f);
      flash_attention({.q = in.q.data(), .nq = in.nq, .q_pos0 = in.q_pos0, .k = in.k.data(),
                       .v = in.v.data(), .nk = in.nk, .kv_pos0 = in.kv_pos0, .shape = in.shape,
                       .mask = in.mask, .scale = in.scale, .compute = ct(),
                       .sinks = sinks ? in.sinks.data() : nullptr, .out = out.data(),
                       .lse = lse.data()});
      std::vector<double> ref_out, ref_lse, dot_abs;
      reference(in, sinks, ref_out, ref_lse, &dot_abs);
      const RowTolerance tol = tolerance_for(in, ct(), ref_lse, dot_abs);
      int nan_rows = 0;
      std::vector<float> clean_out, clean_lse;
      std::vector<double> clean_ref_out, clean_ref_lse;
      RowTolerance clean_tol;
      for (int64_t t = 0; t < in.nq * Hq; ++t) {
        const int64_t i = t / Hq, h = t % Hq;
        const bool sees_nan = (h == 0 && i == 10) || (h >= 2 && visible(i, 40, mask));
        ASSERT_EQ(std::isnan(ref_out[t * D]), sees_nan) << "reference row " << i << " head " << h;
        if (sees_nan) {
          ++nan_rows;
          for (int64_t d = 0; d < D; ++d)
            ASSERT_TRUE(std::isnan(out[t * D + d])) << "row " << i << " head " << h << " dim " << d << ": "
                                                    << out[t * D + d] << ", expected NaN";
          EXPECT_TRUE(std::isnan(lse[t])) << "row " << i << " head " << h;
        } else {
          clean_out.insert(clean_out.end(), out.begin() + t * D, out.begin() + (t + 1) * D);
          clean_ref_out.insert(clean_ref_out.end(), ref_out.begin() + t * D, ref_out.begin() + (t + 1) * D);
          clean_lse.push_back(lse[t]);
          clean_ref_lse.push_back(ref_lse[t]);
          if (!tol.out.empty()) {
            clean_tol.out.push_back(tol.out[t]);
            clean_tol.lse.push_back(tol.lse[t]);
          }
        }
      }
      EXPECT_GT(nan_rows, 1);
      expect_close(clean_out, clean_lse, clean_ref_out, clean_ref_lse, D, clean_tol);
    }
}

// A longer causal sequence: many key blocks per query block and many query blocks.
TEST_P(FlashAttention, LongCausal) {
  std::mt19937 rng(11);
  for (int64_t window : {int64_t{0}, int64_t{128}}) {
    const Inputs in = make_inputs(rng, 1000, 0, 1000, 0, {2, 1, 64}, {true, window}, 0.125f,
                                  window > 0);
    SCOPED_TRACE(describe(in));
    check_flash(in, ct());
  }
}

// Window blocks are bands: only the keys at the window edge and past the diagonal are masked,
// queries are packed and outputs written in 16 x 16 tiles. Windows around the 16-row vector and
// the 32-row block, query counts and positions off multiples of 16, head dims with partial
// tiles (bf16: 16 dims per pair tile; odd dims run the f32 kernel), self-attention and a key
// block that starts inside the queries' windows.
TEST_P(FlashAttention, WindowBandEdges) {
  std::mt19937 rng(21);
  int n = 0;
  for (int64_t window : {1, 2, 15, 16, 17, 31, 32, 33, 127, 128, 129})
    for (int64_t nq : {1, 17, 45, 100}) {
      AttentionShape shape = kHeads[n % 3];
      shape.head_dim = (const int64_t[]){2, 18, 40, 64, 33}[n % 5];
      const int64_t q_pos0 = 1013 + 3 * (n % 4);
      const bool self = n % 2 == 0;
      const int64_t kv_pos0 = self ? q_pos0 : q_pos0 - 141;
      const int64_t nk = self ? nq : 141 + nq;
      const Inputs in = make_inputs(rng, nq, q_pos0, nk, kv_pos0, shape, {true, window},
                                    n % 3 == 0 ? 1.0f : 0.2f, n % 4 == 1);
      SCOPED_TRACE(describe(in));
      check_flash(in, ct());
      ++n;
    }
}

// out and lse of `in` computed as calls over the key blocks [cuts[b], cuts[b + 1]) without
// sinks, merged with attention_merge in block order, then the sinks applied (if in.use_sinks).
void run_split(const Inputs& in, ComputeType ct, const std::vector<int64_t>& cuts,
               std::vector<float>& out, std::vector<float>& lse) {
  const int64_t Hq = in.shape.num_q_heads, Hkv = in.shape.num_kv_heads, D = in.shape.head_dim;
  out.assign(in.nq * Hq * D, 123.0f);
  lse.assign(in.nq * Hq, 123.0f);
  std::vector<float> ob(out.size()), lb(lse.size());
  for (size_t b = 0; b + 1 < cuts.size(); ++b) {
    const int64_t j0 = cuts[b], nkb = cuts[b + 1] - cuts[b];
    flash_attention({.q = in.q.data(), .nq = in.nq, .q_pos0 = in.q_pos0,
                     .k = in.k.data() + j0 * Hkv * D, .v = in.v.data() + j0 * Hkv * D,
                     .nk = nkb, .kv_pos0 = in.kv_pos0 + j0, .shape = in.shape, .mask = in.mask,
                     .scale = in.scale, .compute = ct, .sinks = nullptr,
                     .out = b ? ob.data() : out.data(), .lse = b ? lb.data() : lse.data()});
    if (b) attention_merge(out.data(), lse.data(), ob.data(), lb.data(), in.nq, Hq, D);
  }
  if (in.use_sinks) attention_apply_sinks(out.data(), lse.data(), in.sinks.data(), in.nq, Hq, D);
}

// A window block's edge tiles are triangles, computed by 16-row query vector: each vector
// takes only the keys some row of it sees. Windows around the vector and block sizes, causal
// and not (then the band's upper edge is the keys' end, not the diagonal), several 32-row
// blocks at positions off multiples of 16 and of 2, odd query and key counts, keys starting
// before, at and inside the queries' windows; bf16 also split at odd cuts against one call.
TEST_P(FlashAttention, WindowBandsByVector) {
  std::mt19937 rng(31);
  int n = 0;
  for (int64_t window : {1, 2, 15, 16, 17, 31, 32, 33, 127, 128, 129})
    for (bool causal : {true, false}) {
      AttentionShape shape = kHeads[n % 3];
      shape.head_dim = (const int64_t[]){64, 18, 40}[n % 3];
      const int64_t nq = (const int64_t[]){97, 61, 130}[n % 3];
      const int64_t q_pos0 = 2003 + 5 * (n % 4);
      const int64_t kv_pos0 = q_pos0 - (const int64_t[]){0, 37, 200, 141}[n % 4];
      const int64_t nk = q_pos0 - kv_pos0 + nq + (causal ? 0 : 23);
      const Inputs in = make_inputs(rng, nq, q_pos0, nk, kv_pos0, shape, {causal, window},
                                    n % 3 == 0 ? 1.0f : 0.2f, n % 2 == 1);
      SCOPED_TRACE(describe(in));
      check_flash(in, ct());
      if (ct() == ComputeType::BF16 && runs_bf16_kernel(in) && !(n % 2)) {
        // Keys cut at an odd index: the second call starts on an odd position.
        std::vector<float> out, lse;
        run_split(in, ct(), {0, (nk / 2) | 1, nk}, out, lse);
        std::vector<float> one_out, one_lse;
        run_flash(in, ct(), one_out, one_lse);  // no sinks at even n, as the parts
        expect_split_equals_one_call(out, one_out, max_abs(in.v));
      }
      ++n;
    }
}

// Short windows over GQA groups of 2+ query heads take head-packed blocks (HeadBlocks in
// attention_common.h: 16 positions of up to 4 heads of one KV group, a group of 5 as 3 + 2, 8 as
// 4 + 4), groups of 1 the 32-row blocks of one head. Every group size, windows around 16 and
// 128 and just under kAttentionWindowBlockMaxW, odd query and key counts, positions off
// multiples of 16 and of 2, keys starting before, at and inside the queries' windows, causal
// and not, sinks; and the same call with its keys cut at odd and even points into three calls
// merged equals one call (f32 and bf16: each row's probabilities are rounded alike wherever
// the keys were cut).
TEST_P(FlashAttention, WindowHeadPackedBlocks) {
  std::mt19937 rng(41);
  int n = 0;
  for (int64_t group : {1, 2, 3, 4, 5, 8})
    for (int64_t window : {1, 15, 16, 17, 127, 128, 129, 1023}) {
      const int64_t Hkv = 1 + n % 2;
      const AttentionShape shape{group * Hkv, Hkv, (const int64_t[]){64, 18, 40, 2}[n % 4]};
      const bool causal = n % 5 != 2;
      const int64_t nq = (const int64_t[]){37, 16, 61, 1}[n % 4];
      const int64_t q_pos0 = 2003 + 5 * (n % 4);
      const int64_t before = (const int64_t[]){0, 37, window + 21, 141}[(n / 2) % 4];
      const int64_t kv_pos0 = q_pos0 - before;
      const int64_t nk = before + nq + (causal ? 0 : 23);
      const Inputs in = make_inputs(rng, nq, q_pos0, nk, kv_pos0, shape, {causal, window},
                                    n % 3 == 0 ? 1.0f : 0.2f, n % 2 == 1);
      SCOPED_TRACE(describe(in));
      std::vector<float> one_out, one_lse;
      run_flash(in, ct(), one_out, one_lse);
      expect_matches(in, ct(), one_out, one_lse);
      if (nk >= 4) {
        SCOPED_TRACE("keys cut into three calls, merged, against one call");
        const int64_t a = (nk / 3) | 1, b = std::max(a + 1, 2 * nk / 3);
        std::vector<float> out, lse;
        run_split(in, ct(), {0, a, b, nk}, out, lse);
        expect_split_equals_one_call(out, one_out, max_abs(in.v));
      }
      ++n;
    }
}

// Causal windows of a multiple of 16 keys up to 160 over head_dim a multiple of 32 take the bf16
// kernel's diagonal units on vdpbf16ps (attention_bf16.cpp: each row computes only its own W
// keys): every head-packed unit size (groups of 2 to 8: 2, 3, 4, 3 + 2, 4 + 4 heads), windows
// of 16 to 160 and 176 (key blocks again), head_dim 32 to 128, queries at the start of a sequence
// (rows whose window passes the first key), in a last partial unit and far in, keys starting
// before, at and inside the windows at odd and even positions, sinks. Each call against exact
// attention, its keys cut into three calls merged against one call, and (bf16) the diagonal
// units against the key blocks: the same rounded probabilities, f32 summation order only.
TEST_P(FlashAttention, WindowDiagonalUnits) {
  std::mt19937 rng(43);
  int n = 0;
  for (int64_t group : {2, 3, 4, 5, 8})
    for (int64_t window : {16, 48, 128, 160, 176})
      for (int placement = 0; placement < 2; ++placement) {
      const int64_t Hkv = 1 + n % 2;
      const AttentionShape shape{group * Hkv, Hkv, (const int64_t[]){64, 32, 128}[n % 3]};
      const int64_t nq = (const int64_t[]){37, 16, 200, 1}[n % 4];
      const int64_t q_pos0 = (const int64_t[]){0, 2003, 5, 4096}[(n / 2) % 4];
      // Keys from this far before the queries (15 mod 16: the units' Ks and Vs start at the first
      // key's slot, and a first key at an odd diagonal pairs with the slot before) or at them.
      const int64_t before = std::min(
          q_pos0, (const int64_t[]){0, 37, window + 21, 141, 15, 17, 47, 1}[(n + 3 * placement) % 8]);
      const int64_t kv_pos0 = q_pos0 - before;
      const int64_t nk = before + nq;
      const Inputs in = make_inputs(rng, nq, q_pos0, nk, kv_pos0, shape, {true, window},
                                    n % 3 == 0 ? 1.0f : 0.2f, n % 2 == 1);
      SCOPED_TRACE(describe(in));
      std::vector<float> one_out, one_lse;
      run_flash(in, ct(), one_out, one_lse);
      expect_matches(in, ct(), one_out, one_lse);
      if (nk >= 4) {
        SCOPED_TRACE("keys cut into three calls, merged, against one call");
        const int64_t a = (nk / 3) | 1, b = std::max(a + 1, 2 * nk / 3);
        std::vector<float> out, lse;
        run_split(in, ct(), {0, a, b, nk}, out, lse);
        expect_equal_but_rare_flips(out, one_out, max_abs(in.v));
      }
      expect_diagonals_match_blocks(in, ct(), one_out);
      ++n;
    }
}

// Scores far apart: every query has 1 in its first dimension and every 131st key 200 there,
// so a row sees at most one such key under window 128, scoring about 200 where its other keys
// score a few units: more than exp's range apart (88 in e^x). A softmax whose running max
// missed that key would turn its weight into Inf. Windows 128 and 48 (the diagonal units in
// bf16), with sinks under 48, 16 over 4 heads and 8 over 1, against exact attention. (Under a
// full causal mask a row would see several such keys, whose weights' f32 rounding at scores of
// 200 is more than the f32 bound allows.)
TEST_P(FlashAttention, ScoresFarApart) {
  std::mt19937 rng(53);
  for (int64_t window : {128, 48})
    for (const AttentionShape shape : {AttentionShape{16, 4, 64}, AttentionShape{8, 1, 64}}) {
      Inputs in = make_inputs(rng, 200, 300, 500, 0, shape, {true, window}, 1.0f, window == 48);
      const int64_t D = shape.head_dim;
      for (int64_t t = 0; t < in.nq * shape.num_q_heads; ++t) in.q[t * D] = 1.0f;
      for (int64_t j = 0; j < in.nk; j += 131)
        for (int64_t g = 0; g < shape.num_kv_heads; ++g) in.k[(j * shape.num_kv_heads + g) * D] = 200.0f;
      SCOPED_TRACE(describe(in));
      std::vector<float> out, lse;
      run_flash(in, ct(), out, lse);
      expect_matches(in, ct(), out, lse);
    }
}

// A call of more rows than the bf16 kernel's diagonal units take at a time (kDiagonalRows, 1024)
// runs in parts of that many rows, each packing the keys its rows see: calls just over one part,
// over two with a last partial part, keys from the sequence's start, before the windows and at
// the queries, odd and even positions, sinks. Each against exact attention and (bf16) the key
// blocks, which take the call whole.
TEST_P(FlashAttention, WindowDiagonalUnitsLongCall) {
  std::mt19937 rng(47);
  int n = 0;
  for (int64_t nq : {1025, 2100})
    for (int64_t window : {128, 160})
      for (int64_t before : {int64_t{0}, int64_t{37}, window + 21}) {
        const int64_t Hkv = 1 + n % 2, D = n % 3 == 1 ? 32 : 64;
        const AttentionShape shape{(2 + n % 3) * Hkv, Hkv, D};
        const int64_t q_pos0 = before == 0 ? 0 : 4096 + n % 2;
        const Inputs in = make_inputs(rng, nq, q_pos0, before + nq, q_pos0 - before, shape,
                                      {true, window}, n % 3 == 0 ? 1.0f : 0.2f, n % 2 == 1);
        SCOPED_TRACE(describe(in));
        std::vector<float> out, lse;
        run_flash(in, ct(), out, lse);
        expect_matches(in, ct(), out, lse);
        expect_diagonals_match_blocks(in, ct(), out);
        ++n;
      }
}

// The bf16 kernel's own tests: on the bf16 units, whichever bf16 mode would choose here.
class FlashAttentionBf16 : public ::testing::Test {
 protected:
  void SetUp() override { set_bf16_units(Bf16Units::Bf16); }
  void TearDown() override { set_bf16_units(Bf16Units::Auto); }
};

// The bf16 kernel really runs where the CPU has it: its result differs from the f32 kernel's
// and is closer to exact attention of the rounded inputs than the f32 kernel's is.
TEST_F(FlashAttentionBf16, RunsTheBf16KernelWhereSupported) {
  std::mt19937 rng(5);
  const Inputs in = make_inputs(rng, 130, 0, 130, 0, {4, 2, 64}, {true, 0}, 1.0f, false);
  if (!runs_bf16_kernel(in)) GTEST_SKIP() << "this CPU or build has no AVX512-BF16";
  std::vector<float> out16, lse16, out32, lse32;
  run_flash(in, ComputeType::BF16, out16, lse16);
  run_flash(in, ComputeType::F32, out32, lse32);
  std::vector<double> ref_out, ref_lse;
  reference(rounded_to_bf16(in), false, ref_out, ref_lse);
  double err16 = 0, err32 = 0;
  for (size_t t = 0; t < lse16.size(); ++t) {
    err16 = std::max(err16, std::abs(lse16[t] - ref_lse[t]));
    err32 = std::max(err32, std::abs(lse32[t] - ref_lse[t]));
  }
  EXPECT_NE(lse16, lse32);
  EXPECT_LT(err16 * 10, err32) << "lse error against the rounded inputs: bf16 " << err16
                               << ", f32 " << err32;
}

// The diagonal units write large outputs with non-temporal stores (set_attention_stream_bytes;
// by default from the L3's size up) where every output row starts on a 64-byte boundary. Here
// every call streams: 16 over 4 and 8 over 1 heads, window 128 and 48 (sinks), calls of one part
// and of two (1100 rows), into an output at a 64-byte boundary and one 16 bytes past it (written
// through the cache). Each equals the call written through the cache bit for bit, and exact
// attention within the bound.
TEST_F(FlashAttentionBf16, StreamedOutputRows) {
  std::mt19937 rng(59);
  for (int64_t nq : {200, 1100})
    for (const AttentionShape shape : {AttentionShape{16, 4, 64}, AttentionShape{8, 1, 64}}) {
      const int64_t window = shape.num_kv_heads == 4 ? 128 : 48;
      const Inputs in = make_inputs(rng, nq, 300, nq + 300, 0, shape, {true, window}, 1.0f, window == 48);
      if (!runs_bf16_kernel(in)) GTEST_SKIP() << "this CPU or build has no AVX512-BF16";
      SCOPED_TRACE(describe(in));
      const int64_t n = nq * shape.num_q_heads * shape.head_dim;
      struct Restore {
        ~Restore() { set_attention_stream_bytes(-1); }
      } restore;
      std::vector<float> cached, cached_lse;
      set_attention_stream_bytes(int64_t{1} << 62);
      run_flash(in, ComputeType::BF16, cached, cached_lse);
      set_attention_stream_bytes(0);
      std::vector<float> buf(n + 32);
      for (int64_t skew : {0, 4}) {
        float* out = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 64 / 4) % 16 + skew;
        std::vector<float> lse(nq * shape.num_q_heads, 123.0f);
        std::fill(buf.begin(), buf.end(), 123.0f);
        flash_attention({.q = in.q.data(), .nq = in.nq, .q_pos0 = in.q_pos0, .k = in.k.data(),
                         .v = in.v.data(), .nk = in.nk, .kv_pos0 = in.kv_pos0, .shape = in.shape,
                         .mask = in.mask, .scale = in.scale, .compute = ComputeType::BF16,
                         .sinks = in.use_sinks ? in.sinks.data() : nullptr, .out = out,
                         .lse = lse.data()});
        const std::vector<float> streamed(out, out + n);
        EXPECT_EQ(streamed, cached) << "output 4·" << skew << " bytes past a 64-byte boundary";
        EXPECT_EQ(lse, cached_lse);
        expect_matches(in, ComputeType::BF16, streamed, lse);
      }
    }
}

// Where the bf16 kernel cannot run (odd head_dim), BF16 gives exactly the f32 kernel's result.
TEST_F(FlashAttentionBf16, OddHeadDimRunsTheF32Kernel) {
  std::mt19937 rng(6);
  const Inputs in = make_inputs(rng, 70, 0, 70, 0, {4, 2, 15}, {true, 5}, 0.25f, true);
  std::vector<float> out16, lse16, out32, lse32;
  run_flash(in, ComputeType::BF16, out16, lse16);
  run_flash(in, ComputeType::F32, out32, lse32);
  EXPECT_EQ(out16, out32);
  EXPECT_EQ(lse16, lse32);
}

// A NaN or Inf in a value no row may see stays out of the bf16 kernel's results: keys are
// processed in pairs, and the key before an odd window start and the one after an odd causal
// end are partners that no row sees; with AMX (head_dim 64) the tiles take runs of 32 key slots,
// which pass the last visible key, and head-packed window blocks (4 query heads on one KV head)
// run on them too.
TEST_F(FlashAttentionBf16, UnseenPartnerKeysStayOut) {
  std::mt19937 rng(8);
  for (const AttentionShape shape : {AttentionShape{2, 1, 16}, AttentionShape{4, 1, 64},
                                     AttentionShape{2, 2, 64}, AttentionShape{1, 1, 64}})
    for (const AttentionMask mask : {AttentionMask{true, 5}, AttentionMask{true, 0}})
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        // 50 queries at 101..150, keys at 0..199: the window 5 makes key 97 the first visible
        // one (odd: paired with 96), and 150 is the last (even: paired with 151).
        Inputs in = make_inputs(rng, 50, 101, 200, 0, shape, mask, 0.25f, false);
        SCOPED_TRACE(describe(in));
        const int64_t first = mask.window > 0 ? 97 : 0, Hkv = shape.num_kv_heads, D = shape.head_dim;
        for (int64_t j = 0; j < 200; ++j)
          if (j < first || j > 150)
            for (int64_t x = 0; x < Hkv * D; ++x) in.v[j * Hkv * D + x] = bad;
        // Only keys first..150 are visible to any row, so the reference is finite.
        std::vector<float> out, lse;
        run_flash(in, ComputeType::BF16, out, lse);
        for (size_t t = 0; t < out.size(); ++t)
          ASSERT_TRUE(std::isfinite(out[t])) << "element " << t << ": " << out[t];
        expect_matches(in, ComputeType::BF16, out, lse);
      }
}

// On the f32 units BF16 is the f32 kernel, bit for bit, on every mask, head layout and sinks,
// also where the CPU has the bf16 kernel (which the first case shows gives other numbers).
TEST(FlashAttentionOnF32Units, Bf16RunsTheF32Kernel) {
  std::mt19937 rng(9);
  const Inputs cases[] = {
      make_inputs(rng, 130, 0, 130, 0, {4, 2, 64}, {true, 0}, 1.0f, false),
      make_inputs(rng, 65, 200, 257, 0, {8, 2, 64}, {true, 128}, 0.125f, true),
      make_inputs(rng, 33, 0, 64, 40, {6, 1, 20}, {false, 0}, 0.5f, true),
  };
  for (const Inputs& in : cases) {
    SCOPED_TRACE(describe(in));
    std::vector<float> out16, lse16, out32, lse32;
    set_bf16_units(Bf16Units::F32);
    run_flash(in, ComputeType::BF16, out16, lse16);
    run_flash(in, ComputeType::F32, out32, lse32);
    EXPECT_EQ(out16, out32);
    EXPECT_EQ(lse16, lse32);
    if (&in == &cases[0] && bf16_attention_supported()) {  // the bf16 units give other numbers
      set_bf16_units(Bf16Units::Bf16);
      run_flash(in, ComputeType::BF16, out16, lse16);
      EXPECT_NE(lse16, lse32);
    }
    set_bf16_units(Bf16Units::Auto);
  }
}

// Split the keys into 2-4 disjoint contiguous blocks (as ring attention receives them), attend
// each without sinks, merge in a random order, apply the sinks once: equals whole attention.
TEST_P(FlashAttention, SplitKeysThenMergeAndSink) {
  std::mt19937 rng(2024);
  int n = 0;
  for (int64_t nk : {int64_t{7}, int64_t{65}, int64_t{130}, int64_t{257}})
    for (int64_t window : kWindows)
      for (bool causal : {true, false}) {
        AttentionShape shape = kHeads[n % 3];
        shape.head_dim = kDims[n % 4];
        const int64_t nq = kSizes[(n * 3) % 8];
        const int64_t q_pos0 = 50 + nk / 2;  // overlaps the keys: some blocks are in the future
        const Inputs in = make_inputs(rng, nq, q_pos0, nk, 50, shape, {causal, window}, 0.25f,
                                      true);
        SCOPED_TRACE(describe(in));
        const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;

        // Random cut points -> blocks [cuts[b], cuts[b+1]).
        const int nblocks = 2 + n % 3;
        std::vector<int64_t> cuts{0, nk};
        std::uniform_int_distribution<int64_t> cut(1, std::max<int64_t>(1, nk - 1));
        while (static_cast<int>(cuts.size()) < nblocks + 1 && nk > nblocks) {
          const int64_t c = cut(rng);
          if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
        }
        std::sort(cuts.begin(), cuts.end());
        std::vector<int> order(cuts.size() - 1);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);

        std::vector<float> out(nq * Hq * D), lse(nq * Hq), ob(out.size()), lb(lse.size());
        bool first = true;
        for (int b : order) {
          const int64_t j0 = cuts[b], nkb = cuts[b + 1] - cuts[b];
          float* o = first ? out.data() : ob.data();
          float* l = first ? lse.data() : lb.data();
          flash_attention({.q = in.q.data(), .nq = nq, .q_pos0 = q_pos0,
                           .k = in.k.data() + j0 * Hkv * D, .v = in.v.data() + j0 * Hkv * D,
                           .nk = nkb, .kv_pos0 = 50 + j0, .shape = shape, .mask = in.mask,
                           .scale = in.scale, .compute = ct(), .sinks = nullptr,
                           .out = o, .lse = l});
          if (!first) attention_merge(out.data(), lse.data(), ob.data(), lb.data(), nq, Hq, D);
          first = false;
        }
        attention_apply_sinks(out.data(), lse.data(), in.sinks.data(), nq, Hq, D);

        expect_matches(in, ct(), out, lse);
        if (ct() == ComputeType::BF16 && runs_bf16_kernel(in)) {
          // The bf16 kernel rounds each probability the same way wherever the keys were cut
          // (integer running max, key pairs at even positions), so blocks merged agree with one
          // call up to f32 summation order, far inside the bf16 bound: meshes then agree with
          // one rank.
          SCOPED_TRACE("split against one call, both bf16: f32 summation order only");
          std::vector<float> one_out, one_lse;
          run_flash(in, ct(), one_out, one_lse);
          expect_split_equals_one_call(out, one_out, max_abs(in.v));
        }
        ++n;
      }
}

TEST(AttentionMerge, EmptyRows) {
  // a empty, b non-empty -> b; both empty -> stays empty; sinks on empty -> lse = sink, out 0.
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> oa{0, 0, 0, 0}, la{ninf, ninf}, obv{1, 2, 0, 0}, lbv{0.5f, ninf};
  attention_merge(oa.data(), la.data(), obv.data(), lbv.data(), 2, 1, 2);
  EXPECT_EQ(oa, (std::vector<float>{1, 2, 0, 0}));
  EXPECT_EQ(la[0], 0.5f);
  EXPECT_EQ(la[1], ninf);
  const float sink = 0.5f;
  attention_apply_sinks(oa.data(), la.data(), &sink, 2, 1, 2);
  EXPECT_NEAR(la[0], 0.5 + std::log(2.0), 1e-6);
  EXPECT_NEAR(oa[0], 0.5, 1e-6);
  EXPECT_NEAR(oa[1], 1.0, 1e-6);
  EXPECT_EQ(la[1], sink);
  EXPECT_EQ(oa[2], 0.0f);
  EXPECT_EQ(oa[3], 0.0f);
}

// The bf16 kernel keeps its K/V buffers from call to call, one set per calling thread: calls
// from several threads at once, of different sizes, each match the same call made alone.
TEST_P(FlashAttention, CallsFromSeveralThreadsAtOnce) {
  std::mt19937 rng(5);
  std::vector<Inputs> ins;
  for (int t = 0; t < 4; ++t)
    ins.push_back(make_inputs(rng, 40 + 30 * t, 700, 300 + 150 * t, 600 - 7 * t, {4, 2, 64},
                              {true, t % 2 ? 0 : 128}, 0.2f, t % 2 == 1));
  std::vector<std::vector<float>> alone_out(ins.size()), alone_lse(ins.size());
  for (size_t t = 0; t < ins.size(); ++t) run_flash(ins[t], ct(), alone_out[t], alone_lse[t]);
  std::vector<std::vector<float>> out(ins.size()), lse(ins.size());
  std::vector<int> mismatches(ins.size(), 0);
  {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < ins.size(); ++t)
      threads.emplace_back([&, t] {
        for (int rep = 0; rep < 5; ++rep) {
          run_flash(ins[t], ct(), out[t], lse[t]);
          if (out[t] != alone_out[t] || lse[t] != alone_lse[t]) ++mismatches[t];
        }
      });
    for (std::thread& th : threads) th.join();
  }
  for (size_t t = 0; t < ins.size(); ++t) {
    SCOPED_TRACE(describe(ins[t]));
    EXPECT_EQ(mismatches[t], 0) << "calls that differ from the same call made alone";
    check_flash(ins[t], ct());
  }
}

// The K/V copies a kernel keeps on its calling thread (the memory prediction's term, engine/
// topology.h) stay within attention_kept_bytes_bound for the most keys of the calls made: causal
// and windowed calls of growing and shrinking key counts, on a fresh thread per KV head count.
// Where the kernel copies every visible key (the f32 kernels over several KV heads; the bf16
// kernel always) it keeps at least those keys' K and V, so the bound is not met vacuously.
TEST_P(FlashAttention, KeptCopiesStayWithinTheBound) {
  const int64_t D = 64;
  for (int64_t Hkv : {1, 2, 4}) {
    std::thread([&] {
      SCOPED_TRACE("Hkv=" + std::to_string(Hkv));
      EXPECT_EQ(attention_kept_bytes(), 0) << "a fresh thread keeps nothing";
      std::mt19937 rng(9);
      int64_t most = 0;
      for (int64_t nk : {300, 1500, 700, 2100, 64}) {
        for (int64_t window : {0, 128}) {
          const Inputs in = make_inputs(rng, 64, nk - 64, nk, 0, {4 * Hkv, Hkv, D}, {true, window}, 0.125f, false);
          std::vector<float> out, lse;
          run_flash(in, ct(), out, lse);
          most = std::max(most, nk);
          EXPECT_LE(attention_kept_bytes(), attention_kept_bytes_bound(most, Hkv, D)) << describe(in);
        }
      }
      const bool bf16_kernel = ct() == ComputeType::BF16 && bf16_attention_supported();
      if (bf16_kernel) {
        EXPECT_GE(attention_kept_bytes(), 2 * 2 * most * Hkv * D);
      } else if (Hkv > 1) {
        EXPECT_EQ(attention_kept_bytes(), 2 * 4 * most * Hkv * D);
      }
    }).join();
  }
}

#if defined(__AVX512F__)
// The kernels' vector ln and e^x (the LSE and the sink of each row, attention_common.h) against
// libm: ln to 2e-10 absolute (its series' truncation) over the doubles an f32 row sum can be,
// the ends of the mantissa interval [0.75, 1.5) included; e^y for y <= 0 to 2e-15 · (1 + |y|)
// relative (y · log2 e is rounded once; its series' truncation is below 1e-15), 0 for -inf.
TEST(AttentionLse, VectorLogAndExpMatchLibm) {
  using namespace attention_detail;
  std::vector<double> xs;
  for (double x = 1e-40; x < 1e39; x *= 1.37) xs.push_back(x);
  for (int e = -20; e <= 20; ++e)
    for (double m : {0.75, std::nextafter(0.75, 0.0), 1.0, std::nextafter(1.0, 0.0), 1.5,
                     std::nextafter(1.5, 0.0), std::sqrt(2.0)})
      xs.push_back(std::ldexp(m, e));
  while (xs.size() % 8) xs.push_back(1.0);
  for (size_t i = 0; i < xs.size(); i += 8) {
    alignas(64) double got[8];
    _mm512_store_pd(got, log_pd(_mm512_loadu_pd(xs.data() + i)));
    for (int k = 0; k < 8; ++k)
      EXPECT_NEAR(got[k], std::log(xs[i + k]), 2e-10 + 1e-15 * std::abs(std::log(xs[i + k])))
          << "ln " << xs[i + k];
  }
  std::vector<double> ys{-kInf, -800.0, -745.0, -0.0};
  for (double y = -740; y < 0; y += 0.731) ys.push_back(y);
  for (double y = -1e-3; y < -1e-12; y *= 0.3) ys.push_back(y);
  while (ys.size() % 8) ys.push_back(0.0);
  for (size_t i = 0; i < ys.size(); i += 8) {
    alignas(64) double got[8];
    _mm512_store_pd(got, exp_pd(_mm512_loadu_pd(ys.data() + i)));
    for (int k = 0; k < 8; ++k) {
      const double want = std::exp(ys[i + k]);
      if (want == 0.0)
        EXPECT_EQ(got[k], 0.0) << "e^" << ys[i + k];
      else
        EXPECT_NEAR(got[k], want, 2e-15 * (1 - ys[i + k]) * want) << "e^" << ys[i + k];
    }
  }
}
#endif

// The inputs of the 2^x tests and the check of their results: within 2e-7 relative for x in
// [-125, 0], never a denormal (each would cost a microcode assist), exactly 0 below -125 and for
// -inf, NaN for NaN. Padded to a multiple of 16 lanes.
std::vector<float> exp2_inputs() {
  std::vector<float> xs{0.0f, -0.0f, -0.5f, -1.0f, -124.49f, -124.5f, -124.51f, -125.0f,
                        -125.01f, -125.5f, -126.0f, -130.0f, -149.0f, -150.0f, -200.0f, -1e30f,
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()};
  for (float x = -140.0f; x < 0.0f; x += 0.173f) xs.push_back(x);
  while (xs.size() % 16) xs.push_back(-1.0f);
  return xs;
}

[[maybe_unused]] void check_exp2(const std::vector<float>& xs, const std::vector<float>& got,
                                  double rel = 2e-7) {
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i], y = got[i];
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(y)) << "2^NaN gave " << y;
    } else if (x < -125.0f) {
      EXPECT_EQ(y, 0.0f) << "2^" << x;
    } else {
      EXPECT_EQ(std::fpclassify(y), FP_NORMAL) << "2^" << x << " = " << y;
      EXPECT_NEAR(y, std::exp2(double(x)), rel * std::exp2(double(x))) << "2^" << x;
    }
  }
}

#if defined(__AVX512F__)
// f over xs (a multiple of 16 long), 16 lanes at a time.
std::vector<float> map_avx512(const std::vector<float>& xs, __m512 (*f)(__m512)) {
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16)
    _mm512_storeu_ps(got.data() + i, f(_mm512_loadu_ps(xs.data() + i)));
  return got;
}

// The softmax's 2^x (exp2_avx512.h).
TEST(AttentionSoftmax, Exp2MatchesLibmAndGivesNoDenormal) {
  const std::vector<float> xs = exp2_inputs();
  check_exp2(xs, map_avx512(xs, cpu::exp2_ps));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The bf16 kernel's 2^x for its weights (exp2_weights_ps): the same contract within 3e-6, and
// 2^(x + k) = 2^x · 2^k exactly for integers k, which the kernel's integer running max needs (a
// sequence split into blocks or calls rounds its weights to bf16 as one call does). The grid
// holds the ties x = -1/2, where a reduction to the nearest integer makes f 1/2 or -1/2 by the
// parity of x + k (then p(1/2) must be 2 p(-1/2) to the last bit, which a low-degree fit is not).
TEST(AttentionSoftmax, Exp2WeightsMatchesLibmAndScalesExactly) {
  const std::vector<float> xs = exp2_inputs();
  check_exp2(xs, map_avx512(xs, cpu::exp2_weights_ps), 3e-6);
  // x in (-1, 0] on a 2^-16 grid, so that x + k is exact for every k down to -124.
  alignas(64) float x[16], y[16], yk[16];
  for (int i0 = 0; i0 < 65536; i0 += 16) {
    for (int l = 0; l < 16; ++l) x[l] = -static_cast<float>(i0 + l) / 65536.0f;
    _mm512_store_ps(y, cpu::exp2_weights_ps(_mm512_load_ps(x)));
    for (int k = -124; k <= 0; k += 31) {
      _mm512_store_ps(yk, cpu::exp2_weights_ps(_mm512_add_ps(_mm512_load_ps(x), _mm512_set1_ps(k))));
      for (int l = 0; l < 16; ++l)
        ASSERT_EQ(yk[l], std::ldexp(y[l], k)) << "2^(" << x[l] << " + " << k << ")";
    }
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The AVX2 kernel's 2^x (exp2_avx2.h), to the same contract.
TEST(AttentionSoftmax, Exp2Avx2MatchesLibmAndGivesNoDenormal) {
  const std::vector<float> xs = exp2_inputs();
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += 8)
    _mm256_storeu_ps(got.data() + i, cpu::exp2_ps(_mm256_loadu_ps(xs.data() + i)));
  check_exp2(xs, got);
}
#endif

TEST(AttentionFlops, MatchesBruteForceCount) {
  for (int64_t nq : {1, 7, 64, 130})
    for (int64_t nk : {1, 33, 257})
      for (int placement = 0; placement < 4; ++placement)
        for (int64_t window : kWindows)
          for (bool causal : {true, false}) {
            const AttentionShape shape{6, 2, 24};
            const AttentionMask mask{causal, window};
            const int64_t q_pos0 = 400, kv_pos0 = q_pos0 + kv_offset(placement, nq, nk);
            int64_t pairs = 0;
            for (int64_t i = 0; i < nq; ++i)
              for (int64_t j = 0; j < nk; ++j) pairs += visible(q_pos0 + i, kv_pos0 + j, mask);
            EXPECT_EQ(attention_flops(nq, q_pos0, nk, kv_pos0, shape, mask),
                      4.0 * 24 * 6 * static_cast<double>(pairs))
                << "nq=" << nq << " nk=" << nk << " placement=" << placement
                << " window=" << window << " causal=" << causal;
          }
  // Closed form for full causal self-attention: n(n+1)/2 pairs.
  EXPECT_EQ(attention_flops(16384, 0, 16384, 0, {4, 1, 64}, {true, 0}),
            4.0 * 64 * 4 * (16384.0 * 16385.0 / 2));
}

}  // namespace
}  // namespace slope::kernels
