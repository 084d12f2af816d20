// Engine figures for a hardware profile: how SLOPE's own kernels run on this machine at one
// model's shapes (`slope calibrate --model`; calibrate_engine.cpp says what is timed).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "slope/model/config.h"
#include "slope/parallel/comm.h"

namespace slope::cli {

struct EngineOptions {
  std::string compute_dtype = "bf16";  // GEMM dtype the engine runs (slope run --dtype)
  int64_t block_rows = 1024;           // slope run --chunk
  int64_t attention_max_tokens = 32768;
  int reps = 5;
};

struct EngineFigures {
  std::string compute_dtype;
  int64_t block_rows = 0;
  double layer_gemm_gflops = 0;            // one layer's GEMMs on one block, compute_dtype
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

// Every rank of `world` measures at the same time (as ranks run in a prefill); each returns
// its own figures.
EngineFigures measure_engine(const model::ModelConfig& cfg, const EngineOptions& opt, parallel::Communicator& world);

}  // namespace slope::cli
