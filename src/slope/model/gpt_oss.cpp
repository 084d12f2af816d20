// gpt-oss (GptOssForCausalLM): attention with q/k/v/o biases and per-head sinks, sliding and
// full layers alternating, YaRN RoPE, and a top-k MoE whose experts use the clamped SwiGLU on
// interleaved gate/up columns. Expert weights are bf16/f32 tensors stored [E, in, out], or MXFP4
// blocks/scales stored [E, out, in/32, 16] that are decoded once at load.
// Under tensor parallelism a rank loads its heads (q/k/v rows, o_proj columns, sinks) and its
// slice of every expert's intermediate width (gate/up rows 2·i and 2·i+1 for its i, down
// columns i); the router is replicated and the o/down biases live on tensor rank 0 only.
#include <cstring>

#include "slope/core/error.h"
#include "slope/kernels/copy.h"
#include "slope/kernels/mxfp4.h"
#include "slope/model/model.h"

namespace slope::model {
namespace {

// Expert e's whole weight as f32 [out, in] (the torch Linear orientation).
Tensor expert_weight_f32(const WeightLoader& wl, const std::string& base, int64_t e, int64_t out,
                         int64_t in) {
  const int64_t E = wl.cfg.num_experts;
  Tensor w({out, in}, DType::F32);
  if (wl.cfg.mxfp4_experts) {
    SLOPE_CHECK(in % 32 == 0, base, ": MXFP4 needs the input width (", in, ") to be a multiple of 32");
    const int64_t nb = in / 32;
    Tensor blocks = wl.store.get(base + "_blocks", {E, out, nb, 16});
    Tensor scales = wl.store.get(base + "_scales", {E, out, nb});
    SLOPE_CHECK(blocks.dtype() == DType::U8 && scales.dtype() == DType::U8, base,
                "_blocks/_scales must be U8 (MXFP4), got ", dtype_name(blocks.dtype()), "/",
                dtype_name(scales.dtype()));
    kernels::mxfp4_dequantize(blocks.data<uint8_t>() + e * out * nb * 16,
                              scales.data<uint8_t>() + e * out * nb, out, nb, w.data<float>());
  } else {
    Tensor all = wl.store.get(base, {E, in, out});  // [E, in, out], used as x @ W[e]
    const size_t es = dtype_size(all.dtype());
    Tensor mine = Tensor::view(static_cast<uint8_t*>(all.raw()) + size_t(e * in * out) * es,
                               {in, out}, all.dtype(), std::make_shared<Tensor>(all))
                      .to_f32();
    kernels::transpose(mine.data<float>(), in, out, w.data<float>());
  }
  return w;
}

// Rows [row0, row0+rows) and columns [col0, col0+cols) of an f32 [out, in] matrix.
Tensor sub_matrix(const Tensor& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  Tensor out({rows, cols}, DType::F32);
  kernels::copy_columns(w.data<float>() + row0 * w.dim(1), rows, w.dim(1), col0, cols, out.data<float>());
  return out;
}

}  // namespace

void load_gpt_oss_layer(const WeightLoader& wl, int layer, LayerWeights& w) {
  const ModelConfig& c = wl.cfg;
  const TensorSlice& s = wl.slice;
  const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.intermediate_size;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string a = p + "self_attn.";
  w.attn.qkv = wl.linear({{a + "q_proj.weight", a + "q_proj.bias", c.num_heads * D, s.q_head0 * D, s.q_heads * D},
                          {a + "k_proj.weight", a + "k_proj.bias", c.num_kv_heads * D, s.kv_head0 * D, s.kv_heads * D},
                          {a + "v_proj.weight", a + "v_proj.bias", c.num_kv_heads * D, s.kv_head0 * D, s.kv_heads * D}},
                         H);
  w.attn.o = wl.linear({{a + "o_proj.weight", a + "o_proj.bias", H}}, c.num_heads * D, s.q_head0 * D,
                       s.q_heads * D, /*bias_on_rank0_only=*/true);
  Tensor sinks = wl.f32(a + "sinks", {c.num_heads});  // one logit per query head
  Tensor mine({s.q_heads}, DType::F32);
  std::memcpy(mine.data<float>(), sinks.data<float>() + s.q_head0, size_t(s.q_heads) * sizeof(float));
  w.attn.sinks = wl.backend.upload(mine);

  const std::string m = p + "mlp.";
  w.moe.router = wl.linear({{m + "router.weight", m + "router.bias", E}}, H);
  Tensor gu_bias = wl.f32(m + "experts.gate_up_proj_bias", {E, 2 * I});
  Tensor down_bias = wl.f32(m + "experts.down_proj_bias", {E, H});
  for (int64_t e = 0; e < E; ++e) {
    // gate_up rows are interleaved (gate, up) per intermediate index i: rows [2·i0, 2·i1).
    Tensor gu = expert_weight_f32(wl, m + "experts.gate_up_proj", e, 2 * I, H);
    Tensor gu_mine = s.size == 1 ? gu : sub_matrix(gu, 2 * s.inter0, 2 * s.inter, 0, H);
    w.moe.gate_up.push_back(wl.pack(gu_mine, gu_bias.data<float>() + e * 2 * I + 2 * s.inter0));
    Tensor down = expert_weight_f32(wl, m + "experts.down_proj", e, H, I);
    Tensor down_mine = s.size == 1 ? down : sub_matrix(down, 0, H, s.inter0, s.inter);
    w.moe.down.push_back(wl.pack(down_mine, s.rank == 0 ? down_bias.data<float>() + e * H : nullptr));
  }
}

}  // namespace slope::model
