// Memory bandwidth of this machine, OpenMP threads over SPAN_MIB of f32: read (sum), write
// (non-temporal off: plain stores, so each line is also read for ownership), and copy, best of
// 5 passes each, in GB/s of bytes the program names (a write counts its bytes once).
// g++ -O3 -ffast-math -march=native -fopenmp stream.cpp (-ffast-math: the read sum vectorises) -o stream; OMP_NUM_THREADS=2 ./stream SPAN_MIB
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const size_t n = (argc > 1 ? std::atol(argv[1]) : 256) * (size_t{1} << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  auto best = [&](auto&& f) {
    double t = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto s = std::chrono::steady_clock::now();
      f();
      t = std::min(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
    }
    return t;
  };
  double sink = 0;
  const double bytes = n * sizeof(float);
  const double tr = best([&] {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t i = 0; i < n; ++i) s += a[i];
    sink += s;
  });
  const double tw = best([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = 3.0f;
  });
  const double tc = best([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
  });
  std::printf("{\"span_mib\": %zu, \"threads\": %d, \"read_gbs\": %.1f, \"write_gbs\": %.1f, "
              "\"copy_gbs\": %.1f, \"sink\": %g}\n",
              n * sizeof(float) >> 20, omp_get_max_threads(), bytes / tr / 1e9, bytes / tw / 1e9,
              2 * bytes / tc / 1e9, sink + b[n / 2]);
}
