// Element types SLOPE reads and computes with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slope {

enum class DType : uint8_t { F32, BF16, F16, U8, I32, I64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; throws slope::Error naming the unsupported type.
DType parse_dtype(std::string_view s);

}  // namespace slope
