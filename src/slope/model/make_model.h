// Random-weight models in the Hugging Face layout: config.json plus model.safetensors with HF
// tensor names, loadable unchanged by transformers (>= 4.55) and by SLOPE. Used for tests
// (tiny: runs in a second) and for benchmarks (bench: a few hundred million parameters, the
// shape of gpt-oss or of a ~1B dense model) without downloading real weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slope/core/dtype.h"
#include "slope/model/config.h"
#include "slope/model/safetensors.h"

namespace slope::model {

struct MakeModelOptions {
  std::string arch;    // "gpt-oss" | "llama" | "qwen2" | "qwen3"
  std::string preset;  // "tiny" | "bench"
  uint64_t seed = 0;   // same seed, same bytes (independent of the thread count)
  std::string out_dir; // created if absent; config.json and model.safetensors are overwritten
  DType dtype = DType::BF16;  // weight dtype: F32, BF16 or F16 (norms too, as HF stores them)
  bool mxfp4 = false;         // gpt-oss only: experts as MXFP4 blocks + scales (U8)
};

// Writes OUT_DIR/config.json and OUT_DIR/model.safetensors. Throws slope::Error on a bad
// option or an I/O failure.
void make_model(const MakeModelOptions& opts);

// The config.json text make_model writes (pretty-printed JSON).
std::string make_model_config_json(const MakeModelOptions& opts);

// Every weight tensor of a model with this config, in HF names and shapes, in file order
// (embedding, layers, final norm, head). Float weights get `dtype`; MXFP4 expert blocks and
// scales (cfg.mxfp4_experts) are U8:
//   gate_up_proj_blocks [E, 2I, H/32, 16], gate_up_proj_scales [E, 2I, H/32],
//   down_proj_blocks    [E, H, I/32, 16],  down_proj_scales    [E, H, I/32].
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg, DType dtype);

}  // namespace slope::model
