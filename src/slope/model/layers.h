// Shared decoder-layer building blocks. Every supported family (gpt_oss.cpp, llama.cpp) loads
// its tensors into these structs; the forward helpers below are the same for all of them, and
// what differs between families is data (biases present or not, norm order, sinks, window, MoE).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "slope/core/ledger.h"
#include "slope/core/tensor.h"
#include "slope/kernels/gemm.h"
#include "slope/ops/backend.h"
#include "slope/ops/attention_runner.h"
#include "slope/model/config.h"

namespace slope::model {

// The attention seam and the sequence types live below the model, in ops/, where the parallel
// runners reach them too.
using ops::AttentionRunner;
using ops::LayerAttention;
using ops::LocalAttention;
using ops::Segment;
using ops::SequenceShard;

struct AttentionWeights {
  ops::Linear qkv;  // fused [Hq·D + 2·Hkv·D, H] (rows: q, then k, then v), biases included
  ops::Linear o;    // [H, Hq·D]; under tensor parallelism the local heads' columns, and
                    // the bias only on tensor rank 0 (the partial sums are all-reduced)
  Tensor q_norm, k_norm;  // f32 [D] (qwen3) or empty
  Tensor sinks;           // f32 [Hq] (gpt-oss) or empty; the local heads' under TP
};

struct DenseMlpWeights {
  ops::Linear gate_up;  // fused [2I, H]: gate rows then up rows
  ops::Linear down;     // [H, I]
};

struct MoeWeights {
  ops::Linear router;                // [E, H] + bias
  std::vector<ops::Linear> gate_up;  // per expert, 2I outputs interleaved gate/up, + bias
  std::vector<ops::Linear> down;     // per expert, H outputs, + bias
};

struct LayerWeights {
  Tensor input_norm;  // f32 [H]
  Tensor post_norm;   // f32 [H]
  AttentionWeights attn;
  DenseMlpWeights mlp;  // dense families
  MoeWeights moe;       // MoE families
  int64_t window = 0;   // 0 = full causal, else sliding window
};

// Per-layer forward over the rows a rank holds (`q_shard` gives their global positions).
// h [n, H] is the residual stream, updated in place. The layer's K (after RoPE) and V for these
// rows are written into the KV cache k_cache, v_cache [*, Hkv, D] at rows kv_row0 .. kv_row0+n-1;
// attention then runs over cache rows 0 .. kv_row0+n-1, whose positions `kv_shard` describes
// (kv_row0 = 0 and kv_shard = q_shard for a whole prompt; > 0 when earlier chunks are cached).
// Token-local work runs in chunks of `chunk` rows so temporaries grow with the chunk, not the
// prompt.
// Tensor parallelism (Megatron layout): this rank holds query heads [q_head0, q_head0 + q_heads),
// the KV heads they read, and intermediate columns [inter0, inter0 + inter) of every MLP/expert.
// Without tensor parallelism these are the whole model's counts.
struct TensorSlice {
  int64_t q_head0 = 0, q_heads = 0;
  int64_t kv_head0 = 0, kv_heads = 0;
  int64_t inter0 = 0, inter = 0;
  int rank = 0, size = 1;
  static TensorSlice whole(const ModelConfig& c) {
    return {0, c.num_heads, 0, c.num_kv_heads, 0, c.intermediate_size, 0, 1};
  }
  // Rank t of T. Throws slope::Error unless T divides the query heads and the intermediate
  // width, and T and the KV heads nest (T | Hkv, or Hkv | T: KV heads are then replicated).
  static TensorSlice of(const ModelConfig& c, int rank, int size);
};

// Sums a partial [rows, cols] result over the tensor-parallel group, in place.
using AllReduceFn = std::function<void(float* data, int64_t count)>;

// Per-call buffers of a layer (queries and attention output, [rows, heads, head_dim] f32), kept
// from layer to layer and chunk to chunk: fresh allocations of that size come back from the
// allocator as new pages, a page fault each, every layer.
struct LayerBuffers {
  Tensor q, attn;
  // The token-local temporaries of one chunk (norm output, fused projection, router logits,
  // dense MLP activations, the tensor-parallel partial sums): kept across layers and chunks so
  // that no layer takes fresh zeroed pages; every element read is written first.
  Tensor x, qkv, logits, gu, act, partial;
  // Flat f32 storage on the backend's device for at least `n` floats in `t` (grown, never
  // shrunk); not cleared.
  static float* reserve(const ops::Backend& ops, Tensor& t, int64_t n);
};

// The engine's default rows per MoE call (LayerContext::moe_chunk, slope run --moe-chunk). On the
// AMX machine an expert GEMM streams its weights from beyond L2: 4096-row calls ran the MoE at
// 0.94-1.09 of the dense MLP of the same FLOPs where 1024-row calls ran at 0.79-0.86, and the
// gpt-oss bench prefill 1.04-1.12x faster (docs/performance.md, fourteenth window).
inline constexpr int64_t kDefaultMoeChunk = 4096;

struct LayerContext {
  const ModelConfig* cfg = nullptr;
  TensorSlice slice;
  AllReduceFn tp_allreduce;  // empty without tensor parallelism
  const kernels::Rope* rope = nullptr;
  const ops::Backend* ops = nullptr;  // the device's ops (ops::cpu() on the host)
  DType act_dtype = DType::F32;  // where norms cast (bf16 compute rounds like the model dtype)
  int64_t chunk = 1024;
  // Rows per MoE call (router, routing and experts; at least `chunk`, at most the shard): each
  // routed expert reads its weights once a call, so a larger call reads fewer weight bytes per
  // FLOP. Dense MLPs run in `chunk` rows.
  int64_t moe_chunk = kDefaultMoeChunk;
  Ledger* ledger = nullptr;  // where the layer's phases are timed (none if null)
  LayerBuffers* buffers = nullptr;  // reused if set, else allocated per call
};

// Rows of each o_proj + MLP pass of decoder_layer_forward over `rows` tokens: chunks of `chunk`,
// or in a MoE layer calls of `moe_chunk` (at least a chunk, at most the rows).
int64_t mlp_pass_rows(const ModelConfig& c, int64_t chunk, int64_t moe_chunk, int64_t rows);

void decoder_layer_forward(const LayerContext& ctx, int layer, const LayerWeights& w, float* h,
                           const SequenceShard& q_shard, AttentionRunner& runner, float* k_cache,
                           float* v_cache, int64_t kv_row0, const SequenceShard& kv_shard);

}  // namespace slope::model
