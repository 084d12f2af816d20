// A dense row-major tensor: shape, dtype and a (possibly shared, possibly borrowed) buffer.
// Kernels take raw pointers and sizes; Tensor is what the model and engine layers pass around.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slope/core/dtype.h"

namespace slope {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

// Where a tensor's storage lives. Only the host exists today; a device backend allocates
// tensors of its own device and ops dispatch on it (docs/architecture.md, "Where a CUDA kernel
// goes").
enum class Device : uint8_t { CPU, CUDA };

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-initialised, 64-byte aligned storage.
  Tensor(Shape shape, DType dtype);
  // Borrows memory owned elsewhere (an mmap'd file, a device allocation); `keepalive` holds the
  // owner alive. `device` says where `data` lives (a backend's alloc sets it).
  static Tensor view(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive = {},
                     Device device = Device::CPU);

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return int(shape_.size()); }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }
  Device device() const { return device_; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() { return static_cast<T*>(data_); }
  template <typename T> const T* data() const { return static_cast<const T*>(data_); }

  // A copy converted to f32 (F32, BF16 and F16 sources).
  Tensor to_f32() const;
  // Same data, new shape of equal element count.
  Tensor reshape(Shape shape) const;

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
};

}  // namespace slope
