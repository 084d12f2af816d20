// The data plane on NCCL (parallel/data_plane.h): device buffers, a communication stream of its
// own. Before any transfer the communication stream waits for the work already queued on the
// compute (default) stream, so a send reads what the kernels wrote; a Request completes when its
// transfer has completed on the device, and the host waits for it before the compute stream
// reads a received buffer (the parallel algorithms wait() before they use one).
//
// Point-to-point operations are posted lazily: isend/irecv queue them, and the first test() or
// wait() of any of them posts the whole queue as one NCCL group. A ring step posts its receives
// and sends together, which NCCL requires (a send and a receive posted one after the other on
// each rank would each wait for the other rank's matching call).
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/cuda/backend.h"
#include "slope/cuda/nccl_comm.h"
#include "slope/parallel/mpi_comm.h"

namespace slope::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

class NcclDataPlane final : public parallel::DataPlane {
 public:
  NcclDataPlane(parallel::Communicator& comm, int device, double timeout_s) : comm_(comm) {
    auto* mpi = dynamic_cast<parallel::MpiCommunicator*>(&comm);
    SLOPE_CHECK(mpi, "the NCCL data plane bootstraps over an MPI communicator; '", comm.name(), "' is not one");
    NcclOptions o;
    o.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
    nccl_ = std::make_unique<NcclComm>(mpi->handle(), device, o);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~NcclDataPlane() override {
    cudaEventDestroy(compute_done_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::CUDA; }
  parallel::Stream stream() const override { return {stream_}; }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const std::string& name() const override { return comm_.name(); }

  parallel::Request isend(const float* data, size_t count, int dest, parallel::Tag) override {
    stats_.bytes_sent += int64_t(count * sizeof(float));
    return queue({true, const_cast<float*>(data), count, dest});
  }
  parallel::Request irecv(float* data, size_t count, int src, parallel::Tag) override {
    stats_.bytes_received += int64_t(count * sizeof(float));
    return queue({false, data, count, src});
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_displs,
                 float* recv, const std::vector<int64_t>& recv_counts,
                 const std::vector<int64_t>& recv_displs) override {
    flush();
    after_compute();
    std::vector<size_t> sc(send_counts.begin(), send_counts.end()), sd(send_displs.begin(), send_displs.end()),
        rc(recv_counts.begin(), recv_counts.end()), rd(recv_displs.begin(), recv_displs.end());
    for (int p = 0; p < size(); ++p)
      if (p != rank()) stats_.bytes_sent += int64_t(sc[p] * sizeof(float)), stats_.bytes_received += int64_t(rc[p] * sizeof(float));
    nccl_->all_to_all_v(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), ElemType::F32, stream_);
    wait_stream();
  }
  void allreduce_sum(float* data, size_t count) override {
    flush();
    after_compute();
    stats_.bytes_sent += int64_t(count * sizeof(float));
    stats_.bytes_received += int64_t(count * sizeof(float));
    nccl_->allreduce(data, data, count, ElemType::F32, ReduceOp::Sum, stream_);
    wait_stream();
  }
  const parallel::CommStats& stats() const override { return stats_; }

 private:
  // A posted group's completion: an event recorded after it, shared by its requests.
  struct Done {
    cudaEvent_t event = nullptr;
    ~Done() {
      if (event) cudaEventDestroy(event);
    }
  };
  class Pending final : public parallel::Request::Impl {
   public:
    Pending(NcclDataPlane* plane, std::shared_ptr<Done> done) : plane_(plane), done_(std::move(done)) {}
    bool test() override {
      plane_->flush();
      return cudaEventQuery(done_->event) == cudaSuccess;
    }
    void wait() override {
      plane_->flush();
      const double t0 = now_seconds();
      while (cudaEventQuery(done_->event) == cudaErrorNotReady) {
        if (plane_->nccl_->aborted()) plane_->nccl_->wait(plane_->stream_);  // throws the reason
      }
      plane_->stats_.wait_seconds += now_seconds() - t0;
      plane_->nccl_->wait(plane_->stream_);  // surfaces an abort that raced with completion
    }

   private:
    NcclDataPlane* plane_;
    std::shared_ptr<Done> done_;
  };

  parallel::Request queue(NcclComm::P2p op) {
    queued_.push_back(op);
    return parallel::Request(std::make_unique<Pending>(this, group_));
  }
  void after_compute() {
    check(cudaEventRecord(compute_done_, nullptr), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, compute_done_, 0), "cudaStreamWaitEvent");
  }
  void flush() {
    if (queued_.empty()) return;
    after_compute();
    nccl_->send_recv(queued_.data(), queued_.size(), ElemType::F32, stream_);
    // Every request of the group completes with it: one event, shared by their Pending.
    check(cudaEventCreateWithFlags(&group_->event, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(group_->event, stream_), "cudaEventRecord");
    queued_.clear();
    group_ = std::make_shared<Done>();
  }
  void wait_stream() {
    const double t0 = now_seconds();
    nccl_->wait(stream_);
    stats_.wait_seconds += now_seconds() - t0;
  }

  parallel::Communicator& comm_;
  std::unique_ptr<NcclComm> nccl_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  std::vector<NcclComm::P2p> queued_;             // posted at the next flush, as one group
  std::shared_ptr<Done> group_ = std::make_shared<Done>();  // the completion of queued_
  parallel::CommStats stats_;
};

}  // namespace

parallel::DataPlaneFactory nccl_data_plane(int device, double timeout_s) {
  return [device, timeout_s](parallel::Communicator& comm) -> std::unique_ptr<parallel::DataPlane> {
    return std::make_unique<NcclDataPlane>(comm, device, timeout_s);
  };
}

}  // namespace slope::cuda
