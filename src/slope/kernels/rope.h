// Rotary position embedding, NeoX ("rotate half") style as in HF transformers:
//   x = [x1, x2] (halves of head_dim), out = [x1·cos − x2·sin, x2·cos + x1·sin]
// with cos/sin of angle p·inv_freq_i, both multiplied by attention_scaling (YaRN's mscale).
// inv_freq follows HF modeling_rope_utils for "default", "llama3" and "yarn".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slope::kernels {

struct RopeConfig {
  std::string type = "default";  // "default" | "llama3" | "yarn"
  double theta = 10000.0;
  int64_t head_dim = 0;          // rotary dimension (= head_dim for every supported model)
  // llama3, yarn. Used as given (as current HF does). Some HF releases replaced yarn's factor by
  // max_position_embeddings / original_max_position_embeddings when the latter is set; the
  // config parser decides (the two agree for gpt-oss: 131072 / 4096 = 32).
  double factor = 1.0;
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0; // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  double beta_fast = 32.0;       // yarn
  double beta_slow = 1.0;        // yarn
  bool truncate = true;          // yarn: floor/ceil the correction range (gpt-oss: false)
  double attention_factor = 0.0; // yarn: 0 = default get_mscale(factor) (below)
  // yarn, DeepSeek-style (HF rope_scaling "mscale"/"mscale_all_dim"; 0 = absent). With both
  // set and attention_factor 0: attention_factor = get_mscale(factor, mscale) /
  // get_mscale(factor, mscale_all_dim), where get_mscale(s, m) = 0.1·m·ln(s) + 1 (1 if s <= 1).
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
};

class Rope {
 public:
  Rope() = default;
  explicit Rope(const RopeConfig& cfg);

  // Rotates x [n, H, head_dim] in place; row i is at global position pos0 + i.
  void apply(float* x, int64_t n, int64_t H, int64_t pos0) const;
  // Same for rows at arbitrary positions pos[n].
  void apply(float* x, int64_t n, int64_t H, const int64_t* pos) const;
  // Splits fused projection rows qkv [n, (Hq + 2·Hkv)·head_dim] = [q | k | v] into q [n, Hq, D]
  // and k, v [n, Hkv, D], rotating q and k (row i at position pos[i]) in the same pass: equal,
  // bit for bit, to copying the three column ranges out and then apply() on q and on k.
  void split_apply(const float* qkv, int64_t n, int64_t Hq, int64_t Hkv, const int64_t* pos,
                   float* q, float* k, float* v) const;

  const std::vector<double>& inv_freq() const { return inv_freq_; }  // [head_dim / 2]
  double attention_scaling() const { return attention_scaling_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  std::vector<double> inv_freq_;
  double attention_scaling_ = 1.0;
  int64_t head_dim_ = 0;
};

}  // namespace slope::kernels
