// One long-lived PrefillEngine on a mesh, many requests in sequence, each against a fresh
// single-rank prefill of the same prompt, under mpirun.
//
//   mpirun -np N test_engine_mesh --model DIR --mesh PP,RING,ULYSSES,TP [--coordinator]
//
// The engine is built once. It runs prompts of 1, 5, 33, 130, 257 and 64 tokens one request
// after another, and a batch of two prompts, with bad requests between them (an id outside the
// vocabulary, a prompt longer than the model allows, an empty request): each bad request must
// fail with its message and the next request must still succeed. For every prompt the logits
// and every layer's whole KV cache (gathered from all ranks) must equal a single-rank prefill
// of the same prompt within f32 relative error 1e-4, with the same first token.
//
// With --coordinator, rank 0 submits each request and the other ranks sit in serve() (the
// server's layout); before the last request rank 0 waits 2 s and reads the idle ranks' CPU time
// from /proc: an idle rank must use under 5% of a core (a busy-polling wait would use ~100%).
// With --seam, the engine runs on a backend and a data plane handed in by the test (both forward
// to the host ones and count what passes through): the results must be the same, every op family
// and every payload path the mesh uses must have gone through them, which is what a device
// backend relies on (docs/architecture.md, "Where a CUDA kernel goes").
// Exit code 0 on every rank only if everything passed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/distributed.h"
#include "slope/engine/engine.h"
#include "slope/engine/prefill.h"
#include "slope/ops/attention_runner.h"
#include "slope/ops/backend.h"
#include "slope/parallel/data_plane.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;

namespace {

constexpr double kTolerance = 1e-4;

struct Args {
  std::string model;
  engine::ParallelShape mesh;
  bool coordinator = false;
  bool seam = false;
};

// The host backend, counting the calls of each op family.
class CountingBackend final : public ops::Backend {
 public:
  mutable std::map<std::string, int64_t> calls;
  Device device() const override { return Device::CPU; }
  Tensor alloc(Shape shape, DType dtype) const override { return count("alloc"), host().alloc(shape, dtype); }
  Tensor upload(const Tensor& t) const override { return count("upload"), host().upload(t); }
  void to_host(const float* s, int64_t n, float* d) const override { count("to_host"), host().to_host(s, n, d); }
  void fill(float* x, int64_t n, float v) const override { count("fill"), host().fill(x, n, v); }
  void copy(float* d, const float* s, int64_t n) const override { count("copy"), host().copy(d, s, n); }
  bool all_finite(const float* x, int64_t n) const override { return count("all_finite"), host().all_finite(x, n); }
  void copy_columns(const float* s, int64_t r, int64_t sc, int64_t c0, int64_t c, float* d,
                    int64_t ds) const override {
    count("copy_columns"), host().copy_columns(s, r, sc, c0, c, d, ds);
  }
  void add_inplace(float* y, const float* x, int64_t n) const override { count("add"), host().add_inplace(y, x, n); }
  void embed(const void* t, DType dt, int64_t w, const int32_t* ids, int64_t n, float* o) const override {
    count("embed"), host().embed(t, dt, w, ids, n, o);
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t r, int64_t d, float e, kernels::NormOrder o,
               DType a) const override {
    count("rmsnorm"), host().rmsnorm(x, w, y, r, d, e, o, a);
  }
  void rope(const kernels::Rope& r, float* x, int64_t n, int64_t H, const int64_t* p) const override {
    count("rope"), host().rope(r, x, n, H, p);
  }
  void silu_mul(const float* g, int64_t m, int64_t I, float* o) const override {
    count("activation"), host().silu_mul(g, m, I, o);
  }
  void swiglu_oai(const float* g, int64_t m, int64_t I, float a, float l, float* o) const override {
    count("activation"), host().swiglu_oai(g, m, I, a, l, o);
  }
  ops::ExpertRouting route_experts(const float* l, int64_t n, int64_t E, int k) const override {
    return count("route"), host().route_experts(l, n, E, k);
  }
  void gather_rows(const float* s, const int64_t* r, int64_t m, int64_t d, float* o) const override {
    count("gather_rows"), host().gather_rows(s, r, m, d, o);
  }
  void scatter_add_rows(const float* s, const int64_t* r, const float* w, int64_t m, int64_t d,
                        float* o) const override {
    count("scatter_add"), host().scatter_add_rows(s, r, w, m, d, o);
  }
  void flash_attention(const kernels::AttentionArgs& a) const override { count("attention"), host().flash_attention(a); }
  void attention_merge(float* oa, float* la, const float* ob, const float* lb, int64_t n, int64_t H,
                       int64_t D) const override {
    count("merge"), host().attention_merge(oa, la, ob, lb, n, H, D);
  }
  void attention_apply_sinks(float* o, float* l, const float* s, int64_t n, int64_t H, int64_t D) const override {
    count("sinks"), host().attention_apply_sinks(o, l, s, n, H, D);
  }
  ops::Linear linear(const void* w, DType dt, kernels::WeightLayout lay, int64_t out, int64_t in, const float* b,
                     kernels::ComputeType ct) const override {
    count("linear"), void();
    // Forwards are counted too: the packed weight is the host's, wrapped.
    struct Counted final : ops::LinearImpl {
      ops::Linear inner;
      const CountingBackend* owner;
      void forward(const float* x, int64_t M, float* y, bool acc) const override {
        owner->count("linear_forward"), inner.forward(x, M, y, acc);
      }
      int64_t in_features() const override { return inner.in_features(); }
      int64_t out_features() const override { return inner.out_features(); }
      size_t weight_bytes() const override { return inner.weight_bytes(); }
    };
    auto c = std::make_shared<Counted>();
    c->inner = host().linear(w, dt, lay, out, in, b, ct);
    c->owner = this;
    return ops::Linear(c);
  }
  int count(const char* what) const { return int(++calls[what]); }

 private:
  static const ops::Backend& host() { return ops::cpu(); }
};

// The host data plane, counting payload floats sent and received per communicator name.
struct PlaneCounts {
  std::map<std::string, int64_t> floats;
};
class CountingPlane final : public parallel::DataPlane {
 public:
  CountingPlane(parallel::Communicator& c, PlaneCounts& counts) : inner_(c), counts_(counts) {}
  Device device() const override { return Device::CPU; }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  parallel::Request isend(const float* d, size_t n, int to, parallel::Tag t) override {
    counts_.floats[name()] += int64_t(n);
    return inner_.isend(d, n, to, t);
  }
  parallel::Request irecv(float* d, size_t n, int from, parallel::Tag t) override {
    counts_.floats[name()] += int64_t(n);
    return inner_.irecv(d, n, from, t);
  }
  void alltoallv(const float* s, const std::vector<int64_t>& sc, const std::vector<int64_t>& sd, float* r,
                 const std::vector<int64_t>& rc, const std::vector<int64_t>& rd) override {
    for (int64_t n : sc) counts_.floats[name()] += n;
    inner_.alltoallv(s, sc, sd, r, rc, rd);
  }
  void allreduce_sum(float* d, size_t n) override {
    counts_.floats[name()] += int64_t(n);
    inner_.allreduce_sum(d, n);
  }
  const parallel::CommStats& stats() const override { return inner_.stats(); }

 private:
  parallel::HostDataPlane inner_;
  PlaneCounts& counts_;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--model" && i + 1 < argc) a.model = argv[++i];
    else if (k == "--mesh" && i + 1 < argc)
      SLOPE_CHECK(std::sscanf(argv[++i], "%d,%d,%d,%d", &a.mesh.pp, &a.mesh.ring, &a.mesh.ulysses, &a.mesh.tp) == 4,
                  "--mesh PP,RING,ULYSSES,TP");
    else if (k == "--coordinator") a.coordinator = true;
    else if (k == "--seam") a.seam = true;
    else fail("unknown argument ", k);
  }
  SLOPE_CHECK(!a.model.empty(), "--model DIR is required");
  return a;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// utime + stime of a process, in seconds (/proc/PID/stat fields 14 and 15).
double cpu_seconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

struct Step {
  engine::PrefillRequest request;
  std::string expect_error;  // non-empty: the request must fail with a message containing this
};

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
    const Args a = parse(argc, argv);
    engine::EngineConfig ec;
    ec.model_dir = a.model;
    ec.mesh = a.mesh;
    ec.compute = kernels::ComputeType::F32;
    ec.gemm_chunk = 16;  // several row chunks per prompt
    ec.threads = 1;
    ec.balance_tokens = 130;
    CountingBackend backend;
    PlaneCounts planes;
    if (a.seam) {
      ec.backend = &backend;
      ec.data_plane = [&planes](parallel::Communicator& c) -> std::unique_ptr<parallel::DataPlane> {
        return std::make_unique<CountingPlane>(c, planes);
      };
    }
    engine::PrefillEngine eng(ec, *world);
    const model::ModelConfig& cfg = eng.model_config();
    const int64_t V = cfg.vocab_size;

    std::vector<Step> steps;
    auto good = [&](std::vector<int64_t> lengths) {
      Step s;
      for (int64_t n : lengths) s.request.prompts.push_back(prompt(n, V, unsigned(1000 + n)));
      s.request.top_k = 3;
      s.request.keep_kv = true;
      steps.push_back(s);
    };
    auto bad = [&](std::vector<int32_t> ids, const std::string& message) {
      Step s;
      if (!ids.empty()) s.request.prompts.push_back(ids);
      s.expect_error = message;
      steps.push_back(s);
    };
    good({1});
    good({5});
    bad({1, 2, int32_t(V), 3}, "outside the vocabulary");
    good({33});
    bad(std::vector<int32_t>(size_t(cfg.max_position_embeddings + 1), 1), "max_position_embeddings");
    good({130});
    bad({}, "no prompt");
    good({257});
    good({64, 13});  // a batch: two prompts pipelined as micro-batches

    // Rank 0's reference: the whole model on one rank, a fresh prefill per prompt.
    std::unique_ptr<model::Model> reference;
    if (rank == 0) {
      model::LoadOptions whole;
      whole.compute = kernels::ComputeType::F32;
      reference = model::Model::load(a.model, whole);
    }
    auto compare = [&](const engine::PrefillRequest& req, const engine::PrefillOutput& out) {
      for (size_t b = 0; b < req.prompts.size(); ++b) {
        std::vector<Tensor> k, v;
        engine::gather_kv(out.results[b], out.kv.first_layer, out.kv.kv_head0, cfg, *world, k, v);
        if (rank != 0) continue;
        const std::vector<int32_t>& ids = req.prompts[b];
        ops::LocalAttention local;
        engine::PrefillOptions po;
        const engine::PrefillResult one = engine::prefill(
            *reference, ids, ops::SequenceShard::whole(int64_t(ids.size())), local, po);
        const std::string what = str_cat("prompt of ", ids.size(), " tokens");
        const double le = engine::relative_error(out.results[b].logits.data(), one.logits.data(), V);
        double kve = 0;
        for (size_t l = 0; l < one.k.size(); ++l) {
          kve = std::max(kve, engine::relative_error(k[l].data<float>(), one.k[l].data<float>(), k[l].numel()));
          kve = std::max(kve, engine::relative_error(v[l].data<float>(), one.v[l].data<float>(), v[l].numel()));
        }
        std::printf("  %s: logits rel err %.2e, KV rel err %.2e, first token %d (one rank %d)\n", what.c_str(), le,
                    kve, out.results[b].first_token, one.first_token);
        check(le <= kTolerance, what + ": logits differ from one rank");
        check(kve <= kTolerance, what + ": KV differs from one rank");
        check(out.results[b].first_token == one.first_token, what + ": first token differs");
      }
    };

    // A bad request fails with its message (and the engine goes on to the next one).
    auto expect_failure = [&](const Step& s, const std::function<void()>& call) {
      std::string error;
      try {
        call();
      } catch (const Error& e) {
        error = e.what();
      }
      check(error.find(s.expect_error) != std::string::npos,
            "bad request: expected an error with '" + s.expect_error + "', got '" + error + "'");
    };

    if (!a.coordinator) {  // every rank drives the engine with the same requests
      for (const Step& s : steps) {
        if (!s.expect_error.empty()) {
          expect_failure(s, [&] { eng.prefill(s.request); });
          continue;
        }
        compare(s.request, eng.prefill(s.request));
      }
    } else if (rank == 0) {  // rank 0 coordinates; the others serve
      const std::vector<int> pids = world->allgather(int(getpid()));
      for (size_t i = 0; i < steps.size(); ++i) {
        const Step& s = steps[i];
        if (i + 1 == steps.size()) {  // the mesh idles while rank 0 waits
          std::vector<double> cpu0;
          for (size_t r = 1; r < pids.size(); ++r) cpu0.push_back(cpu_seconds(pids[r]));
          const auto t0 = std::chrono::steady_clock::now();
          std::this_thread::sleep_for(std::chrono::seconds(2));
          const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          for (size_t r = 1; r < pids.size(); ++r) {
            const double share = (cpu_seconds(pids[r]) - cpu0[r - 1]) / wall;
            std::printf("  idle rank %zu: %.2f%% of a core while waiting for a request\n", r, 100 * share);
            check(share < 0.05, str_cat("idle rank ", r, " used ", 100 * share, "% of a core"));
          }
        }
        if (!s.expect_error.empty()) {
          expect_failure(s, [&] { eng.submit(s.request); });
          continue;
        }
        compare(s.request, eng.submit(s.request));
      }
      eng.shutdown();
    } else {
      world->allgather(int(getpid()));
      size_t next = 0;
      eng.serve([&](const engine::PrefillOutput& out) {
        while (!steps[next].expect_error.empty()) ++next;  // rank 0 never ships a bad request
        compare(steps[next++].request, out);
      });
    }
    if (a.seam) {  // every op family and payload path this mesh uses went through the seam
      std::vector<std::string> families = {"alloc",   "upload", "linear", "linear_forward", "rmsnorm", "rope",
                                           "activation", "route", "gather_rows", "scatter_add", "attention",
                                           "sinks", "copy_columns", "fill", "all_finite"};
      if (eng.topology().stage() == 0) families.push_back("embed");
      if (a.mesh.tp > 1) families.push_back("add");
      for (const std::string& f : families)
        check(backend.calls[f] > 0, "the backend's " + f + " op was never called");
      std::vector<std::string> paths;
      if (a.mesh.pp > 1) paths.push_back("world");    // pipeline activations
      if (a.mesh.tp > 1) paths.push_back("tensor");   // tensor all-reduces
      if (a.mesh.ring > 1) paths.push_back("ring");   // ring K/V blocks
      if (a.mesh.ulysses > 1) paths.push_back("ulysses");
      if (a.mesh.ring * a.mesh.ulysses > 1) paths.push_back(a.mesh.tp > 1 ? "context" : "stage");  // halo rows
      for (const std::string& p : paths) {
        std::printf("  rank %d: %lld payload floats over the '%s' data plane\n", rank, (long long)planes.floats[p],
                    p.c_str());
        check(planes.floats[p] > 0, "no payload went over the '" + p + "' data plane");
      }
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL: %s\n", rank, e.what());
    ++failures;
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int64_t total = failures;
  world->allreduce(&total, 1, parallel::ReduceOp::Sum);
  if (rank == 0) std::printf("%s\n", total == 0 ? "PASS" : "FAIL");
  return total == 0 ? 0 : 1;
}
