// KV shard files as kv-merge reads them (docs/kv-format.md). The input is one shard, or two:
// a 4-byte little-endian length L, then L bytes of the first file and the rest as the second.
// The merged file is written too (into this process's work directory).
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "slope/core/error.h"
#include "slope/engine/kv_export.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> inputs;
  uint32_t first = 0;
  if (size >= 4) std::memcpy(&first, data, 4);
  if (size >= 4 && first <= size - 4) {
    inputs.push_back(slope::fuzz::write_file("kv.rank0-of-2.safetensors", data + 4, first));
    inputs.push_back(slope::fuzz::write_file("kv.rank1-of-2.safetensors", data + 4 + first, size - 4 - first));
  } else {
    inputs.push_back(slope::fuzz::write_file("kv.rank0-of-1.safetensors", data, size));
  }
  try {
    slope::engine::merge_kv_shards(inputs, (slope::fuzz::work_dir() / "merged.safetensors").string());
  } catch (const slope::Error&) {
  }
  return 0;
}
