// Context-parallel attention on chunked prefill, against the single-rank result, under mpirun.
//
//   mpirun -np U·R test_dist_chunked --ulysses U --ring R [--hq 8 --hkv 2 --dim 8]
//          [--cases 301:64,301:100,301:301,7:3] [--window 16] [--sinks 0,1] [--cache 1]
//
// Every rank draws the same random Q, K, V and sinks (same seed) for a whole sequence of N
// tokens and three layers (full, sliding window, full), and computes LocalAttention over the
// whole sequence as the reference. The sequence is then cut into chunks of C tokens (the last
// one shorter when C does not divide N); for chunk c every rank calls the runner, layer by layer,
// with its zigzag shard of the chunk as queries and its rows of chunks 0..c (in chunk order) as
// K/V, as the pipeline executor does. Each case runs twice with different data on the same
// runner (a second prompt must not reuse the first one's cached K/V). Pass criterion (f32):
// max |cp - ref| / max |ref| <= 1e-4 over all ranks' rows, per case. Also checks that shards
// missing some earlier tokens are refused on every rank. Prints PASS or FAIL on rank 0.
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "slope/core/error.h"
#include "slope/ops/attention_runner.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;
using namespace slope::parallel;
using ops::Segment;
using ops::SequenceShard;

namespace {

using dist_test::kTolerance;
using dist_test::random_vec;
using dist_test::gather_rows;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

struct Case {
  int64_t tokens, chunk;
};

struct Args {
  MeshShape mesh;
  int64_t hq = 8, hkv = 2, dim = 8, window = 16;
  std::vector<Case> cases{{301, 64}, {301, 100}, {301, 301}, {7, 3}};
  std::vector<int64_t> sinks{0, 1};
  bool cache = true;
  unsigned seed = 4321;
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
    else if (k == "--window") a.window = std::stoll(v);
    else if (k == "--cache") a.cache = std::stoi(v) != 0;
    else if (k == "--seed") a.seed = unsigned(std::stoul(v));
    else if (k == "--sinks") {
      a.sinks.clear();
      for (const std::string& x : split(v, ',')) a.sinks.push_back(std::stoll(x));
    } else if (k == "--cases") {
      a.cases.clear();
      for (const std::string& x : split(v, ',')) {
        const std::vector<std::string> nc = split(x, ':');
        SLOPE_CHECK(nc.size() == 2, "--cases wants N:C,N:C,...; got ", x);
        a.cases.push_back({std::stoll(nc[0]), std::stoll(nc[1])});
      }
    } else fail("unknown flag ", k);
  }
  return a;
}

struct Layer {
  ops::LayerAttention spec;
  std::vector<float> q, k, v, sinks, ref;  // whole sequence
};

// One prompt of n tokens in chunks; returns the relative error over all ranks and layers.
double run_prompt(const Args& a, Mesh& mesh, ContextParallelAttention& cp, Case c, bool sinks,
                  unsigned seed) {
  const int64_t n = c.tokens, D = a.dim;
  std::mt19937 rng(seed);
  std::vector<Layer> layers(3);
  double ref_max = 0;
  for (int l = 0; l < 3; ++l) {
    Layer& L = layers[l];
    L.q = random_vec(rng, n * a.hq * D, -1.f, 1.f);
    L.k = random_vec(rng, n * a.hkv * D, -1.f, 1.f);
    L.v = random_vec(rng, n * a.hkv * D, -1.f, 1.f);
    L.sinks = random_vec(rng, a.hq, -2.f, 2.f);
    L.spec.layer = l;
    L.spec.shape = {a.hq, a.hkv, D};
    L.spec.mask.causal = true;
    L.spec.mask.window = l == 1 ? a.window : 0;
    L.spec.scale = 1.f / std::sqrt(float(D)) * 2.f;  // sharper softmax than 1/√D
    L.spec.sinks = sinks ? L.sinks.data() : nullptr;
    L.ref.resize(size_t(n * a.hq * D));
    ops::LocalAttention local;
    const SequenceShard whole = SequenceShard::whole(n);
    local.attend(L.spec, L.q.data(), whole, L.k.data(), L.v.data(), whole, L.ref.data());
    for (float x : L.ref) ref_max = std::max(ref_max, double(std::fabs(x)));
  }

  double err = 0;
  SequenceShard kv{n, {}};
  for (int64_t c0 = 0; c0 < n; c0 += c.chunk) {
    const SequenceShard q_shard = my_chunk_shard(mesh, {c0, std::min(c.chunk, n - c0)}, n);
    for (const Segment& g : q_shard.segments) kv.segments.push_back(g);  // this chunk's rows last
    for (Layer& L : layers) {
      const std::vector<float> q = gather_rows(L.q, q_shard, a.hq * D);
      const std::vector<float> k = gather_rows(L.k, kv, a.hkv * D);
      const std::vector<float> v = gather_rows(L.v, kv, a.hkv * D);
      const std::vector<float> ref = gather_rows(L.ref, q_shard, a.hq * D);
      std::vector<float> out(ref.size(), std::nanf(""));
      cp.attend(L.spec, q.data(), q_shard, k.data(), v.data(), kv, out.data());
      for (size_t i = 0; i < out.size(); ++i) {
        const double d = std::fabs(double(out[i]) - double(ref[i]));
        err = std::max(err, std::isnan(d) ? 1e30 : d);
      }
    }
  }
  double e[2] = {err, ref_max};
  mesh.world().allreduce(e, 2, ReduceOp::Max);
  return e[0] / std::max(e[1], 1e-30);
}

// Keys that miss chunk 0 must be refused on every rank (no rank may hang in a collective).
bool refuses_missing_keys(const Args& a, Mesh& mesh, ContextParallelAttention& cp) {
  const int64_t n = 64, D = a.dim;
  const SequenceShard q_shard = my_chunk_shard(mesh, {32, 32}, n);  // chunk 1, kv = chunk 1 only
  std::vector<float> q(size_t(q_shard.local_tokens() * a.hq * D), 0.f);
  std::vector<float> kv(size_t(q_shard.local_tokens() * a.hkv * D), 0.f), out(q.size());
  ops::LayerAttention spec;
  spec.shape = {a.hq, a.hkv, D};
  spec.mask.causal = true;
  int64_t refused = 0;
  try {
    cp.attend(spec, q.data(), q_shard, kv.data(), kv.data(), q_shard, out.data());
  } catch (const Error& e) {
    refused = std::string(e.what()).find("held by no rank") != std::string::npos ? 1 : 0;
  }
  mesh.world().allreduce(&refused, 1, ReduceOp::Sum);
  return refused == mesh.world().size();
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
    ContextParallelAttention cp(mesh, CpOptions{.progress_rows = 8, .cache_kv = a.cache});
    bool ok = true;
    for (const Case& c : a.cases)
      for (int64_t s : a.sinks)
        for (int prompt = 0; prompt < 2; ++prompt) {
          cp.reset_stats();
          const unsigned seed = a.seed + unsigned(c.tokens * 131 + c.chunk * 7 + s * 3 + prompt);
          const double rel = run_prompt(a, mesh, cp, c, s != 0, seed);
          const bool pass = rel <= kTolerance;
          ok = ok && pass;
          const CpStats& st = cp.stats();
          if (rank == 0)
            std::printf("%s %s Hq=%lld Hkv=%lld D=%lld N=%lld chunk=%lld window=%lld sinks=%lld "
                        "prompt=%d cache=%d rel_err=%.2e (rank0: sent %lld B, recv %lld B, "
                        "cached rows %lld)\n",
                        pass ? "ok  " : "BAD ", a.mesh.str().c_str(), (long long)a.hq,
                        (long long)a.hkv, (long long)a.dim, (long long)c.tokens,
                        (long long)c.chunk, (long long)a.window, (long long)s, prompt, int(a.cache),
                        rel, (long long)st.ledger.bytes_sent(), (long long)st.ledger.bytes_received(),
                        (long long)cp.cached_kv_rows());
        }
    const bool refused = refuses_missing_keys(a, mesh, cp);
    ok = ok && refused;
    if (rank == 0) {
      std::printf("%s keys missing chunk 0 refused on every rank\n", refused ? "ok  " : "BAD ");
      std::printf("%s\n", ok ? "PASS" : "FAIL");
    }
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
