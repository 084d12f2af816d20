// Engine figures for a hardware profile: how SLOPE's own kernels run on this machine at one
// model's shapes (`slope calibrate --model`; calibrate_engine.cpp says what is timed).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slope/core/sys.h"
#include "slope/kernels/attention.h"
#include "slope/model/config.h"
#include "slope/model/model.h"
#include "slope/parallel/comm.h"

namespace slope::cli {

// Seconds of the fastest of `reps` timed runs of fn, after one warm-up run (none when reps is
// 0: one timed run). The fastest, not the median: on a shared machine a disturbance only ever
// slows a run down, and a profile states what the machine does undisturbed.
template <typename F>
double best_seconds(int reps, F&& fn) {
  if (reps > 0) fn();
  double best = 0;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const double t0 = now_seconds();
    fn();
    const double t = now_seconds() - t0;
    if (i == 0 || t < best) best = t;
  }
  return best;
}

// n uniform floats in [-1, 1), the same for the same seed.
std::vector<float> random_floats(size_t n, uint32_t seed);

// GFLOP/s (exact pairs) of flash_attention with compute type ct on a causal self-attention of n
// tokens; the fastest of `reps` runs after a warm-up (best_seconds). With `rows` in [1, n), only
// the last `rows` queries, against all n keys: one chunk's call at n keys, as the engine's
// chunked prefill makes it.
double causal_attention_gflops(const kernels::AttentionShape& shape, int64_t n, int reps, kernels::ComputeType ct,
                               int64_t rows = 0);

// The profile's name for the attention the engine runs with GEMMs in `compute_dtype` ("fp32" or
// "bf16"): bf16 where the bf16 kernel runs on this CPU (kernels::bf16_attention_supported) and
// bf16 mode runs on the bf16 units (kernels::bf16_units), else fp32. And its compute type.
std::string engine_attention_dtype(const std::string& compute_dtype);
kernels::ComputeType attention_compute(const std::string& attention_dtype);

// Key-equivalents of per-row work in flash_attention (softmax rescale, output update),
// fitted to bench_attention's 1K and 16K causal points (docs/planner.md section 6).
inline constexpr double kAttentionRowOverhead = 56;
// Length of the causal self-attention whose rate goes into the profile's device.attention.
inline constexpr int64_t kAttentionCalibratedTokens = 4096;

struct EngineOptions {
  std::string compute_dtype = "bf16";  // GEMM dtype the engine runs (slope run --dtype)
  int64_t block_rows = 1024;           // slope run --chunk
  int64_t moe_rows = model::kDefaultMoeChunk;  // slope run --moe-chunk
  int64_t attention_max_tokens = 32768;
  int reps = 5;
};

struct EngineFigures {
  std::string compute_dtype;
  std::string attention_dtype;  // engine_attention_dtype(compute_dtype): the curve's kernel
  int64_t block_rows = 0;
  int64_t moe_rows = 0;
  int64_t layer_rows = 0;          // the rows the layer was timed on (one MoE call's for MoE)
  double layer_seconds = 0;        // one real layer's token-local work on one block
  double elementwise_seconds = 0;  // its element-wise kernels alone
  double layer_gemm_gflops = 0;    // the layer's GEMM FLOPs / (layer - element-wise) seconds
  double elementwise_bytes_per_token = 0;  // per layer, as the cost model counts them
  double elementwise_gbs = 0;
  double zero_fill_gbs = 0;
  int64_t attention_kv_heads = 0;
  std::vector<std::pair<int64_t, double>> attention_curve;  // (tokens, GFLOP/s exact pairs)
  int64_t attention_curve_query_rows = 0;  // each point: the last this many queries (0: all n)
};

// Throws naming the flag when an option is out of range.
void check_engine_options(const EngineOptions& opt);

// The model's first layers (up to 4, at most ~2 GB of weights) as `slope run` loads them for
// `compute_dtype`; throws naming the fix when the directory has no weights.
std::unique_ptr<model::Model> load_calibration_layers(const std::string& model_dir, const std::string& compute_dtype);

// Every rank of `world` measures at the same time (as ranks run in a prefill); each returns
// its own figures. `model` from load_calibration_layers, `opt` passed check_engine_options.
EngineFigures measure_engine(const model::Model& model, const EngineOptions& opt, parallel::Communicator& world);

}  // namespace slope::cli
