// MPI implementation of Communicator (host memory), and the RAII owner of MPI itself.
//
//   slope::parallel::MpiRuntime mpi(argc, argv);         // MPI_Init_thread .. MPI_Finalize
//   auto world = mpi.world();                              // unique_ptr<Communicator>
//   Mesh mesh(*world, {.ring = 2, .ulysses = 4});
//
// Errors: communicators use MPI_ERRORS_RETURN, and every MPI error code becomes a slope::Error
// carrying MPI's message. Waits poll MPI_Test against a deadline (default 300 s) and throw
// "rank X: timed out after N s waiting for <op> from rank Y — a peer may have died".
// Polling backs off (yield, then short sleeps) so oversubscribed ranks leave the cores to
// ranks that compute.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "slope/parallel/comm.h"

namespace slope::parallel {

inline constexpr double kDefaultTimeoutSeconds = 300.0;

// Initialises MPI (MPI_THREAD_SERIALIZED: the thread that created the runtime calls MPI, and
// while it computes a BackgroundProgress thread may test its transfers; kernels' OpenMP threads
// never call MPI) and finalises it on destruction. Started without mpirun,
// MPI comes up as a singleton world of size 1. If MPI is already initialised (a test harness
// did it), it is used and left running. Only one MpiRuntime may exist at a time.
class MpiRuntime {
 public:
  MpiRuntime();
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // A new communicator over all processes (a dup of MPI_COMM_WORLD), named "world".
  std::unique_ptr<Communicator> world(double timeout_seconds = kDefaultTimeoutSeconds) const;
  int world_rank() const;
  int world_size() const;
  // Ranks of this job on this node (collective over all ranks).
  int ranks_on_this_node() const;
  // The node's cores shared evenly by its ranks, at least 1 (collective over all ranks).
  int default_threads_per_rank() const;
  int thread_level() const { return provided_; }

 private:
  void init(int* argc, char*** argv);
  bool owns_ = false;
  int provided_ = 0;
};

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction) unless it is MPI_COMM_WORLD/SELF.
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_seconds);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) const override;

  double timeout() const override { return timeout_; }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  const CommStats& stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }
  bool progress_from_helper_thread() const override;

  Request isend_bytes(const void* data, size_t bytes, int dest, Tag tag) override;
  Request irecv_bytes(void* data, size_t bytes, int src, Tag tag) override;

  void barrier() override;
  void broadcast_bytes(void* data, size_t bytes, int root) override;
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, float* recv,
                 const std::vector<int64_t>& recv_counts,
                 const std::vector<int64_t>& recv_displs) override;
  void allgather_bytes(const void* send, size_t bytes, void* recv) override;
  std::vector<int64_t> allgatherv_bytes(const void* send, size_t bytes,
                                        std::vector<uint8_t>& recv) override;
  std::vector<int64_t> gatherv_bytes(const void* send, size_t bytes, std::vector<uint8_t>& recv,
                                     int root) override;
  void allreduce(float* data, size_t count, ReduceOp op) override;
  void allreduce(double* data, size_t count, ReduceOp op) override;
  void allreduce(int64_t* data, size_t count, ReduceOp op) override;
  void reduce(double* data, size_t count, ReduceOp op, int root) override;

 private:
  // Waits for a collective's request with the deadline; `what` names it in errors.
  void wait_collective(MPI_Request& req, const char* what);
  void allreduce_typed(void* data, size_t count, MPI_Datatype type, ReduceOp op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_ = kDefaultTimeoutSeconds;
  CommStats stats_;
};

// Throws slope::Error with MPI's message if `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* what);

}  // namespace slope::parallel
