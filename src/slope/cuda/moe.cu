// MoE kernels (contract: moe.h). Grouping is two passes with one block per expert, each
// reading all n·k ids: a count, then an ordered compaction (block-wide prefix sums of "slot is
// mine" flags in slot order), so the grouped order is the CPU's (by expert, then by token)
// with no atomics; E·n·k id reads (128 experts × 128K slots at a 32K prompt: 64 MB from L2).
//
// grouped_gemm: a tile list built on the device (plan_tiles: one entry per BM rows of each
// expert, so no host sync for the counts) drives one launch of BM×BN output tiles; extra
// blocks of the upper-bound grid exit at once. Per K step of BK = 32 the block loads A rows
// (gathered by token, f32 -> bf16) and the expert's W rows (bf16, or one MXFP4 block of 32
// per row: 16 bytes of nibbles + one scale, dequantised exactly to bf16 as value = FP4[nib]·
// 2^(scale−127)) into shared memory, and 4 warps (2×2, each 32×64) run mma.sync m16n8k16.
// Leads once it runs on a GPU: cp.async double buffering, 128-row tiles for large experts,
// wgmma on sm_90a.
#include "slope/cuda/moe.h"

#include <cuda_bf16.h>

#include "slope/cuda/check.cuh"
#include "slope/cuda/mma.cuh"

namespace slope::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::lds32;
using detail::mma_bf16_16816;

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n, int threads = kThreads) { return unsigned((n + threads - 1) / threads); }

// ---------------------------------------------------------------- routing

constexpr int kMaxTopK = 32;

__global__ void route_kernel(const float* logits, int64_t n, int64_t E, int k, int32_t* ids, float* weights) {
  const int64_t tok = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tok >= n) return;
  const float* l = logits + tok * E;
  int32_t id[kMaxTopK];
  int filled = 0;
  // Insertion into a sorted list of k: strictly greater logits move ahead (ties: lower index first).
  for (int64_t e = 0; e < E; ++e) {
    const float v = l[e];
    if (filled == k && !(v > l[id[k - 1]])) continue;
    int pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && v > l[id[pos - 1]]) {
      id[pos] = id[pos - 1];
      --pos;
    }
    id[pos] = int32_t(e);
  }
  const double m = l[id[0]];
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += exp(double(l[id[j]]) - m);
  for (int j = 0; j < k; ++j) {
    ids[tok * k + j] = id[j];
    weights[tok * k + j] = float(exp(double(l[id[j]]) - m) / sum);
  }
}

// ---------------------------------------------------------------- grouping

// Exclusive prefix sum of one flag per thread over the block; returns the block total in *total.
__device__ int block_exclusive_scan(int flag, int* total) {
  __shared__ int warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is reused by the next call
  *total = all;
  return before + in_warp;
}

// Block e counts the slots routed to e; block 0 also counts ids outside [0, E).
__global__ void count_kernel(const int32_t* ids, int64_t slots, int64_t E, int32_t* counts, int32_t* bad) {
  const int e = blockIdx.x;
  int mine = 0, wrong = 0;
  for (int64_t s = threadIdx.x; s < slots; s += kThreads) {
    const int32_t id = ids[s];
    mine += id == e;
    wrong += id < 0 || id >= E;
  }
  for (int o = 16; o > 0; o >>= 1) {
    mine += __shfl_xor_sync(0xffffffffu, mine, o);
    wrong += __shfl_xor_sync(0xffffffffu, wrong, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(counts + e, mine);
    if (e == 0 && wrong) atomicAdd(bad, wrong);
  }
}

// Block e places its slots in slot order at offsets[e]...; block 0 writes offsets[0..E].
__global__ void place_kernel(const int32_t* ids, const float* weights, int64_t slots, int k, int64_t E,
                             const int32_t* counts, int32_t* offsets, int32_t* token, float* weight,
                             int32_t* slot_row) {
  const int e = blockIdx.x;
  __shared__ int base;
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int i = 0; i < e; ++i) acc += counts[i];
    base = acc;
    if (e == 0) {
      int run = 0;
      for (int i = 0; i < E; ++i) {
        offsets[i] = run;
        run += counts[i];
      }
      offsets[E] = run;
    }
  }
  __syncthreads();
  int next = base;
  for (int64_t s0 = 0; s0 < slots; s0 += kThreads) {
    const int64_t s = s0 + threadIdx.x;
    const int flag = s < slots && ids[s] == e;
    int total;
    const int pos = next + block_exclusive_scan(flag, &total);
    if (flag) {
      token[pos] = int32_t(s / k);
      weight[pos] = weights[s];
      slot_row[s] = pos;
    }
    next += total;
  }
}

// ---------------------------------------------------------------- combine, gather, scatter

__global__ void combine_kernel(const float* y, const float* gw, const int32_t* slot_row, int64_t n, int k,
                               int64_t dim, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= n * dim) return;
  const int64_t t = idx / dim, c = idx % dim;
  float acc = out[idx];
  for (int j = 0; j < k; ++j) {
    const int32_t r = slot_row[t * k + j];
    if (r < 0) continue;  // a slot with an out-of-range expert id (ExpertGroups::check reports it)
    acc += gw[r] * y[int64_t(r) * dim + c];
  }
  out[idx] = acc;
}

__global__ void gather_kernel(const float* src, const int32_t* rows, int64_t m, int64_t dim, float* dst) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx < m * dim) dst[idx] = src[int64_t(rows[idx / dim]) * dim + idx % dim];
}

__global__ void scatter_add_kernel(const float* src, const int32_t* rows, const float* w, int64_t m, int64_t dim,
                                   float* dst) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx < m * dim) atomicAdd(dst + int64_t(rows[idx / dim]) * dim + idx % dim, w[idx / dim] * src[idx]);
}

// ---------------------------------------------------------------- MXFP4

__constant__ float kFp4[16] = {+0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Element j of a 16-byte block (low nibble of byte j/2 for even j, high for odd), scaled.
__device__ __forceinline__ float fp4_value(uint8_t byte, int high, uint8_t scale) {
  return ldexpf(kFp4[high ? byte >> 4 : byte & 0x0f], int(scale) - 127);
}

__global__ void mxfp4_kernel(const uint8_t* blocks, const uint8_t* scales, int64_t total, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // one output element
  if (idx >= total * 32) return;
  const int64_t b = idx / 32;
  const int j = int(idx % 32);
  out[idx] = fp4_value(blocks[b * 16 + j / 2], j & 1, scales[b]);
}

// ---------------------------------------------------------------- grouped GEMM

constexpr int BM = 64, BN = 128, BK = 32, kGemmThreads = 128;
constexpr int AS = BK + 8, BS = BK + 8;  // padded smem row strides (20 words: conflict-free fragments)

struct Tile {
  int32_t expert, row0;
};

// One thread per expert: tiles_e = ceil(count_e / BM), scanned; tiles[start_e + i] = (e, off_e + i·BM).
__global__ void plan_tiles_kernel(const int32_t* offsets, int64_t E, Tile* tiles, int32_t* ntiles) {
  __shared__ int32_t start[1025];
  const int e = threadIdx.x;
  if (e == 0) {
    int32_t acc = 0;
    for (int i = 0; i < E; ++i) {
      start[i] = acc;
      acc += (offsets[i + 1] - offsets[i] + BM - 1) / BM;
    }
    start[E] = acc;
    *ntiles = acc;
  }
  __syncthreads();
  for (int x = e; x < E; x += blockDim.x)
    for (int32_t i = 0; i < start[x + 1] - start[x]; ++i) tiles[start[x] + i] = {int32_t(x), offsets[x] + i * BM};
}

template <bool kMxfp4>
__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(GroupedGemmArgs p, const Tile* tiles,
                                                                     const int32_t* ntiles) {
  if (int32_t(blockIdx.x) >= *ntiles) return;
  const Tile tile = tiles[blockIdx.x];
  const int e = tile.expert;
  const int64_t row0 = tile.row0, row_end = min(int64_t(p.offsets[e + 1]), row0 + BM);
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  const int64_t K = p.K, N = p.N;

  __shared__ __align__(16) bf16 As[BM * AS];
  __shared__ __align__(16) bf16 Bs[BN * BS];
  __shared__ int64_t arow[BM];  // the A row of each tile row, -1 past the expert's rows
  for (int r = threadIdx.x; r < BM; r += kGemmThreads) {
    const int64_t gr = row0 + r;
    arow[r] = gr < row_end ? (p.a_rows ? int64_t(p.a_rows[gr]) : gr) : -1;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = warp / 2, wn = warp % 2;  // this warp's 32 rows and 64 columns
  float acc[2][8][4] = {};

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();  // previous step's readers are done (and arow is written)
    for (int idx = threadIdx.x; idx < BM * BK; idx += kGemmThreads) {
      const int r = idx / BK, c = idx % BK;
      const int64_t ar = arow[r];
      As[r * AS + c] = __float2bfloat16_rn(ar >= 0 && k0 + c < K ? p.a[ar * K + k0 + c] : 0.f);
    }
    if constexpr (kMxfp4) {
      // One 32-wide K step = one MXFP4 block per W row: 256 (row, half) items of 16 values.
      const int64_t nb = K / 32, kb = k0 / 32;
      for (int item = threadIdx.x; item < BN * 2; item += kGemmThreads) {
        const int n = item / 2, half = item % 2;
        const int64_t wr = n0 + n;
        bf16* dst = Bs + n * BS + 16 * half;
        if (wr < N) {
          const int64_t b = (int64_t(e) * N + wr) * nb + kb;
          const uint8_t s = p.w_scales[b];
          const uint8_t* bytes = p.w_blocks + b * 16 + 8 * half;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const uint8_t byte = bytes[j];
            dst[2 * j] = __float2bfloat16_rn(fp4_value(byte, 0, s));
            dst[2 * j + 1] = __float2bfloat16_rn(fp4_value(byte, 1, s));
          }
        } else {
#pragma unroll
          for (int j = 0; j < 16; ++j) dst[j] = __float2bfloat16_rn(0.f);
        }
      }
    } else {
      const bf16* w = reinterpret_cast<const bf16*>(p.w_bf16) + int64_t(e) * N * K;
      for (int idx = threadIdx.x; idx < BN * BK; idx += kGemmThreads) {
        const int n = idx / BK, c = idx % BK;
        const int64_t wr = n0 + n;
        Bs[n * BS + c] = wr < N && k0 + c < K ? w[wr * K + k0 + c] : __float2bfloat16_rn(0.f);
      }
    }
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const bf16* ar = As + (wm * 32 + mt * 16 + g) * AS + kk * 16 + 2 * t;
        a[mt][0] = lds32(ar);
        a[mt][1] = lds32(ar + 8 * AS);
        a[mt][2] = lds32(ar + 8);
        a[mt][3] = lds32(ar + 8 * AS + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const bf16* br = Bs + (wn * 64 + nt * 8 + g) * BS + kk * 16 + 2 * t;
        const uint32_t b0 = lds32(br), b1 = lds32(br + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
      }
    }
  }

  // y[r, c] = acc + bias[e, c] for the rows of this expert and the columns < N.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e4 = 0; e4 < 4; ++e4) {
        const int64_t r = row0 + wm * 32 + mt * 16 + g + 8 * (e4 >> 1);
        const int64_t c = n0 + wn * 64 + nt * 8 + 2 * t + (e4 & 1);
        if (r < row_end && c < N) p.y[r * N + c] = acc[mt][nt][e4] + (p.bias ? p.bias[int64_t(e) * N + c] : 0.f);
      }
}

}  // namespace

void route_topk_softmax(const float* logits, int64_t n, int64_t E, int k, int32_t* ids, float* weights,
                        Stream stream) {
  SLOPE_CHECK(k >= 1 && k <= E, "cuda::route_topk_softmax: k = ", k, " must be in [1, ", E, "]");
  SLOPE_CHECK(k <= kMaxTopK, "cuda::route_topk_softmax: k = ", k, " is over the GPU kernel's limit of ", kMaxTopK);
  if (n <= 0) return;
  SLOPE_CHECK(logits && ids && weights, "cuda::route_topk_softmax: null device pointer");
  route_kernel<<<blocks_for(n, 128), 128, 0, stream>>>(logits, n, E, k, ids, weights);
  SLOPE_CUDA_CHECK_LAUNCH("route_kernel");
}

ExpertGroups::ExpertGroups(int64_t slots, int64_t E)
    : offsets_(size_t(E + 1) * 4 + size_t(E) * 4),  // offsets, then the per-expert counts
      token_(size_t(slots) * 4),
      weight_(size_t(slots) * 4),
      slot_row_(size_t(slots) * 4),
      bad_(4),
      slots_(slots),
      E_(E) {
  SLOPE_CHECK(E >= 1 && E <= 1024, "cuda::ExpertGroups: ", E, " experts; the GPU grouping takes 1 to 1024");
  SLOPE_CHECK(slots >= 0 && slots < (int64_t{1} << 31), "cuda::ExpertGroups: ", slots,
              " slots (tokens × experts per token) are over 2^31; prefill in chunks");
}

void ExpertGroups::check(Stream stream) const {
  synchronize(stream);
  int32_t bad = 0;
  bad_.download(&bad, 4);
  SLOPE_CHECK(bad == 0, "cuda::group_by_expert: ", bad, " expert ids outside [0, ", E_,
              "); those slots were dropped. The ids must come from a router over ", E_, " experts");
}

void group_by_expert(const int32_t* ids, const float* weights, int64_t n, int k, ExpertGroups& g, Stream stream) {
  const int64_t slots = n * k;
  SLOPE_CHECK(slots == g.slots(), "cuda::group_by_expert: ", n, " tokens × ", k, " slots do not match the ",
              g.slots(), " the ExpertGroups was sized for");
  const int64_t E = g.experts();
  int32_t* counts = g.offsets() + E + 1;
  SLOPE_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * 4, stream));
  SLOPE_CUDA_CHECK(cudaMemsetAsync(g.bad_ids(), 0, 4, stream));
  if (slots > 0) SLOPE_CUDA_CHECK(cudaMemsetAsync(g.slot_row(), 0xff, size_t(slots) * 4, stream));  // -1: dropped
  if (slots > 0) {
    SLOPE_CHECK(ids && weights, "cuda::group_by_expert: null device pointer");
    count_kernel<<<unsigned(E), kThreads, 0, stream>>>(ids, slots, E, counts, g.bad_ids());
    SLOPE_CUDA_CHECK_LAUNCH("count_kernel");
  }
  place_kernel<<<unsigned(E), kThreads, 0, stream>>>(ids, weights, slots, k, E, counts, g.offsets(), g.token(),
                                                     g.weight(), g.slot_row());
  SLOPE_CUDA_CHECK_LAUNCH("place_kernel");
}

void grouped_gemm(const GroupedGemmArgs& p, Stream stream) {
  const bool mx = p.w_blocks != nullptr;
  SLOPE_CHECK(p.E >= 1 && p.E <= 1024, "cuda::grouped_gemm: ", p.E, " experts; 1 to 1024 are supported");
  SLOPE_CHECK(p.K > 0 && p.N > 0, "cuda::grouped_gemm: empty weights [", p.N, ", ", p.K, "]");
  SLOPE_CHECK(mx != (p.w_bf16 != nullptr), "cuda::grouped_gemm: give either bf16 weights or MXFP4 blocks, not both");
  SLOPE_CHECK(!mx || (p.w_scales && p.K % 32 == 0), "cuda::grouped_gemm: MXFP4 needs scales and K (", p.K,
              ") a multiple of 32");
  SLOPE_CHECK(p.N <= int64_t(BN) * 65535, "cuda::grouped_gemm: N = ", p.N, " is over the grid limit");
  if (p.rows <= 0) return;
  SLOPE_CHECK(p.a && p.offsets && p.y, "cuda::grouped_gemm: null device pointer");
  const int64_t max_tiles = (p.rows + BM - 1) / BM + p.E;  // Σ ceil(c_e / BM) <= ceil(Σ c_e / BM) + E
  // The tile list lives in stream-ordered scratch: no host sync, freed after the kernels run.
  void* plan = nullptr;
  SLOPE_CUDA_CHECK(cudaMallocAsync(&plan, size_t(max_tiles) * sizeof(Tile) + 16, stream));
  Tile* tiles = static_cast<Tile*>(plan);
  int32_t* ntiles = reinterpret_cast<int32_t*>(static_cast<char*>(plan) + size_t(max_tiles) * sizeof(Tile));
  plan_tiles_kernel<<<1, 1024, 0, stream>>>(p.offsets, p.E, tiles, ntiles);
  SLOPE_CUDA_CHECK_LAUNCH("plan_tiles_kernel");
  const dim3 grid(unsigned(max_tiles), unsigned((p.N + BN - 1) / BN));
  if (mx)
    grouped_gemm_kernel<true><<<grid, kGemmThreads, 0, stream>>>(p, tiles, ntiles);
  else
    grouped_gemm_kernel<false><<<grid, kGemmThreads, 0, stream>>>(p, tiles, ntiles);
  SLOPE_CUDA_CHECK_LAUNCH("grouped_gemm_kernel");
  SLOPE_CUDA_CHECK(cudaFreeAsync(plan, stream));
}

void moe_combine(const float* y, ExpertGroups& g, int64_t n, int k, int64_t dim, float* out, Stream stream) {
  SLOPE_CHECK(n * k == g.slots(), "cuda::moe_combine: ", n, " tokens × ", k, " do not match the grouping's ",
              g.slots(), " slots");
  if (n <= 0 || dim <= 0) return;
  SLOPE_CHECK(y && out, "cuda::moe_combine: null device pointer");
  combine_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(y, g.weight(), g.slot_row(), n, k, dim, out);
  SLOPE_CUDA_CHECK_LAUNCH("combine_kernel");
}

void gather_rows(const float* src, const int32_t* rows, int64_t m, int64_t dim, float* dst, Stream stream) {
  if (m <= 0 || dim <= 0) return;
  gather_kernel<<<blocks_for(m * dim), kThreads, 0, stream>>>(src, rows, m, dim, dst);
  SLOPE_CUDA_CHECK_LAUNCH("gather_kernel");
}

void scatter_add_rows(const float* src, const int32_t* rows, const float* w, int64_t m, int64_t dim, float* dst,
                      Stream stream) {
  if (m <= 0 || dim <= 0) return;
  scatter_add_kernel<<<blocks_for(m * dim), kThreads, 0, stream>>>(src, rows, w, m, dim, dst);
  SLOPE_CUDA_CHECK_LAUNCH("scatter_add_kernel");
}

void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t nblocks, float* out,
                      Stream stream) {
  const int64_t total = rows * nblocks;
  if (total <= 0) return;
  mxfp4_kernel<<<blocks_for(total * 32), kThreads, 0, stream>>>(blocks, scales, total, out);
  SLOPE_CUDA_CHECK_LAUNCH("mxfp4_kernel");
}

}  // namespace slope::cuda
