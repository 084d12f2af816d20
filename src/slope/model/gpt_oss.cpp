// gpt-oss (GptOssForCausalLM): attention with q/k/v/o biases and per-head sinks, sliding and
// full layers alternating, YaRN RoPE, and a top-k MoE whose experts use the clamped SwiGLU on
// interleaved gate/up columns. Expert weights are bf16/f32 tensors stored [E, in, out], or MXFP4
// blocks/scales stored [E, out, in/32, 16] that are decoded once at load.
#include <cstring>

#include "slope/core/error.h"
#include "slope/kernels/mxfp4.h"
#include "slope/model/model.h"

namespace slope::model {
namespace {

// Expert e's weight as a Linear. Dense checkpoints hold [E, in, out] (used as x @ W[e]);
// MXFP4 checkpoints hold [E, out, in/32, 16] blocks and [E, out, in/32] scales.
kernels::Linear expert_linear(const WeightLoader& wl, const std::string& base, int64_t e,
                              int64_t out, int64_t in, const float* bias) {
  const int64_t E = wl.cfg.num_experts;
  kernels::Linear lin;
  if (wl.cfg.mxfp4_experts) {
    SLOPE_CHECK(in % 32 == 0, base, ": MXFP4 needs the input width (", in, ") to be a multiple of 32");
    const int64_t nb = in / 32;
    Tensor blocks = wl.store.get(base + "_blocks", {E, out, nb, 16});
    Tensor scales = wl.store.get(base + "_scales", {E, out, nb});
    SLOPE_CHECK(blocks.dtype() == DType::U8 && scales.dtype() == DType::U8, base,
                "_blocks/_scales must be U8 (MXFP4), got ", dtype_name(blocks.dtype()), "/",
                dtype_name(scales.dtype()));
    Tensor w({out, in}, DType::F32);
    kernels::mxfp4_dequantize(blocks.data<uint8_t>() + e * out * nb * 16,
                              scales.data<uint8_t>() + e * out * nb, out, nb, w.data<float>());
    lin = kernels::Linear(w.data<float>(), DType::F32, kernels::WeightLayout::OutIn, out, in, bias,
                          wl.compute);
  } else {
    Tensor all = wl.store.get(base, {E, in, out});
    const size_t esz = dtype_size(all.dtype());
    const uint8_t* src = static_cast<const uint8_t*>(all.raw()) + e * in * out * esz;
    lin = kernels::Linear(src, all.dtype(), kernels::WeightLayout::InOut, out, in, bias, wl.compute);
  }
  *wl.bytes += lin.weight_bytes();
  return lin;
}

}  // namespace

void load_gpt_oss_layer(const WeightLoader& wl, int layer, LayerWeights& w) {
  const ModelConfig& c = wl.cfg;
  const int64_t H = c.hidden_size, D = c.head_dim, qw = c.num_heads * D, kw = c.num_kv_heads * D;
  const int64_t E = c.num_experts, I = c.intermediate_size;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string a = p + "self_attn.";
  w.attn.qkv = wl.fused_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {qw, kw, kw}, H, {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
  w.attn.o = wl.linear(a + "o_proj.weight", H, qw, a + "o_proj.bias");
  w.attn.sinks = wl.f32(a + "sinks", {c.num_heads});

  const std::string m = p + "mlp.";
  w.moe.router = wl.linear(m + "router.weight", E, H, m + "router.bias");
  Tensor gu_bias = wl.f32(m + "experts.gate_up_proj_bias", {E, 2 * I});
  Tensor down_bias = wl.f32(m + "experts.down_proj_bias", {E, H});
  for (int64_t e = 0; e < E; ++e) {
    w.moe.gate_up.push_back(expert_linear(wl, m + "experts.gate_up_proj", e, 2 * I, H,
                                          gu_bias.data<float>() + e * 2 * I));
    w.moe.down.push_back(expert_linear(wl, m + "experts.down_proj", e, H, I,
                                       down_bias.data<float>() + e * H));
  }
}

}  // namespace slope::model
