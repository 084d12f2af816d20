// Llama (LlamaForCausalLM, llama3 RoPE scaling), Qwen2 (q/k/v bias) and Qwen3 (per-head q/k
// RMSNorm): dense GQA decoders with a SwiGLU MLP. Tensor names are the HF names.
#include "slope/model/model.h"

namespace slope::model {

void load_llama_layer(const WeightLoader& wl, int layer, LayerWeights& w) {
  const ModelConfig& c = wl.cfg;
  const int64_t H = c.hidden_size, D = c.head_dim, qw = c.num_heads * D, kw = c.num_kv_heads * D;
  const int64_t I = c.intermediate_size;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string a = p + "self_attn.";
  auto bias = [&](const std::string& n) { return c.qkv_bias ? a + n + ".bias" : std::string(); };
  w.attn.qkv = wl.fused_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {qw, kw, kw}, H, {bias("q_proj"), bias("k_proj"), bias("v_proj")});
  w.attn.o = wl.linear(a + "o_proj.weight", H, qw, c.o_bias ? a + "o_proj.bias" : "");
  if (c.qk_norm) {
    w.attn.q_norm = wl.f32(a + "q_norm.weight", {D});
    w.attn.k_norm = wl.f32(a + "k_norm.weight", {D});
  }
  // gate and up fused into one GEMM: rows [0, I) gate, [I, 2I) up (kernels::silu_mul's layout).
  w.mlp.gate_up = wl.fused_linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {I, I},
                                  H, {});
  w.mlp.down = wl.linear(p + "mlp.down_proj.weight", H, I);
}

}  // namespace slope::model
