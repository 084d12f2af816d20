// The typed model configuration, parsed once from a HF config.json. Every architecture
// difference the forward pass needs is a field here, so the layer helpers stay generic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slope/kernels/norm.h"
#include "slope/kernels/rope.h"

namespace slope::model {

enum class Arch { GptOss, Llama, Qwen2, Qwen3 };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string architecture;  // HF class name, e.g. "GptOssForCausalLM"
  std::string model_type;    // "gpt_oss", "llama", "qwen2", "qwen3"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width, or per-expert width for MoE
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  kernels::NormOrder norm_order = kernels::NormOrder::CastThenWeight;
  kernels::RopeConfig rope;

  bool qkv_bias = false;  // gpt-oss, qwen2
  bool o_bias = false;    // gpt-oss
  bool qk_norm = false;   // qwen3: RMSNorm(head_dim) on q and k before RoPE
  bool sinks = false;     // gpt-oss: one learned logit per query head
  // Per layer: 0 = full causal attention, W > 0 = sliding window of W keys.
  std::vector<int64_t> layer_window;

  // Mixture of experts (gpt-oss). num_experts == 0 means a dense SwiGLU MLP.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  bool mxfp4_experts = false;  // quantization_config.quant_method == "mxfp4"

  bool tie_word_embeddings = false;
  std::string torch_dtype = "float32";

  bool is_moe() const { return num_experts > 0; }
  double attention_scale() const;  // 1/sqrt(head_dim)
  // Parameters in total (embedding and head included), and active per token: the top-k
  // experts plus every other weight a token is multiplied through, head included but not the
  // embedding table (a lookup). This is OpenAI's convention for gpt-oss: 120b has 116.83 B in
  // total and 5.13 B active, 20b 20.91 B and 3.61 B.
  int64_t num_parameters() const;
  int64_t num_active_parameters() const;
};

// Parses config.json text. Unknown architectures, missing or inconsistent fields throw
// slope::Error naming the field and the file.
ModelConfig parse_config(const std::string& json_text, const std::string& source = "config.json");
ModelConfig load_config(const std::string& model_dir);  // reads MODEL_DIR/config.json
std::string arch_name(Arch a);

}  // namespace slope::model
