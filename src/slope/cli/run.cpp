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
#include "slope/engine/topology.h"
#include "slope/model/model.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/mpi_comm.h"
#include "slope/parallel/shard.h"

namespace slope::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  std::vector<std::string> tokens_files;
  int64_t random_tokens = 0;
  int batch = 1;
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
  int pp = 1;
  int tp = 1;
  int64_t pp_chunk = -1;  // -1: default; 0: whole prompt
  int64_t max_memory = 0;
  bool dry_run = false;
  bool check = false;
  bool check_weights = false;
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
          {"stage", r.stage},
          {"pipeline_wait_ms", r.pipe_wait_seconds * 1e3},
          {"tp_allreduce_ms", r.tp_seconds * 1e3},
          {"weight_bytes", r.weight_bytes},
          {"kv_bytes", r.kv_bytes},
          {"activation_bytes_predicted", r.activation_bytes},
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
// Relative error (max-norm) allowed between a mesh and one rank.
//  f32: 1e-4, as for every parallel test; the results differ only by summation order.
//  bf16: activations are rounded to bf16 before every GEMM, so a change of summation order
//  anywhere (LSE merge of attention partials, GEMM blocking for another row count) can move a
//  rounded activation by one bf16 ulp (4e-3 relative); through attention that reaches every
//  later row. Measured on the bench model (4 ranks, 512 tokens): logits 6e-3, KV 8e-2.
struct CheckTolerance {
  double logits, kv;
};
CheckTolerance check_tolerance(kernels::ComputeType ct) {
  return ct == kernels::ComputeType::BF16 ? CheckTolerance{3e-2, 1.5e-1} : CheckTolerance{1e-4, 1e-4};
}

CheckResult check_against_one_rank(const model::Model& model, const std::vector<int32_t>& tokens,
                                   const engine::PrefillResult& mesh_result,
                                   const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                                   int64_t chunk, CheckTolerance tol) {
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
  c.pass = c.same_first_token && c.logits_rel_err <= tol.logits && c.kv_rel_err <= tol.kv;
  return c;
}

// Default pipeline chunk: about four chunks per stage keeps the bubble near (P-1)/(4P+P-1)
// while chunks stay large enough for efficient GEMMs.
int64_t default_pp_chunk(int pp, int64_t n) {
  if (pp <= 1) return 0;
  return std::max<int64_t>(256, (n + 4 * pp - 1) / (4 * pp));
}

std::string gb(int64_t bytes) { return str_cat(std::fixed, std::setprecision(3), double(bytes) / 1e9, " GB"); }

// Prints each rank's predicted memory; with --max-memory, refuses a shape that does not fit
// and names one of the same rank count (or, failing that, more stages) that does.
void check_memory(const RunArgs& a, const model::ModelConfig& cfg, const engine::MemoryQuery& q,
                  int world_size, bool print) {
  const std::vector<engine::RankMemory> mem = engine::estimate_memory(cfg, q);
  int64_t worst = 0;
  for (const auto& m : mem) worst = std::max(worst, m.total());
  if (print) {
    std::cout << "predicted memory per rank (" << q.shape.str() << ", " << q.batch << " x "
              << q.num_tokens << " tokens, " << a.dtype << "):\n"
              << "rank stage layers    tokens     weights          kv   activations       total\n";
    for (const auto& m : mem)
      std::cout << std::setw(4) << m.rank << std::setw(6) << m.stage << std::setw(4) << m.first_layer
                << "-" << std::left << std::setw(5) << m.last_layer << std::right << std::setw(7)
                << m.tokens << std::setw(12) << gb(m.weights) << std::setw(12) << gb(m.kv)
                << std::setw(14) << gb(m.activations) << std::setw(12) << gb(m.total()) << "\n";
  }
  if (a.max_memory <= 0 || worst <= a.max_memory) return;
  // Suggest a shape that fits: same rank count first, then more pipeline stages.
  for (int w : {world_size, world_size * 2, world_size * 4, world_size * 8}) {
    for (const engine::ParallelShape& s : engine::all_shapes(w, cfg, q.num_tokens)) {
      engine::MemoryQuery alt = q;
      alt.shape = s;
      alt.pp_chunk = default_pp_chunk(s.pp, q.num_tokens);
      int64_t alt_worst = 0;
      for (const auto& m : engine::estimate_memory(cfg, alt)) alt_worst = std::max(alt_worst, m.total());
      if (alt_worst <= a.max_memory)
        fail("this configuration needs ", gb(worst), " on its largest rank, more than --max-memory ",
             gb(a.max_memory), "; ", s.str(), " on ", w, " ranks needs ", gb(alt_worst),
             " per rank and fits (mpirun -np ", w, " with", (s.pp > 1 ? str_cat(" --pp ", s.pp) : ""),
             (s.ring > 1 ? str_cat(" --ring ", s.ring) : ""), (s.ulysses > 1 ? str_cat(" --ulysses ", s.ulysses) : ""),
             (s.tp > 1 ? str_cat(" --tp ", s.tp) : ""), ")");
    }
  }
  fail("this configuration needs ", gb(worst), " on its largest rank, more than --max-memory ",
       gb(a.max_memory), ", and no configuration of up to ", 8 * world_size, " ranks fits");
}

int run(const RunArgs& a, parallel::Communicator& world) {
  const int W = world.size(), rank = world.rank();
  const engine::ParallelShape shape{a.pp, a.ring, a.ulysses, a.tp};
  SLOPE_CHECK(a.chunk > 0, "--chunk must be positive");
  SLOPE_CHECK(a.top_k > 0, "--top-k must be positive");
  SLOPE_CHECK(a.batch >= 1, "--batch must be at least 1");
  SLOPE_CHECK(a.kv_dtype == "f32" || a.kv_dtype == "bf16", "--kv-dtype must be f32 or bf16");
  SLOPE_CHECK(!a.tokens_files.empty() || a.random_tokens != 0,
              "give the prompt with --tokens FILE or --random-tokens N");
  SLOPE_CHECK(a.tokens_files.empty() || a.batch == 1,
              "--batch goes with --random-tokens; give several prompts as several --tokens FILE");
  set_num_threads(a.threads > 0 ? a.threads : default_threads());
  const kernels::ComputeType compute = parse_compute(a.dtype);

  const model::ModelConfig cfg = model::load_config(a.model_dir);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& f : a.tokens_files) prompts.push_back(read_token_file(f));
  for (int b = 0; a.tokens_files.empty() && b < a.batch; ++b)
    prompts.push_back(random_tokens(a.random_tokens, cfg.vocab_size, a.seed + uint64_t(b)));
  int64_t n_max = 0;
  for (const auto& p : prompts) {
    model::validate_token_ids(cfg, p);
    n_max = std::max<int64_t>(n_max, int64_t(p.size()));
  }
  const int64_t n = int64_t(prompts[0].size());
  engine::validate_shape(shape, W, cfg, n);
  const int64_t pp_chunk = a.pp_chunk >= 0 ? a.pp_chunk : default_pp_chunk(a.pp, n);

  engine::MemoryQuery mq;
  mq.shape = shape;
  mq.num_tokens = n_max;
  mq.batch = int(prompts.size());
  mq.pp_chunk = pp_chunk;
  mq.gemm_chunk = a.chunk;
  mq.bf16 = compute == kernels::ComputeType::BF16;
  check_memory(a, cfg, mq, W, a.dry_run && rank == 0);
  if (a.dry_run) return 0;

  engine::Topology topo(world, shape);
  const std::vector<int> bounds = engine::balance_stages(cfg, a.pp, n);
  model::LoadOptions lo;
  lo.compute = compute;
  lo.first_layer = bounds[topo.stage()];
  lo.last_layer = bounds[topo.stage() + 1];
  lo.load_embedding = topo.stage() == 0;
  lo.load_head = topo.stage() == a.pp - 1;
  lo.tp_rank = topo.tp_rank();
  lo.tp_size = a.tp;
  lo.check_weights = a.check_weights;
  const double t_load = now_seconds();
  auto model = model::Model::load(a.model_dir, lo);
  const double load_s = now_seconds() - t_load;

  std::unique_ptr<model::AttentionRunner> runner;
  parallel::ContextParallelAttention* cp = nullptr;
  if (topo.cp_mesh()) {
    auto r = std::make_unique<parallel::ContextParallelAttention>(*topo.cp_mesh());
    cp = r.get();
    runner = std::move(r);
  } else {
    runner = std::make_unique<model::LocalAttention>();
  }
  engine::PrefillOptions po;
  po.chunk_tokens = a.chunk;
  po.top_k = a.top_k;
  po.keep_kv = !a.kv_out.empty() || a.check;
  engine::PipelineTimes pt;
  world.barrier();
  const double t0 = now_seconds();
  std::vector<engine::PrefillResult> results =
      engine::run_prefill(*model, prompts, pp_chunk, topo.stage_plan(), *runner, po, &pt);
  for (auto& r : results) engine::share_logits(r, world, a.top_k);
  const double ttft = now_seconds() - t0;  // every prompt's first token known on every rank
  engine::PrefillResult& r = results.back();

  engine::RankReport mine;
  mine.rank = rank;
  for (const auto& res : results) {
    mine.tokens += res.shard.local_tokens();
    mine.prefill_seconds += res.seconds;
    mine.attention_seconds += res.times.attention;
    mine.other_compute_seconds += res.times.embed + res.times.norm_qkv_rope + res.times.o_proj +
                                  res.times.mlp + res.times.lm_head;
    mine.tp_seconds += res.times.tp_allreduce;
    // The KV cache held during the prefill (kept afterwards only with --kv-out / --check).
    mine.kv_bytes += res.shard.local_tokens() * (model->last_layer() - model->first_layer()) * 2 *
                     model->slice().kv_heads * cfg.head_dim * int64_t(sizeof(float));
  }
  mine.stage = topo.stage();
  mine.weight_bytes = int64_t(model->weight_bytes());
  mine.pipe_wait_seconds = pt.recv_wait_seconds + pt.send_wait_seconds;
  mine.bytes_sent = pt.bytes_sent;
  mine.bytes_received = pt.bytes_received;
  if (cp) {
    mine.cp_compute_seconds = cp->stats().compute_seconds;
    mine.cp_comm_seconds = cp->stats().comm_seconds;
    mine.cp_wait_seconds = cp->stats().wait_seconds;
    mine.bytes_sent += cp->stats().bytes_sent;
    mine.bytes_received += cp->stats().bytes_received;
  } else {
    mine.cp_compute_seconds = mine.attention_seconds;
  }
  if (a.tp > 1) {  // all-reduce payload, each way
    mine.bytes_sent += topo.tp_payload_bytes();
    mine.bytes_received += topo.tp_payload_bytes();
  }
  mine.peak_rss_bytes = peak_rss_bytes();
  // Activations are not tracked allocation by allocation: report the prediction (--dry-run's).
  mine.activation_bytes = engine::estimate_memory(cfg, mq).at(rank).activations;
  const std::vector<engine::RankReport> reports = engine::gather_reports(mine, world);

  // Under tensor parallelism with replicated KV heads only the first holder of a head writes it.
  const model::TensorSlice& sl = model->slice();
  const bool writes_kv = sl.size == 1 || cfg.num_kv_heads >= sl.size ||
                         sl.rank % (sl.size / cfg.num_kv_heads) == 0;
  if (!a.kv_out.empty() && writes_kv) {
    engine::KvWriteOptions ko;
    ko.dtype = a.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
    ko.model_name = a.model_dir;
    ko.rank = rank;
    ko.world_size = W;
    ko.kv_head0 = sl.kv_head0;
    for (size_t b = 0; b < results.size(); ++b) {
      const std::string dir = results.size() == 1 ? a.kv_out : str_cat(a.kv_out, "/prompt", b);
      engine::write_kv_shard(engine::kv_shard_path(dir, rank, W), results[b], cfg, model->first_layer(), ko);
    }
  }
  if (rank == 0 && !a.logits_out.empty()) write_logits(a.logits_out, r.logits);

  CheckResult check;
  if (a.check) {
    check.pass = true;
    for (size_t b = 0; b < results.size(); ++b) {
      std::vector<Tensor> k, v;
      engine::gather_kv(results[b], model->first_layer(), sl.kv_head0, cfg, world, k, v);
      CheckResult one;
      if (rank == 0) {
        model::LoadOptions whole;
        whole.compute = compute;
        static std::unique_ptr<model::Model> reference;  // loaded once for all prompts
        if (!reference) reference = model::Model::load(a.model_dir, whole);
        one = check_against_one_rank(*reference, prompts[b], results[b], k, v, a.chunk,
                                     check_tolerance(compute));
      }
      check.logits_rel_err = std::max(check.logits_rel_err, one.logits_rel_err);
      check.kv_rel_err = std::max(check.kv_rel_err, one.kv_rel_err);
      check.same_first_token = b == 0 ? one.same_first_token : check.same_first_token && one.same_first_token;
      check.pass = check.pass && (rank != 0 || one.pass);
    }
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
    j["mesh"] = {{"pp", a.pp}, {"ring", a.ring}, {"ulysses", a.ulysses}, {"tp", a.tp}, {"pp_chunk", pp_chunk}};
    j["batch"] = int(results.size());
    if (results.size() > 1) {
      j["first_tokens"] = nlohmann::json::array();
      for (const auto& res : results) j["first_tokens"].push_back(res.first_token);
    }
    j["per_rank"] = nlohmann::json::array();
    for (const auto& rep : reports) j["per_rank"].push_back(report_json(rep));
    if (a.check)
      j["check"] = {{"pass", check.pass}, {"logits_rel_err", check.logits_rel_err},
                    {"kv_rel_err", check.kv_rel_err}, {"same_first_token", check.same_first_token},
                    {"tolerance_logits", check_tolerance(compute).logits},
                    {"tolerance_kv", check_tolerance(compute).kv}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "model        " << a.model_dir << " (" << cfg.architecture << ", " << cfg.num_layers
              << " layers, " << a.dtype << ")\n"
              << "mesh         " << W << " rank(s): " << shape.str() << (a.pp > 1 ? str_cat(", pipeline chunk ", pp_chunk) : "")
              << ", " << num_threads() << " thread(s) per rank\n"
              << "tokens       " << n << "\n"
              << "first token  " << r.first_token << "\n"
              << "top logprobs";
    for (const auto& t : r.top_logprobs) std::cout << " " << t.token << ":" << std::setprecision(4) << t.logprob;
    std::cout << std::setprecision(6) << "\nTTFT         " << ttft * 1e3 << " ms (" << double(n) / ttft
              << " tokens/s, " << flops / ttft / 1e9 << " GFLOP/s)\n";
    if (results.size() > 1) {
      std::cout << "first tokens";
      for (const auto& res : results) std::cout << " " << res.first_token;
      std::cout << " (" << results.size() << " prompts)\n";
    }
    if (W > 1) {
      std::cout << "\nrank stage tokens compute_ms attn_ms comm_ms wait_ms pipe_ms  tp_ms sent_MB recv_MB weights_GB  kv_GB peak_GB\n";
      for (const auto& rep : reports)
        std::cout << std::fixed << std::setprecision(1) << std::setw(4) << rep.rank << std::setw(6) << rep.stage
                  << std::setw(7) << rep.tokens << std::setw(11) << (rep.other_compute_seconds + rep.cp_compute_seconds) * 1e3
                  << std::setw(8) << rep.attention_seconds * 1e3 << std::setw(8) << rep.cp_comm_seconds * 1e3
                  << std::setw(8) << rep.cp_wait_seconds * 1e3 << std::setw(8) << rep.pipe_wait_seconds * 1e3
                  << std::setw(7) << rep.tp_seconds * 1e3 << std::setw(8) << rep.bytes_sent / 1e6
                  << std::setw(8) << rep.bytes_received / 1e6 << std::setprecision(3) << std::setw(11)
                  << rep.weight_bytes / 1e9 << std::setw(7) << rep.kv_bytes / 1e9 << std::setw(8)
                  << rep.peak_rss_bytes / 1e9 << "\n";
      std::cout.unsetf(std::ios::fixed);
      std::cout << std::setprecision(6);
    } else {
      std::cout << "memory       weights " << gb(mine.weight_bytes) << ", KV " << gb(mine.kv_bytes)
                << ", peak RSS " << gb(peak_rss_bytes()) << "\n";
    }
    if (a.check)
      std::cout << "\ncheck vs one rank: " << (check.pass ? "PASS" : "FAIL") << " (logits rel err "
                << check.logits_rel_err << ", KV rel err " << check.kv_rel_err << ", first token "
                << (check.same_first_token ? "equal" : "DIFFERENT") << ", tolerance " << check_tolerance(compute).logits
                << " / " << check_tolerance(compute).kv << ")\n";
  }
  return a.check && !check.pass ? 1 : 0;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunArgs a;
  CLI::App app{"Prefill one prompt: first token, top logprobs, last-position logits, KV cache"};
  app.add_option("--model", a.model_dir, "HF model directory (config.json + safetensors)")->required();
  auto* tok = app.add_option("--tokens", a.tokens_files,
                             "file of token ids (whitespace/comma separated); repeat for several prompts");
  auto* rnd = app.add_option("--random-tokens", a.random_tokens, "use N random token ids instead");
  tok->excludes(rnd);
  app.add_option("--seed", a.seed, "seed for --random-tokens");
  app.add_option("--batch", a.batch, "with --random-tokens: this many prompts (pipelined as micro-batches)");
  app.add_option("--dtype", a.dtype, "compute type: f32 or bf16 (bf16 weights/activations, f32 accumulation)");
  app.add_option("--threads", a.threads, "OpenMP threads per rank (default: cores / ranks on the node)");
  app.add_option("--chunk", a.chunk, "tokens per chunk of the token-local work");
  app.add_option("--top-k", a.top_k, "top logprobs to report");
  app.add_option("--logits-out", a.logits_out, "write the last position's logits (float32, little endian)");
  app.add_option("--kv-out", a.kv_out, "write each rank's KV cache (safetensors) into DIR; see docs/kv-format.md");
  app.add_option("--kv-dtype", a.kv_dtype, "KV file dtype: f32 or bf16");
  app.add_option("--ulysses", a.ulysses, "Ulysses degree U (heads split inside a group of U ranks)");
  app.add_option("--ring", a.ring, "ring degree R (sequence split into 2R zigzag chunks)");
  app.add_option("--pp", a.pp, "pipeline stages P (layers split, balanced by cost; outermost)");
  app.add_option("--tp", a.tp, "tensor-parallel degree T (heads and MLP split, Megatron layout)");
  app.add_option("--pp-chunk", a.pp_chunk, "tokens per pipeline chunk (default: about 4 chunks per stage; 0 = whole prompt)");
  app.add_option("--max-memory", a.max_memory, "refuse to run if a rank would need more than BYTES (predicted)");
  app.add_flag("--dry-run", a.dry_run, "print each rank's predicted memory and exit without computing");
  app.add_flag("--check", a.check, "also run the prompt on one rank and compare logits and KV");
  app.add_flag("--check-weights", a.check_weights, "scan every weight for NaN/Inf at load and name the tensor "
               "(one more read of the weights: about 0.1 s per GB, 2% of the bench model's load)");
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
