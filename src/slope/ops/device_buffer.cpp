// ops::DeviceBuffer (ops/backend.h): grow-only storage on any backend's device.
#include <algorithm>

#include "slope/ops/backend.h"

namespace slope::ops {

void DeviceBuffer::resize(size_t n) {
  const size_t capacity = storage_.empty() ? 0 : size_t(storage_.numel());  // (an empty Tensor's numel is 1)
  if (n > capacity) {
    // Geometric growth, as std::vector: appending chunk after chunk copies O(total) in all.
    Tensor grown = ops_->alloc({int64_t(std::max(n, capacity + capacity / 2))}, DType::F32);
    if (size_ > 0) ops_->copy(grown.data<float>(), storage_.data<float>(), int64_t(size_));
    storage_ = std::move(grown);
  }
  size_ = n;
}

}  // namespace slope::ops
