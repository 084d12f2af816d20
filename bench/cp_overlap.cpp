// How much of the ring's K/V traffic hides behind block attention.
//
//   mpirun -np R bench_cp_overlap --ring R --tokens N [--hq 8 --hkv 8 --dim 64]
//          [--progress-rows 64] [--progress-tests 16] [--progress-thread 1|0] [--reps 3] [--compute f32|bf16]
//
// 1. Transfer alone: the ring's per-step exchange (isend/irecv of one K/V block to the next /
//    from the previous rank), no compute: T_xfer per step.
// 2. Ring attention on a full causal layer: exposed wait W (time blocked on communication)
//    and compute C, per step.
// Hidden fraction = 1 - W / T_xfer (per step, medians over reps; max over ranks).
// Run with OMP_NUM_THREADS such that ranks × threads <= cores.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;
using namespace slope::parallel;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  try {
    int R = 2, reps = 3, progress_tests = 16;
    bool progress_thread = true, bf16 = false;
    int64_t n = 8192, hq = 8, hkv = 8, dim = 64, progress_rows = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--ring") R = std::stoi(v);
      else if (k == "--tokens") n = std::stoll(v);
      else if (k == "--hq") hq = std::stoll(v);
      else if (k == "--hkv") hkv = std::stoll(v);
      else if (k == "--dim") dim = std::stoll(v);
      else if (k == "--progress-rows") progress_rows = std::stoll(v);
      else if (k == "--progress-tests") progress_tests = std::stoi(v);
      else if (k == "--progress-thread") progress_thread = v != "0";
      else if (k == "--reps") reps = std::stoi(v);
      else if (k == "--compute") {
        if (v != "f32" && v != "bf16") fail("--compute takes f32 or bf16, got ", v);
        bf16 = v == "bf16";
      }
      else fail("unknown flag ", k);
    }
    auto world = mpi.world();
    Mesh mesh(*world, {.ring = R, .ulysses = 1});
    const SequenceShard shard = my_shard(mesh, n);
    const int64_t rows = shard.local_tokens();
    std::mt19937 rng(7 + world->rank());
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> q(rows * hq * dim), k(rows * hkv * dim), v(rows * hkv * dim), out(q.size());
    for (auto* vec : {&q, &k, &v})
      for (float& x : *vec) x = d(rng);

    // 1. The exchange alone: one step = send my block (K and V) on, receive the previous one.
    Communicator& ring = mesh.ring_comm();
    const int next = (ring.rank() + 1) % R, prev = (ring.rank() - 1 + R) % R;
    std::vector<float> rk(k.size() + 64 * hkv * dim), rv(rk.size());
    std::vector<double> xfer;
    for (int rep = 0; rep < reps + 1; ++rep) {
      world->barrier();
      const double t0 = now_seconds();
      std::vector<Request> reqs;
      const int64_t prev_rows = ZigzagLayout(n, mesh.shape()).ring_shard(prev).local_tokens();
      reqs.push_back(ring.irecv(rk.data(), prev_rows * hkv * dim, prev, Tag::RingKV));
      reqs.push_back(ring.irecv(rv.data(), prev_rows * hkv * dim, prev, Tag::RingKV));
      reqs.push_back(ring.isend(k.data(), k.size(), next, Tag::RingKV));
      reqs.push_back(ring.isend(v.data(), v.size(), next, Tag::RingKV));
      wait_all(reqs);
      double dt = now_seconds() - t0;
      world->allreduce(&dt, 1, ReduceOp::Max);
      if (rep > 0) xfer.push_back(dt);  // first one warms up the connections
    }

    // 2. Ring attention, full causal layer.
    ContextParallelAttention cp(mesh, CpOptions{.progress_rows = progress_rows, .progress_tests = progress_tests,
                                               .progress_thread = progress_thread});
    ops::LayerAttention spec;
    spec.shape = {hq, hkv, dim};
    spec.scale = 1.f / std::sqrt(float(dim));
    spec.compute = bf16 ? kernels::ComputeType::BF16 : kernels::ComputeType::F32;
    std::vector<double> wait, comp, total;
    for (int rep = 0; rep < reps; ++rep) {
      cp.reset_stats();
      world->barrier();
      const double t0 = now_seconds();
      cp.attend(spec, q.data(), shard, k.data(), v.data(), shard, out.data());
      double m[3] = {cp.stats().wait_seconds(), cp.stats().compute_seconds(), now_seconds() - t0};
      world->allreduce(m, 3, ReduceOp::Max);
      wait.push_back(m[0]);
      comp.push_back(m[1]);
      total.push_back(m[2]);
    }
    const int steps = R - 1;  // steps with a transfer
    const double x = median(xfer), w = median(wait) / steps, c = median(comp) / R;
    if (world->rank() == 0)
      std::printf("R=%d N=%lld Hq=%lld Hkv=%lld D=%lld progress_rows=%lld tests=%d thread=%d threads=%d | block %.2f MB"
                  " | per step: transfer alone %.3f ms, exposed wait %.3f ms, compute %.3f ms"
                  " | hidden %.1f%% | layer %.1f ms\n",
                  R, (long long)n, (long long)hq, (long long)hkv, (long long)dim,
                  (long long)progress_rows, progress_tests,
                  int(progress_thread && mesh.ring_data().progress_from_helper_thread()), num_threads(), 2.0 * k.size() * 4 / 1e6, x * 1e3,
                  w * 1e3, c * 1e3, 100.0 * (1.0 - std::min(1.0, w / x)), median(total) * 1e3);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}
