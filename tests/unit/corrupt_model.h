// A copy of a test model with one weight element replaced by NaN or Inf, in a fresh temporary
// directory: for the tests that non-finite weights never give a result.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "slope/model/safetensors.h"

namespace slope::testing {

// Copies MODEL_DIR (config.json and a single model.safetensors) to a new directory under the
// system temp dir named after `tag`, with element `element` of tensor `name` set to `value`
// (NaN or ±Inf, written in the tensor's dtype; a U8 tensor gets 255). Returns the new directory.
inline std::filesystem::path corrupt_model_copy(const std::filesystem::path& model_dir, const std::string& tag,
                                                const std::string& name, float value, int64_t element = 0) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("slope_corrupt_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  for (const auto& f : fs::directory_iterator(model_dir))
    if (f.path().extension() != ".safetensors") fs::copy_file(f.path(), out / f.path().filename());
  model::SafetensorsFile in((model_dir / "model.safetensors").string());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : in.names()) {
    const Tensor src = in.get(n);
    Tensor t(src.shape(), src.dtype());
    std::memcpy(t.raw(), src.raw(), src.nbytes());
    if (n == name) {
      if (t.dtype() == DType::F32) {
        t.data<float>()[element] = value;
      } else if (t.dtype() == DType::U8) {  // an MXFP4 scale: 255 is e8m0's NaN
        t.data<uint8_t>()[element] = 255;
      } else {  // BF16 / F16 bit patterns of NaN and ±Inf
        const bool bf16 = t.dtype() == DType::BF16;
        uint16_t bits = std::isnan(value) ? (bf16 ? 0x7fc0 : 0x7e00) : (bf16 ? 0x7f80 : 0x7c00);
        if (!std::isnan(value) && value < 0) bits |= 0x8000;
        t.data<uint16_t>()[element] = bits;
      }
    }
    tensors.emplace_back(n, std::move(t));
  }
  model::write_safetensors((out / "model.safetensors").string(), tensors, in.metadata());
  return out;
}

}  // namespace slope::testing
