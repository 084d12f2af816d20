// The CUDA backend's view of the machine, in a header the CPU side can include (no CUDA
// headers): whether a device is usable, and the stream type every kernel entry point takes.
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*; declared here so callers need no CUDA headers

namespace slope::cuda {

// A CUDA stream; nullptr is the legacy default stream.
using Stream = CUstream_st*;

// Number of usable CUDA devices; 0 when there is no driver or no device, with the reason in
// *why (e.g. "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected").
int device_count(std::string* why = nullptr);

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  int64_t global_memory = 0;  // bytes
  int64_t shared_memory_per_block_optin = 0;
};
DeviceInfo device_info(int device = 0);

// Waits for all work on `stream` and throws slope::Error if any of it failed.
void synchronize(Stream stream = nullptr);
// Makes `device` the calling thread's current CUDA device.
void set_device(int device);

}  // namespace slope::cuda
