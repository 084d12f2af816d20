#include "slope/cuda/device.h"

#include "slope/cuda/check.cuh"

namespace slope::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = str_cat("cudaGetDeviceCount: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    cudaGetLastError();  // clear the sticky-free error so later calls do not report it
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found 0 devices";
  return n;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  SLOPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return {p.name, p.major, p.minor, p.multiProcessorCount, int64_t(p.totalGlobalMem),
          int64_t(p.sharedMemPerBlockOptin)};
}

void synchronize(Stream stream) { SLOPE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

void set_device(int device) { SLOPE_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace slope::cuda
