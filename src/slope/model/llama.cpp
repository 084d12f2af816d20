// Llama (LlamaForCausalLM, llama3 RoPE scaling), Qwen2 (q/k/v bias) and Qwen3 (per-head q/k
// RMSNorm): dense GQA decoders with a SwiGLU MLP. Tensor names are the HF names. Under tensor
// parallelism a rank loads its heads' rows of q/k/v, their columns of o_proj, and its
// intermediate slice of gate/up (rows) and down (columns).
#include "slope/model/model.h"

namespace slope::model {

void load_llama_layer(const WeightLoader& wl, int layer, LayerWeights& w) {
  const ModelConfig& c = wl.cfg;
  const TensorSlice& s = wl.slice;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string a = p + "self_attn.";
  auto bias = [&](const std::string& n) { return c.qkv_bias ? a + n + ".bias" : std::string(); };
  w.attn.qkv = wl.linear({{a + "q_proj.weight", bias("q_proj"), c.num_heads * D, s.q_head0 * D, s.q_heads * D},
                          {a + "k_proj.weight", bias("k_proj"), c.num_kv_heads * D, s.kv_head0 * D, s.kv_heads * D},
                          {a + "v_proj.weight", bias("v_proj"), c.num_kv_heads * D, s.kv_head0 * D, s.kv_heads * D}},
                         H);
  w.attn.o = wl.linear({{a + "o_proj.weight", c.o_bias ? a + "o_proj.bias" : "", H}}, c.num_heads * D,
                       s.q_head0 * D, s.q_heads * D, /*bias_on_rank0_only=*/true);
  if (c.qk_norm) {
    w.attn.q_norm = wl.param(a + "q_norm.weight", {D});
    w.attn.k_norm = wl.param(a + "k_norm.weight", {D});
  }
  // gate and up fused into one GEMM: rows [0, I) gate, [I, 2I) up (kernels::silu_mul's layout).
  w.mlp.gate_up = wl.linear({{p + "mlp.gate_proj.weight", "", I, s.inter0, s.inter},
                             {p + "mlp.up_proj.weight", "", I, s.inter0, s.inter}},
                            H);
  w.mlp.down = wl.linear({{p + "mlp.down_proj.weight", "", H}}, I, s.inter0, s.inter);
}

}  // namespace slope::model
