// `slope run`: prefill prompts on one rank or, under mpirun, on a mesh (pipeline stages x ring x
// Ulysses, or tensor parallelism). Each rank loads its stage's layers and computes its shard of
// every prompt; the first token and logits come back on every rank, and rank 0 prints the result
// and a per-rank report. Mistakes in the input are found before any work and reported once.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/cli/tokens.h"
#include "slope/core/error.h"
#include "slope/core/file_io.h"
#include "slope/core/sha256.h"
#include "slope/core/sys.h"
#include "slope/engine/check.h"
#include "slope/engine/distributed.h"
#include "slope/engine/engine.h"
#include "slope/engine/kv_export.h"
#ifdef SLOPE_WITH_CUDA
#include "slope/cuda/backend.h"
#include "slope/cuda/device.h"
#endif
#include "slope/engine/prefill.h"
#include "slope/engine/topology.h"
#include "slope/kvx/service.h"
#include "slope/model/model.h"
#include "slope/model/parallel_shape.h"
#include "slope/model/token_file.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/mpi_comm.h"
#include "slope/parallel/shard.h"
#include "slope/serve/mesh_spec.h"
#include "slope/text/tokenizer.h"

namespace slope::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  std::vector<std::string> tokens_files;
  std::string prompt;       // --prompt TEXT
  std::string prompt_file;  // --prompt-file F
  bool prompt_given = false;  // --prompt, even an empty one
  int64_t random_tokens = 0;
  int batch = 1;
  uint64_t seed = 0;
  std::string dtype = kDefaultComputeDtype;
  std::string bf16_units = "auto";  // --bf16-units auto|bf16|f32
  std::string device = "cpu";  // --device cpu|cuda
  int threads = 0;
  int64_t chunk = 1024;
  int64_t moe_chunk = model::kDefaultMoeChunk;
  int top_k = 5;
  std::string logits_out;
  std::string kv_out;
  std::string kv_dtype = "f32";
  bool json = false;
  int ulysses = 1;
  int ring = 1;
  int pp = 1;
  int tp = 1;
  int64_t pp_chunk = -1;  // -1 (not given): the engine's default; 0: whole prompt
  int64_t max_memory = 0;
  bool dry_run = false;
  bool check = false;
  bool quiet = false;
  bool pp_chunk_given = false;
  bool check_weights = false;
  double timeout = parallel::kDefaultTimeoutSeconds;
  bool kv_serve = false;  // keep the KV and serve it (docs/kv-format.md) until acked or the lease ends
  double kv_lease_s = 60;
  std::string kv_host = "127.0.0.1", kv_api_key;
  int kv_port_base = 0;
};

void write_logits(const std::string& path, const std::vector<float>& logits) {
  write_file_atomically(path, logits.data(), logits.size() * sizeof(float), "--logits-out file");
}

// The engine's backend and data plane for --device. A CUDA rank takes GPU (world rank mod the
// node's GPUs): its node-local GPU when ranks are placed by slot, as many per node as GPUs.
void select_device(const std::string& device, parallel::Communicator& world, double timeout_s, engine::EngineConfig& ec) {
  if (device == "cpu") return;
#ifdef SLOPE_WITH_CUDA
  std::string why;
  const int gpus = cuda::device_count(&why);
  SLOPE_CHECK(gpus > 0, "--device cuda: no CUDA device (", why, "); run with --device cpu");
  const int gpu = world.rank() % gpus;
  cuda::set_device(gpu);
  ec.backend = &cuda::backend();
  ec.data_plane = cuda::nccl_data_plane(gpu, timeout_s);
#else
  (void)world, (void)timeout_s, (void)ec;
  fail("--device ", device, ": this slope was built without CUDA; build the cuda preset (cmake --preset cuda) or use --device cpu");
#endif
}

nlohmann::json phases_json(const Ledger& t) {
  nlohmann::json j;
  for (Phase p : {Phase::Embed, Phase::NormQkvRope, Phase::Attention, Phase::OProj, Phase::Mlp, Phase::LmHead})
    j[std::string(phase_name(p)) + "_ms"] = t.seconds(p) * 1e3;
  return j;
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
engine::CheckResult check_against_one_rank(const model::Model& model, const std::vector<int32_t>& tokens,
                                           const engine::PrefillResult& mesh_result, const std::vector<Tensor>& k,
                                           const std::vector<Tensor>& v, int64_t chunk, int64_t moe_chunk,
                                           engine::CheckTolerance tol) {
  ops::LocalAttention local;
  engine::PrefillOptions po;
  po.chunk_tokens = chunk;
  po.moe_chunk_tokens = moe_chunk;
  const engine::PrefillResult one =
      engine::prefill(model, tokens, ops::SequenceShard::whole(int64_t(tokens.size())), local, po);
  return engine::compare_with_one_rank(mesh_result.logits, mesh_result.first_token, k, v, one.logits,
                                       one.first_token, one.k, one.v, tol);
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
      alt.pp_chunk = model::default_pipeline_chunk(s.pp, q.num_tokens);
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

// Everything a run needs that can be checked before any work: flags, config, prompts, mesh and
// memory. Throws slope::Error; communicates with no other rank.
struct RunPlan {
  kernels::ComputeType compute = kernels::ComputeType::BF16;
  kernels::Bf16Units bf16_units = kernels::Bf16Units::Auto;  // as asked (the engine resolves Auto)
  model::ModelConfig cfg;
  std::vector<std::vector<int32_t>> prompts;
  engine::ParallelShape shape;
  int64_t n = 0;  // tokens of the first prompt (balancing, default chunk)
  int64_t pp_chunk = 0;
  engine::MemoryQuery mq;
  std::unique_ptr<text::Tokenizer> tokenizer;  // MODEL_DIR/tokenizer.json, when there is one
};

// MODEL_DIR/tokenizer.json. A text prompt needs it; for token ids it only names the first
// token, so there a missing file is no tokenizer and one that does not load is a warning.
std::unique_ptr<text::Tokenizer> load_tokenizer(const RunArgs& a, bool text_prompt, int rank) {
  const std::string path = (std::filesystem::path(a.model_dir) / "tokenizer.json").string();
  if (text_prompt) {
    SLOPE_CHECK(std::filesystem::exists(path), a.prompt_given ? "--prompt" : "--prompt-file",
                " needs the model's tokenizer, and ", path, " does not exist; add the model's tokenizer.json ",
                "there, or give token ids with --tokens FILE");
    return std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(path));
  }
  if (!std::filesystem::exists(path)) return nullptr;
  try {
    return std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(path));
  } catch (const Error& e) {
    if (rank == 0) std::cerr << "slope run: warning: " << e.what() << "; the first token is shown as an id only\n";
    return nullptr;
  }
}

// The prompt of --prompt or --prompt-file as the tokenizer encodes it, BOS included.
std::vector<int32_t> encode_prompt(const RunArgs& a, const text::Tokenizer& tok, const model::ModelConfig& cfg) {
  const std::string flag = a.prompt_given ? "--prompt" : "--prompt-file";
  const std::string text = a.prompt_given ? a.prompt : read_regular_file(a.prompt_file, "--prompt-file");
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, true);
  } catch (const Error& e) {
    fail(flag, ": ", e.what());
  }
  SLOPE_CHECK(!ids.empty(), flag, " gives no tokens (the text is empty and the tokenizer adds no BOS); give some text");
  for (size_t i = 0; i < ids.size(); ++i)
    SLOPE_CHECK(ids[i] < cfg.vocab_size, flag, ": the tokenizer gives id ", ids[i], " at position ", i,
                ", outside the model's vocabulary [0, ", cfg.vocab_size, "); ", a.model_dir,
                "/tokenizer.json does not belong to this model");
  return ids;
}

// The text of the first token, or nothing without a tokenizer or for an id it does not know.
std::optional<std::string> token_text(const text::Tokenizer* tok, int32_t id) {
  if (tok == nullptr || id < 0 || id >= tok->vocab_size()) return std::nullopt;
  try {
    return tok->decode({id}, false);
  } catch (const Error&) {
    return std::nullopt;  // a gap in the tokenizer's ids
  }
}

RunPlan plan_run(const RunArgs& a, int world_size, int rank) {
  RunPlan p;
  p.shape = engine::ParallelShape{a.pp, a.ring, a.ulysses, a.tp};
  SLOPE_CHECK(a.chunk > 0, "--chunk must be positive, got ", a.chunk);
  SLOPE_CHECK(a.moe_chunk > 0, "--moe-chunk must be positive, got ", a.moe_chunk);
  SLOPE_CHECK(a.top_k > 0, "--top-k must be positive, got ", a.top_k);
  SLOPE_CHECK(a.threads >= 0, "--threads must be positive, or 0 for the node's cores shared by its ranks; got ", a.threads);
  SLOPE_CHECK(a.pp_chunk >= -1 && (a.pp_chunk != -1 || !a.pp_chunk_given), "--pp-chunk must be a positive number of ",
              "tokens, or 0 for whole prompts; got ", a.pp_chunk, " (leave it out for the engine's default)");
  SLOPE_CHECK(a.max_memory >= 0, "--max-memory must be a positive number of bytes (0: no limit); got ", a.max_memory);
  const bool text_prompt = a.prompt_given || !a.prompt_file.empty();
  const bool random = a.tokens_files.empty() && !text_prompt;
  SLOPE_CHECK(!random || a.random_tokens > 0, "--random-tokens must be positive, got ", a.random_tokens);
  SLOPE_CHECK(a.batch >= 1, "--batch must be at least 1");
  SLOPE_CHECK(a.kv_dtype == "f32" || a.kv_dtype == "bf16", "--kv-dtype must be f32 or bf16");
  SLOPE_CHECK(!a.kv_serve || (a.kv_out.empty() && !a.check), "--kv-serve keeps the KV in memory for the pull; it does "
              "not go with --kv-out or --check (run them separately)");
  SLOPE_CHECK(!a.kv_serve || a.kv_lease_s > 0, "--kv-lease-s must be a positive number of seconds, got ", a.kv_lease_s);
  SLOPE_CHECK(a.kv_port_base >= 0 && a.kv_port_base <= 65535, "--kv-port-base must be in [0, 65535]");
  SLOPE_CHECK(!random || a.random_tokens != 0,
              "give the prompt with --tokens FILE, --prompt TEXT, --prompt-file F or --random-tokens N");
  SLOPE_CHECK(random || a.batch == 1,
              "--batch goes with --random-tokens; give several prompts as several --tokens FILE");
  SLOPE_CHECK(!a.kv_serve || (a.batch == 1 && a.tokens_files.size() <= 1), "--kv-serve serves the KV of one prompt; ",
              "give one prompt");
  p.compute = parse_compute_dtype(a.dtype);
  p.bf16_units = kernels::parse_bf16_units(a.bf16_units);

  p.cfg = model::load_config(a.model_dir);
  SLOPE_CHECK(a.top_k <= p.cfg.vocab_size, "--top-k ", a.top_k, " exceeds the vocabulary (", p.cfg.vocab_size, " tokens)");
  // Before any random ids are drawn: a too-long prompt costs nothing to refuse.
  SLOPE_CHECK(!random || a.random_tokens <= p.cfg.max_position_embeddings, "--random-tokens ",
              a.random_tokens, " is more than the model's max_position_embeddings (", p.cfg.max_position_embeddings,
              "); shorten it");
  p.tokenizer = load_tokenizer(a, text_prompt, rank);
  if (text_prompt) p.prompts.push_back(encode_prompt(a, *p.tokenizer, p.cfg));
  for (const std::string& f : a.tokens_files) p.prompts.push_back(model::read_token_file(f));
  for (int b = 0; random && b < a.batch; ++b)
    p.prompts.push_back(random_tokens(a.random_tokens, p.cfg.vocab_size, a.seed + uint64_t(b)));
  int64_t n_max = 0;
  for (const auto& t : p.prompts) {
    model::validate_token_ids(p.cfg, t);
    n_max = std::max<int64_t>(n_max, int64_t(t.size()));
  }
  p.n = int64_t(p.prompts[0].size());
  // A dry run computes nothing, so it predicts any mesh from one process.
  engine::validate_shape(p.shape, a.dry_run ? p.shape.size() : world_size, p.cfg, p.n);
  p.pp_chunk = a.pp_chunk >= 0 ? a.pp_chunk : model::default_pipeline_chunk(a.pp, p.n);

  p.mq.shape = p.shape;
  p.mq.num_tokens = n_max;
  p.mq.batch = int(p.prompts.size());
  p.mq.pp_chunk = p.pp_chunk;
  p.mq.gemm_chunk = a.chunk;
  p.mq.moe_chunk = a.moe_chunk;
  kernels::set_bf16_units(p.bf16_units);  // a dry run predicts the units this machine would run
  p.mq.bf16_weights = engine::bf16_weights(p.compute, kernels::bf16_units());
  check_memory(a, p.cfg, p.mq, p.shape.size(), a.dry_run && rank == 0);
  if (a.dry_run) return p;
  // Output paths are checked before any work (a device, FIFO or directory is refused).
  if (!a.kv_out.empty()) engine::check_kv_out(a.kv_out, rank, world_size, p.prompts.size());
  if (rank == 0 && !a.logits_out.empty()) check_output_path(a.logits_out, "--logits-out file");
  return p;
}

// --kv-serve, after the prefill: rank 0 prints the KV handle (the shape of /v1/prefill's "kv"),
// then every rank serves its shard until a client acks it or the lease ends, and exits 0. A
// replica rank (tensor parallelism beyond the KV heads) holds nothing a client needs: it drops
// its copy at once.
int serve_kv(const RunArgs& a, engine::PrefillEngine& eng, const kvx::KvService& service, const std::string& kv_id,
             const engine::PrefillOutput& out, parallel::Communicator& world) {
  const double lease_end = now_seconds() + a.kv_lease_s;
  const std::vector<kvx::RankLayout> layout = world.allgather(kvx::rank_layout(eng, service.endpoint()));
  const std::shared_ptr<const engine::KeptKv> kept = eng.kept_kv(kv_id);
  if (world.rank() == 0) {
    using namespace std::chrono;
    const double wall = duration<double>(system_clock::now().time_since_epoch()).count();
    int64_t bytes = 0;
    for (const engine::RankReport& r : out.reports) bytes += r.kv_bytes;
    const nlohmann::json handle = {{"id", kv_id}, {"lease_s", a.kv_lease_s}, {"lease_expires_at", wall + a.kv_lease_s},
                                   {"mesh", serve::mesh_spec(eng.config().mesh)}, {"num_tokens", kept->shards.at(0).total_tokens},
                                   {"bytes", bytes}, {"dtype", a.kv_dtype}, {"first_token", kept->first_tokens.at(0)},
                                   {"protocol", kvx::kProtocolVersion}, {"ranks", kvx::layout_json(layout)}};
    std::cout << handle.dump() << std::endl;  // one line, flushed: the client reads it while the ranks wait
  }
  if (!out.kv.owner) eng.release_local(kv_id);
  while (eng.kept_kv(kv_id) && now_seconds() < lease_end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (eng.release_local(kv_id))
    std::cerr << "slope run: rank " << world.rank() << ": the KV lease ended before a client acked the shard; released\n";
  return kExitOk;
}

int run(const RunArgs& a, parallel::Communicator& world) {
  const int W = world.size(), rank = world.rank();
  RunPlan plan;
  if (!on_every_rank(world, "run", [&] { plan = plan_run(a, W, rank); })) return kExitError;
  if (a.dry_run) return kExitOk;
  // Every rank of one run writes the same prefill id into its KV shard (docs/kv-format.md).
  const std::string prefill_id = a.kv_out.empty() ? "" : engine::shared_prefill_id(world);
  const kernels::ComputeType compute = plan.compute;
  const model::ModelConfig& cfg = plan.cfg;
  const std::vector<std::vector<int32_t>>& prompts = plan.prompts;
  const engine::ParallelShape& shape = plan.shape;
  const int64_t n = plan.n, pp_chunk = plan.pp_chunk;

  TerminalProgress progress(rank == 0 && !a.quiet);
  engine::EngineConfig ec;
  ec.model_dir = a.model_dir;
  ec.mesh = shape;
  ec.compute = compute;
  ec.bf16_units = plan.bf16_units;
  ec.gemm_chunk = a.chunk;
  ec.moe_chunk = a.moe_chunk;
  ec.mesh.pp_chunk = pp_chunk;
  ec.timeout_s = a.timeout;
  ec.max_memory = a.max_memory;
  ec.balance_tokens = n;  // stages balanced for the first prompt
  ec.check_weights = a.check_weights;
  if (!on_every_rank(world, "run", [&] { select_device(a.device, world, a.timeout, ec); })) return kExitError;
  ec.on_layer_loaded = [&](int done, int total) {
    progress.update(str_cat("loading ", a.model_dir, ": layer ", done, "/", total), done == total);
  };
  const double t_load = now_seconds();
  std::unique_ptr<engine::PrefillEngine> eng;
  try {
    eng = std::make_unique<engine::PrefillEngine>(ec, world);  // every rank throws the same error
  } catch (const Error& e) {
    if (W == 1) throw;
    if (rank == 0) std::cerr << "slope run: error: " << e.what() << "\n";
    return kExitError;
  }
  const double load_s = now_seconds() - t_load;
  progress.done();
  const model::Model* model = &eng->model();
  std::unique_ptr<kvx::KvService> kv_service;  // --kv-serve: every rank serves its shard
  if (a.kv_serve &&
      !on_every_rank(world, "run", [&] {
        kvx::ServiceOptions so;
        so.host = a.kv_host;
        so.port = a.kv_port_base > 0 ? a.kv_port_base + rank : 0;
        // One key: the service names the shard owned_kv_id(kv_id, its digest); this run keeps it
        // under kv_id.
        const std::string owner = a.kv_api_key.empty() ? "" : sha256_hex(a.kv_api_key);
        if (!owner.empty()) so.key_hashes = {owner};
        auto plain = [owner](const std::string& id) { return owner.empty() ? id : id.substr(0, id.size() - owner.size() - 1); };
        kv_service = std::make_unique<kvx::KvService>(
            kvx::describe_shard(*eng, a.model_dir, engine::model_fingerprint(a.model_dir)), so,
            [&eng, plain](const std::string& id) { return eng->kept_kv(plain(id)); },
            [&eng, plain](const std::string& id) { eng->release_local(plain(id)); });
      }))
    return kExitError;

  engine::PrefillRequest request;
  request.prompts = prompts;
  // 128 random bits drawn on rank 0: the handle is the only way to the KV, so it must not be guessable.
  if (a.kv_serve) request.kv_id = str_cat("kv-", engine::shared_prefill_id(world), engine::shared_prefill_id(world));
  request.top_k = a.top_k;
  request.keep_kv = !a.kv_out.empty() || a.check;
  if (progress.active())
    request.on_progress = [&](const engine::PrefillProgress& p) {
      progress.update(str_cat("prefill", p.prompts > 1 ? str_cat(" prompt ", p.prompt + 1, "/", p.prompts) : "", ": ",
                              p.tokens_done, "/", p.tokens, " tokens, layer ", p.layer, "/", p.layers));
    };
  if (!on_every_rank(world, "run", [&] { eng->validate(request); })) return kExitError;
  engine::PrefillOutput output;
  try {
    output = eng->prefill(request);
  } catch (const RequestError& e) {  // every rank raised it (e.g. a non-finite result): report once
    if (W == 1) throw;
    if (rank == 0) std::cerr << "slope run: error: " << e.what() << "\n";
    return kExitError;
  }
  progress.done();
  std::vector<engine::PrefillResult>& results = output.results;
  const double ttft = output.ttft_s;
  engine::PrefillResult& r = results.back();
  const engine::RankReport& mine = output.report;
  const std::vector<engine::RankReport>& reports = output.reports;

  if (!a.kv_out.empty() && output.kv.owner) {
    engine::KvWriteOptions ko;
    ko.dtype = a.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
    ko.model_name = a.model_dir;
    ko.rank = rank;
    ko.world_size = W;
    ko.kv_head0 = output.kv.kv_head0;
    ko.model_hash = engine::model_fingerprint(a.model_dir);
    ko.prefill_id = prefill_id;
    ko.compute_dtype = a.dtype;
    for (size_t b = 0; b < results.size(); ++b) {
      const std::string dir = results.size() == 1 ? a.kv_out : str_cat(a.kv_out, "/prompt", b);
      engine::write_kv_shard(engine::kv_shard_path(dir, rank, W), results[b], prompts[b], cfg, output.kv.first_layer, ko);
    }
  }
  if (rank == 0 && !a.logits_out.empty()) write_logits(a.logits_out, r.logits);

  engine::CheckResult check;
  if (a.check) {
    check.pass = true;
    std::unique_ptr<model::Model> reference;  // rank 0: the whole model, loaded once for all prompts
    for (size_t b = 0; b < results.size(); ++b) {
      std::vector<Tensor> k, v;
      engine::gather_kv(results[b], output.kv.first_layer, output.kv.kv_head0, cfg, world, k, v);
      engine::CheckResult one;
      if (rank == 0) {
        model::LoadOptions whole;
        whole.compute = compute;
        if (!reference) reference = model::Model::load(a.model_dir, whole);
        one = check_against_one_rank(*reference, prompts[b], results[b], k, v, a.chunk, a.moe_chunk,
                                     engine::check_tolerance(compute));
      }
      check.logits_rel_err = std::max(check.logits_rel_err, one.logits_rel_err);
      check.kv_rel_err = std::max(check.kv_rel_err, one.kv_rel_err);
      check.kv_rows_over = std::max(check.kv_rows_over, one.kv_rows_over);
      check.kv_rows_allowed = b == 0 ? one.kv_rows_allowed : std::min(check.kv_rows_allowed, one.kv_rows_allowed);
      check.same_first_token = b == 0 ? one.same_first_token : check.same_first_token && one.same_first_token;
      check.pass = check.pass && (rank != 0 || one.pass);
    }
    int pass = check.pass;
    world.broadcast(&pass, 1, 0);
    check.pass = pass;
  }
  const int code = a.check && !check.pass ? kExitCheckFailed : kExitOk;
  if (rank != 0) return kv_service ? serve_kv(a, *eng, *kv_service, request.kv_id, output, world) : code;

  // Several prompts are reported each on its own; tokens, FLOPs and phase times are the batch's.
  int64_t total_tokens = 0;
  double flops = 0;
  Ledger phases;
  for (size_t b = 0; b < results.size(); ++b) {
    total_tokens += int64_t(prompts[b].size());
    flops += engine::prefill_flops(cfg, int64_t(prompts[b].size()));
    phases += results[b].ledger;
  }
  auto logprobs_json = [](const engine::PrefillResult& res) {
    nlohmann::json l = nlohmann::json::array();
    for (const auto& t : res.top_logprobs) l.push_back({{"token", t.token}, {"logprob", t.logprob}});
    return l;
  };
  if (a.json) {
    nlohmann::json j;
    if (results.size() == 1) {
      j["first_token"] = r.first_token;
      if (auto t = token_text(plan.tokenizer.get(), r.first_token)) j["first_token_text"] = *t;
      j["top_logprobs"] = logprobs_json(r);
    }
    j["prompts"] = nlohmann::json::array();
    for (size_t b = 0; b < results.size(); ++b)
      j["prompts"].push_back({{"num_tokens", prompts[b].size()}, {"first_token", results[b].first_token},
                              {"top_logprobs", logprobs_json(results[b])}});
    j["num_tokens"] = total_tokens;
    j["ttft_ms"] = ttft * 1e3;
    j["load_ms"] = load_s * 1e3;
    j["phases"] = phases_json(phases);
    j["peak_memory_bytes"] = peak_rss_bytes();
    j["weight_bytes"] = model->weight_bytes();
    j["gflop"] = flops / 1e9;
    j["gflops_per_s"] = flops / ttft / 1e9;
    j["tokens_per_s"] = double(total_tokens) / ttft;
    j["dtype"] = a.dtype;
    if (compute == kernels::ComputeType::BF16) j["bf16_units"] = kernels::bf16_units_name(eng->bf16_units());
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
                    {"kv_rel_err", check.kv_rel_err}, {"kv_rows_over_tolerance", check.kv_rows_over},
                    {"kv_rows_allowed", check.kv_rows_allowed}, {"same_first_token", check.same_first_token},
                    {"tolerance_logits", engine::check_tolerance(compute).logits},
                    {"tolerance_kv", engine::check_tolerance(compute).kv}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "model        " << a.model_dir << " (" << cfg.architecture << ", " << cfg.num_layers
              << " layers, " << a.dtype << ")\n"
              << (compute == kernels::ComputeType::BF16 ? str_cat("bf16 on      ", kernels::describe_bf16_units(), "\n") : "")
              << "mesh         " << W << " rank(s): " << shape.str() << (a.pp > 1 ? str_cat(", pipeline chunk ", pp_chunk) : "")
              << ", " << num_threads() << " thread(s) per rank\n";
    auto print_logprobs = [](const engine::PrefillResult& res) {
      for (const auto& t : res.top_logprobs) std::cout << " " << t.token << ":" << std::setprecision(4) << t.logprob;
      std::cout << std::setprecision(6) << "\n";
    };
    if (results.size() == 1) {
      const std::optional<std::string> t = token_text(plan.tokenizer.get(), r.first_token);
      const std::string first_text =
          t ? str_cat(" (", nlohmann::json(*t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), ")") : "";
      std::cout << "tokens       " << n << "\n"
                << "first token  " << r.first_token << first_text << "\n"
                << "top logprobs";
      print_logprobs(r);
    } else {
      std::cout << "tokens       " << total_tokens << " in " << results.size() << " prompts\n"
                << "prompt  tokens  first token  top logprobs\n";
      for (size_t b = 0; b < results.size(); ++b) {
        std::cout << std::setw(6) << b << std::setw(8) << prompts[b].size() << std::setw(13) << results[b].first_token << " ";
        print_logprobs(results[b]);
      }
    }
    std::cout << "TTFT         " << ttft * 1e3 << " ms" << (results.size() > 1 ? " (every prompt's first token)" : "")
              << " (" << double(total_tokens) / ttft << " tokens/s, " << flops / ttft / 1e9 << " GFLOP/s)\n";
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
                << check.logits_rel_err << ", KV rel err " << check.kv_rel_err << " with "
                << check.kv_rows_over << " rows of a layer past the tolerance, " << check.kv_rows_allowed
                << " allowed, first token "
                << (check.same_first_token ? "equal" : "DIFFERENT") << ", tolerance " << engine::check_tolerance(compute).logits
                << " / " << engine::check_tolerance(compute).kv << ")\n";
  }
  if (kv_service) return serve_kv(a, *eng, *kv_service, request.kv_id, output, world);
  return code;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunArgs a;
  CLI::App app{"Prefill prompts on one rank or, under mpirun, on a mesh: first token, top logprobs,\n"
               "last-position logits, KV cache", "slope run"};
  setup_app(app);
  app.add_option("--model", a.model_dir, "HF model directory (config.json + safetensors)")->required();
  auto* tok = app.add_option("--tokens", a.tokens_files,
                             "file of token ids (whitespace/comma separated); repeat for several prompts")
                 ->default_str("");
  auto* rnd = app.add_option("--random-tokens", a.random_tokens, "use N random token ids instead");
  auto* prompt = app.add_option("--prompt", a.prompt, "the prompt as text, encoded with MODEL_DIR/tokenizer.json (BOS added)");
  auto* prompt_file = app.add_option("--prompt-file", a.prompt_file, "the prompt as text, the whole file F (UTF-8) as it is");
  tok->excludes(rnd);
  prompt->excludes(tok)->excludes(rnd)->excludes(prompt_file);
  prompt_file->excludes(tok)->excludes(rnd);
  app.add_option("--seed", a.seed, "seed for --random-tokens");
  app.add_option("--batch", a.batch, "with --random-tokens: this many prompts (pipelined as micro-batches)");
  app.add_option("--dtype", a.dtype, "compute type: bf16 (bf16 weights and activations, f32 accumulation) or f32");
  app.add_option("--bf16-units", a.bf16_units,
                 "where bf16's products run: bf16 (the CPU's bf16 instructions), f32 (the FMA units, f32 copies of "
                 "the weights: twice their memory, the same numbers), or auto (the faster here)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  app.add_option("--device", a.device, "where the prefill runs: cpu, or cuda (a build with -DSLOPE_CUDA=ON; one GPU per rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", a.threads, "OpenMP threads per rank (0: the node's cores shared by its ranks)");
  app.add_option("--chunk", a.chunk, "tokens per chunk of the token-local work");
  app.add_option("--moe-chunk", a.moe_chunk,
                 "tokens per MoE call (router and experts; at least --chunk): each routed expert reads its "
                 "weights once a call");
  app.add_option("--top-k", a.top_k, "top logprobs to report");
  app.add_option("--logits-out", a.logits_out, "write the last position's logits (float32, little endian)");
  app.add_option("--kv-out", a.kv_out, "write each rank's KV cache (safetensors) into DIR; see docs/kv-format.md");
  app.add_option("--kv-dtype", a.kv_dtype, "KV file dtype: f32 or bf16 (with --kv-serve: the handle's default for the pull)");
  app.add_flag("--kv-serve", a.kv_serve, "keep every rank's KV in memory after the prefill and serve it over TCP "
               "(docs/kv-format.md); rank 0 prints the handle; exit when every shard is acked or the lease ends");
  app.add_option("--kv-lease-s", a.kv_lease_s, "with --kv-serve: seconds to keep the KV for a client");
  app.add_option("--kv-host", a.kv_host, "with --kv-serve: address the ranks' KV services listen on");
  app.add_option("--kv-port-base", a.kv_port_base, "with --kv-serve: rank r listens on this + r (0: any free port)");
  app.add_option("--kv-api-key", a.kv_api_key, "with --kv-serve: the key a client must send (none: no key)");
  app.add_option("--ulysses", a.ulysses, "Ulysses degree U (heads split inside a group of U ranks)");
  app.add_option("--ring", a.ring, "ring degree R (sequence split into 2R zigzag chunks)");
  app.add_option("--pp", a.pp, "pipeline stages P (layers split, balanced by cost; outermost)");
  app.add_option("--tp", a.tp, "tensor-parallel degree T (heads and MLP split, Megatron layout)");
  auto* pp_chunk = app.add_option("--pp-chunk", a.pp_chunk,
                                  "tokens per pipeline chunk (default: about 4 chunks per stage; 0 = whole prompt)")
                       ->default_str("");
  app.add_option("--max-memory", a.max_memory, "refuse to run if a rank would need more than BYTES (predicted)");
  app.add_flag("--dry-run", a.dry_run, "print each rank's predicted memory and exit without computing");
  app.add_flag("--check", a.check, "also run the prompt on one rank and compare logits and KV");
  app.add_flag("--check-weights", a.check_weights, "scan every weight for NaN/Inf at load and name the tensor "
               "(one more read of the weights: about 0.1 s per GB, 2% of the bench model's load)");
  app.add_option("--timeout", a.timeout, "seconds a rank waits for a peer before failing (positive)");
  app.add_flag("--json", a.json, "print one JSON object");
  app.add_flag("--quiet", a.quiet, "no progress lines (shown only on a terminal, by rank 0)");
  // MPI first, so that under mpirun one rank prints a usage error instead of every rank.
  parallel::MpiRuntime mpi(&argc, &argv);
  if (const int code = parse_args(app, argc, argv, "run", mpi.world_rank() == 0); code >= 0) return code;
  a.pp_chunk_given = pp_chunk->count() > 0;
  a.prompt_given = prompt->count() > 0;
  if (!(a.timeout > 0)) {  // before any communication, which the timeout governs; every rank stops here
    if (mpi.world_rank() == 0)
      std::cerr << "slope run: error: --timeout must be a positive number of seconds, got " << a.timeout << "\n";
    return kExitError;
  }
  auto world = mpi.world(a.timeout);
  set_num_threads(a.threads > 0 ? a.threads : mpi.default_threads_per_rank());
  if (world->size() == 1) return run(a, *world);
  try {
    return run(a, *world);
  } catch (const std::exception& e) {
    // Under mpirun a rank that stops alone would leave its peers waiting: end them all.
    const bool user = dynamic_cast<const Error*>(&e) != nullptr;
    std::cerr << "slope run: rank " << world->rank() << ": " << (user ? "error: " : "internal error: ") << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, user ? kExitError : kExitInternal);
    return kExitError;
  }
}

}  // namespace slope::cli
