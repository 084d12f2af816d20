// `slope run`: prefill one prompt on one rank or, under mpirun, on a context-parallel mesh
// (--ulysses U --ring R, U·R ranks). Every rank loads the whole model and computes its own
// zigzag shard of the prompt; the first token and logits come back on every rank, and rank 0
// prints the result and a per-rank report.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "slope/cli/commands.h"
#include "slope/cli/tokens.h"
#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/engine/distributed.h"
#include "slope/engine/kv_export.h"
#include "slope/engine/prefill.h"
#include "slope/model/model.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/mpi_comm.h"
#include "slope/parallel/shard.h"

namespace slope::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  std::string tokens_file;
  int64_t random_tokens = 0;
  uint64_t seed = 0;
  std::string dtype = "f32";
  int threads = 0;
  int64_t chunk = 1024;
  int top_k = 5;
  std::string logits_out;
  std::string kv_out;
  std::string kv_dtype = "f32";
  bool json = false;
  int ulysses = 1;
  int ring = 1;
  bool check = false;
  double timeout = parallel::kDefaultTimeoutSeconds;
};

kernels::ComputeType parse_compute(const std::string& s) {
  if (s == "f32") return kernels::ComputeType::F32;
  if (s == "bf16") return kernels::ComputeType::BF16;
  fail("--dtype must be f32 or bf16, got '", s, "'");
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  std::ofstream f(path, std::ios::binary);
  SLOPE_CHECK(f, "cannot write --logits-out file '", path, "'");
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  SLOPE_CHECK(f.good(), "writing '", path, "' failed");
}

// Threads per rank when --threads is not given: the cores shared by the ranks on this node.
int default_threads() {
  int local = 1;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(s));
  return std::max(1, int(std::thread::hardware_concurrency()) / local);
}

nlohmann::json phases_json(const model::PhaseTimes& t) {
  return {{"embed_ms", t.embed * 1e3},         {"norm_qkv_rope_ms", t.norm_qkv_rope * 1e3},
          {"attention_ms", t.attention * 1e3}, {"o_proj_ms", t.o_proj * 1e3},
          {"mlp_ms", t.mlp * 1e3},             {"lm_head_ms", t.lm_head * 1e3}};
}

nlohmann::json report_json(const engine::RankReport& r) {
  return {{"rank", r.rank},
          {"tokens", r.tokens},
          {"prefill_ms", r.prefill_seconds * 1e3},
          {"compute_ms", (r.other_compute_seconds + r.cp_compute_seconds) * 1e3},
          {"attention_ms", r.attention_seconds * 1e3},
          {"attention_compute_ms", r.cp_compute_seconds * 1e3},
          {"communication_ms", r.cp_comm_seconds * 1e3},
          {"communication_wait_ms", r.cp_wait_seconds * 1e3},
          {"bytes_sent", r.bytes_sent},
          {"bytes_received", r.bytes_received},
          {"peak_memory_bytes", r.peak_rss_bytes}};
}

// The same prompt on one rank (LocalAttention), compared with the mesh's logits and KV.
struct CheckResult {
  double logits_rel_err = 0, kv_rel_err = 0;
  bool same_first_token = false;
  bool pass = false;
};
constexpr double kCheckTolerance = 1e-4;  // f32 relative error, as for every parallel test

CheckResult check_against_one_rank(const model::Model& model, const std::vector<int32_t>& tokens,
                                   const engine::PrefillResult& mesh_result,
                                   const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                                   int64_t chunk) {
  model::LocalAttention local;
  engine::PrefillOptions po;
  po.chunk_tokens = chunk;
  engine::PrefillResult one =
      engine::prefill(model, tokens, model::SequenceShard::whole(int64_t(tokens.size())), local, po);
  CheckResult c;
  c.logits_rel_err = engine::relative_error(mesh_result.logits.data(), one.logits.data(),
                                            int64_t(one.logits.size()));
  for (size_t l = 0; l < one.k.size(); ++l) {
    c.kv_rel_err = std::max(c.kv_rel_err, engine::relative_error(k[l].data<float>(), one.k[l].data<float>(), k[l].numel()));
    c.kv_rel_err = std::max(c.kv_rel_err, engine::relative_error(v[l].data<float>(), one.v[l].data<float>(), v[l].numel()));
  }
  c.same_first_token = mesh_result.first_token == one.first_token;
  c.pass = c.same_first_token && c.logits_rel_err <= kCheckTolerance && c.kv_rel_err <= kCheckTolerance;
  return c;
}

int run(const RunArgs& a, parallel::Communicator& world) {
  const int W = world.size(), rank = world.rank();
  const parallel::MeshShape shape{a.ring, a.ulysses};
  SLOPE_CHECK(a.chunk > 0, "--chunk must be positive");
  SLOPE_CHECK(a.top_k > 0, "--top-k must be positive");
  SLOPE_CHECK(a.kv_dtype == "f32" || a.kv_dtype == "bf16", "--kv-dtype must be f32 or bf16");
  SLOPE_CHECK(!a.tokens_file.empty() || a.random_tokens != 0,
              "give the prompt with --tokens FILE or --random-tokens N");
  set_num_threads(a.threads > 0 ? a.threads : default_threads());

  model::LoadOptions lo;
  lo.compute = parse_compute(a.dtype);
  const double t_load = now_seconds();
  auto model = model::Model::load(a.model_dir, lo);
  const double load_s = now_seconds() - t_load;
  const model::ModelConfig& cfg = model->config();

  std::vector<int32_t> tokens = a.tokens_file.empty()
                                    ? random_tokens(a.random_tokens, cfg.vocab_size, a.seed)
                                    : read_token_file(a.tokens_file);
  model->validate_tokens(tokens);
  const int64_t n = int64_t(tokens.size());
  parallel::validate_mesh(shape, W, cfg.num_heads, cfg.num_kv_heads, n);

  std::unique_ptr<parallel::Mesh> mesh;
  std::unique_ptr<model::AttentionRunner> runner;
  parallel::ContextParallelAttention* cp = nullptr;
  model::SequenceShard shard = model::SequenceShard::whole(n);
  if (W > 1) {
    mesh = std::make_unique<parallel::Mesh>(world, shape);
    auto r = std::make_unique<parallel::ContextParallelAttention>(*mesh);
    cp = r.get();
    runner = std::move(r);
    shard = parallel::my_shard(*mesh, n);
  } else {
    runner = std::make_unique<model::LocalAttention>();
  }

  engine::PrefillOptions po;
  po.chunk_tokens = a.chunk;
  po.top_k = a.top_k;
  po.keep_kv = !a.kv_out.empty() || a.check;
  world.barrier();
  const double t0 = now_seconds();
  engine::PrefillResult r = engine::prefill(*model, tokens, shard, *runner, po);
  if (W > 1) engine::share_logits(r, world, a.top_k);
  const double ttft = now_seconds() - t0;

  engine::RankReport mine;
  mine.rank = rank;
  mine.tokens = shard.local_tokens();
  mine.prefill_seconds = r.seconds;
  mine.attention_seconds = r.times.attention;
  mine.other_compute_seconds = r.times.embed + r.times.norm_qkv_rope + r.times.o_proj + r.times.mlp + r.times.lm_head;
  if (cp) {
    mine.cp_compute_seconds = cp->stats().compute_seconds;
    mine.cp_comm_seconds = cp->stats().comm_seconds;
    mine.cp_wait_seconds = cp->stats().wait_seconds;
    mine.bytes_sent = cp->stats().bytes_sent;
    mine.bytes_received = cp->stats().bytes_received;
  } else {
    mine.cp_compute_seconds = r.times.attention;
  }
  mine.peak_rss_bytes = peak_rss_bytes();
  const std::vector<engine::RankReport> reports = engine::gather_reports(mine, world);

  if (!a.kv_out.empty()) {
    engine::KvWriteOptions ko;
    ko.dtype = a.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
    ko.model_name = a.model_dir;
    ko.rank = rank;
    ko.world_size = W;
    engine::write_kv_shard(engine::kv_shard_path(a.kv_out, rank, W), r, cfg, 0, ko);
  }
  if (rank == 0 && !a.logits_out.empty()) write_logits(a.logits_out, r.logits);

  CheckResult check;
  if (a.check) {
    std::vector<Tensor> k, v;
    engine::gather_kv(r, cfg.num_kv_heads, cfg.head_dim, world, k, v);
    if (rank == 0) check = check_against_one_rank(*model, tokens, r, k, v, a.chunk);
    int pass = check.pass;
    world.broadcast(&pass, 1, 0);
    check.pass = pass;
  }
  if (rank != 0) return a.check && !check.pass ? 1 : 0;

  const double flops = engine::prefill_flops(cfg, n);
  if (a.json) {
    nlohmann::json j;
    j["first_token"] = r.first_token;
    j["top_logprobs"] = nlohmann::json::array();
    for (const auto& t : r.top_logprobs) j["top_logprobs"].push_back({{"token", t.token}, {"logprob", t.logprob}});
    j["num_tokens"] = n;
    j["ttft_ms"] = ttft * 1e3;
    j["load_ms"] = load_s * 1e3;
    j["phases"] = phases_json(r.times);
    j["peak_memory_bytes"] = peak_rss_bytes();
    j["weight_bytes"] = model->weight_bytes();
    j["gflop"] = flops / 1e9;
    j["gflops_per_s"] = flops / ttft / 1e9;
    j["tokens_per_s"] = double(n) / ttft;
    j["dtype"] = a.dtype;
    j["threads_per_rank"] = num_threads();
    j["ranks"] = W;
    j["mesh"] = {{"ulysses", a.ulysses}, {"ring", a.ring}};
    j["per_rank"] = nlohmann::json::array();
    for (const auto& rep : reports) j["per_rank"].push_back(report_json(rep));
    if (a.check)
      j["check"] = {{"pass", check.pass}, {"logits_rel_err", check.logits_rel_err},
                    {"kv_rel_err", check.kv_rel_err}, {"same_first_token", check.same_first_token},
                    {"tolerance", kCheckTolerance}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "model        " << a.model_dir << " (" << cfg.architecture << ", " << cfg.num_layers
              << " layers, " << a.dtype << ")\n"
              << "mesh         " << W << " rank(s): ulysses " << a.ulysses << " x ring " << a.ring
              << ", " << num_threads() << " thread(s) per rank\n"
              << "tokens       " << n << "\n"
              << "first token  " << r.first_token << "\n"
              << "top logprobs";
    for (const auto& t : r.top_logprobs) std::cout << " " << t.token << ":" << std::setprecision(4) << t.logprob;
    std::cout << std::setprecision(6) << "\nTTFT         " << ttft * 1e3 << " ms (" << double(n) / ttft
              << " tokens/s, " << flops / ttft / 1e9 << " GFLOP/s)\n";
    if (W > 1) {
      std::cout << "\nrank tokens  compute_ms  attn_ms  comm_ms  wait_ms   sent_MB   recv_MB  peak_GB\n";
      for (const auto& rep : reports)
        std::cout << std::setw(4) << rep.rank << std::setw(7) << rep.tokens << std::fixed << std::setprecision(1)
                  << std::setw(12) << (rep.other_compute_seconds + rep.cp_compute_seconds) * 1e3
                  << std::setw(9) << rep.attention_seconds * 1e3 << std::setw(9) << rep.cp_comm_seconds * 1e3
                  << std::setw(9) << rep.cp_wait_seconds * 1e3 << std::setw(10) << rep.bytes_sent / 1e6
                  << std::setw(10) << rep.bytes_received / 1e6 << std::setw(9) << std::setprecision(2)
                  << rep.peak_rss_bytes / 1e9 << "\n";
      std::cout.unsetf(std::ios::fixed);
    } else {
      std::cout << "peak memory  " << double(peak_rss_bytes()) / 1e9 << " GB\n";
    }
    if (a.check)
      std::cout << "\ncheck vs one rank: " << (check.pass ? "PASS" : "FAIL") << " (logits rel err "
                << check.logits_rel_err << ", KV rel err " << check.kv_rel_err << ", first token "
                << (check.same_first_token ? "equal" : "DIFFERENT") << ", tolerance " << kCheckTolerance << ")\n";
  }
  return a.check && !check.pass ? 1 : 0;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunArgs a;
  CLI::App app{"Prefill one prompt: first token, top logprobs, last-position logits, KV cache"};
  app.add_option("--model", a.model_dir, "HF model directory (config.json + safetensors)")->required();
  auto* tok = app.add_option("--tokens", a.tokens_file, "file of token ids (whitespace/comma separated)");
  auto* rnd = app.add_option("--random-tokens", a.random_tokens, "use N random token ids instead");
  tok->excludes(rnd);
  app.add_option("--seed", a.seed, "seed for --random-tokens");
  app.add_option("--dtype", a.dtype, "compute type: f32 or bf16 (bf16 weights/activations, f32 accumulation)");
  app.add_option("--threads", a.threads, "OpenMP threads per rank (default: cores / ranks on the node)");
  app.add_option("--chunk", a.chunk, "tokens per chunk of the token-local work");
  app.add_option("--top-k", a.top_k, "top logprobs to report");
  app.add_option("--logits-out", a.logits_out, "write the last position's logits (float32, little endian)");
  app.add_option("--kv-out", a.kv_out, "write each rank's KV cache (safetensors) into DIR; see docs/kv-format.md");
  app.add_option("--kv-dtype", a.kv_dtype, "KV file dtype: f32 or bf16");
  app.add_option("--ulysses", a.ulysses, "Ulysses degree U (heads split inside a group of U ranks)");
  app.add_option("--ring", a.ring, "ring degree R (sequence split into 2R zigzag chunks)");
  app.add_flag("--check", a.check, "also run the prompt on one rank and compare logits and KV");
  app.add_option("--timeout", a.timeout, "seconds a rank waits for a peer before failing");
  app.add_flag("--json", a.json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  parallel::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world(a.timeout);
  if (world->size() == 1) return run(a, *world);
  try {
    return run(a, *world);
  } catch (const std::exception& e) {
    // Under mpirun a rank that stops alone would leave its peers waiting: end them all.
    std::cerr << "slope run: rank " << world->rank() << ": error: " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace slope::cli
