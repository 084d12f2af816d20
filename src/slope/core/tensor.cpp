#include "slope/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

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
  // Tensors of 2 MiB or more start on a 2 MiB boundary, fill whole 2 MiB pages and ask for
  // transparent huge pages (where the system's THP setting is "madvise"; "always" gives them
  // anyway and "never" ignores the advice). Attention reads each query row and writes each
  // output row a whole row of heads apart (4 KiB at 16 heads of head_dim 64), a page each on
  // 4 KiB pages: whole window-128 calls ran 1.03-1.06x faster on caller buffers in huge pages
  // (docs/performance.md, twenty-fourth window of issue 14).
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = nbytes() >= kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t bytes = nbytes() ? (nbytes() + align - 1) / align * align : 64;
  void* p = std::aligned_alloc(align, bytes);
  SLOPE_CHECK(p, "out of memory allocating ", bytes, " bytes for a tensor of shape ", shape_str(shape_));
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: no error to act on
  // Zeroing is the first touch of fresh pages: the page faults (the kernel clears each page)
  // cost more than the stores. Large tensors (a prefill's KV cache, its layer buffers) are
  // zeroed by all threads, so the faults are taken on every core and not on one while the others
  // wait; in parts of a huge page, so that no two threads fault on one.
  constexpr size_t kPart = kHuge;
  const int64_t parts = static_cast<int64_t>((bytes + kPart - 1) / kPart);
#pragma omp parallel for schedule(static) if (parts >= 2)
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
