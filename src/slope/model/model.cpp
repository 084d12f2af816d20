#include "slope/model/model.h"

#include <cstring>

#include "slope/core/error.h"
#include "slope/core/finite.h"
#include "slope/core/half.h"
#include "slope/kernels/copy.h"

namespace slope::model {

Tensor WeightLoader::f32(const std::string& name, const Shape& shape) const {
  Tensor t = store.get(name, shape).to_f32();
  *bytes += t.nbytes();
  return t;
}

Tensor WeightLoader::f32_rows(const std::string& name, int64_t out, int64_t cols, int64_t row0,
                              int64_t rows) const {
  Tensor t = store.get(name, {out, cols});
  const size_t es = dtype_size(t.dtype());
  Tensor part = Tensor::view(static_cast<uint8_t*>(t.raw()) + size_t(row0 * cols) * es, {rows, cols},
                             t.dtype(), std::make_shared<Tensor>(t));
  return part.to_f32();
}

ops::Linear WeightLoader::pack(const Tensor& w, const float* bias) const {
  ops::Linear lin = backend.linear(w.data<float>(), DType::F32, kernels::WeightLayout::OutIn, w.dim(0), w.dim(1),
                                   bias, compute);
  *bytes += lin.weight_bytes() + (bias ? size_t(w.dim(0)) * sizeof(float) : 0);
  return lin;
}

ops::Linear WeightLoader::linear(const std::vector<WeightRows>& parts, int64_t in, int64_t col0, int64_t cols,
                                 bool bias_on_rank0_only) const {
  if (cols < 0) cols = in;
  int64_t total = 0;
  for (const WeightRows& p : parts) total += p.rows < 0 ? p.out : p.rows;
  // Stack the parts as f32 (exact for F32/BF16/F16 sources); Linear packs to the compute type.
  Tensor w({total, cols}, DType::F32);
  Tensor b;
  const bool want_bias = !(bias_on_rank0_only && slice.rank != 0);
  int64_t row = 0;
  for (const WeightRows& p : parts) {
    const int64_t rows = p.rows < 0 ? p.out : p.rows;
    Tensor part = f32_rows(p.weight, p.out, in, p.row0, rows);
    kernels::copy_columns(part.data<float>(), rows, in, col0, cols, w.data<float>() + row * cols);
    if (!p.bias.empty() && want_bias) {
      if (b.empty()) b = Tensor({total}, DType::F32);
      Tensor pb = store.get(p.bias, {p.out}).to_f32();
      std::memcpy(b.data<float>() + row, pb.data<float>() + p.row0, size_t(rows) * sizeof(float));
    }
    row += rows;
  }
  return pack(w, b.empty() ? nullptr : b.data<float>());
}

namespace {

// The layer of "model.layers.N.<rest>", or -1 for other names.
int layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  int layer = 0;
  bool digits = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (1 << 24); ++i, digits = true)
    layer = layer * 10 + (name[i] - '0');
  return digits && i < name.size() && name[i] == '.' ? layer : -1;
}

// --check-weights: the tensors of `store` that a model loaded with `o` (layers [first, last))
// reads, scanned in their checkpoint dtype. MXFP4 scales (U8 e8m0) of 254 and 255 are reported
// too: 255 is e8m0's NaN, and 2^127 times an e2m1 value of 2 or more overflows to Inf.
void check_weights(const WeightStore& store, const ModelConfig& c, const LoadOptions& o, int last) {
  for (const std::string& name : store.names()) {
    const int layer = layer_of(name);
    if (layer >= 0 && (layer < o.first_layer || layer >= last)) continue;
    if (layer < 0) {
      const bool embedding = name == "model.embed_tokens.weight";
      if (embedding && !o.load_embedding && !(o.load_head && c.tie_word_embeddings)) continue;
      if ((name == "lm_head.weight" || name == "model.norm.weight") && !o.load_head) continue;
    }
    const Tensor t = store.get(name);
    int64_t bad = first_nonfinite(t);
    const bool scales = t.dtype() == DType::U8 && name.size() > 7 && name.compare(name.size() - 7, 7, "_scales") == 0;
    if (scales) {
      const uint8_t* p = t.data<uint8_t>();
      for (int64_t i = 0; i < t.numel() && bad < 0; ++i)
        if (p[i] >= 254) bad = i;
    }
    SLOPE_CHECK(bad < 0, "--check-weights: tensor ", name, " ", shape_str(t.shape()), " holds ",
                scales ? "an MXFP4 scale that dequantises to Inf or NaN" : "a non-finite value (NaN or Inf)",
                " at element ", bad, "; the checkpoint is corrupt: restore or re-download it");
  }
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& model_dir, const LoadOptions& opts) {
  auto m = std::make_unique<Model>();
  m->cfg_ = load_config(model_dir);
  const ModelConfig& c = m->cfg_;
  m->opts_ = opts;
  if (m->opts_.last_layer < 0) m->opts_.last_layer = int(c.num_layers);
  SLOPE_CHECK(0 <= m->opts_.first_layer && m->opts_.first_layer <= m->opts_.last_layer &&
                  m->opts_.last_layer <= c.num_layers,
              "layer range [", m->opts_.first_layer, ", ", m->opts_.last_layer,
              ") is outside the model's ", c.num_layers, " layers");
  m->rope_ = kernels::Rope(c.rope);
  m->slice_ = opts.tp_size > 1 ? TensorSlice::of(c, opts.tp_rank, opts.tp_size) : TensorSlice::whole(c);

  WeightStore store(model_dir);
  if (opts.check_weights) check_weights(store, c, opts, m->opts_.last_layer);
  WeightLoader wl{store, c, m->slice_, opts.compute, m->ops(), &m->weight_bytes_};
  const int64_t V = c.vocab_size, H = c.hidden_size;
  if (opts.load_embedding) {
    m->embedding_ = m->ops().upload(store.get("model.embed_tokens.weight", {V, H}));  // no copy on the host
    SLOPE_CHECK(m->embedding_.dtype() == DType::F32 || m->embedding_.dtype() == DType::BF16 ||
                    m->embedding_.dtype() == DType::F16,
                "model.embed_tokens.weight has dtype ", dtype_name(m->embedding_.dtype()),
                "; expected F32, BF16 or F16");
    m->weight_bytes_ += m->embedding_.nbytes();
  }
  if (opts.load_head) {
    m->final_norm_ = wl.param("model.norm.weight", {H});
    const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    m->head_ = wl.linear({{head, "", V}}, H);
  }
  for (int i = m->opts_.first_layer; i < m->opts_.last_layer; ++i) {
    LayerWeights w;
    w.window = c.layer_window.at(i);
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w.input_norm = wl.param(p + "input_layernorm.weight", {H});
    w.post_norm = wl.param(p + "post_attention_layernorm.weight", {H});
    if (c.arch == Arch::GptOss)
      load_gpt_oss_layer(wl, i, w);
    else
      load_llama_layer(wl, i, w);
    m->layers_.push_back(std::move(w));
    // The layer's weights are packed copies now: its checkpoint pages leave this process's RSS
    // (the embedding's, where they are read, fault back in as they are), so that what a loaded
    // model holds, and the peak while loading, are what the memory prediction counts.
    store.release_pages();
    if (opts.on_layer_loaded)
      opts.on_layer_loaded(i + 1 - m->opts_.first_layer, m->opts_.last_layer - m->opts_.first_layer);
  }
  return m;
}

void validate_token_ids(const ModelConfig& cfg, const std::vector<int32_t>& tokens) {
  SLOPE_CHECK(!tokens.empty(), "the prompt is empty; give at least one token id");
  SLOPE_CHECK(int64_t(tokens.size()) <= cfg.max_position_embeddings, "the prompt has ",
              tokens.size(), " tokens, more than the model's max_position_embeddings (",
              cfg.max_position_embeddings, "); shorten it");
  for (size_t i = 0; i < tokens.size(); ++i)
    SLOPE_CHECK(tokens[i] >= 0 && tokens[i] < cfg.vocab_size, "token id ", tokens[i],
                " at position ", i, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
}

void Model::embed(const int32_t* tokens, int64_t n, float* h) const {
  SLOPE_CHECK(!embedding_.empty(), "this rank did not load the embedding");
  ops().embed(embedding_.raw(), embedding_.dtype(), cfg_.hidden_size, tokens, n, h);
}

void Model::logits(const float* h_row, float* out) const {
  SLOPE_CHECK(!head_.empty(), "this rank did not load lm_head");
  const ops::Backend& ops = this->ops();
  Tensor x = ops.alloc({cfg_.hidden_size}, DType::F32);
  ops.rmsnorm(h_row, final_norm_.data<float>(), x.data<float>(), 1, cfg_.hidden_size, float(cfg_.rms_norm_eps),
              cfg_.norm_order, layer_context(1, nullptr).act_dtype);
  if (ops.device() == Device::CPU) {
    head_.forward(x.data<float>(), 1, out);
    return;
  }
  Tensor y = ops.alloc({cfg_.vocab_size}, DType::F32);
  head_.forward(x.data<float>(), 1, y.data<float>());
  ops.to_host(y.data<float>(), cfg_.vocab_size, out);
}

LayerContext Model::layer_context(int64_t chunk, Ledger* ledger) const {
  LayerContext ctx;
  ctx.cfg = &cfg_;
  ctx.rope = &rope_;
  ctx.ops = &ops();
  ctx.slice = slice_;
  ctx.act_dtype = opts_.compute == kernels::ComputeType::BF16 ? DType::BF16 : DType::F32;
  ctx.chunk = chunk;
  ctx.ledger = ledger;
  return ctx;
}

}  // namespace slope::model
