// The data plane: payload traffic between ranks, on the buffers of one device. Ring K/V blocks,
// halo rows, Ulysses all-to-alls, pipeline activations and tensor-parallel all-reduces move only
// through a DataPlane; the control plane (Communicator: shapes, counts, agreement, reports,
// requests shipped by a coordinator) stays on the host. The parallel algorithms are written
// against this interface, so an NCCL data plane on device memory replaces the host one by
// passing another DataPlaneFactory to Mesh and Topology, without touching parallel/'s code.
//
// Ordering: operations are enqueued on stream() where the backend has streams (the host has
// none: a null Stream) and a Request completes when the transfer has completed on the device.
// The counters (stats()) are the data plane's own: bytes moved and seconds blocked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/parallel/comm.h"

namespace slope::parallel {

// A backend's stream (cudaStream_t, hipStream_t): where device work and transfers are ordered.
// Null on the host.
struct Stream {
  void* handle = nullptr;
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  DataPlane() = default;
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  virtual Device device() const = 0;  // where the buffers passed in live
  virtual Stream stream() const { return {}; }
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // Non-blocking point to point, `count` floats.
  virtual Request isend(const float* data, size_t count, int dest, Tag tag) = 0;
  virtual Request irecv(float* data, size_t count, int src, Tag tag) = 0;
  // Blocking (on the host) or stream-ordered (on a device) collectives, with the deadline of
  // the communicator the plane was made from. Layouts as Communicator::alltoallv.
  virtual void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                         const std::vector<int64_t>& send_displs, float* recv,
                         const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& recv_displs) = 0;
  virtual void allreduce_sum(float* data, size_t count) = 0;

  virtual const CommStats& stats() const = 0;
  // True if a BackgroundProgress thread may drive this plane's requests (comm.h).
  virtual bool progress_from_helper_thread() const { return false; }
};

// Makes the data plane over the ranks of `comm` (same ranks, same order). Collective over comm:
// a device backend bootstraps its own communicator through it (an NCCL unique id broadcast).
using DataPlaneFactory = std::function<std::unique_ptr<DataPlane>(Communicator& comm)>;

// Host memory over a Communicator (MPI): the CPU backend's data plane. Its traffic is counted
// in the communicator's stats, which stats() returns.
class HostDataPlane final : public DataPlane {
 public:
  explicit HostDataPlane(Communicator& comm) : comm_(comm) {}

  Device device() const override { return Device::CPU; }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const std::string& name() const override { return comm_.name(); }
  Request isend(const float* data, size_t count, int dest, Tag tag) override {
    return comm_.isend(data, count, dest, tag);
  }
  Request irecv(float* data, size_t count, int src, Tag tag) override {
    return comm_.irecv(data, count, src, tag);
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, float* recv,
                 const std::vector<int64_t>& recv_counts,
                 const std::vector<int64_t>& recv_displs) override {
    comm_.alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
  void allreduce_sum(float* data, size_t count) override { comm_.allreduce(data, count, ReduceOp::Sum); }
  const CommStats& stats() const override { return comm_.stats(); }
  bool progress_from_helper_thread() const override { return comm_.progress_from_helper_thread(); }

 private:
  Communicator& comm_;
};

// The default factory: a HostDataPlane over the communicator.
DataPlaneFactory host_data_plane();

}  // namespace slope::parallel
