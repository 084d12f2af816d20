// Engine figures for a hardware profile: how SLOPE's own kernels run on this machine at one
// model's shapes (`slope calibrate --model`; calibrate_engine.cpp says what is timed).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "slope/core/sys.h"
#include <memory>

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

struct EngineOptions {
  std::string compute_dtype = "bf16";  // GEMM dtype the engine runs (slope run --dtype)
  int64_t block_rows = 1024;           // slope run --chunk
  int64_t attention_max_tokens = 32768;
  int reps = 5;
};

struct EngineFigures {
  std::string compute_dtype;
  int64_t block_rows = 0;
  double layer_seconds = 0;        // one real layer's token-local work on one block
  double elementwise_seconds = 0;  // its element-wise kernels alone
  double layer_gemm_gflops = 0;    // the layer's GEMM FLOPs / (layer - element-wise) seconds
  double elementwise_bytes_per_token = 0;  // per layer, as the cost model counts them
  double elementwise_gbs = 0;
  double zero_fill_gbs = 0;
  int64_t attention_block_q = 0, attention_block_k = 0;
  double attention_row_overhead = 0;
  int64_t attention_kv_heads = 0;
  std::vector<std::pair<int64_t, double>> attention_curve;  // (tokens, GFLOP/s exact pairs)
};

// Throws naming the flag when an option is out of range.
void check_engine_options(const EngineOptions& opt);

// The model's first layers (up to 4, at most ~2 GB of weights) as `slope run` loads them for
// `compute_dtype`; throws naming the fix when the directory has no weights.
std::unique_ptr<model::Model> load_calibration_layers(const std::string& model_dir, const std::string& compute_dtype);

// Every rank of `world` measures at the same time (as ranks run in a prefill); each returns
// its own figures. `model` from load_calibration_layers.
EngineFigures measure_engine(const model::Model& model, const EngineOptions& opt, parallel::Communicator& world);

}  // namespace slope::cli
