// Rotary position embedding. inv_freq follows HF transformers modeling_rope_utils, but in double
// precision (HF computes it in f32); angles p·inv_freq and their cos/sin are also computed in
// double, so large positions (1M tokens) keep full f32 accuracy in cos/sin.
#include "slope/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "slope/core/error.h"

namespace slope::kernels {
namespace {

constexpr double kPi = 3.14159265358979323846;

// YaRN's magnitude correction: 0.1·m·ln(s) + 1, and 1 for s <= 1 (no interpolation).
double get_mscale(double scale, double m = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// The (fractional) rotary dimension index whose wavelength makes `rotations` full turns over
// the original context: d·ln(L / (2π·rotations)) / (2·ln θ).
double yarn_correction_dim(double rotations, double dim, double theta, double orig_ctx) {
  return dim * std::log(orig_ctx / (rotations * 2.0 * kPi)) / (2.0 * std::log(theta));
}

}  // namespace

Rope::Rope(const RopeConfig& c) {
  SLOPE_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "RoPE: head_dim must be positive and even, got ",
              c.head_dim);
  SLOPE_CHECK(c.theta > 1.0, "RoPE: rope_theta must be > 1, got ", c.theta);
  head_dim_ = c.head_dim;
  const int64_t half = c.head_dim / 2;
  const double dim = double(c.head_dim);

  // Default: inv_freq_i = θ^(−2i/d).
  std::vector<double> base(half);
  for (int64_t i = 0; i < half; ++i) base[i] = 1.0 / std::pow(c.theta, double(2 * i) / dim);

  inv_freq_ = base;
  attention_scaling_ = 1.0;
  if (c.type == "default") {
    // nothing more
  } else if (c.type == "llama3") {
    // Wavelengths longer than L/low_freq_factor are divided by `factor`, shorter than
    // L/high_freq_factor kept, and in between interpolated by
    //   s = (L/λ − low) / (high − low),  f = (1 − s)·f/factor + s·f.
    SLOPE_CHECK(c.factor > 0 && c.original_max_position_embeddings > 0 &&
                    c.high_freq_factor != c.low_freq_factor,
                "RoPE llama3: needs factor > 0, original_max_position_embeddings > 0 and "
                "high_freq_factor != low_freq_factor");
    const double L = double(c.original_max_position_embeddings);
    const double low_wavelen = L / c.low_freq_factor;
    const double high_wavelen = L / c.high_freq_factor;
    for (int64_t i = 0; i < half; ++i) {
      const double f = base[i];
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > low_wavelen) {
        inv_freq_[i] = f / c.factor;
      } else if (wavelen < high_wavelen) {
        inv_freq_[i] = f;
      } else {
        const double s = (L / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        inv_freq_[i] = (1.0 - s) * f / c.factor + s * f;
      }
    }
  } else if (c.type == "yarn") {
    // Dimensions below `low` (fast rotations) keep their frequency (extrapolation), above
    // `high` are divided by `factor` (interpolation), with a linear ramp between:
    //   ramp_i = clamp((i − low)/(high − low), 0, 1)
    //   inv_freq_i = f_i/factor · ramp_i + f_i · (1 − ramp_i)
    SLOPE_CHECK(c.factor > 0 && c.original_max_position_embeddings > 0,
                "RoPE yarn: needs factor > 0 and original_max_position_embeddings > 0");
    const double L = double(c.original_max_position_embeddings);
    double low = yarn_correction_dim(c.beta_fast, dim, c.theta, L);
    double high = yarn_correction_dim(c.beta_slow, dim, c.theta, L);
    if (c.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // as HF: avoid a zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      inv_freq_[i] = base[i] / c.factor * ramp + base[i] * (1.0 - ramp);
    }
    if (c.attention_factor > 0) {
      attention_scaling_ = c.attention_factor;
    } else if (c.mscale != 0 && c.mscale_all_dim != 0) {
      attention_scaling_ = get_mscale(c.factor, c.mscale) / get_mscale(c.factor, c.mscale_all_dim);
    } else {
      attention_scaling_ = get_mscale(c.factor);
    }
  } else {
    fail("RoPE: rope_type '", c.type, "' is not supported (default, llama3, yarn)");
  }
}

namespace {

// cs, sn [D/2] of one position p.
void angles(int64_t D, double p, const std::vector<double>& inv_freq, double scaling, float* cs,
            float* sn) {
  for (int64_t i = 0; i < D / 2; ++i) {
    const double a = p * inv_freq[i];
    cs[i] = float(std::cos(a) * scaling);
    sn[i] = float(std::sin(a) * scaling);
  }
}

// H heads of one row: dst [H, D] = src [H, D] rotated; src == dst rotates in place (each element
// is read before its own index is written).
void rotate_heads(const float* src, float* dst, int64_t H, int64_t D, const float* cs,
                  const float* sn) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h) {
    const float* s1 = src + h * D;
    const float* s2 = s1 + half;
    float* d1 = dst + h * D;
    float* d2 = d1 + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = s1[i], b = s2[i];
      d1[i] = a * cs[i] - b * sn[i];
      d2[i] = b * cs[i] + a * sn[i];
    }
  }
}

// Rows r in [0, n) over the threads, each with its own cos/sin scratch: row(r, cs, sn).
template <typename RowFn>
void for_rows(int64_t n, int64_t work, int64_t D, RowFn row) {
  SLOPE_CHECK(D > 0, "RoPE::apply on a Rope built without a config");
#pragma omp parallel if (work >= (1 << 15))
  {
    std::vector<float> cs(D / 2), sn(D / 2);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) row(r, cs.data(), sn.data());
  }
}

template <typename PosFn>
void apply_rows(float* x, int64_t n, int64_t H, int64_t D, const std::vector<double>& inv_freq,
                double scaling, PosFn pos) {
  for_rows(n, n * H * D, D, [&](int64_t r, float* cs, float* sn) {
    angles(D, double(pos(r)), inv_freq, scaling, cs, sn);
    rotate_heads(x + r * H * D, x + r * H * D, H, D, cs, sn);
  });
}

}  // namespace

void Rope::apply(float* x, int64_t n, int64_t H, int64_t pos0) const {
  apply_rows(x, n, H, head_dim_, inv_freq_, attention_scaling_,
             [pos0](int64_t r) { return pos0 + r; });
}

void Rope::apply(float* x, int64_t n, int64_t H, const int64_t* pos) const {
  apply_rows(x, n, H, head_dim_, inv_freq_, attention_scaling_,
             [pos](int64_t r) { return pos[r]; });
}

void Rope::split_apply(const float* qkv, int64_t n, int64_t Hq, int64_t Hkv, const int64_t* pos,
                       float* q, float* k, float* v) const {
  const int64_t D = head_dim_, width = (Hq + 2 * Hkv) * D;
  for_rows(n, n * width, D, [&](int64_t r, float* cs, float* sn) {
    const float* src = qkv + r * width;
    angles(D, double(pos[r]), inv_freq_, attention_scaling_, cs, sn);
    rotate_heads(src, q + r * Hq * D, Hq, D, cs, sn);
    rotate_heads(src + Hq * D, k + r * Hkv * D, Hkv, D, cs, sn);
    std::memcpy(v + r * Hkv * D, src + (Hq + Hkv) * D, size_t(Hkv * D) * sizeof(float));
  });
}

}  // namespace slope::kernels
