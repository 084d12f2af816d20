#include "slope/model/layers.h"

#include <algorithm>
#include <cstring>

#include "slope/core/error.h"

namespace slope::model {
namespace {

// h [m, H] -> q [m, Hq, D], k/v rows of the cache [m, Hkv, D]; qk-norm and RoPE applied. x and
// qkv are scratch rows [m, H] and [m, (Hq + 2·Hkv)·D].
void norm_qkv_rope(const LayerContext& ctx, const LayerWeights& w, const float* h, int64_t m,
                   const int64_t* pos, float* q, float* k, float* v, float* x, float* qkv) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t Hq = ctx.slice.q_heads, Hkv = ctx.slice.kv_heads;
  const int64_t H = c.hidden_size, D = c.head_dim, qw = Hq * D, kw = Hkv * D;
  const ops::Backend& ops = *ctx.ops;
  ops.rmsnorm_linear(h, w.input_norm.data<float>(), m, H, float(c.rms_norm_eps), c.norm_order, ctx.act_dtype,
                     w.attn.qkv, x, /*keep_normed=*/false, qkv);
  if (w.attn.q_norm.empty()) {  // split [q | k | v] per row and rotate q, k in one pass
    ops.split_qkv_rope(*ctx.rope, qkv, m, Hq, Hkv, pos, q, k, v);
    return;
  }
  // qwen3: split, per-head RMSNorm of q and k over head_dim, then RoPE.
  const int64_t width = qw + 2 * kw;
  ops.copy_columns(qkv, m, width, 0, qw, q);
  ops.copy_columns(qkv, m, width, qw, kw, k);
  ops.copy_columns(qkv, m, width, qw + kw, kw, v);
  ops.rmsnorm(q, w.attn.q_norm.data<float>(), q, m * Hq, D, float(c.rms_norm_eps), c.norm_order, ctx.act_dtype);
  ops.rmsnorm(k, w.attn.k_norm.data<float>(), k, m * Hkv, D, float(c.rms_norm_eps), c.norm_order, ctx.act_dtype);
  ops.rope(*ctx.rope, q, m, Hq, pos);
  ops.rope(*ctx.rope, k, m, Hkv, pos);
}

// The MLP of rows hr [m, H]: dst (+)= mlp(post_norm(hr)), over the local intermediate columns
// (dst is hr itself, or the tensor-parallel partial sums). Scratch comes from buf.
//   dense SwiGLU: down(silu(gate(x)) · up(x));
//   gpt-oss MoE: route each token to its top-k experts, run each expert once over all of its
//   tokens, and add Σ_k w_k · (expert_k(x) + b_k) back (the down bias sits inside the weighting).
void norm_mlp(const LayerContext& ctx, const LayerWeights& w, const float* hr, int64_t m, float* dst,
              LayerBuffers& buf) {
  const ModelConfig& c = *ctx.cfg;
  const ops::Backend& ops = *ctx.ops;
  const int64_t H = c.hidden_size, I = ctx.slice.inter;
  const float eps = float(c.rms_norm_eps);
  float* x = LayerBuffers::reserve(ops, buf.x, m * H);
  if (c.is_moe()) {
    const int64_t E = c.num_experts;
    float* logits = LayerBuffers::reserve(ops, buf.logits, m * E);
    ops.rmsnorm_linear(hr, w.post_norm.data<float>(), m, H, eps, c.norm_order, ctx.act_dtype, w.moe.router, x,
                       /*keep_normed=*/true, logits);
    const ops::ExpertRouting g = ops.route_experts(logits, m, E, int(c.experts_per_token));
    ops.moe_experts(w.moe.gate_up, w.moe.down, g, x, H, I, float(c.swiglu_alpha), float(c.swiglu_limit), dst);
    return;
  }
  float* gu = LayerBuffers::reserve(ops, buf.gu, m * 2 * I);
  float* act = LayerBuffers::reserve(ops, buf.act, m * I);
  ops.rmsnorm_linear(hr, w.post_norm.data<float>(), m, H, eps, c.norm_order, ctx.act_dtype, w.mlp.gate_up, x,
                     /*keep_normed=*/false, gu);
  ops.silu_mul(gu, m, I, act);
  w.mlp.down.forward(act, m, dst, /*accumulate=*/true);
}

}  // namespace

int64_t mlp_pass_rows(const ModelConfig& c, int64_t chunk, int64_t moe_chunk, int64_t rows) {
  const int64_t r = std::max<int64_t>(rows, 1), pass = std::min(chunk, r);
  return c.is_moe() ? std::max(pass, std::min(moe_chunk, r)) : pass;
}

float* LayerBuffers::reserve(const ops::Backend& ops, Tensor& t, int64_t n) {
  if (t.empty() || t.numel() < n || t.device() != ops.device()) {
    t = Tensor();  // free before allocating the larger one
    t = ops.alloc({n}, DType::F32);
  }
  return t.data<float>();
}

void decoder_layer_forward(const LayerContext& ctx, int layer, const LayerWeights& w, float* h,
                           const SequenceShard& q_shard, AttentionRunner& runner, float* k_cache,
                           float* v_cache, int64_t kv_row0, const SequenceShard& kv_shard) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t n = q_shard.local_tokens();
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t Hq = ctx.slice.q_heads, Hkv = ctx.slice.kv_heads;
  const int64_t chunk = std::max<int64_t>(1, std::min(ctx.chunk, std::max<int64_t>(n, 1)));
  const ops::Backend& ops = *ctx.ops;
  Ledger unused;
  Ledger& t = ctx.ledger ? *ctx.ledger : unused;
  const std::vector<int64_t> pos = q_shard.positions();

  LayerBuffers local;
  LayerBuffers& buf = ctx.buffers ? *ctx.buffers : local;
  float* q = LayerBuffers::reserve(ops, buf.q, n * Hq * D);  // every row written below
  float* k_new = k_cache + kv_row0 * Hkv * D;
  float* v_new = v_cache + kv_row0 * Hkv * D;
  {
    auto timed = t.time(Phase::NormQkvRope);
    float* x = LayerBuffers::reserve(ops, buf.x, chunk * H);
    float* qkv = LayerBuffers::reserve(ops, buf.qkv, chunk * (Hq + 2 * Hkv) * D);
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t m = std::min(chunk, n - r);
      norm_qkv_rope(ctx, w, h + r * H, m, pos.data() + r, q + r * Hq * D,
                    k_new + r * Hkv * D, v_new + r * Hkv * D, x, qkv);
    }
  }

  float* attn = LayerBuffers::reserve(ops, buf.attn, n * Hq * D);
  ops.fill(attn, n * Hq * D, 0.f);
  {
    auto timed = t.time(Phase::Attention);
    LayerAttention spec;
    spec.layer = layer;
    spec.shape = {Hq, Hkv, D};
    spec.mask.causal = true;
    spec.mask.window = w.window;
    spec.scale = float(c.attention_scale());
    spec.sinks = w.attn.sinks.empty() ? nullptr : w.attn.sinks.data<float>();
    // bf16 activations take the bf16 attention kernel (QKᵀ and PV on bf16 products, the softmax
    // in f32; attention.h), f32 the f32 kernel.
    spec.compute = ctx.act_dtype == DType::BF16 ? kernels::ComputeType::BF16 : kernels::ComputeType::F32;
    runner.attend(spec, q, q_shard, k_cache, v_cache, kv_shard, attn);
  }

  // Under tensor parallelism o_proj and the MLP produce partial sums over the local heads /
  // intermediate columns: they go to `partial`, are all-reduced, then added to h.
  // o_proj and the MLP run in passes of `step` rows: the chunk, or a MoE call (ctx.moe_chunk).
  const int64_t step = mlp_pass_rows(c, chunk, ctx.moe_chunk, n);
  const bool tp = bool(ctx.tp_allreduce);
  float* partial = tp ? LayerBuffers::reserve(ops, buf.partial, step * H) : nullptr;
  auto add_reduced = [&](float* hr, int64_t m, Phase phase) {
    {
      auto timed = t.time(Phase::TpAllreduce);
      ctx.tp_allreduce(partial, m * H);
    }
    auto timed = t.time(phase);
    ops.add_inplace(hr, partial, m * H);
  };
  for (int64_t r = 0; r < n; r += step) {
    const int64_t m = std::min(step, n - r);
    float* hr = h + r * H;
    {
      auto timed = t.time(Phase::OProj);
      w.attn.o.forward(attn + r * Hq * D, m, tp ? partial : hr, /*accumulate=*/!tp);
    }
    if (tp) add_reduced(hr, m, Phase::OProj);
    {
      auto timed = t.time(Phase::Mlp);
      if (tp) ops.fill(partial, m * H, 0.f);
      norm_mlp(ctx, w, hr, m, tp ? partial : hr, buf);
    }
    if (tp) add_reduced(hr, m, Phase::Mlp);
  }
}

}  // namespace slope::model
