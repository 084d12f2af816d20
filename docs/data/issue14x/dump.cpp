// Dumps the outputs and LSEs of bf16 calls that reach the diagonal units' edge paths, for a
// bitwise comparison of two builds: keys from the sequence's start, odd kv_pos0, windows
// 48 / 128 / 160, GQA 8 over 1 and 6 over 2, sinks, calls longer than a part.
#include <cstdio>
#include <random>
#include <vector>
#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
using namespace slope::kernels;
int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  FILE* f = std::fopen(argv[1], "wb");
  struct C { int64_t nq, q_pos0, nk, kv_pos0, hq, hkv, w; bool sinks; };
  const C cs[] = {{300, 0, 300, 0, 8, 1, 128, false}, {257, 101, 358, 0, 6, 2, 48, true},
                  {1100, 77, 1177, 0, 16, 4, 128, false}, {200, 1001, 300, 901, 8, 2, 160, true},
                  {2100, 0, 2100, 0, 4, 4, 128, true}, {129, 517, 300, 346, 16, 4, 128, false},
                  {64, 63, 127, 0, 8, 1, 128, false}};
  for (const C& c : cs) {
    std::mt19937 rng(7);
    std::normal_distribution<float> u(0.f, 1.f);
    std::vector<float> q(c.nq * c.hq * 64), k(c.nk * c.hkv * 64), v(k.size()), out(q.size()), lse(c.nq * c.hq), s(c.hq);
    for (auto* x : {&q, &k, &v, &s}) for (float& y : *x) y = u(rng);
    flash_attention({.q = q.data(), .nq = c.nq, .q_pos0 = c.q_pos0, .k = k.data(), .v = v.data(), .nk = c.nk,
                     .kv_pos0 = c.kv_pos0, .shape = {c.hq, c.hkv, 64}, .mask = {true, c.w}, .scale = 0.125f,
                     .compute = ComputeType::BF16, .sinks = c.sinks ? s.data() : nullptr, .out = out.data(),
                     .lse = lse.data()});
    std::fwrite(out.data(), 4, out.size(), f);
    std::fwrite(lse.data(), 4, lse.size(), f);
  }
  std::fclose(f);
}
