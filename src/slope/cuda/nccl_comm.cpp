// NCCL communicator (nccl_comm.h). The watchdog: each operation records a CUDA event on its
// stream after the NCCL call and queues (event, deadline, name); a thread polls the oldest
// entry every `poll` ms: done -> dropped; past its deadline, or ncclCommGetAsyncError reports
// an error -> ncclCommAbort, which also makes NCCL's kernels return, so the streams drain and
// wait() can throw instead of hanging. The communicator is destroyed (or was aborted) in the
// destructor after the thread has stopped.
#include "slope/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "slope/core/error.h"
#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

#define SLOPE_NCCL_CHECK(call)                                                                          \
  do {                                                                                                  \
    const ncclResult_t slope_nr_ = (call);                                                              \
    if (slope_nr_ != ncclSuccess && slope_nr_ != ncclInProgress)                                        \
      fail("NCCL error in ", #call, ": ", ncclGetErrorString(slope_nr_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

ncclDataType_t nccl_type(ElemType t) {
  switch (t) {
    case ElemType::F32: return ncclFloat32;
    case ElemType::BF16: return ncclBfloat16;
    case ElemType::I32: return ncclInt32;
    case ElemType::I64: return ncclInt64;
    case ElemType::U8: return ncclUint8;
  }
  return ncclUint8;
}

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32: case ElemType::I32: return 4;
    case ElemType::BF16: return 2;
    case ElemType::I64: return 8;
    case ElemType::U8: return 1;
  }
  return 1;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  NcclOptions opt;

  struct Pending {
    cudaEvent_t done;
    std::chrono::steady_clock::time_point deadline;
    const char* what;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // guarded by mu
  bool stop = false;         // guarded by mu
  std::thread watchdog;

  void check_usable() {
    if (aborted.load()) {
      std::lock_guard<std::mutex> lock(mu);
      fail("NCCL communicator was aborted (", abort_reason, "); restart the job");
    }
  }

  // Under mu, so the watchdog's ncclCommGetAsyncError never runs on a communicator being freed.
  void do_abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted.exchange(true)) return;
    abort_reason = reason;
    ncclCommAbort(comm);  // NCCL kernels in flight return; the communicator is gone
  }

  // Queues the completion event of the operation just enqueued on `stream`.
  void track(cudaStream_t stream, const char* what) {
    cudaEvent_t ev;
    SLOPE_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    SLOPE_CUDA_CHECK(cudaEventRecord(ev, stream));
    std::lock_guard<std::mutex> lock(mu);
    pending.push_back({ev, std::chrono::steady_clock::now() + opt.timeout, what});
    cv.notify_one();
  }

  void watch() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, opt.poll);
      while (!pending.empty()) {
        Pending& p = pending.front();
        const cudaError_t q = cudaEventQuery(p.done);
        if (q == cudaSuccess) {
          cudaEventDestroy(p.done);
          pending.pop_front();
          continue;
        }
        std::string reason;
        ncclResult_t async = ncclSuccess;
        if (!aborted.load() && ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          reason = str_cat("NCCL reported ", ncclGetErrorString(async), " during ", p.what);
        else if (q != cudaErrorNotReady)
          reason = str_cat("CUDA error ", cudaGetErrorName(q), " during ", p.what);
        else if (std::chrono::steady_clock::now() > p.deadline)
          reason = str_cat(p.what, " did not finish within ", opt.timeout.count(),
                           " ms (a peer rank died or hangs; raise NcclOptions::timeout for slow steps)");
        if (!reason.empty() && !aborted.load()) {
          lock.unlock();
          do_abort(reason);
          lock.lock();
        }
        break;  // the oldest is still running: look again next poll
      }
    }
  }
};

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

NcclId NcclComm::new_id() {
  ncclUniqueId id{};
  SLOPE_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

static NcclId broadcast_id(MPI_Comm mpi) {
  int rank = 0;
  MPI_Comm_rank(mpi, &rank);
  NcclId id{};
  if (rank == 0) id = NcclComm::new_id();
  const int rc = MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, mpi);
  SLOPE_CHECK(rc == MPI_SUCCESS, "NcclComm: MPI_Bcast of the NCCL unique id failed (MPI error ", rc, ")");
  return id;
}

static int mpi_rank(MPI_Comm mpi) {
  int r = 0;
  MPI_Comm_rank(mpi, &r);
  return r;
}

static int mpi_size(MPI_Comm mpi) {
  int s = 1;
  MPI_Comm_size(mpi, &s);
  return s;
}

NcclComm::NcclComm(MPI_Comm mpi, int device, NcclOptions options)
    : NcclComm(broadcast_id(mpi), mpi_rank(mpi), mpi_size(mpi), device, options) {}

NcclComm::NcclComm(const NcclId& id, int rank, int size, int device, NcclOptions options)
    : impl_(std::make_unique<Impl>()) {
  SLOPE_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclComm: rank ", rank, " outside [0, ", size, ")");
  Impl& m = *impl_;
  m.opt = options;
  m.device = device;
  m.rank = rank;
  m.size = size;
  SLOPE_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  SLOPE_NCCL_CHECK(ncclCommInitRank(&m.comm, size, nid, rank));
  m.watchdog = std::thread([&m] { m.watch(); });
}

NcclComm::~NcclComm() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stop = true;
    m.cv.notify_one();
  }
  if (m.watchdog.joinable()) m.watchdog.join();
  for (auto& p : m.pending) cudaEventDestroy(p.done);
  if (!m.aborted.load() && m.comm) ncclCommDestroy(m.comm);
}

int NcclComm::rank() const { return impl_->rank; }
int NcclComm::size() const { return impl_->size; }
bool NcclComm::aborted() const { return impl_->aborted.load(); }
void NcclComm::abort(const char* reason) { impl_->do_abort(reason); }

void NcclComm::send(const void* buf, size_t count, ElemType type, int peer, Stream stream) {
  impl_->check_usable();
  SLOPE_CHECK(peer >= 0 && peer < size(), "NcclComm::send: peer ", peer, " outside [0, ", size(), ")");
  SLOPE_NCCL_CHECK(ncclSend(buf, count, nccl_type(type), peer, impl_->comm, stream));
  impl_->track(stream, "ncclSend");
}

void NcclComm::recv(void* buf, size_t count, ElemType type, int peer, Stream stream) {
  impl_->check_usable();
  SLOPE_CHECK(peer >= 0 && peer < size(), "NcclComm::recv: peer ", peer, " outside [0, ", size(), ")");
  SLOPE_NCCL_CHECK(ncclRecv(buf, count, nccl_type(type), peer, impl_->comm, stream));
  impl_->track(stream, "ncclRecv");
}

void NcclComm::send_recv(const P2p* ops, size_t n, ElemType type, Stream stream) {
  impl_->check_usable();
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i)  // checked before the group opens, so a bad peer leaves none open
    SLOPE_CHECK(ops[i].peer >= 0 && ops[i].peer < size(), "NcclComm::send_recv: peer ", ops[i].peer, " outside [0, ",
                size(), ")");
  SLOPE_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].send)
      SLOPE_NCCL_CHECK(ncclSend(ops[i].buf, ops[i].count, nccl_type(type), ops[i].peer, impl_->comm, stream));
    else
      SLOPE_NCCL_CHECK(ncclRecv(ops[i].buf, ops[i].count, nccl_type(type), ops[i].peer, impl_->comm, stream));
  }
  SLOPE_NCCL_CHECK(ncclGroupEnd());
  impl_->track(stream, "send_recv");
}

void NcclComm::allreduce(const void* send, void* recv, size_t count, ElemType type, ReduceOp op, Stream stream) {
  impl_->check_usable();
  SLOPE_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), impl_->comm, stream));
  impl_->track(stream, "ncclAllReduce");
}

void NcclComm::all_to_all_v(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                            const size_t* recv_counts, const size_t* recv_displs, ElemType type, Stream stream) {
  impl_->check_usable();
  const size_t es = elem_size(type);
  const ncclDataType_t nt = nccl_type(type);
  SLOPE_NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < size(); ++p) {
    if (send_counts[p])
      SLOPE_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_displs[p] * es, send_counts[p], nt, p,
                                impl_->comm, stream));
    if (recv_counts[p])
      SLOPE_NCCL_CHECK(
          ncclRecv(static_cast<char*>(recv) + recv_displs[p] * es, recv_counts[p], nt, p, impl_->comm, stream));
  }
  SLOPE_NCCL_CHECK(ncclGroupEnd());
  impl_->track(stream, "all_to_all_v");
}

void NcclComm::wait(Stream stream) {
  // Poll rather than block: after an abort the stream drains and the reason is thrown.
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) SLOPE_CUDA_CHECK(q);
    if (impl_->aborted.load()) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  impl_->check_usable();
}

}  // namespace slope::cuda
