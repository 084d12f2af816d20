// The CUDA implementation of the op interface (ops/backend.h) and of the data plane
// (parallel/data_plane.h): what `slope run --device cuda` hands the engine. Each op calls the
// kernel of the same contract in this folder, on the default stream; the data plane is NCCL on
// its own stream, ordered after the compute stream's work. Compiled and linked; not yet run on a
// GPU (docs/cuda.md). No CUDA headers.
#pragma once

#include "slope/ops/backend.h"
#include "slope/parallel/data_plane.h"

namespace slope::cuda {

// The backend of the current CUDA device (cudaSetDevice before the first call).
const ops::Backend& backend();

// NCCL data planes over each communicator the engine makes (bootstrapped through it: rank 0's
// unique id broadcast), on CUDA device `device`; waits are bounded by `timeout_s`.
parallel::DataPlaneFactory nccl_data_plane(int device, double timeout_s);

}  // namespace slope::cuda
