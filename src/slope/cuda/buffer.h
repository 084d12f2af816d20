// An owned block of device memory (cudaMalloc; never managed memory) with typed host copies.
// No CUDA headers: the CPU side and the tests can hold one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "slope/cuda/device.h"

namespace slope::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // throws slope::Error naming the size when out of memory
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  // A buffer holding a copy of host data.
  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    b.upload(host.data(), host.size() * sizeof(T));
    return b;
  }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> h(bytes_ / sizeof(T));
    download(h.data(), h.size() * sizeof(T));
    return h;
  }
  // Every byte set to `value` (tests poison outputs with 0xff: NaN in f32 and bf16).
  void fill_bytes(int value);

  template <typename T>
  T* as() { return static_cast<T*>(ptr_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(ptr_); }
  void* data() { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Plain copies between host memory and device memory the caller does not hold as a
// DeviceBuffer (e.g. an ExpertGroups array).
void copy_to_host(void* host, const void* device, size_t bytes);
void copy_to_device(void* device, const void* host, size_t bytes);

}  // namespace slope::cuda
