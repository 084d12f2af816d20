#include "slope/parallel/mpi_comm.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <thread>

#include "slope/core/error.h"
#include "slope/core/log.h"
#include "slope/core/sys.h"

namespace slope::parallel {

// ---- Request ----------------------------------------------------------------------------------

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    Request old(std::move(*this));  // waits for (or abandons) the request we held
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() {
  if (!impl_) return;
  // Unwinding after another failure (a timeout, say): don't wait another full timeout per
  // request; the process is going down with the first error.
  if (std::uncaught_exceptions() > 0) {
    (void)impl_.release();  // abandoned on purpose: MPI may still write into its buffer
    return;
  }
  try {
    impl_->wait();
  } catch (const std::exception& e) {
    log(LogLevel::Error, "pending request failed in destructor: ", e.what());
  }
}

void wait_all(std::vector<Request>& requests) {
  for (Request& r : requests) r.wait();
}

bool test_all(std::vector<Request>& requests) {
  bool done = true;
  for (Request& r : requests) done = r.test() && done;
  return done;
}

BackgroundProgress::BackgroundProgress(std::vector<Request>& requests, bool enabled) : requests_(requests) {
  if (!enabled || requests_.empty()) return;
  thread_ = std::thread([this] {
    try {
      // A round of tests moves a few fragments of each message; 20 us between rounds keeps a
      // 32 MB block moving at shared-memory speed while the thread takes little of a core.
      while (!stop_.load(std::memory_order_relaxed)) {
        if (test_all(requests_)) {
          completed_ = now_seconds();
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    } catch (const std::exception&) {
      // The caller's wait_all after finish() meets the same error and reports it.
    }
  });
}

double BackgroundProgress::finish() {
  if (!thread_.joinable()) return completed_;
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
  return completed_;
}

// ---- helpers ----------------------------------------------------------------------------------

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  fail("MPI error in ", what, ": ", std::string(msg, len));
}

namespace {

const char* tag_name(Tag tag) {
  switch (tag) {
    case Tag::Generic: return "message";
    case Tag::RingKV: return "ring K/V block";
    case Tag::Halo: return "sliding-window halo";
    case Tag::Pipeline: return "pipeline activations";
    case Tag::Gather: return "gathered result";
    case Tag::Control: return "request from the coordinator";
    case Tag::Test: return "test message";
  }
  return "message";
}

int to_int(int64_t n, const char* what) {
  SLOPE_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(), what, ": count ", n,
              " does not fit in an MPI int count; split the message");
  return int(n);
}

// Polls `req` with MPI_Test until it completes or `timeout` seconds pass. Backs off from
// spinning to yielding to sleeping so that oversubscribed ranks don't starve the ones that
// compute. Returns false on timeout. Adds the time spent to *waited.
bool poll_request(MPI_Request& req, double timeout, double* waited, const char* what) {
  const double t0 = now_seconds();
  int done = 0;
  for (long iter = 0;; ++iter) {
    check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) break;
    const double elapsed = now_seconds() - t0;
    if (elapsed > timeout) {
      *waited += elapsed;
      return false;
    }
    if (elapsed < 2e-4) continue;
    if (elapsed < 1e-2)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  *waited += now_seconds() - t0;
  return true;
}

class MpiRequest : public Request::Impl {
 public:
  MpiRequest(MPI_Request req, const MpiCommunicator* comm, CommStats* stats, bool send, int peer,
             Tag tag)
      : req_(req), comm_(comm), stats_(stats), send_(send), peer_(peer), tag_(tag) {}
  ~MpiRequest() override = default;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), send_ ? "MPI_Isend" : "MPI_Irecv");
    done_ = flag != 0;
    return done_;
  }

  void wait() override {
    if (done_) return;
    if (!poll_request(req_, comm_->timeout(), &stats_->wait_seconds,
                      send_ ? "MPI_Isend" : "MPI_Irecv")) {
      fail("rank ", comm_->rank(), " of '", comm_->name(), "': timed out after ",
           comm_->timeout(), " s waiting for ", send_ ? "send of " : "", tag_name(tag_),
           send_ ? " to rank " : " from rank ", peer_,
           " — a peer may have died");
    }
    done_ = true;
  }

 private:
  MPI_Request req_;
  const MpiCommunicator* comm_;
  CommStats* stats_;
  bool send_;
  int peer_;
  Tag tag_;
  bool done_ = false;
};

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

}  // namespace

// ---- MpiRuntime -------------------------------------------------------------------------------

MpiRuntime::MpiRuntime() { init(nullptr, nullptr); }
MpiRuntime::MpiRuntime(int* argc, char*** argv) { init(argc, argv); }

void MpiRuntime::init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&provided_);
  } else {
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided_), "MPI_Init_thread");
    owns_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiRuntime::~MpiRuntime() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiRuntime::world(double timeout_seconds) const {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(dup, "world", timeout_seconds);
}

int MpiRuntime::world_rank() const {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiRuntime::world_size() const {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int MpiRuntime::ranks_on_this_node() const {
  // MPI-3's shared-memory split groups the ranks of one node, under any launcher (mpirun, srun,
  // MPICH's hydra), where launcher-specific variables such as OMPI_COMM_WORLD_LOCAL_SIZE are not.
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

int MpiRuntime::default_threads_per_rank() const {
  return std::max(1, int(std::thread::hardware_concurrency()) / ranks_on_this_node());
}

// ---- MpiCommunicator --------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, double timeout_seconds)
    : comm_(comm), name_(std::move(name)), timeout_(timeout_seconds) {
  SLOPE_CHECK(comm_ != MPI_COMM_NULL, "MpiCommunicator: null communicator '", name_, "'");
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

bool MpiCommunicator::progress_from_helper_thread() const {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_SERIALIZED;
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) const {
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(out, std::move(name), timeout_);
}

Request MpiCommunicator::isend_bytes(const void* data, size_t bytes, int dest, Tag tag) {
  MPI_Request req;
  check_mpi(MPI_Isend(data, to_int(int64_t(bytes), "isend"), MPI_BYTE, dest, int(tag), comm_, &req),
            "MPI_Isend");
  if (dest != rank_) stats_.bytes_sent += int64_t(bytes);
  return Request(std::make_unique<MpiRequest>(req, this, &stats_, true, dest, tag));
}

Request MpiCommunicator::irecv_bytes(void* data, size_t bytes, int src, Tag tag) {
  MPI_Request req;
  check_mpi(MPI_Irecv(data, to_int(int64_t(bytes), "irecv"), MPI_BYTE, src, int(tag), comm_, &req),
            "MPI_Irecv");
  if (src != rank_) stats_.bytes_received += int64_t(bytes);
  return Request(std::make_unique<MpiRequest>(req, this, &stats_, false, src, tag));
}

void MpiCommunicator::wait_collective(MPI_Request& req, const char* what) {
  if (!poll_request(req, timeout_, &stats_.wait_seconds, what))
    fail("rank ", rank_, " of '", name_, "': timed out after ", timeout_, " s waiting for ", what,
         " over ", size_, " ranks — a peer may have died");
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  wait_collective(req, "barrier");
}

void MpiCommunicator::broadcast_bytes(void* data, size_t bytes, int root) {
  MPI_Request req;
  check_mpi(MPI_Ibcast(data, to_int(int64_t(bytes), "broadcast"), MPI_BYTE, root, comm_, &req),
            "MPI_Ibcast");
  if (rank_ == root)
    stats_.bytes_sent += int64_t(bytes) * (size_ - 1);
  else
    stats_.bytes_received += int64_t(bytes);
  wait_collective(req, "broadcast");
}

void MpiCommunicator::alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& send_displs, float* recv,
                                const std::vector<int64_t>& recv_counts,
                                const std::vector<int64_t>& recv_displs) {
  SLOPE_CHECK(int(send_counts.size()) == size_ && int(send_displs.size()) == size_ &&
                  int(recv_counts.size()) == size_ && int(recv_displs.size()) == size_,
              "alltoallv: count/displacement vectors must have one entry per rank (", size_, ")");
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  for (int i = 0; i < size_; ++i) {
    sc[i] = to_int(send_counts[i], "alltoallv");
    sd[i] = to_int(send_displs[i], "alltoallv");
    rc[i] = to_int(recv_counts[i], "alltoallv");
    rd[i] = to_int(recv_displs[i], "alltoallv");
    if (i != rank_) {
      stats_.bytes_sent += send_counts[i] * int64_t(sizeof(float));
      stats_.bytes_received += recv_counts[i] * int64_t(sizeof(float));
    }
  }
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                           MPI_FLOAT, comm_, &req),
            "MPI_Ialltoallv");
  wait_collective(req, "alltoallv");
}

void MpiCommunicator::allgather_bytes(const void* send, size_t bytes, void* recv) {
  MPI_Request req;
  const int n = to_int(int64_t(bytes), "allgather");
  check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), "MPI_Iallgather");
  stats_.bytes_sent += int64_t(bytes) * (size_ - 1);
  stats_.bytes_received += int64_t(bytes) * (size_ - 1);
  wait_collective(req, "allgather");
}

std::vector<int64_t> MpiCommunicator::allgatherv_bytes(const void* send, size_t bytes,
                                                       std::vector<uint8_t>& recv) {
  const int64_t mine = int64_t(bytes);
  std::vector<int64_t> counts = allgather(mine);
  std::vector<int> rc(size_), rd(size_);
  int64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    rc[i] = to_int(counts[i], "allgatherv");
    rd[i] = to_int(total, "allgatherv (total)");
    total += counts[i];
  }
  recv.resize(size_t(total));
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(send, rc[rank_], MPI_BYTE, recv.data(), rc.data(), rd.data(), MPI_BYTE,
                            comm_, &req),
            "MPI_Iallgatherv");
  stats_.bytes_sent += mine * (size_ - 1);
  stats_.bytes_received += total - mine;
  wait_collective(req, "allgatherv");
  return counts;
}

std::vector<int64_t> MpiCommunicator::gatherv_bytes(const void* send, size_t bytes,
                                                    std::vector<uint8_t>& recv, int root) {
  const int64_t mine = int64_t(bytes);
  std::vector<int64_t> counts(rank_ == root ? size_ : 0);
  {
    MPI_Request req;
    check_mpi(MPI_Igather(&mine, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, root, comm_, &req),
              "MPI_Igather");
    wait_collective(req, "gather of sizes");
  }
  std::vector<int> rc, rd;
  if (rank_ == root) {
    rc.resize(size_);
    rd.resize(size_);
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      rc[i] = to_int(counts[i], "gatherv");
      rd[i] = to_int(total, "gatherv (total)");
      total += counts[i];
    }
    recv.resize(size_t(total));
    stats_.bytes_received += total - mine;
  } else {
    stats_.bytes_sent += mine;
  }
  MPI_Request req;
  check_mpi(MPI_Igatherv(send, to_int(mine, "gatherv"), MPI_BYTE, recv.data(), rc.data(),
                         rd.data(), MPI_BYTE, root, comm_, &req),
            "MPI_Igatherv");
  wait_collective(req, "gatherv");
  return counts;
}

void MpiCommunicator::allreduce_typed(void* data, size_t count, MPI_Datatype type, ReduceOp op) {
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, to_int(int64_t(count), "allreduce"), type,
                           mpi_op(op), comm_, &req),
            "MPI_Iallreduce");
  wait_collective(req, "allreduce");
}

void MpiCommunicator::allreduce(float* data, size_t count, ReduceOp op) {
  allreduce_typed(data, count, MPI_FLOAT, op);
}
void MpiCommunicator::allreduce(double* data, size_t count, ReduceOp op) {
  allreduce_typed(data, count, MPI_DOUBLE, op);
}
void MpiCommunicator::allreduce(int64_t* data, size_t count, ReduceOp op) {
  allreduce_typed(data, count, MPI_INT64_T, op);
}

void MpiCommunicator::reduce(double* data, size_t count, ReduceOp op, int root) {
  MPI_Request req;
  const int n = to_int(int64_t(count), "reduce");
  if (rank_ == root)
    check_mpi(MPI_Ireduce(MPI_IN_PLACE, data, n, MPI_DOUBLE, mpi_op(op), root, comm_, &req),
              "MPI_Ireduce");
  else
    check_mpi(MPI_Ireduce(data, nullptr, n, MPI_DOUBLE, mpi_op(op), root, comm_, &req),
              "MPI_Ireduce");
  wait_collective(req, "reduce");
}

}  // namespace slope::parallel
