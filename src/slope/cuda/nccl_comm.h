// An NCCL communicator on device buffers, bootstrapped through MPI (rank 0 makes the unique id,
// MPI_Bcast gives it to the others), with point-to-point, all-reduce and all-to-all(v) on a
// caller's stream, and a watchdog: every operation is timed by an event, and a background
// thread aborts the communicator (ncclCommAbort) when one outlives its deadline or NCCL
// reports an asynchronous error (ncclCommGetAsyncError), so a dead peer ends in a slope::Error,
// not a hang. Non-copyable RAII, like the MPI communicator (parallel/mpi_comm.h).
//
// Standalone for now: the data-plane interface it will implement is being defined in
// parallel/. No CUDA or NCCL headers here (MPI's only). Compiled and linked; not yet run on a
// GPU (docs/cuda.md). HIP: RCCL has this API, so a HIP build needs only hipify of the .cpp.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "slope/cuda/device.h"

namespace slope::cuda {

enum class ElemType { F32, BF16, I32, I64, U8 };
enum class ReduceOp { Sum, Max, Min };

struct NcclOptions {
  // An operation not finished this long after it was enqueued aborts the communicator.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds poll{5};  // how often the watchdog looks
};

// An NCCL unique id (ncclUniqueId's 128 bytes), opaque to callers.
using NcclId = std::array<char, 128>;

class NcclComm {
 public:
  // Collective over `mpi`: every rank calls it, with the CUDA device it drives. Rank 0 makes
  // the id (new_id) and MPI_Bcast hands it to the others.
  NcclComm(MPI_Comm mpi, int device, NcclOptions options = {});
  // Without MPI: every one of `size` ranks passes the same id (from new_id on one of them,
  // carried by any other means). Also how a single process drives one GPU as one rank.
  NcclComm(const NcclId& id, int rank, int size, int device, NcclOptions options = {});
  static NcclId new_id();
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const;
  int size() const;

  // Counts are elements of `type`. All enqueue on `stream` and return at once; wait() waits.
  void send(const void* buf, size_t count, ElemType type, int peer, Stream stream);
  void recv(void* buf, size_t count, ElemType type, int peer, Stream stream);
  void allreduce(const void* send, void* recv, size_t count, ElemType type, ReduceOp op, Stream stream);
  // All-to-all-v as one NCCL group of sends and receives: to peer p go send_counts[p] elements
  // from send + send_displs[p]; from peer p come recv_counts[p] into recv + recv_displs[p].
  void all_to_all_v(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                    const size_t* recv_counts, const size_t* recv_displs, ElemType type, Stream stream);

  // Point-to-point operations posted together as one NCCL group (what a ring step needs: its
  // sends and receives must not wait on each other).
  struct P2p {
    bool send = true;
    void* buf = nullptr;
    size_t count = 0;
    int peer = 0;
  };
  void send_recv(const P2p* ops, size_t n, ElemType type, Stream stream);
  // Waits for `stream`; throws slope::Error if the watchdog aborted the communicator meanwhile
  // (timeout or NCCL error), naming the reason.
  void wait(Stream stream);
  // Aborts now (e.g. another rank reported a failure); later operations throw.
  void abort(const char* reason);
  bool aborted() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slope::cuda
