#include "slope/model/config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/core/file_io.h"

namespace slope::model {
namespace {
using json = nlohmann::json;

// Upper limits of config fields. Each is far above any published model and small enough that
// the products the engine forms stay inside int64: the weights of one layer (hidden x
// intermediate x experts), the embedding (vocab x hidden), KV and activation sizes (positions
// x heads x head_dim).
constexpr int64_t kMaxField = int64_t(1) << 40;           // generic counts (windows, layer indices)
constexpr int64_t kMaxVocab = int64_t(1) << 24;           // 16.7 M ids; the largest vocabularies are ~260 k
constexpr int64_t kMaxHidden = int64_t(1) << 17;          // 131072; the widest models are ~25 k
constexpr int64_t kMaxIntermediate = int64_t(1) << 20;    // 1 M
constexpr int64_t kMaxLayers = int64_t(1) << 12;          // 4096; the deepest models have ~200
constexpr int64_t kMaxHeads = int64_t(1) << 12;           // 4096 attention heads
constexpr int64_t kMaxHeadDim = int64_t(1) << 12;         // 4096
constexpr int64_t kMaxPositions = int64_t(1) << 32;       // 4.3 G positions
constexpr int64_t kMaxExperts = int64_t(1) << 12;         // 4096 experts

// Typed access to config.json fields; every error names the field and the file.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // Present and not null (HF writes null for "unset").
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& raw(const char* key) const { return j_.at(key); }

  template <typename... Args>
  [[noreturn]] void bad(const char* key, const Args&... args) const {
    fail(source_, ": field '", prefix_, key, "' ", args...);
  }

  // An integer field. JSON floats are refused, even integral ones (transformers refuses them
  // too), and so is anything beyond int64.
  int64_t integer(const char* key) const {
    if (!has(key)) bad(key, "is missing; add it to the config (see the model's Hugging Face config.json)");
    const json& v = j_.at(key);
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(key, "is ", v.dump(), ", out of range (expected a positive integer of at most ", kMaxField, ")");
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float())
      bad(key, "is ", v.dump(), ", a floating-point number; expected an integer (write it without a decimal point or exponent)");
    bad(key, "is ", v.dump(), ", expected an integer");
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  // An integer in [1, max]; the limits are far above any published model and keep every size
  // product the engine forms (weights, KV, activations) inside int64.
  int64_t positive(const char* key, int64_t max = kMaxField) const {
    int64_t v = integer(key);
    if (v <= 0) bad(key, "is ", v, ", expected a positive integer");
    if (v > max)
      bad(key, "is ", v, ", out of range: SLOPE accepts at most ", max,
          " (far above any published model; is the config corrupt?)");
    return v;
  }
  int64_t positive_or(const char* key, int64_t dflt, int64_t max = kMaxField) const {
    return has(key) ? positive(key, max) : dflt;
  }

  double number(const char* key) const {
    if (!has(key)) bad(key, "is missing; add it to the config");
    const json& v = j_.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) bad(key, "is ", v.dump(), ", expected a finite number");
    return v.get<double>();
  }
  double number(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }

  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) bad(key, "is ", v.dump(), ", expected true or false");
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) bad(key, "is ", v.dump(), ", expected a string");
    return v.get<std::string>();
  }

  const json& object(const char* key) const {
    const json& v = j_.at(key);
    if (!v.is_object()) bad(key, "is ", v.dump(), ", expected an object");
    return v;
  }

  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
  std::string prefix_;
};

struct ArchInfo {
  Arch arch;
  const char* class_name;
  const char* model_type;
};
constexpr ArchInfo kArchs[] = {
    {Arch::GptOss, "GptOssForCausalLM", "gpt_oss"},
    {Arch::Llama, "LlamaForCausalLM", "llama"},
    {Arch::Qwen2, "Qwen2ForCausalLM", "qwen2"},
    {Arch::Qwen3, "Qwen3ForCausalLM", "qwen3"},
};
constexpr const char* kSupported = "GptOssForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

// Rotary embedding: "rope_scaling" (transformers < 5) or "rope_parameters" (transformers >= 5,
// which also moves rope_theta inside). The scaling type is "rope_type", or "type" in old files.
kernels::RopeConfig parse_rope(const Fields& f, double default_theta,
                               int64_t head_dim, int64_t max_pos) {
  kernels::RopeConfig rope;
  rope.head_dim = head_dim;
  rope.theta = f.number("rope_theta", default_theta);
  const char* key = f.has("rope_parameters") ? "rope_parameters"
                    : f.has("rope_scaling")  ? "rope_scaling"
                                             : nullptr;
  if (!key) return rope;
  const json& rs = f.object(key);
  Fields r(rs, f.source(), std::string(key) + ".");
  if (r.has("rope_theta")) rope.theta = r.number("rope_theta");
  std::string type = r.string("rope_type", r.string("type", "default"));
  if (type == "default") return rope;
  if (type == "llama3") {
    rope.type = "llama3";
    rope.factor = r.number("factor");
    rope.low_freq_factor = r.number("low_freq_factor");
    rope.high_freq_factor = r.number("high_freq_factor");
    rope.original_max_position_embeddings = r.positive("original_max_position_embeddings", kMaxPositions);
    if (rope.high_freq_factor <= rope.low_freq_factor)
      r.bad("high_freq_factor", "(", rope.high_freq_factor, ") must exceed low_freq_factor (",
            rope.low_freq_factor, ")");
  } else if (type == "yarn") {
    rope.type = "yarn";
    rope.beta_fast = r.number("beta_fast", 32.0);
    rope.beta_slow = r.number("beta_slow", 1.0);
    // transformers 5.x (modeling_rope_utils._compute_yarn_parameters) uses "factor" as given and
    // falls back to max_position_embeddings / original_max_position_embeddings only when the
    // factor is absent (4.5x took the ratio whenever the original length was given; for gpt-oss
    // both are 32). The fixtures are recorded with 5.x, where they differ (4 vs 16).
    rope.original_max_position_embeddings =
        r.has("original_max_position_embeddings") ? r.positive("original_max_position_embeddings", kMaxPositions) : max_pos;
    rope.factor = r.has("factor") ? r.number("factor")
                                  : double(max_pos) / double(rope.original_max_position_embeddings);
    rope.truncate = r.boolean("truncate", true);
    rope.attention_factor = r.number("attention_factor", 0.0);
    if (r.has("mscale") || r.has("mscale_all_dim"))
      r.bad("mscale", "is set: DeepSeek-style YaRN mscale is not supported");
  } else {
    r.bad("rope_type", "is '", type, "', which SLOPE does not support (supported: default, llama3, yarn)");
  }
  if (rope.factor <= 0) r.bad("factor", "is ", rope.factor, ", expected a positive number");
  return rope;
}

// Per-layer attention windows from "layer_types" (or a default list of types).
std::vector<int64_t> parse_layer_windows(const Fields& f, int64_t num_layers, int64_t sliding_window,
                                         const std::vector<std::string>& default_types) {
  std::vector<std::string> types = default_types;
  if (f.has("layer_types")) {
    const json& lt = f.raw("layer_types");
    if (!lt.is_array()) f.bad("layer_types", "is ", lt.dump(), ", expected an array of strings");
    types.clear();
    for (const json& t : lt) {
      if (!t.is_string()) f.bad("layer_types", "contains ", t.dump(), ", expected \"sliding_attention\" or \"full_attention\"");
      types.push_back(t.get<std::string>());
    }
  }
  if (int64_t(types.size()) != num_layers)
    f.bad("layer_types", "has ", types.size(), " entries, but num_hidden_layers is ", num_layers);
  std::vector<int64_t> windows;
  for (const std::string& t : types) {
    if (t == "full_attention") {
      windows.push_back(0);
    } else if (t == "sliding_attention") {
      if (sliding_window <= 0)
        f.bad("sliding_window", "must be a positive integer when layer_types has sliding_attention layers");
      windows.push_back(sliding_window);
    } else {
      f.bad("layer_types", "contains '", t, "', expected \"sliding_attention\" or \"full_attention\"");
    }
  }
  return windows;
}

Arch detect_arch(const Fields& f, const json& root, std::string& architecture, std::string& model_type) {
  model_type = f.string("model_type", "");
  if (f.has("architectures")) {
    const json& a = root.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      f.bad("architectures", "is ", a.dump(), ", expected a list like [\"LlamaForCausalLM\"]");
    architecture = a[0].get<std::string>();
    for (const ArchInfo& info : kArchs) {
      if (architecture == info.class_name) {
        if (!model_type.empty() && model_type != info.model_type)
          f.bad("model_type", "is '", model_type, "' but architectures names ", architecture,
                " (model_type '", info.model_type, "')");
        model_type = info.model_type;
        return info.arch;
      }
    }
    f.bad("architectures", "names '", architecture, "', which SLOPE does not support (supported: ", kSupported, ")");
  }
  if (model_type.empty())
    f.bad("architectures", "is missing and so is 'model_type'; add e.g. \"architectures\": [\"LlamaForCausalLM\"]");
  for (const ArchInfo& info : kArchs) {
    if (model_type == info.model_type) {
      architecture = info.class_name;
      return info.arch;
    }
  }
  f.bad("model_type", "is '", model_type, "', which SLOPE does not support (supported: gpt_oss, llama, qwen2, qwen3)");
}

}  // namespace

std::string arch_name(Arch a) {
  for (const ArchInfo& info : kArchs)
    if (info.arch == a) return info.model_type;
  return "unknown";
}

double ModelConfig::attention_scale() const { return 1.0 / std::sqrt(double(head_dim)); }

namespace {
// Parameters of the layers outside the experts and apart from embedding and head.
struct ParamSplit {
  int64_t embed = 0, head = 0, dense = 0, per_expert = 0;
};
ParamSplit split_params(const ModelConfig& c) {
  ParamSplit p;
  const int64_t H = c.hidden_size, D = c.head_dim, q = c.num_heads * D, kv = c.num_kv_heads * D;
  p.embed = c.vocab_size * H;
  p.head = c.tie_word_embeddings ? 0 : c.vocab_size * H;
  int64_t layer = H * q + 2 * H * kv + q * H;  // q, k, v, o projections
  if (c.qkv_bias) layer += q + 2 * kv;
  if (c.o_bias) layer += H;
  if (c.qk_norm) layer += 2 * D;
  if (c.sinks) layer += c.num_heads;
  layer += 2 * H;  // input and post-attention norms
  const int64_t I = c.intermediate_size;
  if (c.is_moe()) {
    layer += c.num_experts * H + c.num_experts;        // router weight and bias
    p.per_expert = c.num_layers * (H * 2 * I + 2 * I   // gate_up and its bias
                                   + I * H + H);       // down and its bias
  } else {
    layer += 3 * H * I;  // gate, up, down
  }
  p.dense = c.num_layers * layer + H;  // + final norm
  return p;
}
}  // namespace

int64_t ModelConfig::num_parameters() const {
  ParamSplit p = split_params(*this);
  return p.embed + p.head + p.dense + num_experts * p.per_expert;
}

int64_t ModelConfig::num_active_parameters() const {
  // OpenAI's convention for gpt-oss ("5.1B active"): everything a token multiplies through,
  // so the head counts but the embedding table (a lookup) does not. With tied embeddings the
  // shared matrix counts once, as the head.
  ParamSplit p = split_params(*this);
  const int64_t head = tie_word_embeddings ? p.embed : p.head;
  return head + p.dense + (is_moe() ? experts_per_token : 0) * p.per_expert;
}

ModelConfig parse_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail(source, ": not valid JSON; check the file (a truncated download?)");
  if (!root.is_object()) fail(source, ": expected a JSON object, found ", root.type_name());
  Fields f(root, source);

  ModelConfig c;
  c.arch = detect_arch(f, root, c.architecture, c.model_type);
  const bool gpt_oss = c.arch == Arch::GptOss;

  c.vocab_size = f.positive("vocab_size", kMaxVocab);
  c.hidden_size = f.positive("hidden_size", kMaxHidden);
  c.intermediate_size = f.positive("intermediate_size", kMaxIntermediate);
  c.num_layers = f.positive("num_hidden_layers", kMaxLayers);
  c.num_heads = f.positive("num_attention_heads", kMaxHeads);
  c.num_kv_heads = f.positive_or("num_key_value_heads", c.num_heads, kMaxHeads);
  if (c.num_heads % c.num_kv_heads != 0)
    f.bad("num_key_value_heads", "(", c.num_kv_heads, ") must divide num_attention_heads (", c.num_heads, ")");

  // head_dim: explicit for gpt-oss (HF default 64) and qwen3 (HF default 128); Llama and Qwen2
  // derive it from hidden_size / num_attention_heads unless given.
  if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim", kMaxHeadDim);
  } else if (gpt_oss) {
    c.head_dim = 64;
  } else if (c.arch == Arch::Qwen3) {
    c.head_dim = 128;
  } else {
    if (c.hidden_size % c.num_heads != 0)
      f.bad("head_dim", "is missing and hidden_size (", c.hidden_size, ") is not a multiple of num_attention_heads (",
            c.num_heads, ")");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) f.bad("head_dim", "is ", c.head_dim, ", expected an even number (rotary halves)");

  const int64_t default_max_pos = gpt_oss ? 131072 : c.arch == Arch::Llama ? 2048 : 32768;
  c.max_position_embeddings = f.positive_or("max_position_embeddings", default_max_pos, kMaxPositions);
  c.rms_norm_eps = f.number("rms_norm_eps", gpt_oss ? 1e-5 : 1e-6);
  if (!(c.rms_norm_eps > 0)) f.bad("rms_norm_eps", "is ", c.rms_norm_eps, ", expected a positive number");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.torch_dtype = f.string("torch_dtype", f.string("dtype", "float32"));
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16")
    f.bad("torch_dtype", "is '", c.torch_dtype, "', expected float32, bfloat16 or float16");

  c.rope = parse_rope(f, gpt_oss ? 150000.0 : 10000.0, c.head_dim, c.max_position_embeddings);

  const bool attention_bias = f.boolean("attention_bias", gpt_oss);
  std::string quant;
  if (f.has("quantization_config")) {
    Fields q(f.object("quantization_config"), source, "quantization_config.");
    quant = q.string("quant_method", "");
    if (!(gpt_oss && quant == "mxfp4"))
      q.bad("quant_method", "is '", quant, "', which SLOPE does not support",
            gpt_oss ? " (only mxfp4)" : " for this architecture; use an unquantized checkpoint");
  }

  if (gpt_oss) {
    c.norm_order = kernels::NormOrder::WeightThenCast;
    c.qkv_bias = c.o_bias = attention_bias;
    c.sinks = true;
    c.num_experts = f.positive_or("num_local_experts", 128, kMaxExperts);
    c.experts_per_token = f.has("num_experts_per_tok") ? f.positive("num_experts_per_tok", kMaxExperts)
                                                       : f.positive_or("experts_per_token", 4, kMaxExperts);
    if (f.has("num_experts_per_tok") && f.has("experts_per_token") &&
        f.integer("experts_per_token") != c.experts_per_token)
      f.bad("experts_per_token", "(", f.integer("experts_per_token"), ") disagrees with num_experts_per_tok (",
            c.experts_per_token, ")");
    if (c.experts_per_token > c.num_experts)
      f.bad("num_experts_per_tok", "(", c.experts_per_token, ") exceeds num_local_experts (", c.num_experts, ")");
    c.swiglu_limit = f.number("swiglu_limit", 7.0);
    c.mxfp4_experts = quant == "mxfp4";
    if (c.mxfp4_experts && (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0))
      f.bad("hidden_size", "and intermediate_size must be multiples of 32 for mxfp4 experts (got ", c.hidden_size,
            ", ", c.intermediate_size, ")");
    const int64_t window = f.positive_or("sliding_window", 128, kMaxPositions);
    std::vector<std::string> types;
    for (int64_t i = 0; i < c.num_layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    c.layer_window = parse_layer_windows(f, c.num_layers, window, types);
  } else {
    c.norm_order = kernels::NormOrder::CastThenWeight;
    const std::string act = f.string("hidden_act", "silu");
    if (act != "silu") f.bad("hidden_act", "is '", act, "'; only silu (SwiGLU) MLPs are supported");
    if (c.arch == Arch::Llama) {
      c.qkv_bias = c.o_bias = attention_bias;
      if (f.boolean("mlp_bias", false)) f.bad("mlp_bias", "is true; MLP biases are not supported");
    } else if (c.arch == Arch::Qwen2) {
      c.qkv_bias = true;  // Qwen2 always has q/k/v biases and never an o bias
      c.o_bias = false;
    } else {  // Qwen3
      c.qkv_bias = c.o_bias = attention_bias;
      c.qk_norm = true;
    }
    // Qwen sliding windows (HF Qwen2Config/Qwen3Config): with use_sliding_window, layers from
    // max_window_layers on use a window of sliding_window keys; the others are full.
    std::vector<std::string> types(size_t(c.num_layers), "full_attention");
    int64_t window = 0;
    if (c.arch != Arch::Llama && f.boolean("use_sliding_window", false)) {
      window = f.positive("sliding_window", kMaxPositions);
      const int64_t first = f.integer("max_window_layers", c.num_layers);
      for (int64_t i = std::max<int64_t>(first, 0); i < c.num_layers; ++i) types[size_t(i)] = "sliding_attention";
    } else if (f.has("layer_types")) {
      window = f.positive_or("sliding_window", 0, kMaxPositions);
    }
    c.layer_window = parse_layer_windows(f, c.num_layers, window, types);
  }
  return c;
}

ModelConfig load_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(model_dir);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "config.json";
  if (!fs::exists(p, ec))
    fail("cannot read ", p.string(), " (it does not exist); pass a Hugging Face model directory that contains config.json");
  return parse_config(read_regular_file(p.string(), "config"), p.string());
}

}  // namespace slope::model
