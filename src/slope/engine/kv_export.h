// KV cache files (docs/kv-format.md). Each rank writes the rows it holds as one safetensors
// file with their global positions; kv-merge assembles a complete cache from all shard files.
// Every file carries the identity of its prefill (model fingerprint, dtypes, token ids, a
// prefill id shared by the ranks of one run) and a checksum per tensor, so that shards of
// different prefills are never mixed and corrupted bytes are caught when a file is read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slope/core/dtype.h"
#include "slope/engine/prefill.h"
#include "slope/model/config.h"
#include "slope/model/safetensors.h"
#include "slope/parallel/comm.h"

namespace slope::engine {

inline constexpr const char* kKvFormatVersion = "2";

struct KvWriteOptions {
  DType dtype = DType::F32;  // F32 or BF16
  int rank = 0;
  int world_size = 1;
  std::string model_name;
  int64_t kv_head0 = 0;  // first KV head held (tensor parallelism); the file holds dim(1) heads
  // Identity of the prefill (docs/kv-format.md): equal on every rank of one run.
  std::string model_hash;     // model_fingerprint(model directory)
  std::string prefill_id;     // shared_prefill_id(world)
  std::string compute_dtype;  // the run's --dtype, "f32" or "bf16"
};

// Writes result.k/v of layers [first_layer, first_layer + k.size()) with "positions", the
// prefill's identity (tokens are the prompt's ids) and a checksum per tensor.
void write_kv_shard(const std::string& path, const PrefillResult& result, const std::vector<int32_t>& tokens,
                    const model::ModelConfig& cfg, int first_layer, const KvWriteOptions& opts);

// Checks, before any work, that this rank's shard files of `num_prompts` prompts can be
// written under --kv-out `dir` (the directory is absent or a directory, the files are absent
// or regular files). Throws slope::Error naming the path.
void check_kv_out(const std::string& dir, int rank, int world_size, size_t num_prompts);

// A fingerprint of the model directory: FNV-1a 64 over config.json, and for each safetensors
// file its header, data size and the first and last 64 KiB of its data. Content, not file
// times, so copies of a checkpoint on different nodes agree; reading the whole checkpoint
// would cost as much as loading it, so weights that differ only in the middle of every file
// are not told apart (the prefill id still tells runs apart).
std::string model_fingerprint(const std::string& model_dir);

// A random 64-bit id (hex) drawn on rank 0 of `world` and broadcast, so every rank of one run
// holds the same id and no two runs do (collective: every rank must call it).
std::string shared_prefill_id(parallel::Communicator& world);

// Opens a KV shard and verifies it: format and version, the metadata checksum and every
// tensor's checksum. Throws slope::Error naming the file and the tensor.
std::unique_ptr<model::SafetensorsFile> open_kv_shard(const std::string& path);

// Throws slope::Error naming both files unless shards a and b come from the same prefill.
void check_same_prefill(const model::SafetensorsFile& a, const model::SafetensorsFile& b);

struct KvMergeOptions {
  // Inclusive layer range to merge. Unset: every layer of the model must be present.
  std::optional<std::pair<int, int>> layers;
};

// Reads shard files that together cover positions 0..N-1 exactly once per layer and head and
// writes one file in the same format with rows in global order. Throws slope::Error on gaps,
// overlaps, missing layers, corrupted files or shards of different prefills.
void merge_kv_shards(const std::vector<std::string>& inputs, const std::string& output,
                     const KvMergeOptions& opts = {});

// Parses a --layers value "A-B" (inclusive) or "A".
std::pair<int, int> parse_layer_range(const std::string& text);

// Shard file name for a rank: DIR/kv.rank<r>-of-<n>.safetensors.
std::string kv_shard_path(const std::string& dir, int rank, int world_size);

}  // namespace slope::engine
