// A loaded causal LM: configuration, weights packed for the chosen compute type, and the three
// pieces of a forward pass (embed, decoder layers, final norm + lm_head on chosen rows).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slope/kernels/gemm.h"
#include "slope/kernels/rope.h"
#include "slope/model/config.h"
#include "slope/model/layers.h"
#include "slope/model/safetensors.h"
#include "slope/ops/backend.h"

namespace slope::model {

struct LoadOptions {
  kernels::ComputeType compute = kernels::ComputeType::F32;
  // Layers [first_layer, last_layer) are loaded (pipeline stages load only their own);
  // last_layer = -1 means all. Embedding and lm_head are loaded only when requested.
  int first_layer = 0;
  int last_layer = -1;
  bool load_embedding = true;
  bool load_head = true;
  // Tensor parallelism: this rank's slice of heads and intermediate columns (TensorSlice::of).
  int tp_rank = 0;
  int tp_size = 1;
  // Called after each decoder layer is loaded with (layers loaded, layers to load): progress.
  std::function<void(int, int)> on_layer_loaded;
  // Scan every tensor this rank loads for NaN and Inf (and MXFP4 scales that dequantise to
  // Inf) before packing, and throw slope::Error naming the first bad tensor and element. One
  // extra read of the checkpoint: docs/reliability.md gives what it costs.
  bool check_weights = false;
  // The device's ops the weights are packed for and the forward pass runs on (null: ops::cpu()).
  const ops::Backend* backend = nullptr;
};

class Model {
 public:
  // Reads MODEL_DIR/config.json and the safetensors weights. Throws slope::Error for missing or
  // malformed files and for tensors that are missing or misshaped (naming them).
  static std::unique_ptr<Model> load(const std::string& model_dir, const LoadOptions& opts = {});

  const ModelConfig& config() const { return cfg_; }
  const kernels::Rope& rope() const { return rope_; }
  kernels::ComputeType compute() const { return opts_.compute; }
  int first_layer() const { return opts_.first_layer; }
  int last_layer() const { return opts_.last_layer; }
  const LayerWeights& layer(int i) const { return layers_.at(i - opts_.first_layer); }
  size_t weight_bytes() const { return weight_bytes_; }
  const ops::Backend& ops() const { return opts_.backend ? *opts_.backend : ops::cpu(); }

  // h [n, H] = embedding rows of tokens[n].
  void embed(const int32_t* tokens, int64_t n, float* h) const;
  // logits [V] (host memory) = lm_head(final_norm(h_row)) for one hidden row (device memory).
  void logits(const float* h_row, float* out) const;

  const TensorSlice& slice() const { return slice_; }
  LayerContext layer_context(int64_t chunk, Ledger* ledger) const;

  // Family loaders (gpt_oss.cpp, llama.cpp) fill these.
  ModelConfig cfg_;
  LoadOptions opts_;
  kernels::Rope rope_;
  TensorSlice slice_;
  Tensor embedding_;   // [V, H], kept in the checkpoint dtype (mmap'd view)
  Tensor final_norm_;  // f32 [H]
  ops::Linear head_;
  std::vector<LayerWeights> layers_;
  size_t weight_bytes_ = 0;
};

// Rows [row0, row0 + rows) of an [out, in] torch weight (and its optional bias): one part of a
// (possibly fused, possibly tensor-parallel) projection.
struct WeightRows {
  std::string weight;
  std::string bias;  // "" = none
  int64_t out = 0;   // full row count of the stored tensor
  int64_t row0 = 0;
  int64_t rows = -1;  // -1 = all
};

// Checks token ids against the vocabulary and the prompt length against max_position_embeddings;
// throws slope::Error naming the offending id or length.
void validate_token_ids(const ModelConfig& cfg, const std::vector<int32_t>& tokens);

// Shared loading helpers for the family files.
struct WeightLoader {
  const WeightStore& store;
  const ModelConfig& cfg;
  const TensorSlice& slice;
  kernels::ComputeType compute;
  const ops::Backend& backend;
  size_t* bytes;
  Tensor f32(const std::string& name, const Shape& shape) const;  // converted copy, on the host
  // A weight the forward pass reads directly (norm weights): f32, on the backend's device.
  Tensor param(const std::string& name, const Shape& shape) const { return backend.upload(f32(name, shape)); }
  // f32 rows [row0, row0 + rows) of a [out, cols] tensor.
  Tensor f32_rows(const std::string& name, int64_t out, int64_t cols, int64_t row0, int64_t rows) const;
  // A Linear whose weight is the given row ranges stacked, restricted to input columns
  // [col0, col0 + cols) of `in` (cols = -1: all). Biases follow their rows; with
  // bias_on_rank0_only the bias is dropped on tensor ranks other than 0 (row-parallel
  // layers, whose partial sums are all-reduced).
  ops::Linear linear(const std::vector<WeightRows>& parts, int64_t in, int64_t col0 = 0, int64_t cols = -1,
                     bool bias_on_rank0_only = false) const;
  // Packs an f32 [out, in] weight (+ optional bias [out]) into a Linear and counts its bytes.
  ops::Linear pack(const Tensor& w, const float* bias) const;
};

void load_gpt_oss_layer(const WeightLoader& wl, int layer, LayerWeights& w);  // gpt_oss.cpp
void load_llama_layer(const WeightLoader& wl, int layer, LayerWeights& w);    // llama.cpp

}  // namespace slope::model
