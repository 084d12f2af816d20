// Flash-style attention for prefill: streams K/V in blocks with an online softmax and returns
// the output and the per-row log-sum-exp, so partial results over different K/V blocks can be
// merged exactly (attention_merge.h). Positions are global, so the same kernel serves a whole
// sequence on one rank and one (query shard, K/V block) step of context parallelism.
#pragma once

#include <cstdint>

#include "slope/kernels/gemm.h"  // ComputeType

namespace slope::kernels {

// Tiles of flash_attention: query rows and keys per block. A block streams the keys some row
// of it sees, all rows at once; the planner's cost model counts work in these tiles. Sliding
// windows shorter than 1024 keys compute, for each kAttentionWindowVectorQ = 16 consecutive
// query rows of a head, only the keys some row of them sees: W + 15 keys per row for a window
// of W, instead of W + 31 (32-row blocks) or W + 63 (64-row blocks). Where a KV head serves 2 or
// more query heads, a block is those 16 positions of up to 4 heads of the group (one 16-row
// vector per head, all over the same keys); with one query head per KV head, a block is
// kAttentionWindowBlockQ rows of one head, each of its 16-row vectors over its own keys.
inline constexpr int64_t kAttentionBlockQ = 64;
inline constexpr int64_t kAttentionBlockK = 64;
inline constexpr int64_t kAttentionWindowBlockQ = 32;
inline constexpr int64_t kAttentionWindowVectorQ = 16;
// Windows of fewer keys than this take the window blocks.
inline constexpr int64_t kAttentionWindowBlockMaxW = 1024;

struct AttentionShape {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;  // GQA: query head h reads KV head h / (num_q_heads / num_kv_heads)
  int64_t head_dim = 0;
};

struct AttentionMask {
  bool causal = true;
  // Sliding window: if > 0, key position j is visible to query position p iff p - window < j
  // (so `window` keys including p itself). 0 means unlimited.
  int64_t window = 0;
};

// One attention call: a block of queries against a block of keys and values, at global
// positions (callers name the fields: flash_attention({.q = q, .nq = n, ...})).
struct AttentionArgs {
  const float* q = nullptr;   // [nq, Hq, D]  rows at global positions q_pos0 .. q_pos0 + nq - 1
  int64_t nq = 0;
  int64_t q_pos0 = 0;
  const float* k = nullptr;   // [nk, Hkv, D] rows at global positions kv_pos0 .. kv_pos0 + nk - 1
  const float* v = nullptr;   // [nk, Hkv, D]
  int64_t nk = 0;
  int64_t kv_pos0 = 0;
  AttentionShape shape;
  AttentionMask mask;
  float scale = 1.f;
  // F32: f32 products. BF16: q, k and v rounded to bf16 (round to nearest even), QKᵀ and PV on
  // bf16 products with f32 accumulation, the softmax, its running max and sum, and the LSE in
  // f32 (the probabilities are rounded to bf16 for PV). On the f32 units (bf16_units(),
  // kernels/bf16_units.h) BF16 runs the f32 kernel; so it does where the CPU lacks AVX512-BF16,
  // where head_dim is odd or scale is not a positive finite number (the first time, it says so
  // in the log).
  ComputeType compute = ComputeType::F32;
  // Optional [Hq] logits, one per query head. When given, each row's softmax denominator also
  // includes exp(sink[h]) once, `out` is final and `lse` includes the sink. nullptr for partial
  // results that will be merged and finalised with attention_apply_sinks.
  const float* sinks = nullptr;
  float* out = nullptr;  // [nq, Hq, D]
  float* lse = nullptr;  // [nq, Hq]  log Σ_j exp(scale · q·k_j) over the visible keys; -inf when
                         //           none is visible (then the out row is 0)
};

// Blocks of keys that no query can see are skipped (causal, window). Threads over (head, query
// block) with OpenMP.
void flash_attention(const AttentionArgs& args);

// True when the bf16 kernel can run on this CPU (built with AVX512-BF16 and the CPU has it);
// compute = BF16 runs it where this is true and bf16_units() is Bf16.
bool bf16_attention_supported();

// True when the bf16 kernel runs QKᵀ and PV on AMX tiles on this CPU (AMX-BF16, granted by the
// kernel), for head_dim a multiple of 32. set_amx_attention(false) keeps it on vdpbf16ps
// (process-wide, for the calls that start afterwards: tests and A/B benchmarks).
bool amx_attention_supported();
void set_amx_attention(bool on);
// Whether the bf16 kernel on vdpbf16ps runs the head-packed units of causal windows of a multiple
// of 16 keys up to 160 (head_dim a multiple of 32) on the diagonals (attention_bf16.cpp), each
// row computing only its own keys; false keeps them on the key blocks (process-wide, for the
// calls that start afterwards: tests and A/B benchmarks).
void set_diagonal_window_attention(bool on);
// Output size in bytes from which those diagonal units write the output with non-temporal
// stores (where its rows start on 64-byte boundaries); -1 restores the default, the L3 cache's
// size (process-wide, for the calls that start afterwards: tests and A/B benchmarks).
void set_attention_stream_bytes(int64_t bytes);

// Which f32 kernel flash_attention runs. Auto: the widest the build has (AVX-512; else AVX2 +
// FMA; else a portable one). Avx2: the AVX2 one wherever the build has AVX2 and FMA, also on an
// AVX-512 machine (for tests, so that the kernel of CPUs without AVX-512 is checked on every
// machine). Process-wide, for the calls that start afterwards; the bf16 kernel is not affected.
enum class AttentionKernel { Auto, Avx2 };
void set_attention_kernel(AttentionKernel kernel);
// Whether this build has the AVX2 kernel (built with AVX2 and FMA).
bool avx2_attention_built();

// The copies of K and V a flash_attention call keeps on its calling thread for the next call (so
// that the engine's per-layer calls do not fault in fresh pages each time): what this thread keeps
// now, and the most that calls of up to nk keys over Hkv KV heads of head_dim D keep, whichever
// kernel runs them (one kernel per thread; the memory prediction counts it, engine/topology.h).
int64_t attention_kept_bytes();
int64_t attention_kept_bytes_bound(int64_t nk, int64_t Hkv, int64_t D);

// FLOPs of the work flash_attention actually has to do (QKᵀ and PV, 4·D per visible
// (query, key, head) triple), counted exactly from the mask. For benchmarks and the planner.
double attention_flops(int64_t nq, int64_t q_pos0, int64_t nk, int64_t kv_pos0,
                       const AttentionShape& shape, const AttentionMask& mask);

}  // namespace slope::kernels
