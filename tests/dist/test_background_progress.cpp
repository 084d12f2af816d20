// BackgroundProgress (parallel/comm.h) under mpirun -np 2, on the transport the dist tests use
// (shared memory without CMA single-copy: a large message moves only while a host thread is
// inside MPI). Each rank posts a 32 MB exchange with its peer, then "computes" (sleeps) for
// 0.6 s without any MPI call:
//   - with the helper thread, the exchange completes during the sleep: finish() returns a time
//     before the sleep ended, and the data is right;
//   - without it (the thread disabled), nothing completes during the sleep: finish() returns 0
//     and the first test afterwards finds the exchange still pending (what made the ring's
//     transfers exposed on this transport before the thread existed).
// Exit 0 on success, 1 with a message on stderr otherwise. Extra arguments are ignored.
#include <cstdio>
#include <thread>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;
using namespace slope::parallel;

namespace {

constexpr size_t kFloats = size_t(8) << 20;  // 32 MB each way
constexpr double kComputeSeconds = 0.6;

struct Outcome {
  double completed = 0;  // finish()'s answer, relative to the start of the "compute"
  bool pending_after = false;
  bool data_ok = false;
};

Outcome exchange(Communicator& comm, bool thread, float tag) {
  const int peer = 1 - comm.rank();
  std::vector<float> send(kFloats, tag + float(comm.rank())), recv(kFloats, -1.0f);
  comm.barrier();
  std::vector<Request> reqs;
  reqs.push_back(comm.irecv(recv.data(), kFloats, peer, Tag::Test));
  reqs.push_back(comm.isend(send.data(), kFloats, peer, Tag::Test));
  Outcome o;
  const double t0 = now_seconds();
  {
    BackgroundProgress background(reqs, thread && comm.progress_from_helper_thread());
    std::this_thread::sleep_for(std::chrono::duration<double>(kComputeSeconds));  // no MPI here
    const double done = background.finish();
    o.completed = done > 0 ? done - t0 : 0;
  }
  o.pending_after = !test_all(reqs);
  wait_all(reqs);
  o.data_ok = recv.front() == tag + float(peer) && recv.back() == tag + float(peer);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  try {
    auto world = mpi.world(60);
    SLOPE_CHECK(world->size() == 2, "run under mpirun -np 2");
    SLOPE_CHECK(world->progress_from_helper_thread(), "MPI gave thread level ", mpi.thread_level(),
                ", below MPI_THREAD_SERIALIZED: BackgroundProgress cannot run");
    const Outcome with = exchange(*world, true, 10.0f);
    const Outcome without = exchange(*world, false, 20.0f);
    int bad = 0;
    auto expect = [&](bool ok, const char* what) {
      if (!ok) {
        std::fprintf(stderr, "rank %d: FAIL: %s (with thread: completed at %.3f s, data %d; without: "
                     "completed %.3f, pending after %d, data %d)\n", world->rank(), what, with.completed,
                     int(with.data_ok), without.completed, int(without.pending_after), int(without.data_ok));
        ++bad;
      }
    };
    expect(with.completed > 0 && with.completed < kComputeSeconds,
           "with the helper thread the 32 MB exchange completes while the caller computes");
    expect(with.data_ok && without.data_ok, "the received data is the peer's");
    expect(without.completed == 0 && without.pending_after,
           "without the thread the exchange is still pending after the compute (this transport "
           "needs host progress; with CMA single-copy this check does not apply)");
    double worst = bad;
    world->allreduce(&worst, 1, ReduceOp::Max);
    if (world->rank() == 0)
      std::printf("%s: with the thread the exchange completed %.1f ms into %.0f ms of compute\n",
                  worst == 0 ? "PASS" : "FAIL", with.completed * 1e3, kComputeSeconds * 1e3);
    return worst == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_dist_progress: %s\n", e.what());
    return 1;
  }
}
