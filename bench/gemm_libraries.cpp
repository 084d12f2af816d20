// Which BLAS library SLOPE's GEMM should use, measured side by side in one run: OpenBLAS and
// BLIS (cblas_sgemm, loaded with dlopen so their clashing cblas_* symbols stay apart), oneDNN's
// sgemm, and oneDNN matmul with plain and with prepacked weights, in f32 and bf16.
// Layout everywhere: C[M,N] f32 = A[M,K] · Wᵀ with W [N,K] row-major (nn.Linear).
// Each (shape, library) pair runs back to back with the others of the same shape, so machine
// noise hits all libraries alike; `--rounds=N` repeats the whole interleaved sequence N times.
//
// The environment decides the kernels OpenBLAS and BLIS pick (OPENBLAS_CORETYPE,
// BLIS_ARCH_TYPE); the label shows what they picked, and `err` is the largest error of 64
// sampled outputs against a double reference, relative to Σ|a·w| (catches wrong results).
//
//   build/gemm/bench/bench_gemm_libraries --rounds=3 --benchmark_min_time=0.5
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "slope/core/half.h"
#include "slope/core/sys.h"

namespace {

constexpr double kPeakPerThreadF32 = 224e9, kPeakPerThreadBf16 = 448e9;
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int,
                               const float*, int, float, float*, int);

struct Blas {
  void* handle = nullptr;
  cblas_sgemm_t sgemm = nullptr;
  std::string label;
};

const Blas& openblas() {
  static Blas b = [] {
    Blas b;
    b.handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!b.handle) return b;
    b.sgemm = reinterpret_cast<cblas_sgemm_t>(dlsym(b.handle, "cblas_sgemm"));
    if (auto set = reinterpret_cast<void (*)(int)>(dlsym(b.handle, "openblas_set_num_threads")))
      set(slope::num_threads());
    auto core = reinterpret_cast<const char* (*)()>(dlsym(b.handle, "openblas_get_corename"));
    auto cfg = reinterpret_cast<const char* (*)()>(dlsym(b.handle, "openblas_get_config"));
    b.label = std::string("core=") + (core ? core() : "?") + " " + (cfg ? cfg() : "");
    return b;
  }();
  return b;
}

const Blas& blis() {
  static Blas b = [] {
    Blas b;
    b.handle = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!b.handle) return b;
    b.sgemm = reinterpret_cast<cblas_sgemm_t>(dlsym(b.handle, "cblas_sgemm"));
    if (auto set = reinterpret_cast<void (*)(long)>(dlsym(b.handle, "bli_thread_set_num_threads")))
      set(slope::num_threads());
    auto id = reinterpret_cast<int (*)()>(dlsym(b.handle, "bli_arch_query_id"));
    auto name = reinterpret_cast<const char* (*)(int)>(dlsym(b.handle, "bli_arch_string"));
    auto ver = reinterpret_cast<const char* (*)()>(dlsym(b.handle, "bli_info_get_version_str"));
    b.label = std::string("arch=") + (id && name ? name(id()) : "?") + " " + (ver ? ver() : "");
    return b;
  }();
  return b;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Max over 64 sampled outputs of |c − ref| / Σ|a·w| (inputs rounded to bf16 when asked).
double sampled_error(const std::vector<float>& A, const std::vector<float>& W,
                     const std::vector<float>& C, int64_t M, int64_t N, int64_t K, bool bf16) {
  std::mt19937 rng(9);
  double worst = 0;
  auto r = [&](float v) { return double(bf16 ? slope::round_bf16(v) : v); };
  for (int s = 0; s < 64; ++s) {
    const int64_t i = rng() % M, j = rng() % N;
    double sum = 0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double t = r(A[i * K + k]) * r(W[j * K + k]);
      sum += t;
      mag += std::abs(t);
    }
    const double e = std::abs(C[i * N + j] - sum) / mag;
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

enum class Lib { OpenBlas, Blis, OnednnSgemm, OnednnPlainF32, OnednnPackedF32, OnednnPlainBf16,
                 OnednnPackedBf16, OnednnRuntimeMF32, OnednnRuntimeMBf16 };
const char* lib_name(Lib l) {
  switch (l) {
    case Lib::OpenBlas: return "openblas_f32";
    case Lib::Blis: return "blis_f32";
    case Lib::OnednnSgemm: return "onednn_sgemm_f32";
    case Lib::OnednnPlainF32: return "onednn_matmul_plain_f32";
    case Lib::OnednnPackedF32: return "onednn_matmul_packed_f32";
    case Lib::OnednnPlainBf16: return "onednn_matmul_plain_bf16";
    case Lib::OnednnPackedBf16: return "onednn_matmul_packed_bf16";
    case Lib::OnednnRuntimeMF32: return "onednn_matmul_runtimeM_f32";
    case Lib::OnednnRuntimeMBf16: return "onednn_matmul_runtimeM_bf16";
  }
  return "?";
}

void BM_Gemm(benchmark::State& state, Lib lib, int64_t M, int64_t N, int64_t K) {
  const auto A = random_floats(M * K, 1), W = random_floats(N * K, 2);
  std::vector<float> C(M * N);
  const bool bf16 = lib == Lib::OnednnPlainBf16 || lib == Lib::OnednnPackedBf16 ||
                    lib == Lib::OnednnRuntimeMBf16;
  std::string label;
  std::function<void()> run;

  // oneDNN matmul objects (kept alive for the loop).
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::matmul mm;
  dnnl::memory a_mem, w_mem, c_mem, scratch_mem;
  std::vector<uint16_t> a_bf, w_bf;
  std::vector<uint8_t> scratch;

  switch (lib) {
    case Lib::OpenBlas:
    case Lib::Blis: {
      const Blas& b = lib == Lib::OpenBlas ? openblas() : blis();
      if (!b.sgemm) {
        state.SkipWithError("library not found (dlopen)");
        return;
      }
      label = b.label;
      run = [&, f = b.sgemm] {
        f(kCblasRowMajor, kCblasNoTrans, kCblasTrans, int(M), int(N), int(K), 1.f, A.data(),
          int(K), W.data(), int(K), 0.f, C.data(), int(N));
      };
      break;
    }
    case Lib::OnednnSgemm:
      run = [&] {
        dnnl_sgemm('N', 'T', M, N, K, 1.f, A.data(), K, W.data(), K, 0.f, C.data(), N);
      };
      break;
    default: {
      const dt cdt = bf16 ? dt::bf16 : dt::f32;
      // runtimeM: one primitive for every M (DNNL_RUNTIME_DIM_VAL) with weights format any,
      // the alternative to Linear's per-M primitives.
      const bool runtime_m = lib == Lib::OnednnRuntimeMF32 || lib == Lib::OnednnRuntimeMBf16;
      const bool packed = lib == Lib::OnednnPackedF32 || lib == Lib::OnednnPackedBf16 || runtime_m;
      const void* a_ptr = A.data();
      const void* w_ptr = W.data();
      if (bf16) {
        a_bf.resize(A.size());
        w_bf.resize(W.size());
        for (size_t i = 0; i < A.size(); ++i) a_bf[i] = slope::f32_to_bf16(A[i]);
        for (size_t i = 0; i < W.size(); ++i) w_bf[i] = slope::f32_to_bf16(W[i]);
        a_ptr = a_bf.data();
        w_ptr = w_bf.data();
      }
      dnnl::memory::desc a_md({M, K}, cdt, tag::ab), c_md({M, N}, dt::f32, tag::ab);
      dnnl::memory::desc w_plain({K, N}, cdt, tag::ba);  // W [N,K] row-major viewed as [K,N]
      dnnl::memory::desc w_md = packed ? dnnl::memory::desc({K, N}, cdt, tag::any) : w_plain;
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const int64_t pd_m = runtime_m ? DNNL_RUNTIME_DIM_VAL : M;
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(dnnl::memory::desc({pd_m, K}, cdt, tag::ab), w_md,
                             dnnl::memory::desc({pd_m, N}, dt::f32, tag::ab)),
          attr, eng);
      label = pd.impl_info_str();
      if (runtime_m) {
        const bool plain = pd.weights_desc() == w_plain ||
                           pd.weights_desc() == dnnl::memory::desc({K, N}, cdt, tag::ab);
        label += plain ? " (plain weights)" : " (blocked weights)";
      }
      mm = dnnl::matmul(pd);
      a_mem = dnnl::memory(a_md, eng, const_cast<void*>(a_ptr));
      c_mem = dnnl::memory(c_md, eng, C.data());
      dnnl::memory w_src(w_plain, eng, const_cast<void*>(w_ptr));
      if (packed) {
        w_mem = dnnl::memory(pd.weights_desc(), eng);
        dnnl::reorder(w_src, w_mem).execute(strm, w_src, w_mem);  // once, outside the timing
        strm.wait();
      } else {
        w_mem = w_src;
      }
      scratch.resize(pd.scratchpad_desc().get_size() + 64);
      scratch_mem = dnnl::memory(pd.scratchpad_desc(), eng, scratch.data());
      run = [&] {
        mm.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, w_mem},
                          {DNNL_ARG_DST, c_mem}, {DNNL_ARG_SCRATCHPAD, scratch_mem}});
        strm.wait();
      };
    }
  }

  run();  // warm-up (thread pools, first-touch)
  const double err = sampled_error(A, W, C, M, N, K, bf16);
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * M * N * K;
  const double peak = (bf16 ? kPeakPerThreadBf16 : kPeakPerThreadF32) *
                      std::min(slope::num_threads(), 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["%peak"] =
      benchmark::Counter(flops / peak * 100.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["err"] = err;
  state.SetLabel(label);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 1;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(1, std::atoi(argv[i] + 9));
    else args.push_back(argv[i]);
  }
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());

  const Lib libs[] = {Lib::OpenBlas,         Lib::Blis,
                      Lib::OnednnSgemm,      Lib::OnednnPlainF32,
                      Lib::OnednnPackedF32,  Lib::OnednnRuntimeMF32,
                      Lib::OnednnPlainBf16,  Lib::OnednnPackedBf16,
                      Lib::OnednnRuntimeMBf16};
  for (int r = 0; r < rounds; ++r)
    for (int64_t M : {512, 2048})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {5760, 2880}, {2880, 5760},
                          {2048, 1024}, {1024, 1024}})
        for (Lib lib : libs) {
          const std::string name = std::string(lib_name(lib)) + "/M:" + std::to_string(M) +
                                   "/N:" + std::to_string(N) + "/K:" + std::to_string(K) +
                                   "/round:" + std::to_string(r);
          benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, lib, M, N, K)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
