// KV cache files (docs/kv-format.md). Each rank writes the rows it holds as one safetensors
// file with their global positions; kv-merge assembles a complete cache from all shard files.
#pragma once

#include <string>
#include <vector>

#include "slope/core/dtype.h"
#include "slope/engine/prefill.h"
#include "slope/model/config.h"

namespace slope::engine {

inline constexpr const char* kKvFormatVersion = "1";

struct KvWriteOptions {
  DType dtype = DType::F32;  // F32 or BF16
  int rank = 0;
  int world_size = 1;
  std::string model_name;
  int64_t kv_head0 = 0;  // first KV head held (tensor parallelism); the file holds dim(1) heads
};

// Writes result.k/v of layers [first_layer, first_layer + k.size()) with "positions".
void write_kv_shard(const std::string& path, const PrefillResult& result,
                    const model::ModelConfig& cfg, int first_layer, const KvWriteOptions& opts);

// Reads shard files that together cover positions 0..N-1 exactly once per layer and writes
// one file in the same format with rows in global order. Throws slope::Error on gaps, overlaps
// or shards from different prompts/models.
void merge_kv_shards(const std::vector<std::string>& inputs, const std::string& output);

// Shard file name for a rank: DIR/kv.rank<r>-of-<n>.safetensors.
std::string kv_shard_path(const std::string& dir, int rank, int world_size);

}  // namespace slope::engine
