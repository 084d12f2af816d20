// model.safetensors.index.json beside two small valid shards (a.safetensors: "x" [2, 3] F32,
// b.safetensors: "y" [4] BF16): WeightStore reads the index and every tensor it names.
#include "fuzz_input.h"
#include "slope/core/error.h"
#include "slope/model/safetensors.h"

namespace {

void write_shards() {
  using slope::DType;
  using slope::Tensor;
  const auto dir = slope::fuzz::work_dir();
  slope::model::write_safetensors((dir / "a.safetensors").string(), {{"x", Tensor({2, 3}, DType::F32)}});
  slope::model::write_safetensors((dir / "b.safetensors").string(), {{"y", Tensor({4}, DType::BF16)}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool shards = (write_shards(), true);
  (void)shards;
  slope::fuzz::write_file("model.safetensors.index.json", data, size);
  try {
    slope::model::WeightStore store(slope::fuzz::work_dir().string());
    volatile size_t sink = 0;
    for (const std::string& name : store.names()) sink = sink + store.get(name).nbytes();
  } catch (const slope::Error&) {
  }
  return 0;
}
