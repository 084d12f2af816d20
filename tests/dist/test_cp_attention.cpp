// Context-parallel attention against the single-rank result, launched under mpirun.
//
//   mpirun -np U·R test_dist_attention --ulysses U --ring R [--hq 8 --hkv 2 --dim 16]
//          [--tokens 1,7,300] [--windows 0,16] [--sinks 0,1] [--progress-rows 8] [--progress-thread 1|0]
//
// Every rank draws the same random Q, K, V and sinks (same seed), computes LocalAttention over
// the whole sequence, runs ContextParallelAttention on its zigzag shard, and compares its own
// rows. Pass criterion (f32): max |cp - ref| / max |ref| <= 1e-4 over all ranks' rows, for
// every (tokens, window, sinks) case. Prints PASS or FAIL on rank 0; exits non-zero on FAIL.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "slope/core/error.h"
#include "slope/ops/attention_runner.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/gather.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;
using namespace slope::parallel;

namespace {

using dist_test::kTolerance;
using dist_test::random_vec;
using dist_test::gather_rows;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

struct Args {
  MeshShape mesh;
  int64_t hq = 8, hkv = 2, dim = 16;
  std::vector<int64_t> tokens{1, 7, 64, 301};
  std::vector<int64_t> windows{0, 16};
  std::vector<int64_t> sinks{0, 1};
  int64_t progress_rows = 8;
  bool progress_thread = true;  // BackgroundProgress (0: MPI_Test polls between slices only)
  int layers = 2;  // repeat each case (runner reuse, stats accumulation)
  unsigned seed = 1234;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    SLOPE_CHECK(i + 1 < argc, "missing value for ", k);
    std::string v = argv[++i];
    if (k == "--ulysses") a.mesh.ulysses = std::stoi(v);
    else if (k == "--ring") a.mesh.ring = std::stoi(v);
    else if (k == "--hq") a.hq = std::stoll(v);
    else if (k == "--hkv") a.hkv = std::stoll(v);
    else if (k == "--dim") a.dim = std::stoll(v);
    else if (k == "--tokens") a.tokens = parse_list(v);
    else if (k == "--windows") a.windows = parse_list(v);
    else if (k == "--sinks") a.sinks = parse_list(v);
    else if (k == "--progress-rows") a.progress_rows = std::stoll(v);
    else if (k == "--progress-thread") a.progress_thread = v != "0";
    else if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--seed") a.seed = unsigned(std::stoul(v));
    else fail("unknown flag ", k);
  }
  return a;
}

// One case; returns the relative error over all ranks.
double run_case(const Args& a, Mesh& mesh, ContextParallelAttention& cp, int64_t n, int64_t window,
                bool with_sinks) {
  std::mt19937 rng(a.seed + unsigned(n * 131 + window * 7 + with_sinks));
  const int64_t D = a.dim;
  std::vector<float> q = random_vec(rng, n * a.hq * D, -1.f, 1.f);
  std::vector<float> k = random_vec(rng, n * a.hkv * D, -1.f, 1.f);
  std::vector<float> v = random_vec(rng, n * a.hkv * D, -1.f, 1.f);
  std::vector<float> sinks = random_vec(rng, a.hq, -2.f, 2.f);

  ops::LayerAttention spec;
  spec.shape = {a.hq, a.hkv, D};
  spec.mask.causal = true;
  spec.mask.window = window;
  spec.scale = 1.f / std::sqrt(float(D)) * 2.f;  // sharper softmax than 1/√D: a harder test
  spec.sinks = with_sinks ? sinks.data() : nullptr;

  // Single-rank reference over the whole sequence.
  std::vector<float> ref(size_t(n * a.hq * D));
  ops::LocalAttention local;
  const ops::SequenceShard whole = ops::SequenceShard::whole(n);
  local.attend(spec, q.data(), whole, k.data(), v.data(), whole, ref.data());

  const ops::SequenceShard shard = my_shard(mesh, n);
  std::vector<float> q_mine = gather_rows(q, shard, a.hq * D);
  std::vector<float> k_mine = gather_rows(k, shard, a.hkv * D);
  std::vector<float> v_mine = gather_rows(v, shard, a.hkv * D);
  std::vector<float> ref_mine = gather_rows(ref, shard, a.hq * D);
  std::vector<float> out(ref_mine.size());
  double err[2] = {0, 0};  // max |diff|, max |ref| (over the whole sequence)
  for (float x : ref) err[1] = std::max(err[1], double(std::fabs(x)));
  for (int layer = 0; layer < a.layers; ++layer) {
    std::fill(out.begin(), out.end(), std::nanf(""));
    spec.layer = layer;
    cp.attend(spec, q_mine.data(), shard, k_mine.data(), v_mine.data(), shard, out.data());
    for (size_t i = 0; i < out.size(); ++i) {
      const double d = std::fabs(double(out[i]) - double(ref_mine[i]));
      err[0] = std::max(err[0], std::isnan(d) ? 1e30 : d);
    }
  }
  // The rows gathered on rank 0 in sequence order are the whole reference output.
  const std::vector<ops::SequenceShard> shards = ZigzagLayout(n, mesh.shape()).all_shards();
  const std::vector<float> full = gather_sequence(mesh.world(), shards, out.data(), a.hq * D, 0);
  if (mesh.world().rank() == 0) {
    if (full.size() != ref.size()) err[0] = 1e30;
    for (size_t i = 0; i < full.size() && i < ref.size(); ++i)
      err[0] = std::max(err[0], double(std::fabs(full[i] - ref[i])));
    if (rank_holding(shards, n - 1) < 0) err[0] = 1e30;
  }
  mesh.world().allreduce(err, 2, ReduceOp::Max);
  return err[0] / std::max(err[1], 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  int rank = mpi.world_rank();
  try {
    const Args a = parse(argc, argv);
    auto world = mpi.world(/*timeout_seconds=*/60);
    validate_mesh(a.mesh, world->size(), a.hq, a.hkv, 1);
    Mesh mesh(*world, a.mesh);
    ContextParallelAttention cp(mesh, CpOptions{.progress_rows = a.progress_rows, .progress_thread = a.progress_thread});
    bool ok = true;
    for (int64_t n : a.tokens)
      for (int64_t w : a.windows)
        for (int64_t s : a.sinks) {
          cp.reset_stats();
          const double rel = run_case(a, mesh, cp, n, w, s != 0);
          const bool pass = rel <= kTolerance;
          ok = ok && pass;
          const CpStats& st = cp.stats();
          if (rank == 0)
            std::printf("%s %s Hq=%lld Hkv=%lld D=%lld N=%lld window=%lld sinks=%lld rel_err=%.2e "
                        "(rank0: sent %lld B, recv %lld B, ring steps %lld, skipped %lld)\n",
                        pass ? "ok  " : "BAD ", a.mesh.str().c_str(), (long long)a.hq,
                        (long long)a.hkv, (long long)a.dim, (long long)n, (long long)w,
                        (long long)s, rel, (long long)st.ledger.bytes_sent(), (long long)st.ledger.bytes_received(),
                        (long long)st.ring_steps, (long long)st.blocks_skipped);
        }
    if (rank == 0) std::printf("%s\n", ok ? "PASS" : "FAIL");
    std::fflush(stdout);
    world->barrier();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\nFAIL\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}
