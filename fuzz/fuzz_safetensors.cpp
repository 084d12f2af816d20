// A .safetensors file: header length, JSON header, data. Every tensor the header lists is
// fetched and its first and last bytes read, so a view outside the mapping is an ASan report.
#include "fuzz_input.h"
#include "slope/core/error.h"
#include "slope/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = slope::fuzz::write_file("model.safetensors", data, size);
  try {
    slope::model::SafetensorsFile f(path);
    volatile uint8_t sink = 0;
    for (const std::string& name : f.names()) {
      const slope::Tensor t = f.get(name);
      if (t.nbytes() > 0) {
        const auto* p = static_cast<const uint8_t*>(t.raw());
        sink = sink + p[0] + p[t.nbytes() - 1];
      }
    }
    for (const auto& [k, v] : f.metadata()) sink = sink + uint8_t(k.size() + v.size());
  } catch (const slope::Error&) {
  }
  return 0;
}
