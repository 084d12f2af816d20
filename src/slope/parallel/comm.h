// The communicator interface every parallel algorithm is written against. MPI on host memory
// implements it today (mpi_comm.h); an NCCL implementation for device memory can fill the same
// interface later. No rank or communicator state is global: a Communicator (or a Mesh holding
// several) is passed down to whatever needs it.
//
// Every blocking operation waits with a deadline (timeout()) and throws slope::Error naming the
// operation and the peer instead of hanging when a peer has died. Counters (stats()) record
// bytes moved and seconds spent waiting, per communicator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace slope::parallel {

// Message tags: one per kind of traffic, so concurrent exchanges never match each other.
enum class Tag : int {
  Generic = 1,
  RingKV = 10,    // ring attention: K/V blocks passed around the ring
  Halo = 20,      // sliding-window halo rows
  Pipeline = 30,  // pipeline-parallel activations
  Gather = 40,    // results gathered to one rank
  Control = 50,   // requests shipped by a coordinator rank (engine::PrefillEngine)
  Test = 90,
};

enum class ReduceOp { Sum, Max };

// Counters of one communicator, accumulated since construction or reset.
struct CommStats {
  int64_t bytes_sent = 0;      // payload bytes this rank handed to the transport (not to itself)
  int64_t bytes_received = 0;  // payload bytes this rank received from other ranks
  double wait_seconds = 0;     // time blocked in wait() / collectives
};

// A pending non-blocking operation. Movable, not copyable. wait() throws slope::Error on a
// transport error or when the communicator's timeout passes; destroying a still-pending
// request waits for it (a request must not outlive its buffers).
class Request {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;  // true once complete (then idempotent)
    virtual void wait() = 0;
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  ~Request();

  bool valid() const { return impl_ != nullptr; }
  // Advances the transfer; true if complete (an empty request is complete).
  bool test() { return !impl_ || impl_->test(); }
  void wait() {
    if (impl_) impl_->wait();
  }

 private:
  std::unique_ptr<Impl> impl_;
};

// Waits for all requests (in order); rethrows the first error.
void wait_all(std::vector<Request>& requests);
// Tests all requests once (drives progress); true if all are complete.
bool test_all(std::vector<Request>& requests);

// Drives `requests` toward completion from a helper thread while the caller computes, for
// transports that move a large message only while the host is inside MPI (shared memory without
// CMA single-copy, TCP): polling between the caller's kernel calls leaves most of such a
// transfer for the final wait. The thread only tests (MPI_Test, with short sleeps between
// rounds), so it needs the communicator to allow calls from another thread while this one makes
// none (MPI_THREAD_SERIALIZED: Communicator::progress_from_helper_thread()). The caller must not
// touch `requests` or call the communicator until finish(). A failed test ends the thread; the
// caller's wait_all then reports it.
class BackgroundProgress {
 public:
  // Starts the thread when `enabled` and there is something to complete.
  BackgroundProgress(std::vector<Request>& requests, bool enabled);
  ~BackgroundProgress() { finish(); }
  BackgroundProgress(const BackgroundProgress&) = delete;
  BackgroundProgress& operator=(const BackgroundProgress&) = delete;

  bool active() const { return thread_.joinable(); }
  // Stops and joins the thread. Returns when the requests completed (now_seconds()), or 0 if
  // they had not: the caller then waits for them itself (the exposed part).
  double finish();

 private:
  std::vector<Request>& requests_;
  std::atomic<bool> stop_{false};
  double completed_ = 0;
  std::thread thread_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short human-readable name ("world", "ring", "ulysses") used in error messages.
  virtual const std::string& name() const = 0;

  // Ranks with the same color form a new communicator, ordered by key (then old rank).
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) const = 0;

  // Deadline for every wait, in seconds.
  virtual double timeout() const = 0;
  virtual void set_timeout(double seconds) = 0;

  virtual const CommStats& stats() const = 0;
  virtual void reset_stats() = 0;

  // True if another thread may test this communicator's requests while the calling thread
  // makes no MPI call (BackgroundProgress): MPI_THREAD_SERIALIZED or better.
  virtual bool progress_from_helper_thread() const { return false; }

  // --- point to point (non-blocking) -------------------------------------------------------
  virtual Request isend_bytes(const void* data, size_t bytes, int dest, Tag tag) = 0;
  virtual Request irecv_bytes(void* data, size_t bytes, int src, Tag tag) = 0;
  Request isend(const float* data, size_t count, int dest, Tag tag) {
    return isend_bytes(data, count * sizeof(float), dest, tag);
  }
  Request irecv(float* data, size_t count, int src, Tag tag) {
    return irecv_bytes(data, count * sizeof(float), src, tag);
  }

  // --- collectives (blocking, with the timeout) ----------------------------------------------
  virtual void barrier() = 0;
  virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;
  // send: [send_counts[0] floats for rank 0 | send_counts[1] for rank 1 | ...], displacements
  // in floats; likewise recv. Counts per peer must fit in int (2^31 floats).
  virtual void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                         const std::vector<int64_t>& send_displs, float* recv,
                         const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& recv_displs) = 0;
  // Every rank contributes `bytes`; recv holds size() * bytes, in rank order.
  virtual void allgather_bytes(const void* send, size_t bytes, void* recv) = 0;
  // Every rank contributes its own count (bytes); recv holds them in rank order; returns the
  // per-rank byte counts.
  virtual std::vector<int64_t> allgatherv_bytes(const void* send, size_t bytes,
                                                std::vector<uint8_t>& recv) = 0;
  // Rank `root` receives every rank's bytes in rank order (recv resized there); returns the
  // per-rank byte counts on root, empty elsewhere.
  virtual std::vector<int64_t> gatherv_bytes(const void* send, size_t bytes,
                                             std::vector<uint8_t>& recv, int root) = 0;
  // In place: data [count] combined over all ranks.
  virtual void allreduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  virtual void allreduce(int64_t* data, size_t count, ReduceOp op) = 0;
  // In place on root; other ranks' buffers are left as they were.
  virtual void reduce(double* data, size_t count, ReduceOp op, int root) = 0;

  template <typename T>
  void broadcast(T* data, size_t count, int root) {
    broadcast_bytes(data, count * sizeof(T), root);
  }
  template <typename T>
  std::vector<T> allgather(const T& value) {
    std::vector<T> out(size());
    allgather_bytes(&value, sizeof(T), out.data());
    return out;
  }
};

}  // namespace slope::parallel
