// GPU flash attention (contract: kernels/attention.h; entry points: attention.h).
//
// One thread block = one query head h and kBq = 64 query rows; its 4 warps own 16 rows each.
// Keys are streamed in tiles of kBk = 64 over the index range some row of the block can see
// (the CPU kernel's visible_keys). Per tile, each warp computes with mma.sync (mma.cuh):
//
//   S  = Q·Kᵀ · scale·log2(e)            (16 × 64 scores in base 2, f32 accumulators)
//   S  = -inf where the key is not visible (causal, window, past the end)
//   m' = max(m, rowmax S),  α = 2^(m − m'),  P = 2^(S − m')
//   l  = α·l + rowsum P,    O = α·O + P·V   (P re-used from the S registers as the bf16 A operand)
//
// and at the end out = O / l, lse = ln2·m + ln l, with the sink, when given, joining the
// denominator once: lse' = logaddexp(lse, sink), out' = out · e^{lse − lse'}. Rows that see no
// key keep m = -inf; they subtract 0 instead of m (never −inf − −inf) and end with l = 0,
// out = 0 and lse = -inf (or the sink). A NaN score makes l and the row NaN, as on the CPU.
//
// Shared memory holds the tiles as bf16: Q [64][DP+8], K [64][DP+8] and V transposed,
// Vt [DP][64+8], so every B fragment is one aligned 32-bit load; the +8 padding puts the 8 rows
// a fragment load touches in 8 different 4-bank groups (row strides of 36 or 68 words).
// DP is head_dim rounded up to 32, 64, 128 or 256; the padding columns are zero.
//
// Tiles are loaded with 16-byte global loads where head_dim and the pointers allow
// (load_tile_vec), else element-wise. Not yet run on a GPU. Leads for speed once it is: cp.async
// double buffering of K/V, ldmatrix, skipping fully masked warp tiles, and wgmma on sm_90a.
#include "slope/cuda/attention.h"

#include <cuda_bf16.h>

#include <cmath>

#include "slope/cuda/check.cuh"
#include "slope/cuda/mma.cuh"

namespace slope::cuda {
namespace {

using detail::lds32;
using detail::mma_bf16_16816;
using detail::pack_bf16;
using detail::to_bf16;
using bf16 = __nv_bfloat16;

constexpr int kBq = 64, kBk = 64, kWarps = 4, kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Params {
  const void* q;
  const void* k;
  const void* v;
  int64_t nq, q_pos0, nk, kv_pos0;
  int Hq, Hkv, D;
  bool causal;
  int64_t window;
  float qscale;  // scale · log2(e)
  const float* sinks;
  float* out;
  float* lse;
};

struct KeyRange {
  int64_t lo, hi;
};

// The key index range [lo, hi) visible to query positions [p_first, p_last] (as the CPU kernel).
__device__ KeyRange visible_keys(int64_t p_first, int64_t p_last, const Params& p) {
  int64_t lo = 0, hi = p.nk;
  if (p.window > 0) lo = max(lo, p_first - p.window + 1 - p.kv_pos0);
  if (p.causal) hi = min(hi, p_last + 1 - p.kv_pos0);
  lo = min(lo, p.nk);
  hi = max(hi, int64_t{0});
  return {lo, max(lo, hi)};
}

// dst[r][c] (row stride ds) = src row (row0 + r) of head `head`, column c, as bf16; zero past
// the valid rows or head_dim. Src rows are H·D elements apart.
template <typename T, int DP, int ROWS>
__device__ void load_tile(bf16* dst, int ds, const T* src, int64_t row0, int64_t nrows, int H, int head, int D) {
  for (int idx = threadIdx.x; idx < ROWS * DP; idx += kThreads) {
    const int r = idx / DP, c = idx % DP;
    const int64_t row = row0 + r;
    bf16 x = __float2bfloat16_rn(0.f);
    if (row < nrows && c < D) x = to_bf16(src[(row * H + head) * D + c]);
    dst[r * ds + c] = x;
  }
}

// The same, stored transposed: dst[c][r] (row stride ds).
template <typename T, int DP, int ROWS>
__device__ void load_tile_t(bf16* dst, int ds, const T* src, int64_t row0, int64_t nrows, int H, int head, int D) {
  for (int idx = threadIdx.x; idx < ROWS * DP; idx += kThreads) {
    const int r = idx / DP, c = idx % DP;
    const int64_t row = row0 + r;
    bf16 x = __float2bfloat16_rn(0.f);
    if (row < nrows && c < D) x = to_bf16(src[(row * H + head) * D + c]);
    dst[c * ds + r] = x;
  }
}

// The same two loads with one 16-byte global load per thread and step (4 f32 or 8 bf16), for
// head_dim a multiple of that width and 16-byte aligned q/k/v (checked on the host). The plain
// tile gets one 8- or 16-byte shared store per chunk; the transposed one stores element-wise.
template <typename T, int DP, int ROWS, bool kTranspose>
__device__ void load_tile_vec(bf16* dst, int ds, const T* src, int64_t row0, int64_t nrows, int H, int head, int D) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kChunks = DP / V;  // per padded row
  static_assert(DP % V == 0, "padded head_dim holds whole chunks");
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c0 = (idx % kChunks) * V;
    const int64_t row = row0 + r;
    alignas(16) bf16 x[V];
    if (row < nrows && c0 < D) {  // D % V == 0: the chunk is whole
      const uint4 u = *reinterpret_cast<const uint4*>(src + (row * H + head) * D + c0);
      if constexpr (sizeof(T) == 4) {
        const float* f = reinterpret_cast<const float*>(&u);
#pragma unroll
        for (int i = 0; i < V; ++i) x[i] = __float2bfloat16_rn(f[i]);
      } else {
        *reinterpret_cast<uint4*>(x) = u;
      }
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) x[i] = __float2bfloat16_rn(0.f);
    }
    if constexpr (kTranspose) {
#pragma unroll
      for (int i = 0; i < V; ++i) dst[(c0 + i) * ds + r] = x[i];
    } else if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(dst + r * ds + c0) = *reinterpret_cast<const uint4*>(x);
    } else {
      *reinterpret_cast<uint2*>(dst + r * ds + c0) = *reinterpret_cast<const uint2*>(x);
    }
  }
}

template <int DP>
constexpr size_t smem_bytes() {
  return sizeof(bf16) * (size_t(kBq) * (DP + 8) + size_t(kBk) * (DP + 8) + size_t(DP) * (kBk + 8));
}

template <typename T, int DP, bool kVec>
__global__ void __launch_bounds__(kThreads) attention_kernel(Params p) {
  constexpr int QS = DP + 8, KS = DP + 8, VS = kBk + 8;
  constexpr int kQInRegs = DP <= 128;  // at 256 the Q fragments would push the warp past 255 registers
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kBq * QS;
  bf16* Vt = Ks + kBk * KS;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int kvh = h / (p.Hq / p.Hkv);
  // Later query blocks see more keys under a causal mask: give them the low block indices.
  const int64_t i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBq;
  const int64_t rows_here = min(int64_t{kBq}, p.nq - i0);
  const KeyRange range = visible_keys(p.q_pos0 + i0, p.q_pos0 + i0 + rows_here - 1, p);

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  if constexpr (kVec) load_tile_vec<T, DP, kBq, false>(Qs, QS, q, i0, p.nq, p.Hq, h, p.D);
  else load_tile<T, DP, kBq>(Qs, QS, q, i0, p.nq, p.Hq, h, p.D);
  __syncthreads();

  // This warp's rows: block-local 16·warp + g (accumulator slots 0, 1) and + 8 (slots 2, 3).
  const bf16* qw = Qs + (16 * warp) * QS;
  uint32_t qf[kQInRegs ? DP / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      qf[kk][0] = lds32(qw + g * QS + kk * 16 + 2 * t);
      qf[kk][1] = lds32(qw + (g + 8) * QS + kk * 16 + 2 * t);
      qf[kk][2] = lds32(qw + g * QS + kk * 16 + 8 + 2 * t);
      qf[kk][3] = lds32(qw + (g + 8) * QS + kk * 16 + 8 + 2 * t);
    }
  }
  int64_t qpos[2];
  qpos[0] = p.q_pos0 + i0 + 16 * warp + g;
  qpos[1] = qpos[0] + 8;

  float o[DP / 8][4];
#pragma unroll
  for (int dt = 0; dt < DP / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int64_t j0 = range.lo; j0 < range.hi; j0 += kBk) {
    __syncthreads();  // the previous tile's readers are done
    if constexpr (kVec) {
      load_tile_vec<T, DP, kBk, false>(Ks, KS, k, j0, range.hi, p.Hkv, kvh, p.D);
      load_tile_vec<T, DP, kBk, true>(Vt, VS, v, j0, range.hi, p.Hkv, kvh, p.D);
    } else {
      load_tile<T, DP, kBk>(Ks, KS, k, j0, range.hi, p.Hkv, kvh, p.D);
      load_tile_t<T, DP, kBk>(Vt, VS, v, j0, range.hi, p.Hkv, kvh, p.D);
    }
    __syncthreads();

    // S = Q·Kᵀ for this warp's 16 rows and the tile's 64 keys (8 column tiles of 8).
    float s[kBk / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBk / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
        a[0] = qf[kk][0], a[1] = qf[kk][1], a[2] = qf[kk][2], a[3] = qf[kk][3];
      } else {
        a[0] = lds32(qw + g * QS + kk * 16 + 2 * t);
        a[1] = lds32(qw + (g + 8) * QS + kk * 16 + 2 * t);
        a[2] = lds32(qw + g * QS + kk * 16 + 8 + 2 * t);
        a[3] = lds32(qw + (g + 8) * QS + kk * 16 + 8 + 2 * t);
      }
#pragma unroll
      for (int nt = 0; nt < kBk / 8; ++nt) {
        const bf16* kr = Ks + (nt * 8 + g) * KS + kk * 16 + 2 * t;
        mma_bf16_16816(s[nt], a, lds32(kr), lds32(kr + 8));
      }
    }

    // Scale to base 2 and mask: key j (position kv_pos0 + j) is visible to position qp iff
    // j < hi, (not causal or kp <= qp) and (no window or kp > qp − window).
#pragma unroll
    for (int nt = 0; nt < kBk / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + nt * 8 + 2 * t + (e & 1);
        const int64_t kp = p.kv_pos0 + j, qp = qpos[e >> 1];
        const bool vis = j < range.hi && (!p.causal || kp <= qp) && (p.window <= 0 || kp > qp - p.window);
        s[nt][e] = vis ? s[nt][e] * p.qscale : -INFINITY;
      }

    // Online softmax, per row r: the row's 64 scores sit in the 4 threads of a quad.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < kBk / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float muse = mx == -INFINITY ? 0.f : mx;  // a row that still sees nothing
      const float alpha = exp2f(m[r] - muse);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kBk / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - muse);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - muse);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;  // this thread's columns only; the quad is summed at the end
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }

    // O += P·V: the S accumulators of column tiles 2kk and 2kk+1 are exactly the A fragment of
    // keys 16kk .. 16kk+15.
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt) {
        const bf16* vr = Vt + (dt * 8 + g) * VS + kk * 16 + 2 * t;
        mma_bf16_16816(o[dt], a, lds32(vr), lds32(vr + 8));
      }
    }
  }

  // Finalise the two rows of this thread.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int64_t qi = i0 + 16 * warp + g + 8 * r;
    if (qi >= p.nq) continue;
    float lse, factor;
    if (isnan(lt)) {
      lse = factor = NAN;
    } else if (!(lt > 0.f)) {  // no visible key: out = 0; with a sink the row is all sink
      lse = p.sinks ? p.sinks[h] : -INFINITY;
      factor = 0.f;
    } else {
      lse = m[r] * kLn2 + logf(lt);
      factor = 1.f / lt;
      if (p.sinks) {  // lse' = logaddexp(lse, sink), out' = out · e^{lse − lse'}
        const float sk = p.sinks[h];
        const float hi = fmaxf(lse, sk), lo = fminf(lse, sk);
        const float lse2 = isinf(lo) ? hi : hi + log1pf(expf(lo - hi));
        factor *= expf(lse - lse2);
        lse = lse2;
      }
    }
    float* orow = p.out + (qi * p.Hq + h) * p.D;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      if (c < p.D) orow[c] = o[dt][2 * r] * factor;
      if (c + 1 < p.D) orow[c + 1] = o[dt][2 * r + 1] * factor;
    }
    if (t == 0) p.lse[qi * p.Hq + h] = lse;
  }
}

template <typename T, int DP, bool kVec>
void launch_kernel(const Params& p, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<DP>();
  SLOPE_CUDA_CHECK(
      cudaFuncSetAttribute(attention_kernel<T, DP, kVec>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((p.nq + kBq - 1) / kBq), unsigned(p.Hq));
  attention_kernel<T, DP, kVec><<<grid, kThreads, smem, stream>>>(p);
  SLOPE_CUDA_CHECK_LAUNCH("attention_kernel");
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// 16-byte loads when every row start is 16-byte aligned: head_dim a multiple of the vector
// width and the three base pointers aligned (views into a larger buffer may not be).
template <typename T, int DP>
void launch(const Params& p, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (p.D % V == 0 && aligned16(p.q) && aligned16(p.k) && aligned16(p.v)) launch_kernel<T, DP, true>(p, stream);
  else launch_kernel<T, DP, false>(p, stream);
}

template <typename T>
void run(Params p, const kernels::AttentionShape& shape, cudaStream_t stream) {
  const int64_t D = shape.head_dim;
  SLOPE_CHECK(shape.num_kv_heads > 0 && shape.num_q_heads % shape.num_kv_heads == 0,
              "cuda::flash_attention: num_q_heads (", shape.num_q_heads, ") must be a multiple of num_kv_heads (",
              shape.num_kv_heads, ")");
  SLOPE_CHECK(D <= kMaxAttentionHeadDim, "cuda::flash_attention: head_dim ", D, " is over the GPU kernel's limit of ",
              kMaxAttentionHeadDim, "; use the CPU backend for this model");
  SLOPE_CHECK(shape.num_q_heads <= 65535, "cuda::flash_attention: ", shape.num_q_heads,
              " query heads are over the grid limit of 65535");
  SLOPE_CHECK(p.nk >= 0, "cuda::flash_attention: nk must be >= 0, got ", p.nk);
  SLOPE_CHECK(p.q && p.out && p.lse && (p.nk == 0 || (p.k && p.v)),
              "cuda::flash_attention: q, k, v, out and lse must be device pointers (got a null one)");
  p.Hq = int(shape.num_q_heads), p.Hkv = int(shape.num_kv_heads), p.D = int(D);
  if (D <= 32) return launch<T, 32>(p, stream);
  if (D <= 64) return launch<T, 64>(p, stream);
  if (D <= 128) return launch<T, 128>(p, stream);
  launch<T, 256>(p, stream);
}

template <typename Args>
Params params_of(const Args& a) {
  Params p{};
  p.q = a.q, p.k = a.k, p.v = a.v;
  p.nq = a.nq, p.q_pos0 = a.q_pos0, p.nk = a.nk, p.kv_pos0 = a.kv_pos0;
  p.causal = a.mask.causal, p.window = a.mask.window;
  p.qscale = a.scale * kLog2e;
  p.sinks = a.sinks, p.out = a.out, p.lse = a.lse;
  return p;
}

}  // namespace

void flash_attention(const kernels::AttentionArgs& a, Stream stream) {
  if (a.nq <= 0 || a.shape.num_q_heads <= 0 || a.shape.head_dim <= 0) return;
  run<float>(params_of(a), a.shape, stream);
}

void flash_attention(const AttentionArgsBf16& a, Stream stream) {
  if (a.nq <= 0 || a.shape.num_q_heads <= 0 || a.shape.head_dim <= 0) return;
  run<bf16>(params_of(a), a.shape, stream);
}

}  // namespace slope::cuda
