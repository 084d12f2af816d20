#include "slope/model/layers.h"

#include <algorithm>
#include <cstring>

#include "slope/core/error.h"

namespace slope::model {
namespace {

// x [m, H] -> q [m, Hq, D], k/v rows of the cache [m, Hkv, D]; qk-norm and RoPE applied.
void norm_qkv_rope(const LayerContext& ctx, const LayerWeights& w, const float* h, int64_t m,
                   const int64_t* pos, float* q, float* k, float* v, Tensor& x, Tensor& qkv) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t Hq = ctx.slice.q_heads, Hkv = ctx.slice.kv_heads;
  const int64_t H = c.hidden_size, D = c.head_dim, qw = Hq * D, kw = Hkv * D;
  const ops::Backend& ops = *ctx.ops;
  ops.rmsnorm(h, w.input_norm.data<float>(), x.data<float>(), m, H, float(c.rms_norm_eps), c.norm_order,
              ctx.act_dtype);
  w.attn.qkv.forward(x.data<float>(), m, qkv.data<float>());
  if (w.attn.q_norm.empty()) {  // split [q | k | v] per row and rotate q, k in one pass
    ops.split_qkv_rope(*ctx.rope, qkv.data<float>(), m, Hq, Hkv, pos, q, k, v);
    return;
  }
  // qwen3: split, per-head RMSNorm of q and k over head_dim, then RoPE.
  const int64_t width = qw + 2 * kw;
  ops.copy_columns(qkv.data<float>(), m, width, 0, qw, q);
  ops.copy_columns(qkv.data<float>(), m, width, qw, kw, k);
  ops.copy_columns(qkv.data<float>(), m, width, qw + kw, kw, v);
  ops.rmsnorm(q, w.attn.q_norm.data<float>(), q, m * Hq, D, float(c.rms_norm_eps), c.norm_order, ctx.act_dtype);
  ops.rmsnorm(k, w.attn.k_norm.data<float>(), k, m * Hkv, D, float(c.rms_norm_eps), c.norm_order, ctx.act_dtype);
  ops.rope(*ctx.rope, q, m, Hq, pos);
  ops.rope(*ctx.rope, k, m, Hkv, pos);
}

// Dense SwiGLU MLP: h += down(silu(gate(x)) · up(x)), over the local intermediate columns.
void dense_mlp(const ops::Backend& ops, int64_t I, const DenseMlpWeights& w, const float* x, int64_t m,
               float* h) {
  Tensor gu = ops.alloc({m, 2 * I}, DType::F32), act = ops.alloc({m, I}, DType::F32);
  w.gate_up.forward(x, m, gu.data<float>());
  ops.silu_mul(gu.data<float>(), m, I, act.data<float>());
  w.down.forward(act.data<float>(), m, h, /*accumulate=*/true);
}

// gpt-oss MoE: route each token to its top-k experts, run each expert once over all of its
// tokens, and add Σ_k w_k · (expert_k(x) + b_k) back (the down bias sits inside the weighting).
void moe_mlp(const ops::Backend& ops, const ModelConfig& c, int64_t I, const MoeWeights& w, const float* x,
             int64_t m, float* h) {
  const int64_t E = c.num_experts, H = c.hidden_size;
  const int k = int(c.experts_per_token);
  Tensor logits = ops.alloc({m, E}, DType::F32);
  w.router.forward(x, m, logits.data<float>());
  const ops::ExpertRouting g = ops.route_experts(logits.data<float>(), m, E, k);
  ops.moe_experts(w.gate_up, w.down, g, x, H, I, float(c.swiglu_alpha), float(c.swiglu_limit), h);
}

}  // namespace

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
    Tensor x = ops.alloc({chunk, H}, DType::F32), qkv = ops.alloc({chunk, (Hq + 2 * Hkv) * D}, DType::F32);
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
  const bool tp = bool(ctx.tp_allreduce);
  Tensor x = ops.alloc({chunk, H}, DType::F32), partial;
  if (tp) partial = ops.alloc({chunk, H}, DType::F32);
  auto add_reduced = [&](float* hr, int64_t m, Phase phase) {
    {
      auto timed = t.time(Phase::TpAllreduce);
      ctx.tp_allreduce(partial.data<float>(), m * H);
    }
    auto timed = t.time(phase);
    ops.add_inplace(hr, partial.data<float>(), m * H);
  };
  const int64_t I = ctx.slice.inter;
  for (int64_t r = 0; r < n; r += chunk) {
    const int64_t m = std::min(chunk, n - r);
    float* hr = h + r * H;
    {
      auto timed = t.time(Phase::OProj);
      w.attn.o.forward(attn + r * Hq * D, m, tp ? partial.data<float>() : hr, /*accumulate=*/!tp);
    }
    if (tp) add_reduced(hr, m, Phase::OProj);
    {
      auto timed = t.time(Phase::Mlp);
      ops.rmsnorm(hr, w.post_norm.data<float>(), x.data<float>(), m, H, float(c.rms_norm_eps), c.norm_order,
                  ctx.act_dtype);
      float* dst = hr;
      if (tp) {
        ops.fill(partial.data<float>(), m * H, 0.f);
        dst = partial.data<float>();
      }
      if (c.is_moe())
        moe_mlp(ops, c, I, w.moe, x.data<float>(), m, dst);
      else
        dense_mlp(ops, I, w.mlp, x.data<float>(), m, dst);
    }
    if (tp) add_reduced(hr, m, Phase::Mlp);
  }
}

}  // namespace slope::model
