// Where bf16 mode's products run on this CPU. bf16 mode multiplies bf16 weights by bf16-rounded
// activations and sums in f32. A bf16 x bf16 product is exact in f32, so the same numbers, up to
// the order of the f32 sums, come from either of two units:
//   Bf16: the CPU's bf16 arithmetic: oneDNN's bf16 matmul (vdpbf16ps, or AMX tiles) on the
//         packed bf16 weights, and SLOPE's bf16 attention kernel.
//   F32:  the f32 FMA units: f32 copies of the bf16 weights (twice the weight memory) times the
//         bf16-rounded rows on oneDNN's f32 matmul, and the f32 attention kernel (the f32
//         products of the unrounded q, k and v: kernels/attention.h).
//   Auto: whichever is faster here (choose_bf16_units).
// Why a choice: one vdpbf16ps (32 bf16 pairs, 64 FLOP on a zmm) does twice the FLOP of one
// vfmadd231ps (16 f32 lanes), but CPUs issue it at different rates. A Zen 4 issues it as fast as
// an FMA, so the bf16 units have twice the FLOP/s; the Intel Xeon without AMX measured in
// docs/performance.md ("Issue 14: third window") at a quarter of the FMA rate, so there the f32
// units have twice the FLOP/s (probes fp32 288-345, bf16 155-170 GFLOP/s); AMX tiles are
// several times either.
#pragma once

#include <string>

namespace slope::kernels {

enum class Bf16Units { Auto, Bf16, F32 };

// The facts choose_bf16_units decides from.
struct Bf16UnitFacts {
  bool bf16_matmul = false;  // oneDNN has a bf16 matmul on this CPU
  bool amx = false;          // AMX-BF16 usable (kernels/cpu/amx.h)
  bool dot = false;          // vdpbf16ps usable (CPU and build)
  double fma_gflops = 0;     // one thread, vfmadd231ps, measured (0 where not measured)
  double dot_gflops = 0;     // one thread, vdpbf16ps, measured (0 where not measured)
};

// This process's facts: the rates measured once, on the calling thread, in about a millisecond
// (dependency-free chains of each instruction, interleaved, the best of several rounds).
const Bf16UnitFacts& bf16_unit_facts();

// Bf16 where oneDNN has a bf16 matmul and either AMX is usable or vdpbf16ps does at least the
// FLOP/s of the FMAs; else F32 (also where the CPU has no bf16 arithmetic: Zen 2 and 3, and
// plain AVX-512, where oneDNN would emulate it).
Bf16Units choose_bf16_units(const Bf16UnitFacts& facts);

// Process-wide, for the BF16 Linears constructed and the attention calls started afterwards
// (the engine sets it before it loads weights). Bf16 where oneDNN has no bf16 matmul is an error
// at a Linear's construction; the bf16 attention kernel falls back to the f32 one where it
// cannot run, as its contract says.
void set_bf16_units(Bf16Units units);
// What runs now: Bf16 or F32, never Auto.
Bf16Units bf16_units();

// "auto", "bf16", "f32", as the command line spells them.
const char* bf16_units_name(Bf16Units units);
// Throws slope::Error naming the accepted values.
Bf16Units parse_bf16_units(const std::string& name);
// What runs and why (the measured rates), for `slope run`'s report: "f32 units (...): ...".
std::string describe_bf16_units();

}  // namespace slope::kernels
