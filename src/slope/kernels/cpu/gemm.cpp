// Linear layers on oneDNN matmul with weights reordered once into the layout oneDNN's brgemm
// kernels want (format_tag::any), and a plain f32 GEMM through oneDNN's sgemm.
//
// Why oneDNN: on the development machine (Zen 5, AVX-512 + avx512_bf16) it is the fastest of
// OpenBLAS, BLIS and oneDNN for f32 with the environment as it is, and the only one of the
// Debian libraries with a bf16 GEMM (docs/performance.md, "## GEMM").
//
// M (the number of tokens in a call) changes from call to call. oneDNN primitives are built for
// fixed shapes. A runtime M (DNNL_RUNTIME_DIM_VAL) is no answer: oneDNN 2.6 then drops to its
// gemm:jit implementation with plain weights, losing the prepacking (measured 10-45% slower,
// docs/performance.md). So the packed weight layout is fixed at construction (from a
// representative M) and one primitive per (shape, M, accumulate, threads) is built on first use
// (about 0.2-0.6 ms) and cached process-wide under a mutex, asked for exactly that packed layout
// so the weights are never re-packed. The cache is shared by all Linears of one shape, so the experts
// of a MoE layer, whose row counts differ per call, build each M once between them.
//
// Row counts past kRowQuantum that are not a multiple of it run as two calls, the rows down to a
// multiple of kRowQuantum and then the rest, so a shape builds primitives only for multiples of
// kRowQuantum and for the kRowQuantum - 1 remainders: the process-wide cache stays bounded in a
// long-running worker. Without that, a 4K gpt-oss `bench` prefill built 646 primitives, with it
// 160 (TTFT did not change measurably: docs/performance.md, "Issue 14: third window"). Each row
// of the result is the same either way on AVX-512 (oneDNN's matmul there reduces every row over
// K in the same order whatever M is). Its AVX2 matmul does not: it blocks rows by 6 and runs
// tails of 1 to 3 rows with another kernel (measured on a Zen 3), so there a row may differ in
// its last bits with the row count, within the f32 accumulation bound. The second call costs one
// more pass over the packed weights, which the first has just brought into cache.
//
// On AMX (bf16 matmul on the tile unit) the quantum is kAmxRowQuantum = 64: oneDNN 2.6's AMX
// matmul runs many row counts that are not a multiple of 64 an order of magnitude slower (M x
// 1024 x 2048, 2 threads, a Sapphire Rapids VM: 760-890 GFLOP/s at M = 1024, 960, 896, 576 and
// at 8 to 63 rows, but 62 at M = 976, 59 at 848, 117 at 992, 125 at 464), and a MoE's expert
// row counts are anything.
//
// BF16 Linears run oneDNN's bf16 matmul or the same numbers on the f32 matmul, as bf16_units()
// says (kernels/bf16_units.h): on the f32 units the weights are widened once from bf16 at load,
// and the rows rounded to bf16 and widened in the pass that would have converted them.
#include "slope/kernels/gemm.h"
#include "slope/kernels/cpu/amx.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/half.h"

namespace slope::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

const dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Grows to the largest size asked for on this thread; never shrinks.
struct ThreadBuffer {
  void* data = nullptr;
  size_t size = 0;
  void* get(size_t n) {
    if (n > size) {
      std::free(data);
      size = (n + 4095) & ~size_t(4095);
      data = std::aligned_alloc(64, size);
      SLOPE_CHECK(data != nullptr, "out of memory allocating a ", size, "-byte GEMM buffer");
    }
    return data;
  }
  ~ThreadBuffer() { std::free(data); }
};

// The M the packed layout is chosen for: a typical prefill chunk.
constexpr int64_t kPackM = 512;
// Row counts are split into a multiple of this and the rest (see the top of the file).
constexpr int64_t kRowQuantum = 16;
constexpr int64_t kAmxRowQuantum = 64;

std::atomic<int64_t> g_primitives_built{0};

// One executable matmul and the scratchpad size it needs.
struct Prim {
  dnnl::matmul matmul;
  size_t scratch_bytes = 0;
};

struct PrimKey {
  int64_t M, N, K;
  int dtype;  // the matmul's source and weight type (dnnl::memory::data_type)
  bool bias, accumulate;
  // The threads the primitive is built for and must run on (oneDNN splits the work at creation):
  // omp_get_max_threads() of the calling thread, 1 where a caller runs one GEMM per thread.
  int threads;
  auto tie() const { return std::tie(M, N, K, dtype, bias, accumulate, threads); }
  bool operator<(const PrimKey& o) const { return tie() < o.tie(); }
};

struct PrimEntry {
  dnnl::memory::desc packed_md;  // the weight layout the primitive was built for
  std::shared_ptr<const Prim> prim;
};

// Process-wide; cleared when it grows past kMaxEntries (callers keep their shared_ptr).
class PrimCache {
 public:
  template <typename Make>
  std::shared_ptr<const Prim> get(const PrimKey& key, const dnnl::memory::desc& packed_md,
                                  Make make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end() && it->second.packed_md == packed_md) return it->second.prim;
    auto prim = make();
    if (map_.size() >= kMaxEntries) map_.clear();
    map_[key] = PrimEntry{packed_md, prim};
    return prim;
  }

 private:
  static constexpr size_t kMaxEntries = 8192;
  std::mutex mu_;
  std::map<PrimKey, PrimEntry> map_;
};

PrimCache& prim_cache() {
  static PrimCache c;
  return c;
}

// f32 -> bf16, round to nearest even (as slope::f32_to_bf16 and torch's .to(bfloat16)).
void convert_to_bf16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 32 <= n; i += 32) {
    __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
    __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_storeu_si512(reinterpret_cast<void*>(y + i), reinterpret_cast<__m512i&>(v));
  }
#endif
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

// y[i] = x[i] rounded to bf16, kept in f32 (what a BF16 Linear on the f32 units multiplies).
void round_rows_bf16(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16(x[i]);
}

void widen_bf16(const uint16_t* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

}  // namespace

void to_bf16_serial(const float* x, uint16_t* y, int64_t n) { convert_to_bf16(x, y, n); }

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    convert_to_bf16(x, y, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk;
    convert_to_bf16(x + b, y + b, std::min(kChunk, n - b));
  }
}

bool native_bf16_matmul_supported() {
  static const bool supported = [] {
    try {
      dnnl::memory::desc src({16, 16}, dt::bf16, tag::ab), wei({16, 16}, dt::bf16, tag::any),
          dst({16, 16}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return supported;
}

bool f32_matmul_packs_per_call() {
  static const bool packs = [] {
    dnnl::memory::desc src({128, 1024}, dt::f32, tag::ab), wei({1024, 2048}, dt::f32, tag::any),
        dst({128, 2048}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), cpu_engine());
    return std::strstr(pd.impl_info_str(), "gemm:jit") != nullptr;
  }();
  return packs;
}

struct Linear::Impl {
  int64_t N = 0, K = 0;
  ComputeType ct = ComputeType::F32;
  bool f32_units = false;  // a BF16 Linear on the f32 matmul (Bf16Units::F32)
  bool has_bias = false;
  dnnl::memory::desc packed_md;  // weights [K, N] in oneDNN's chosen blocked layout
  dnnl::memory weights;
  dnnl::memory bias;  // [1, N] f32

  // The matmul's source and weight type.
  dt compute_dt() const { return ct == ComputeType::BF16 && !f32_units ? dt::bf16 : dt::f32; }

  dnnl::matmul::primitive_desc make_pd(int64_t M, bool accumulate,
                                       const dnnl::memory::desc& wmd) const {
    dnnl::memory::desc src({M, K}, compute_dt(), tag::ab);
    dnnl::memory::desc dst({M, N}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (accumulate) {  // y = 1·y + (x·W + b)
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    if (has_bias) {
      dnnl::memory::desc bmd({1, N}, dt::f32, tag::ab);
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wmd, bmd, dst), attr,
                                          cpu_engine());
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wmd, dst), attr, cpu_engine());
  }

  std::shared_ptr<const Prim> get(int64_t M, bool accumulate) const {
    const PrimKey key{M, N, K, int(compute_dt()), has_bias, accumulate, omp_get_max_threads()};
    return prim_cache().get(key, packed_md, [&] {
      g_primitives_built.fetch_add(1, std::memory_order_relaxed);
      auto pd = make_pd(M, accumulate, packed_md);
      auto prim = std::make_shared<Prim>();
      prim->matmul = dnnl::matmul(pd);
      prim->scratch_bytes = pd.scratchpad_desc().get_size();
      return std::shared_ptr<const Prim>(std::move(prim));
    });
  }
};

Linear::Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;
Linear::~Linear() = default;

Linear::Linear(const void* weight, DType wdtype, WeightLayout layout, int64_t out_features,
               int64_t in_features, const float* bias, ComputeType ct)
    : impl_(std::make_unique<Impl>()) {
  SLOPE_CHECK(out_features > 0 && in_features > 0, "Linear: empty weight [", out_features, ", ",
              in_features, "]");
  SLOPE_CHECK(wdtype == DType::F32 || wdtype == DType::BF16 || wdtype == DType::F16,
              "Linear: weight dtype ", dtype_name(wdtype), " is not supported (F32, BF16, F16)");
  Impl& m = *impl_;
  m.N = out_features;
  m.K = in_features;
  m.ct = ct;
  m.has_bias = bias != nullptr;
  if (ct == ComputeType::BF16) {
    const Bf16Units use = bf16_units();
    SLOPE_CHECK(use == Bf16Units::F32 || native_bf16_matmul_supported(),
                "Linear: oneDNN has no bf16 matmul on this CPU; run bf16 on the f32 units (--bf16-units f32 or auto)");
    m.f32_units = use == Bf16Units::F32;
  }
  const int64_t N = m.N, K = m.K, numel = N * K;

  // 1. Convert the source to the compute dtype in its own layout (exact rounding done here, so
  //    the result does not depend on how oneDNN's reorder rounds).
  auto src_f32 = [&](int64_t i) -> float {
    switch (wdtype) {
      case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(weight)[i]);
      case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(weight)[i]);
      default: return static_cast<const float*>(weight)[i];
    }
  };
  std::vector<float> wf;
  std::vector<uint16_t> wb;
  const void* plain = nullptr;
  if (m.f32_units) {  // f32 copies of the bf16-rounded weights
    wf.resize(numel);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < numel; ++i) wf[i] = round_bf16(src_f32(i));
    plain = wf.data();
  } else if (ct == ComputeType::F32) {
    if (wdtype == DType::F32) {
      plain = weight;
    } else {
      wf.resize(numel);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < numel; ++i) wf[i] = src_f32(i);
      plain = wf.data();
    }
  } else {
    if (wdtype == DType::BF16) {
      plain = weight;
    } else {
      wb.resize(numel);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < numel; ++i) wb[i] = f32_to_bf16(src_f32(i));
      plain = wb.data();
    }
  }

  // 2. oneDNN's weights are logically [K, N]: OutIn [N, K] row-major is tag::ba, InOut is ab.
  const tag plain_tag = layout == WeightLayout::OutIn ? tag::ba : tag::ab;
  dnnl::memory::desc plain_md({K, N}, m.compute_dt(), plain_tag);
  dnnl::memory::desc any_md({K, N}, m.compute_dt(), tag::any);
  m.packed_md = m.make_pd(kPackM, false, any_md).weights_desc();

  // 3. Reorder once into the packed layout.
  const auto& eng = cpu_engine();
  dnnl::stream s(eng);
  dnnl::memory plain_mem(plain_md, eng, const_cast<void*>(plain));
  m.weights = dnnl::memory(m.packed_md, eng);
  dnnl::reorder(plain_mem, m.weights).execute(s, plain_mem, m.weights);
  if (bias) {
    m.bias = dnnl::memory({{1, N}, dt::f32, tag::ab}, eng);
    std::memcpy(m.bias.get_data_handle(), bias, size_t(N) * sizeof(float));
  }
  s.wait();
}

void Linear::forward(const float* x, int64_t M, float* y, bool accumulate) const {
  SLOPE_CHECK(impl_ != nullptr, "Linear::forward on an empty Linear");
  SLOPE_CHECK(M >= 0, "Linear::forward: negative row count ", M);
  if (M == 0) return;
  if (impl_->ct == ComputeType::F32) return run(x, M, y, accumulate);
  thread_local ThreadBuffer act_buf;
  if (impl_->f32_units) {
    auto* xr = static_cast<float*>(act_buf.get(size_t(M * impl_->K) * sizeof(float)));
    round_rows_bf16(x, xr, M * impl_->K);
    return run(xr, M, y, accumulate);
  }
  auto* xb = static_cast<uint16_t*>(act_buf.get(size_t(M * impl_->K) * sizeof(uint16_t)));
  to_bf16(x, xb, M * impl_->K);
  run(xb, M, y, accumulate);
}

void Linear::forward_bf16(const uint16_t* x, int64_t M, float* y, bool accumulate) const {
  SLOPE_CHECK(impl_ != nullptr, "Linear::forward_bf16 on an empty Linear");
  SLOPE_CHECK(impl_->ct == ComputeType::BF16,
              "Linear::forward_bf16 needs a BF16 Linear; this one computes in f32 (call forward)");
  SLOPE_CHECK(M >= 0, "Linear::forward_bf16: negative row count ", M);
  if (M == 0) return;
  if (impl_->f32_units) {
    thread_local ThreadBuffer wide_buf;
    auto* xw = static_cast<float*>(wide_buf.get(size_t(M * impl_->K) * sizeof(float)));
    widen_bf16(x, xw, M * impl_->K);
    return run(xw, M, y, accumulate);
  }
  run(x, M, y, accumulate);
}

void Linear::run(const void* src, int64_t M, float* y, bool accumulate) const {
  const int64_t quantum =
      impl_->compute_dt() == dt::bf16 && cpu::amx_usable() ? kAmxRowQuantum : kRowQuantum;
  const int64_t rest = M % quantum;
  if (M > quantum && rest != 0) {
    const int64_t head = M - rest;
    const size_t elem = impl_->compute_dt() == dt::bf16 ? sizeof(uint16_t) : sizeof(float);
    run_rows(src, head, y, accumulate);
    run_rows(static_cast<const char*>(src) + size_t(head * impl_->K) * elem, rest, y + head * impl_->N, accumulate);
    return;
  }
  run_rows(src, M, y, accumulate);
}

void Linear::run_rows(const void* src, int64_t M, float* y, bool accumulate) const {
  const Impl& m = *impl_;
  auto prim = m.get(M, accumulate);
  const auto& eng = cpu_engine();
  thread_local ThreadBuffer scratch_buf;
  dnnl::memory src_mem({{M, m.K}, m.compute_dt(), tag::ab}, eng, const_cast<void*>(src));
  dnnl::memory dst_mem({{M, m.N}, dt::f32, tag::ab}, eng, y);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, m.weights}, {DNNL_ARG_DST, dst_mem}};
  if (m.has_bias) args.emplace(DNNL_ARG_BIAS, m.bias);
  if (prim->scratch_bytes > 0) {
    dnnl::memory scratch({{int64_t(prim->scratch_bytes)}, dt::u8, tag::a}, eng,
                         scratch_buf.get(prim->scratch_bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
  }
  dnnl::stream s(eng);
  prim->matmul.execute(s, args);
  s.wait();
}

int64_t gemm_primitives_built() { return g_primitives_built.load(std::memory_order_relaxed); }

int64_t Linear::in_features() const { return impl_ ? impl_->K : 0; }
int64_t Linear::out_features() const { return impl_ ? impl_->N : 0; }
size_t Linear::weight_bytes() const { return impl_ ? impl_->packed_md.get_size() : 0; }
ComputeType Linear::compute_type() const { return impl_ ? impl_->ct : ComputeType::F32; }

void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool transpose_b) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // C = beta·C (beta 0 means overwrite, even NaN)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  dnnl_status_t st = dnnl_sgemm('N', transpose_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                beta, C, ldc);
  SLOPE_CHECK(st == dnnl_success, "gemm_f32: oneDNN sgemm failed (status ", int(st),
              ") for M=", M, " N=", N, " K=", K);
}

}  // namespace slope::kernels
