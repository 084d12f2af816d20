#include "slope/model/parallel_shape.h"

#include <algorithm>

#include "slope/core/error.h"
#include "slope/model/layers.h"

namespace slope::model {

std::string MeshShape::str() const {
  return str_cat("pp=", pp, " ring=", ring, " ulysses=", ulysses, " tp=", tp);
}

int64_t MeshShape::pipeline_chunk(int64_t tokens) const {
  return pp_chunk >= 0 ? pp_chunk : default_pipeline_chunk(pp, tokens);
}

std::vector<int> valid_ulysses_degrees(int64_t num_q_heads, int64_t num_kv_heads) {
  std::vector<int> out;
  for (int64_t u = 1; u <= num_q_heads; ++u) {
    if (num_q_heads % u != 0) continue;
    if (num_kv_heads > 0 && num_kv_heads % u != 0 && u % num_kv_heads != 0) continue;
    out.push_back(int(u));
  }
  return out;
}

std::string mesh_problem(const MeshShape& s, const ModelConfig& cfg) {
  if (s.pp < 1 || s.ring < 1 || s.ulysses < 1 || s.tp < 1) return "every degree must be at least 1";
  if (s.pp_chunk < -1) return "the pipeline chunk must be positive, 0 (whole prompt) or -1 (the default)";
  if (s.pp > cfg.num_layers) return str_cat("--pp ", s.pp, " exceeds the model's ", cfg.num_layers, " layers");
  TensorSlice slice = TensorSlice::whole(cfg);
  if (s.tp > 1) {
    try {
      slice = TensorSlice::of(cfg, 0, s.tp);
    } catch (const Error& e) {
      return e.what();
    }
  }
  if (s.ulysses > 1) {  // Ulysses splits the heads of one tensor rank
    const std::vector<int> ok = valid_ulysses_degrees(slice.q_heads, slice.kv_heads);
    if (std::find(ok.begin(), ok.end(), s.ulysses) == ok.end())
      return str_cat("--ulysses ", s.ulysses, " does not fit ", slice.q_heads, " query heads / ", slice.kv_heads,
                     " KV heads", s.tp > 1 ? str_cat(" (a tensor rank's share under --tp ", s.tp, ")") : "");
  }
  return "";
}

// Layout arithmetic of a tensor-parallel rank (declared with the layer in layers.h).
TensorSlice TensorSlice::of(const ModelConfig& c, int rank, int size) {
  SLOPE_CHECK(size >= 1 && rank >= 0 && rank < size, "bad tensor-parallel rank ", rank, " of ", size);
  SLOPE_CHECK(c.num_heads % size == 0, "--tp ", size, " must divide the ", c.num_heads,
              " attention heads");
  SLOPE_CHECK(c.num_kv_heads % size == 0 || size % c.num_kv_heads == 0, "--tp ", size,
              " and the ", c.num_kv_heads, " KV heads must divide one another (so each rank's "
              "query heads read whole KV heads)");
  SLOPE_CHECK(c.intermediate_size % size == 0, "--tp ", size, " must divide the intermediate size ",
              c.intermediate_size);
  TensorSlice s;
  s.rank = rank;
  s.size = size;
  s.q_heads = c.num_heads / size;
  s.q_head0 = rank * s.q_heads;
  const int64_t group = c.num_heads / c.num_kv_heads;  // query heads per KV head
  s.kv_head0 = s.q_head0 / group;
  s.kv_heads = std::max<int64_t>(1, s.q_heads / group);
  s.inter = c.intermediate_size / size;
  s.inter0 = rank * s.inter;
  return s;
}


}  // namespace slope::model
