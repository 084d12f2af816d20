// kv-merge on shards with corrupt metadata or tensors: a slope::Error naming the file and the
// field, never std::invalid_argument ("internal error") or an allocation sized by a corrupt
// number. Found by fuzz/fuzz_kv_shard.cpp (issue 15, fuzzing).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/kv_export.h"
#include "slope/model/safetensors.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

struct Shard {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
};

// A complete one-file cache: 3 positions, 2 KV heads of 4, one layer.
Shard valid_shard() {
  Shard s;
  Tensor pos({3}, DType::I64);
  for (int i = 0; i < 3; ++i) pos.data<int64_t>()[i] = i;
  s.tensors = {{"positions", pos}, {"layers.0.k", Tensor({3, 2, 4}, DType::F32)}, {"layers.0.v", Tensor({3, 2, 4}, DType::F32)}};
  s.meta = {{"format", "slope-kv"}, {"format_version", engine::kKvFormatVersion}, {"model", "m"},
            {"total_tokens", "3"},  {"num_layers", "1"},   {"first_layer", "0"},
            {"layer_count", "1"},   {"num_kv_heads", "2"}, {"kv_head0", "0"},
            {"head_dim", "4"},      {"layer_windows", "0"}, {"rank", "0"}, {"world_size", "1"}};
  return s;
}

// Merges `s` written to a temp file; the error message, or "" if the merge succeeded.
std::string merge_error(const Shard& s) {
  const fs::path d = fs::temp_directory_path() / ("slope_kv_input_" + std::to_string(getpid()));
  fs::create_directories(d);
  const std::string in = (d / "kv.rank0-of-1.safetensors").string(), out = (d / "merged.safetensors").string();
  model::write_safetensors(in, s.tensors, s.meta);
  try {
    engine::merge_kv_shards({in}, out);
  } catch (const Error& e) {
    fs::remove_all(d);
    return e.what();
  }
  fs::remove_all(d);
  return "";
}

TEST(KvMergeInput, ValidShardMerges) { EXPECT_EQ(merge_error(valid_shard()), ""); }

TEST(KvMergeInput, BadNumbersInMetadataAreErrors) {
  const std::pair<const char*, const char*> bad[] = {
      {"total_tokens", "12x"},     {"total_tokens", "99999999999999999999"}, {"total_tokens", "-1"},
      {"total_tokens", "1000000000"},  // more positions than the file holds
      {"first_layer", "x"},        {"layer_count", "1e3"},  {"layer_count", "-2"},
      {"kv_head0", "-5"},          {"kv_head0", "3"},       {"num_kv_heads", "0"},
      {"num_kv_heads", ""},        {"head_dim", "99999999"}};
  for (const auto& [key, value] : bad) {
    Shard s = valid_shard();
    s.meta[key] = value;
    const std::string e = merge_error(s);
    EXPECT_NE(e, "") << key << " = '" << value << "' was accepted";
  }
}

TEST(KvMergeInput, PositionsMustBeI64) {
  Shard s = valid_shard();
  s.tensors[0].second = Tensor({3}, DType::F32);
  EXPECT_NE(merge_error(s).find("positions must be I64"), std::string::npos);
  Shard wide = valid_shard();
  wide.tensors[1].second = Tensor({3, 2, 8}, DType::F32);  // head_dim 8, metadata says 4
  EXPECT_NE(merge_error(wide).find("head_dim 4"), std::string::npos);
}

}  // namespace
