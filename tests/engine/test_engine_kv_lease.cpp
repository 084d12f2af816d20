// KV leases on a long-lived engine: a request with a kv_id leaves every rank's KV shard kept in
// the engine under that id until rank 0 releases it, and the kept shard is the one a plain
// prefill of the same prompt returns.
//
//   mpirun -np N test_engine_kv_lease --model DIR --mesh PP,RING,ULYSSES,TP
//
// Rank 0 submits "a" (kept), "b" (kept), releases "a", then a request with no id; the other
// ranks serve and, after each request, record which ids they keep. Expected on every rank:
// {a}, {a,b}, {b} (the release reached them before the third request), and {b} at the end.
// Refused on rank 0 without shipping anything: a second request under a kept id. Releasing an id
// no longer kept (a KV client acked it) does nothing on any rank. Exit code 0 on every rank only
// if everything passed.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/engine.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;

namespace {

std::vector<int32_t> prompt(int64_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

std::string joined(const std::vector<std::string>& ids) {
  std::string s;
  for (const auto& id : ids) s += (s.empty() ? "" : ",") + id;
  return "{" + s + "}";
}

}  // namespace

int main(int argc, char** argv) {
  parallel::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world(60);
  const int rank = world->rank();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::printf("rank %d: FAIL: %s\n", rank, what.c_str());
    }
  };
  try {
    std::string model_dir;
    engine::ParallelShape mesh;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i];
      if (k == "--model") model_dir = argv[i + 1];
      else if (k == "--mesh")
        SLOPE_CHECK(std::sscanf(argv[i + 1], "%d,%d,%d,%d", &mesh.pp, &mesh.ring, &mesh.ulysses, &mesh.tp) == 4,
                    "--mesh PP,RING,ULYSSES,TP");
      else fail("unknown argument ", k);
    }
    engine::EngineConfig ec;
    ec.model_dir = model_dir;
    ec.mesh = mesh;
    ec.compute = kernels::ComputeType::F32;
    ec.threads = 1;
    engine::PrefillEngine eng(ec, *world);
    const int64_t V = eng.model_config().vocab_size;
    auto request = [&](const std::string& id, int64_t n) {
      engine::PrefillRequest r;
      r.prompts.push_back(prompt(n, V, unsigned(n)));
      r.kv_id = id;
      return r;
    };
    const std::vector<std::string> expected[] = {{"a"}, {"a", "b"}, {"b"}};

    if (rank == 0) {
      std::vector<std::string> seen;
      auto submit = [&](const engine::PrefillRequest& r) {
        eng.submit(r);
        seen.push_back(joined(eng.kept_kv_ids()));
      };
      submit(request("a", 40));
      // The kept shard equals what a plain prefill of the same prompt returns on this rank.
      engine::PrefillRequest plain = request("", 40);
      plain.keep_kv = true;
      const engine::PrefillOutput ref = eng.submit(plain);
      const std::shared_ptr<const engine::KeptKv> kept = eng.kept_kv("a");
      check(kept != nullptr && kept->k.size() == 1 && kept->k[0].size() == ref.results[0].k.size(),
            "the shard kept under 'a' has every layer");
      for (size_t l = 0; kept && l < kept->k[0].size() && l < ref.results[0].k.size(); ++l) {
        const Tensor& a = kept->k[0][l];
        const Tensor& b = ref.results[0].k[l];
        check(a.numel() == b.numel() && engine::relative_error(a.data<float>(), b.data<float>(), a.numel()) == 0,
              str_cat("kept K of layer ", l, " equals the plain prefill's"));
      }
      check(kept && kept->bytes > 0, "the kept shard's bytes are counted");
      std::string dup;
      try {
        eng.submit(request("a", 8));
      } catch (const Error& e) {
        dup = e.what();
      }
      check(dup.find("already kept under id 'a'") != std::string::npos, "a second request under 'a' is refused: " + dup);
      submit(request("b", 17));
      eng.release_kv("a");
      // A second release (e.g. a lease expiring after the KV client acked and a rank dropped its
      // shard) does nothing on any rank.
      std::string again;
      try {
        eng.release_kv("a");
      } catch (const Error& e) {
        again = e.what();
      }
      check(again.empty(), "releasing an id that is no longer kept does nothing: " + again);
      check(eng.kept_kv("a") == nullptr && !eng.release_local("a"), "'a' is gone on rank 0");
      submit(request("", 9));
      eng.shutdown();
      // seen[0] after "a"; the plain request kept nothing new; then "b"; then after the release.
      check(seen.size() == 3 && seen[0] == joined(expected[0]) && seen[1] == joined(expected[1]) &&
                seen[2] == joined(expected[2]),
            "rank 0 keeps {a}, {a,b}, {b}");
    } else {
      std::vector<std::string> seen;
      eng.serve([&](const engine::PrefillOutput&) { seen.push_back(joined(eng.kept_kv_ids())); });
      // Results: "a", plain, "b", the last one (the refused duplicate was never shipped).
      check(seen.size() == 4, str_cat("rank ", rank, " served 4 requests, got ", seen.size()));
      if (seen.size() == 4) {
        check(seen[0] == joined(expected[0]), "after 'a': " + seen[0]);
        check(seen[1] == joined(expected[0]), "after the plain request: " + seen[1]);
        check(seen[2] == joined(expected[1]), "after 'b': " + seen[2]);
        check(seen[3] == joined(expected[2]), "after releasing 'a': " + seen[3]);
      }
      check(eng.kept_kv("b") != nullptr && eng.kept_kv("b")->bytes > 0, "'b' is still kept at the end");
    }
    std::printf("rank %d: kept at the end %s\n", rank, joined(eng.kept_kv_ids()).c_str());
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL: %s\n", rank, e.what());
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int64_t total = failures;
  world->allreduce(&total, 1, parallel::ReduceOp::Sum);
  if (rank == 0) std::printf("%s\n", total == 0 ? "PASS" : "FAIL");
  return total == 0 ? 0 : 1;
}
