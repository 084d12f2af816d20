#include "slope/core/dtype.h"

#include "slope/core/error.h"

namespace slope {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::U8, DType::I32, DType::I64})
    if (dtype_name(t) == s) return t;
  fail("unsupported tensor dtype '", s, "' (supported: F32, BF16, F16, U8, I32, I64)");
}

}  // namespace slope
