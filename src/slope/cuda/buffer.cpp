#include "slope/cuda/buffer.h"

#include <utility>

#include "slope/cuda/check.cuh"

namespace slope::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    cudaGetLastError();
    fail("cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorString(e),
         "); use a shorter prompt or a mesh that spreads the model over more GPUs");
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failed free leaks at worst
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  SLOPE_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload: ", bytes, " bytes at offset ", offset,
              " do not fit in ", bytes_);
  if (bytes) SLOPE_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  SLOPE_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download: ", bytes, " bytes at offset ", offset,
              " exceed ", bytes_);
  if (bytes) SLOPE_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) SLOPE_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

void copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes) SLOPE_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

void copy_to_device(void* device, const void* host, size_t bytes) {
  if (bytes) SLOPE_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

}  // namespace slope::cuda
