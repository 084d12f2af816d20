// The choice of units for bf16 mode's products (kernels/bf16_units.h): the rule on made-up
// machines, the probe against this CPU's features, and the names the command line takes. That
// both units give the bf16 numbers is test_gemm's (Bf16UnitsAgree and every BF16 case on both)
// and test_attention's (FlashAttentionOnF32Units).
#include <gtest/gtest.h>

#include <string>

#include "slope/core/error.h"
#include "slope/kernels/bf16_units.h"
#include "slope/kernels/cpu/amx.h"
#include "slope/kernels/gemm.h"

namespace slope::kernels {
namespace {

Bf16UnitFacts facts(bool matmul, bool amx, bool dot, double fma, double dotr) {
  Bf16UnitFacts f;
  f.bf16_matmul = matmul;
  f.amx = amx;
  f.dot = dot;
  f.fma_gflops = fma;
  f.dot_gflops = dotr;
  return f;
}

TEST(Bf16Units, ChoosesTheFasterUnits) {
  // A Zen 4: vdpbf16ps at twice the FMAs' FLOP/s.
  EXPECT_EQ(choose_bf16_units(facts(true, false, true, 117, 233)), Bf16Units::Bf16);
  // An Intel Xeon without AMX: vdpbf16ps at half the FMAs' FLOP/s.
  EXPECT_EQ(choose_bf16_units(facts(true, false, true, 160, 82)), Bf16Units::F32);
  // The same with AMX: oneDNN's matmul and the attention kernel run on tiles.
  EXPECT_EQ(choose_bf16_units(facts(true, true, true, 160, 82)), Bf16Units::Bf16);
  // Equal rates: the bf16 units (half the weight memory).
  EXPECT_EQ(choose_bf16_units(facts(true, false, true, 100, 100)), Bf16Units::Bf16);
  // AVX-512 without bf16 arithmetic: oneDNN would emulate it.
  EXPECT_EQ(choose_bf16_units(facts(true, false, false, 100, 0)), Bf16Units::F32);
  // No bf16 matmul at all (Zen 2 and 3): only the f32 units can run, whatever else is true.
  EXPECT_EQ(choose_bf16_units(facts(false, true, true, 100, 400)), Bf16Units::F32);
}

// The probe reads this CPU: the features as the kernels see them, and rates where it measures.
TEST(Bf16Units, ProbeReadsThisCpu) {
  const Bf16UnitFacts& f = bf16_unit_facts();
  EXPECT_EQ(f.bf16_matmul, native_bf16_matmul_supported());
  EXPECT_EQ(f.amx, cpu::amx_usable());
#if defined(__AVX512F__)
  // One thread of any AVX-512 CPU does between about 1 and 1000 GFLOP/s of FMAs (a Zen 4 117).
  EXPECT_GT(f.fma_gflops, 1.0);
  EXPECT_LT(f.fma_gflops, 1000.0);
#endif
#if defined(__AVX512BF16__)
  EXPECT_EQ(f.dot, __builtin_cpu_supports("avx512bf16") != 0);
#else
  EXPECT_FALSE(f.dot);
#endif
  if (f.dot) {
    EXPECT_GT(f.dot_gflops, 1.0);
    EXPECT_LT(f.dot_gflops, 2000.0);
  } else {
    EXPECT_EQ(f.dot_gflops, 0.0);
  }
  // The same facts on a second call: measured once per process.
  EXPECT_EQ(&bf16_unit_facts(), &f);
}

TEST(Bf16Units, AutoIsTheChoiceAndAskingOverridesIt) {
  set_bf16_units(Bf16Units::Auto);
  const Bf16Units chosen = choose_bf16_units(bf16_unit_facts());
  EXPECT_EQ(bf16_units(), chosen);
  EXPECT_NE(describe_bf16_units().find(bf16_units_name(chosen)), std::string::npos) << describe_bf16_units();
  for (Bf16Units u : {Bf16Units::Bf16, Bf16Units::F32}) {
    set_bf16_units(u);
    EXPECT_EQ(bf16_units(), u);
    EXPECT_NE(describe_bf16_units().find("as asked"), std::string::npos) << describe_bf16_units();
  }
  set_bf16_units(Bf16Units::Auto);
  EXPECT_EQ(bf16_units(), chosen);
}

TEST(Bf16Units, NamesRoundTripAndBadNamesAreRefused) {
  for (Bf16Units u : {Bf16Units::Auto, Bf16Units::Bf16, Bf16Units::F32})
    EXPECT_EQ(parse_bf16_units(bf16_units_name(u)), u);
  try {
    parse_bf16_units("fp32");
    ADD_FAILURE() << "'fp32' parsed";
  } catch (const slope::Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, bf16 or f32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slope::kernels
