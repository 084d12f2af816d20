// In-process A/B of two builds of the attention kernels: A, a shared object built from an older
// tree's static libraries (with -fPIC; only its wrapper's symbols exported: old_wrap.cpp below),
// loaded with dlopen; B, this tree's libraries linked in. Calls alternate A B, then B A, on the
// same inputs (slope::Tensor buffers, as the engine's); per shape the median of the pairs' time
// ratios A/B (above 1: this tree faster), its quartiles and each side's median GFLOP/s. It first
// checks that both give identical outputs.
//   OMP_NUM_THREADS=2 ab_old_new LIBOLD.so SECONDS [TOKENS,WINDOW ...]   (16 over 4 heads, D 64, bf16)
// LIBOLD.so (old tree at OLD, built with cmake -DCMAKE_POSITION_INDEPENDENT_CODE=ON into build/pic):
//   c++ -O3 -DNDEBUG -march=native -fopenmp -std=c++20 -fPIC -shared -fvisibility=hidden -IOLD/src \
//     old_wrap.cpp -o libold.so OLD/build/pic/libslope_kernels.a OLD/build/pic/libslope_core.a \
//     -ldnnl -lgomp -Wl,--exclude-libs,ALL -Wl,-Bsymbolic
// where old_wrap.cpp exports extern "C" old_flash(const AttentionArgs*) (calls flash_attention)
// and old_init() (calls set_bf16_units(Bf16Units::Bf16)), both visibility("default").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <dlfcn.h>
#include <omp.h>
#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
using namespace slope::kernels;
int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { std::printf("%s\n", dlerror()); return 1; }
  auto old_flash = reinterpret_cast<void (*)(const AttentionArgs*)>(dlsym(lib, "old_flash"));
  auto old_init = reinterpret_cast<void (*)()>(dlsym(lib, "old_init"));
  old_init();
  set_bf16_units(Bf16Units::Bf16);
  const double budget = argc > 2 ? std::atof(argv[2]) : 20;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 128}, {16384, 128}, {32768, 128}, {16384, 0}};
  if (argc > 3) shapes.clear();
  for (int i = 3; i < argc; ++i) { long n, w; std::sscanf(argv[i], "%ld,%ld", &n, &w); shapes.push_back({n, w}); }
  auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
  for (auto [n, w] : shapes) {
    using slope::Tensor;
    using slope::DType;
    Tensor q({n * 16 * 64}, DType::F32), k({n * 4 * 64}, DType::F32), v({n * 4 * 64}, DType::F32),
        out({n * 16 * 64}, DType::F32), lse({n * 16}, DType::F32);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (Tensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = u(rng);
    const AttentionArgs args{.q = q.data<float>(), .nq = n, .q_pos0 = 0, .k = k.data<float>(), .v = v.data<float>(),
                             .nk = n, .kv_pos0 = 0, .shape = {16, 4, 64}, .mask = {true, w}, .scale = 0.125f,
                             .compute = ComputeType::BF16, .sinks = nullptr, .out = out.data<float>(),
                             .lse = lse.data<float>()};
    auto call = [&](bool mine) {
      const auto t0 = std::chrono::steady_clock::now();
      if (mine) flash_attention(args); else old_flash(&args);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    call(false);
    const std::vector<float> a(out.data<float>(), out.data<float>() + out.numel());
    call(true);
    if (std::memcmp(a.data(), out.data<float>(), a.size() * sizeof(float)) != 0) {
      std::printf("outputs differ at %ld tokens, window %ld\n", long(n), long(w));
      return 1;
    }
    const double flops = attention_flops(n, 0, n, 0, args.shape, args.mask);
    std::vector<double> r, ga, gb;
    for (double spent = 0; spent < budget;) {
      const bool ab = r.size() % 2 == 0;
      const double t1 = call(!ab), t2 = call(ab);
      const double ta = ab ? t1 : t2, tb = ab ? t2 : t1;
      r.push_back(ta / tb), ga.push_back(flops / ta * 1e-9), gb.push_back(flops / tb * 1e-9);
      spent += t1 + t2;
    }
    std::printf("tokens %6ld window %3ld threads %d pairs %4zu  old/new median %.3f (quartiles %.3f %.3f)  GFLOP/s old %.1f new %.1f\n",
                long(n), long(w), omp_get_max_threads(), r.size(), med(r), med(r, 0.25), med(r, 0.75), med(ga), med(gb));
    std::fflush(stdout);
  }
}
