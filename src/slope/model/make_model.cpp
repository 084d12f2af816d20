#include "slope/model/make_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"

namespace slope::model {
namespace {
using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers. Each tensor gets its own stream from (seed, name), and each
// chunk of kChunk elements its own xoshiro256** state, so chunks can be filled in parallel and
// the bytes do not depend on the thread count or on the order tensors are generated in.

constexpr int64_t kChunk = int64_t(1) << 16;

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

struct Xoshiro256 {
  uint64_t s[4];
  explicit Xoshiro256(uint64_t seed) {
    for (auto& w : s) w = splitmix64(seed);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t r = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
};

// kLanes independent xoshiro256** streams stepped together, so the compiler vectorises them
// (about 5x faster than one stream). Each 64-bit draw gives one approximately standard normal:
// the sum of its four 16-bit uniforms (Irwin-Hall, variance 1/3), centred and scaled to unit
// variance. Bounded by ±3.46, which is what initial weights want anyway.
struct NormalLanes {
  static constexpr int kLanes = 16;
  uint64_t s0[kLanes], s1[kLanes], s2[kLanes], s3[kLanes];
  explicit NormalLanes(uint64_t seed) {
    for (int l = 0; l < kLanes; ++l) {
      s0[l] = splitmix64(seed);
      s1[l] = splitmix64(seed);
      s2[l] = splitmix64(seed);
      s3[l] = splitmix64(seed);
    }
  }
  void next(float* out) {  // out[kLanes]
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t r = Xoshiro256::rotl(s1[l] * 5, 7) * 9;
      const uint64_t t = s1[l] << 17;
      s2[l] ^= s0[l];
      s3[l] ^= s1[l];
      s1[l] ^= s2[l];
      s0[l] ^= s3[l];
      s2[l] ^= t;
      s3[l] = Xoshiro256::rotl(s3[l], 45);
      const uint32_t sum = uint32_t(r & 0xffff) + uint32_t((r >> 16) & 0xffff) +
                           uint32_t((r >> 32) & 0xffff) + uint32_t(r >> 48);
      out[l] = (float(sum) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
    }
  }
};

// f32 -> bf16, round to nearest even, for finite values (the generator makes no NaN); unlike
// core's f32_to_bf16 it has no branch, so the fill loop vectorises.
inline uint16_t finite_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// f32 -> IEEE half, round to nearest even (core/half.h has only the other direction).
uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));  // inf, NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(abs >> 23);  // 14..24 + 1
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

enum class Init { Normal, Mxfp4Blocks, Mxfp4Scales };

struct WeightInit {
  Init kind = Init::Normal;
  float mean = 0.0f, std = 0.02f;
};

// MXFP4 scales: e8m0 exponents 119..122 give 2^-8..2^-5, so with uniform FP4 codes (RMS 2.9)
// the weights have an RMS of about 0.01-0.09, like a trained model's.
constexpr int kScaleLo = 119, kScaleSpan = 4;

Tensor generate(const TensorSpec& spec, const WeightInit& init, uint64_t seed) {
  Tensor t(spec.shape, spec.dtype);
  const int64_t n = t.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  uint64_t base = seed ^ fnv1a(spec.name);
  base = splitmix64(base);
#pragma omp parallel for schedule(dynamic, 4) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t chunk_seed = base + uint64_t(c) * 0xd1b54a32d192ed03ull;
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    if (spec.dtype == DType::U8) {
      Xoshiro256 rng(chunk_seed);
      uint8_t* p = t.data<uint8_t>();
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t r = rng.next();
        p[i] = init.kind == Init::Mxfp4Scales ? uint8_t(kScaleLo + (r >> 32) % kScaleSpan) : uint8_t(r >> 56);
      }
      continue;
    }
    NormalLanes rng(chunk_seed);
    constexpr int L = NormalLanes::kLanes;
    float buf[L];
    for (int64_t i = lo; i < hi; i += L) {
      rng.next(buf);
      const int64_t m = std::min<int64_t>(L, hi - i);
      for (int l = 0; l < L; ++l) buf[l] = init.mean + init.std * buf[l];
      switch (spec.dtype) {
        case DType::F32: std::memcpy(t.data<float>() + i, buf, size_t(m) * 4); break;
        case DType::BF16: {
          uint16_t* p = t.data<uint16_t>() + i;
          if (m == L) {
            for (int l = 0; l < L; ++l) p[l] = finite_to_bf16(buf[l]);
          } else {
            for (int64_t l = 0; l < m; ++l) p[l] = finite_to_bf16(buf[l]);
          }
          break;
        }
        case DType::F16:
          for (int64_t l = 0; l < m; ++l) t.data<uint16_t>()[i + l] = f32_to_f16(buf[l]);
          break;
        default: break;  // not produced by model_tensor_specs
      }
    }
  }
  return t;
}

// Initialisation by tensor role, from its HF name.
WeightInit init_for(const std::string& name, const ModelConfig& cfg) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("_blocks")) return {Init::Mxfp4Blocks, 0, 0};
  if (ends_with("_scales")) return {Init::Mxfp4Scales, 0, 0};
  if (ends_with("layernorm.weight") || ends_with("norm.weight")) return {Init::Normal, 1.0f, 0.1f};
  if (ends_with("self_attn.sinks")) return {Init::Normal, 0.0f, 1.0f};
  // A router with 0.02 weights gives near-uniform expert weights; a wider one makes routing
  // decisive and varied from token to token, as in a trained model.
  if (ends_with("mlp.router.weight"))
    return {Init::Normal, 0.0f, float(std::max(0.1, 2.0 / std::sqrt(double(cfg.hidden_size))))};
  return {Init::Normal, 0.0f, 0.02f};
}

// ---------------------------------------------------------------------------------------------
// Presets

struct Shape_ {
  int64_t vocab, hidden, layers, heads, kv_heads, head_dim, inter, max_pos;
  int64_t experts = 0, top_k = 0, window = 0;
  int64_t rope_original = 0;
  double rope_factor = 1.0;
};

std::string normalise_arch(const std::string& a) {
  if (a == "gpt-oss" || a == "gpt_oss" || a == "gptoss") return "gpt-oss";
  if (a == "llama" || a == "qwen2" || a == "qwen3") return a;
  fail("unknown model architecture '", a, "' for make-model; choose gpt-oss, llama, qwen2 or qwen3");
}

Shape_ preset_shape(const std::string& arch, const std::string& preset) {
  const bool moe = arch == "gpt-oss";
  if (preset == "tiny") {
    // Runs in a second; hidden and intermediate are multiples of 32 for MXFP4.
    Shape_ s{512, 64, moe ? 4 : 2, 4, 2, 16, 64, 4096};
    if (moe) {
      s.experts = 4;
      s.top_k = 2;
      s.window = 16;
      // transformers takes the YaRN factor as max_position_embeddings / original length when
      // both are given, so the two must agree: 4096 / 1024 = 4.
      s.rope_factor = 4.0;
      s.rope_original = 1024;
    } else if (arch == "llama") {
      s.rope_factor = 8.0;
      s.rope_original = 256;
    }
    return s;
  }
  if (preset == "tiny-wide") {
    // tiny with 16 query heads over 2 KV heads: Ulysses degrees 8 and 16 exceed the KV heads,
    // so the all-to-all must replicate them (tests/mesh).
    Shape_ s = preset_shape(arch, "tiny");
    s.heads = 16;
    s.kv_heads = 2;
    return s;
  }
  if (preset == "bench") {
    if (moe) {  // gpt-oss-shaped, ~0.4 B parameters
      Shape_ s{32000, 1024, 12, 16, 4, 64, 1024, 131072};
      s.experts = 8;
      s.top_k = 4;
      s.window = 128;
      s.rope_factor = 32.0;
      s.rope_original = 4096;
      return s;
    }
    Shape_ s{32000, 2048, 16, 32, 8, 64, 5632, 131072};  // ~0.85 B dense
    if (arch == "llama") {
      s.rope_factor = 8.0;
      s.rope_original = 8192;
    }
    return s;
  }
  fail("unknown make-model preset '", preset, "'; choose tiny, tiny-wide or bench");
}

const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: fail("make-model weights must be F32, BF16 or F16, not ", dtype_name(d));
  }
}

ojson config_json(const MakeModelOptions& o) {
  const std::string arch = normalise_arch(o.arch);
  const Shape_ s = preset_shape(arch, o.preset);
  SLOPE_CHECK(!o.mxfp4 || arch == "gpt-oss", "--mxfp4 applies to gpt-oss only (its experts), not ", arch);
  const char* dtype = torch_dtype_name(o.dtype);
  // Token ids inside the vocabulary, as in the real configs' positions relative to its end.
  const int64_t bos = 1, eos = 2, pad = s.vocab - 1;

  ojson j;
  if (arch == "gpt-oss") {
    ojson layer_types = ojson::array();
    for (int64_t i = 0; i < s.layers; ++i) layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    j = {{"architectures", {"GptOssForCausalLM"}},
         {"attention_bias", true},
         {"attention_dropout", 0.0},
         {"bos_token_id", bos},
         {"eos_token_id", eos},
         {"experts_per_token", s.top_k},
         {"head_dim", s.head_dim},
         {"hidden_act", "silu"},
         {"hidden_size", s.hidden},
         {"initial_context_length", s.rope_original},
         {"initializer_range", 0.02},
         {"intermediate_size", s.inter},
         {"layer_types", layer_types},
         {"max_position_embeddings", s.max_pos},
         {"model_type", "gpt_oss"},
         {"num_attention_heads", s.heads},
         {"num_experts_per_tok", s.top_k},
         {"num_hidden_layers", s.layers},
         {"num_key_value_heads", s.kv_heads},
         {"num_local_experts", s.experts},
         {"output_router_logits", false},
         {"pad_token_id", pad}};
    if (o.mxfp4)
      j["quantization_config"] = {
          {"modules_to_not_convert",
           {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
          {"quant_method", "mxfp4"}};
    j["rms_norm_eps"] = 1e-5;
    j["rope_scaling"] = {{"beta_fast", 32.0},
                         {"beta_slow", 1.0},
                         {"factor", s.rope_factor},
                         {"original_max_position_embeddings", s.rope_original},
                         {"rope_type", "yarn"},
                         {"truncate", false}};
    j["rope_theta"] = 150000.0;
    j["router_aux_loss_coef"] = 0.9;
    j["sliding_window"] = s.window;
    j["swiglu_limit"] = 7.0;
    j["tie_word_embeddings"] = false;
    j["torch_dtype"] = dtype;
    j["use_cache"] = true;
    j["vocab_size"] = s.vocab;
    return j;
  }

  const std::string cls = arch == "llama" ? "LlamaForCausalLM" : arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
  j = {{"architectures", {cls}}};
  if (arch != "qwen2") j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos;
  j["eos_token_id"] = eos;
  if (arch != "qwen2") j["head_dim"] = s.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = s.hidden;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = s.inter;
  j["max_position_embeddings"] = s.max_pos;
  if (arch == "llama") j["mlp_bias"] = false;
  if (arch != "llama") j["max_window_layers"] = s.layers;
  j["model_type"] = arch;
  j["num_attention_heads"] = s.heads;
  j["num_hidden_layers"] = s.layers;
  j["num_key_value_heads"] = s.kv_heads;
  if (arch == "llama") j["pretraining_tp"] = 1;
  j["rms_norm_eps"] = arch == "llama" ? 1e-5 : 1e-6;
  if (arch == "llama")
    j["rope_scaling"] = {{"factor", s.rope_factor},
                         {"high_freq_factor", 4.0},
                         {"low_freq_factor", 1.0},
                         {"original_max_position_embeddings", s.rope_original},
                         {"rope_type", "llama3"}};
  else
    j["rope_scaling"] = nullptr;
  j["rope_theta"] = arch == "llama" ? 500000.0 : 1000000.0;
  if (arch == "qwen2") j["sliding_window"] = s.max_pos;
  if (arch == "qwen3") j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = dtype;
  j["use_cache"] = true;
  if (arch != "llama") j["use_sliding_window"] = false;
  j["vocab_size"] = s.vocab;
  return j;
}

}  // namespace

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c, DType dt) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Q = c.num_heads * D, KV = c.num_kv_heads * D, E = c.num_experts;
  std::vector<TensorSpec> v;
  v.push_back({"model.embed_tokens.weight", dt, {V, H}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    v.push_back({p + "input_layernorm.weight", dt, {H}});
    const struct { const char* name; int64_t out, in; } projs[] = {
        {"q_proj", Q, H}, {"k_proj", KV, H}, {"v_proj", KV, H}, {"o_proj", H, Q}};
    for (const auto& pr : projs) {
      const std::string base = p + "self_attn." + pr.name;
      v.push_back({base + ".weight", dt, {pr.out, pr.in}});
      const bool is_o = std::string(pr.name) == "o_proj";
      if (is_o ? c.o_bias : c.qkv_bias) v.push_back({base + ".bias", dt, {pr.out}});
    }
    if (c.qk_norm) {
      v.push_back({p + "self_attn.q_norm.weight", dt, {D}});
      v.push_back({p + "self_attn.k_norm.weight", dt, {D}});
    }
    if (c.sinks) v.push_back({p + "self_attn.sinks", dt, {c.num_heads}});
    v.push_back({p + "post_attention_layernorm.weight", dt, {H}});
    if (c.is_moe()) {
      const std::string m = p + "mlp.";
      v.push_back({m + "router.weight", dt, {E, H}});
      v.push_back({m + "router.bias", dt, {E}});
      // Dense HF layout is x @ W ([E, in, out]); MXFP4 rows are output features with 32-value
      // blocks along the input.
      if (c.mxfp4_experts) {
        v.push_back({m + "experts.gate_up_proj_blocks", DType::U8, {E, 2 * I, H / 32, 16}});
        v.push_back({m + "experts.gate_up_proj_scales", DType::U8, {E, 2 * I, H / 32}});
      } else {
        v.push_back({m + "experts.gate_up_proj", dt, {E, H, 2 * I}});
      }
      v.push_back({m + "experts.gate_up_proj_bias", dt, {E, 2 * I}});
      if (c.mxfp4_experts) {
        v.push_back({m + "experts.down_proj_blocks", DType::U8, {E, H, I / 32, 16}});
        v.push_back({m + "experts.down_proj_scales", DType::U8, {E, H, I / 32}});
      } else {
        v.push_back({m + "experts.down_proj", dt, {E, I, H}});
      }
      v.push_back({m + "experts.down_proj_bias", dt, {E, H}});
    } else {
      v.push_back({p + "mlp.gate_proj.weight", dt, {I, H}});
      v.push_back({p + "mlp.up_proj.weight", dt, {I, H}});
      v.push_back({p + "mlp.down_proj.weight", dt, {H, I}});
    }
  }
  v.push_back({"model.norm.weight", dt, {H}});
  if (!c.tie_word_embeddings) v.push_back({"lm_head.weight", dt, {V, H}});
  return v;
}

std::string make_model_config_json(const MakeModelOptions& opts) { return config_json(opts).dump(2) + "\n"; }

void make_model(const MakeModelOptions& opts) {
  namespace fs = std::filesystem;
  SLOPE_CHECK(!opts.out_dir.empty(), "make-model needs an output directory");
  const std::string text = make_model_config_json(opts);  // validates arch, preset, dtype
  const ModelConfig cfg = parse_config(text, "generated config.json");

  std::error_code ec;
  fs::create_directories(opts.out_dir, ec);
  SLOPE_CHECK(!ec && fs::is_directory(opts.out_dir), "cannot create output directory ", opts.out_dir, ": ",
              ec ? ec.message() : "a file of that name exists");
  const fs::path dir(opts.out_dir);
  // A stale index would make loaders read the old shards instead of the new file.
  SLOPE_CHECK(!fs::exists(dir / "model.safetensors.index.json"), opts.out_dir,
              " already holds a sharded checkpoint (model.safetensors.index.json); choose an empty directory");
  {
    std::ofstream out(dir / "config.json");
    out << text;
    SLOPE_CHECK(out.good(), "cannot write ", (dir / "config.json").string());
  }

  std::vector<TensorSpec> specs = model_tensor_specs(cfg, opts.dtype);
  SafetensorsWriter writer((dir / "model.safetensors").string(), specs, {{"format", "pt"}});
  for (const TensorSpec& s : specs) writer.append(generate(s, init_for(s.name, cfg), opts.seed));
  writer.finish();
}

}  // namespace slope::model
