#include "slope/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "slope/core/error.h"
#include "slope/core/half.h"

namespace slope {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(Shape shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype) {
  size_t bytes = (nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  SLOPE_CHECK(p, "out of memory allocating ", bytes, " bytes for a tensor of shape ", shape_str(shape_));
  // Zeroing is the first touch of fresh pages: the page faults (the kernel clears each page)
  // cost more than the stores. Large tensors (a prefill's KV cache, its layer buffers) are
  // zeroed by all threads, so the faults are taken on every core and not on one while the others
  // wait.
  constexpr size_t kPart = size_t{1} << 20;
  const int64_t parts = static_cast<int64_t>((bytes + kPart - 1) / kPart);
#pragma omp parallel for schedule(static) if (parts >= 4)
  for (int64_t i = 0; i < parts; ++i) {
    const size_t b = static_cast<size_t>(i) * kPart;
    std::memset(static_cast<char*>(p) + b, 0, std::min(kPart, bytes - b));
  }
  storage_ = std::shared_ptr<void>(p, std::free);
  data_ = p;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive, Device device) {
  Tensor t;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::move(keepalive);
  t.data_ = data;
  return t;
}

Tensor Tensor::to_f32() const {
  Tensor out(shape_, DType::F32);
  float* dst = out.data<float>();
  const int64_t n = numel();
  switch (dtype_) {
    case DType::F32: std::memcpy(dst, data_, nbytes()); break;
    case DType::BF16: {
      auto* src = data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
      break;
    }
    case DType::F16: {
      auto* src = data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
      break;
    }
    default: fail("cannot convert a ", dtype_name(dtype_), " tensor to F32");
  }
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  SLOPE_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace slope
