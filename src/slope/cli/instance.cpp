// `slope instance`: one engine instance of `slope serve`, run under mpirun by the front (hidden
// from `slope --help`). Every rank builds the engine; rank 0 connects to the front's unix socket,
// says hello, then answers one request frame at a time (serve/wire.h, docs/serving.md) with
// PrefillEngine::submit, while the other ranks sit in serve(). An error in the mesh (a peer
// died, a timeout) is reported to the front and ends the whole job (MPI_Abort): the front
// restarts it. The end of the front's connection shuts the instance down cleanly.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <fstream>
#include <iostream>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/engine/engine.h"
#include "slope/engine/kv_export.h"
#include "slope/kernels/bf16_units.h"
#include "slope/kvx/service.h"
#include "slope/parallel/mpi_comm.h"
#include "slope/serve/mesh_spec.h"
#include "slope/serve/wire.h"

namespace slope::cli {
namespace {

using nlohmann::json;

struct InstanceArgs {
  std::string model_dir, mesh = "ring=1", socket, dtype = kDefaultComputeDtype, bf16_units = "auto";
  int threads = 0;
  double timeout = parallel::kDefaultTimeoutSeconds;
  int64_t max_memory = 0;
  int64_t chunk = 1024;
  int64_t moe_chunk = model::kDefaultMoeChunk;
  std::string kv_host = "127.0.0.1", kv_key_file;
  int kv_port_base = 0;  // > 0: rank r's KV service listens on kv_port_base + r
  std::vector<std::string> kv_push_allow;
};

using kvx::layout_json;
using kvx::RankLayout;

json reply_of(const engine::PrefillOutput& out, const std::vector<std::vector<int32_t>>& prompts, bool logits) {
  json results = json::array();
  for (size_t b = 0; b < out.results.size(); ++b) {
    const engine::PrefillResult& r = out.results[b];
    json top = json::array();
    for (const auto& t : r.top_logprobs) top.push_back({t.token, t.logprob});
    json one = {{"first_token", r.first_token}, {"top_logprobs", top}, {"num_tokens", prompts[b].size()}};
    if (logits) one["logits"] = r.logits;
    results.push_back(one);
  }
  // Per-rank sums: the critical path is the slowest rank; the communication share is the part
  // of all ranks' prefill time spent moving or waiting for data.
  double prefill = 0, slowest = 0, comm = 0, compute = 0, kv_bytes = 0, rss_bytes = 0;
  for (const engine::RankReport& rep : out.reports) {
    prefill += rep.prefill_seconds;
    slowest = std::max(slowest, rep.prefill_seconds);
    comm += rep.cp_wait_seconds + rep.pipe_wait_seconds + rep.tp_seconds;
    compute += rep.other_compute_seconds + rep.cp_compute_seconds;
    kv_bytes += double(rep.kv_bytes);
    rss_bytes += double(rep.rss_bytes);
  }
  return {{"ok", true},
          {"results", results},
          {"ttft_ms", out.ttft_s * 1e3},
          {"pp_chunk", out.pp_chunk},
          {"timings", {{"engine_ttft_ms", out.ttft_s * 1e3}, {"prefill_ms", slowest * 1e3},
                       {"compute_ms", compute * 1e3}, {"communication_ms", comm * 1e3},
                       {"communication_share", prefill > 0 ? comm / prefill : 0.0}}},
          {"kv_bytes", kv_bytes},
          {"rss_bytes", rss_bytes}};
}

// Rank 0: the front's requests, one at a time, until the front closes the connection or says
// shutdown. Returns the exit code.
int coordinate(engine::PrefillEngine& eng, const InstanceArgs& a, const std::vector<RankLayout>& layout,
               const std::vector<int>& pids, int64_t rss_bytes) {
  const int fd = serve::connect_unix(a.socket);
  serve::write_frame(fd, {{"op", "hello"}, {"ranks", eng.config().mesh.size()}, {"mesh", serve::mesh_spec(eng.config().mesh)},
                          {"pids", pids}, {"layout", layout_json(layout)}, {"rss_bytes", rss_bytes},
                          {"bf16_units", kernels::bf16_units_name(kernels::bf16_units())}});
  for (;;) {
    std::optional<json> msg;
    try {
      msg = serve::read_frame(fd);
    } catch (const Error& e) {
      std::cerr << "slope instance: " << e.what() << "; shutting down\n";
      msg.reset();
    }
    if (!msg || msg->value("op", "") == "shutdown") {
      eng.shutdown();
      if (msg) serve::write_frame(fd, {{"ok", true}});
      ::close(fd);
      return kExitOk;
    }
    const std::string op = msg->value("op", "");
    json reply;
    try {
      if (op == "prefill") {
        engine::PrefillRequest req;
        req.prompts = msg->at("prompts").get<std::vector<std::vector<int32_t>>>();
        req.top_k = msg->value("top_k", 5);
        // Kept for the API key that asked (its digest): the rank's KV service finds it only with that key.
        req.kv_id = msg->value("kv_id", "");
        if (!req.kv_id.empty()) req.kv_id = kvx::owned_kv_id(req.kv_id, msg->value("kv_owner", ""));
        reply = reply_of(eng.submit(req), req.prompts, msg->value("logits", false));
      } else if (op == "release") {
        eng.release_kv(kvx::owned_kv_id(msg->at("kv_id").get<std::string>(), msg->value("kv_owner", "")));
        reply = {{"ok", true}};
      } else {
        reply = {{"ok", false}, {"error", str_cat("unknown op '", op, "'")}, {"broken", false}};
      }
    } catch (const Error& e) {  // a bad request (validate) or a failure every rank saw: still usable
      reply = {{"ok", false}, {"error", e.what()}, {"broken", false}};
    } catch (const std::exception& e) {  // the mesh is out of step: this instance must be restarted
      reply = {{"ok", false}, {"error", e.what()}, {"broken", true}};
    }
    if (eng.broken()) reply["broken"] = true;  // an error in the mesh, whatever its type
    serve::write_frame(fd, reply);
    if (reply.value("broken", false)) {
      std::cerr << "slope instance: the mesh failed (" << reply.value("error", "") << "); ending the job\n";
      MPI_Abort(MPI_COMM_WORLD, kExitError);
    }
  }
}

}  // namespace

int cmd_instance(int argc, char** argv) {
  InstanceArgs a;
  CLI::App app{"One engine instance of `slope serve` (started by it under mpirun; not for direct use)", "slope instance"};
  setup_app(app);
  app.add_option("--model", a.model_dir, "HF model directory")->required();
  app.add_option("--mesh", a.mesh, "the mesh: \"pp=1,ring=2,ulysses=1,tp=1\"");
  app.add_option("--socket", a.socket, "the front's unix socket")->required();
  app.add_option("--dtype", a.dtype, "compute type: bf16 or f32");
  app.add_option("--bf16-units", a.bf16_units, "where bf16's products run: auto, bf16 or f32 (slope run --bf16-units)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  app.add_option("--threads", a.threads, "OpenMP threads per rank (0: the node's cores shared by its ranks)");
  app.add_option("--timeout", a.timeout, "seconds a rank waits for a peer before failing");
  app.add_option("--max-memory", a.max_memory, "bytes a rank may need (predicted); 0: no limit");
  app.add_option("--chunk", a.chunk, "tokens per chunk of the token-local work");
  app.add_option("--moe-chunk", a.moe_chunk, "tokens per MoE call (slope run --moe-chunk)");
  app.add_option("--kv-host", a.kv_host, "address each rank's KV transfer service listens on");
  app.add_option("--kv-port-base", a.kv_port_base, "rank r's KV service listens on this + r (0: any free port)");
  app.add_option("--kv-key-file", a.kv_key_file, "a file of the SHA-256 digests (hex, one a line) of the API keys KV clients may send (none: no key)");
  app.add_option("--kv-push-allow", a.kv_push_allow, "the hosts a push may dial: CIDR blocks, addresses, names (none: any)")
      ->delimiter(',');
  parallel::MpiRuntime mpi(&argc, &argv);
  if (const int code = parse_args(app, argc, argv, "instance", mpi.world_rank() == 0); code >= 0) return code;
  auto world = mpi.world(a.timeout > 0 ? a.timeout : parallel::kDefaultTimeoutSeconds);
  set_num_threads(a.threads > 0 ? a.threads : mpi.default_threads_per_rank());
  return_large_frees_to_system();  // a long-lived engine: its memory must not creep (docs/serving.md)
  try {
    engine::EngineConfig ec;
    ec.model_dir = a.model_dir;
    ec.mesh = serve::parse_mesh_spec(a.mesh);
    ec.compute = parse_compute_dtype(a.dtype);
    ec.bf16_units = kernels::parse_bf16_units(a.bf16_units);
    ec.timeout_s = a.timeout;
    ec.max_memory = a.max_memory;
    ec.gemm_chunk = a.chunk;
    ec.moe_chunk = a.moe_chunk;
    engine::PrefillEngine eng(ec, *world);  // every rank throws the same error
    // Every rank serves its own KV shards (docs/kv-format.md, "Transfer protocol, version 1").
    kvx::ServiceOptions so;
    so.host = a.kv_host;
    so.port = a.kv_port_base > 0 ? a.kv_port_base + world->rank() : 0;
    so.push_allow = kvx::AddressList(a.kv_push_allow);
    if (!a.kv_key_file.empty()) {  // SHA-256 digests of the API keys, one a line (the keys never reach the ranks)
      std::ifstream key(a.kv_key_file);
      SLOPE_CHECK(key, "cannot read the KV key file ", a.kv_key_file);
      for (std::string line; std::getline(key, line);)
        if (!line.empty()) so.key_hashes.push_back(line);
      SLOPE_CHECK(!so.key_hashes.empty(), "the KV key file ", a.kv_key_file, " holds no key digest");
    }
    kvx::KvService kv_service(kvx::describe_shard(eng, a.model_dir, engine::model_fingerprint(a.model_dir)), so,
                              [&eng](const std::string& id) { return eng.kept_kv(id); },
                              [&eng](const std::string& id) { eng.release_local(id); });
    const std::vector<RankLayout> layout = world->allgather(kvx::rank_layout(eng, kv_service.endpoint()));
    const std::vector<int> pids = world->allgather(int(getpid()));
    int64_t rss_bytes = 0;  // the ranks' resident memory with the model loaded
    for (const int64_t r : world->allgather(current_rss_bytes())) rss_bytes += r;
    if (world->rank() == 0) return coordinate(eng, a, layout, pids, rss_bytes);
    eng.serve();
    return kExitOk;
  } catch (const std::exception& e) {
    const bool user = dynamic_cast<const Error*>(&e) != nullptr;
    std::cerr << "slope instance: rank " << world->rank() << ": " << (user ? "error: " : "internal error: ") << e.what()
              << "\n";
    if (world->size() > 1) MPI_Abort(MPI_COMM_WORLD, user ? kExitError : kExitInternal);
    return user ? kExitError : kExitInternal;
  }
}

}  // namespace slope::cli
