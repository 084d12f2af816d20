// engine::PrefillEngine: a long-lived prefill engine on one rank of a mesh. Built once from an
// EngineConfig (collective: topology, this rank's weights, the attention runner, buffers), it
// then runs prefill after prefill on the live mesh, for prompts of any length.
//
// Two ways to drive it:
//  - collective: every rank calls prefill(request) with the same request (`slope run`);
//  - coordinator: rank 0 calls submit(request), which ships the request to the other ranks,
//    and they sit in serve() between requests (a server's instance). Waiting ranks sleep
//    between polls (no busy-waiting in a blocking MPI call), so an idle instance costs no CPU.
//
// Errors a request can cause (bad ids, a prompt too long for the model or for --max-memory)
// are slope::Error thrown by validate(), before any rank communicates: the engine stays usable
// for the next request. An error inside the mesh (a peer died, a timeout) leaves the engine
// unusable; every later call says so (the instance must be restarted).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "slope/engine/distributed.h"
#include "slope/engine/executor.h"
#include "slope/engine/topology.h"
#include "slope/kernels/gemm.h"
#include "slope/model/model.h"

namespace slope::parallel {
class ContextParallelAttention;
}

namespace slope::engine {

struct EngineConfig {
  std::string model_dir;
  ParallelShape mesh;                                      // pp x ring x ulysses x tp ranks, pipeline chunk
  kernels::ComputeType compute = kernels::ComputeType::BF16;
  // Where BF16's products run (kernels/bf16_units.h); Auto: the faster here. Every rank runs
  // rank 0's resolved choice. Process-wide: it is set before this engine loads its weights.
  kernels::Bf16Units bf16_units = kernels::Bf16Units::Auto;
  int threads = 0;                                         // OpenMP threads per rank; 0: leave as set
  int64_t gemm_chunk = 1024;                               // rows per chunk of the token-local work
  int64_t moe_chunk = model::kDefaultMoeChunk;             // rows per MoE call (at least gemm_chunk)
  double timeout_s = 300;                                  // a rank waits this long for a peer
  int64_t max_memory = 0;                                  // bytes a rank may need (predicted); 0: no limit
  int64_t balance_tokens = 4096;                           // prompt length the stages are balanced for
  bool check_weights = false;                              // scan the weights for NaN/Inf at load
  std::function<void(int, int)> on_layer_loaded;           // progress while loading (layers done, total)
  const ops::Backend* backend = nullptr;                   // the device's ops; null: ops::cpu()
  parallel::DataPlaneFactory data_plane;                   // payload transport; empty: host memory (MPI)
};

struct PrefillRequest {
  std::vector<std::vector<int32_t>> prompts;  // one prompt, or a batch (pipelined as micro-batches)
  int top_k = 5;
  bool keep_kv = false;                       // keep this rank's KV shard in the result (host memory)
  int64_t pp_chunk = -1;                      // -1: the engine's (EngineConfig::mesh.pp_chunk or default)
  // Non-empty: every rank keeps its KV shard of this request inside the engine under this id
  // (a server's KV lease) until release_kv(id); the shard is then not in the returned results.
  std::string kv_id;
  std::function<void(const PrefillProgress&)> on_progress;  // this rank only; not shipped
};

// A KV shard kept under a request's kv_id: per prompt, per local layer, K and V. Immutable once
// kept: the KV transfer service reads it from its own threads (src/slope/kvx) while the engine
// runs the next prefill, and holds it by shared_ptr so that a transfer in flight keeps it
// alive when it is released meanwhile.
struct KeptKv {
  std::vector<std::vector<Tensor>> k, v;  // [prompt][layer] -> [local tokens, kv_heads, head_dim]
  std::vector<ops::SequenceShard> shards;  // [prompt]: the global positions of the rows, in row order
  std::vector<int32_t> first_tokens;       // [prompt]: the greedy first token (every rank knows it)
  int64_t bytes = 0;
};

// Where this rank's KV shard sits in the whole cache: layers [first_layer, first_layer + layers),
// KV heads [kv_head0, kv_head0 + kv_heads), rows at the global positions of result.shard.
struct KvShardInfo {
  int first_layer = 0, layers = 0;
  int64_t kv_head0 = 0, kv_heads = 0;
  bool owner = true;  // false on tensor ranks that hold a replica of another rank's KV heads
};

struct PrefillOutput {
  std::vector<PrefillResult> results;  // per prompt: first token, top logprobs, logits (every rank)
  int64_t pp_chunk = 0;                // the pipeline chunk used
  double ttft_s = 0;                   // start to every prompt's first token known on every rank
  KvShardInfo kv;
  RankReport report;                   // this rank
  std::vector<RankReport> reports;     // every rank's, on rank 0 only
};

class PrefillEngine {
 public:
  // Collective over `world` (every rank, same config). Throws slope::Error naming the problem
  // for an impossible mesh or bad model files.
  PrefillEngine(const EngineConfig& config, parallel::Communicator& world);
  ~PrefillEngine();
  PrefillEngine(const PrefillEngine&) = delete;
  PrefillEngine& operator=(const PrefillEngine&) = delete;

  const EngineConfig& config() const { return config_; }
  const model::ModelConfig& model_config() const { return model_->config(); }
  const model::Model& model() const { return *model_; }
  const Topology& topology() const { return *topo_; }
  int rank() const { return world_.rank(); }
  bool broken() const { return !broken_.empty(); }  // an error in the mesh: restart the instance
  // The units BF16's products run on in this engine (Bf16 or F32, never Auto).
  kernels::Bf16Units bf16_units() const { return bf16_units_; }
  // The Linear weights are packed in bf16 (compute BF16 on the bf16 units): what the memory
  // prediction counts.
  bool bf16_weights() const { return engine::bf16_weights(config_.compute, bf16_units_); }

  // Throws slope::Error for a request this engine cannot run; communicates with no one.
  void validate(const PrefillRequest& request) const;
  // Collective: every rank calls it with the same request. Validates first.
  PrefillOutput prefill(const PrefillRequest& request);

  // Coordinator (rank 0): validates, ships the request to every rank, and runs it. The other
  // ranks must be in serve().
  PrefillOutput submit(const PrefillRequest& request);
  // Coordinator: lets the other ranks leave serve().
  void shutdown();
  // Coordinator: every rank drops the KV shard kept under `kv_id`, if it still holds it (a rank
  // whose shard a KV client acked has dropped it already: release_local). Unknown ids are
  // shipped too and do nothing: rank 0 cannot tell an id the other ranks still hold.
  void release_kv(const std::string& kv_id);
  // This rank only, no communication (the KV transfer service, on the client's ack): drops the
  // shard kept under `kv_id`. False when it was not kept. Thread-safe.
  bool release_local(const std::string& kv_id);
  // The shard kept under `kv_id` on this rank, or nullptr. Thread-safe; the shard stays valid
  // while the pointer is held, even if it is released meanwhile.
  std::shared_ptr<const KeptKv> kept_kv(const std::string& kv_id) const;
  std::vector<std::string> kept_kv_ids() const;  // sorted; thread-safe

  // Other ranks: runs shipped requests until shutdown(); `on_result` sees each result here.
  // Between requests the rank sleeps between polls for the next one.
  void serve(const std::function<void(const PrefillOutput&)>& on_result = {});

 private:
  PrefillOutput run(const PrefillRequest& request);
  // The request's tokens per pipeline chunk: its own, else the mesh's (default per length).
  int64_t pipeline_chunk(const PrefillRequest& request) const;
  void ship(const PrefillRequest* request);  // rank 0; nullptr: shutdown
  static void kv_to_host(PrefillResult& r, const ops::Backend& ops);
  void ship_release(const std::string& kv_id);  // rank 0
  void keep_kv(const std::string& kv_id, PrefillOutput& out);

  EngineConfig config_;
  parallel::Communicator& world_;
  std::unique_ptr<Topology> topo_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<ops::AttentionRunner> runner_;
  parallel::ContextParallelAttention* cp_ = nullptr;  // runner_ when context-parallel
  model::LayerBuffers buffers_;                       // per-layer buffers kept across prefills
  std::vector<int> stage_bounds_;
  std::string broken_;                                // why the engine is unusable, if it is
  kernels::Bf16Units bf16_units_ = kernels::Bf16Units::F32;
  mutable std::mutex kept_mu_;                        // kept_ (read by the KV service's threads)
  std::map<std::string, std::shared_ptr<const KeptKv>> kept_;  // KV shards kept under a request's kv_id
};

}  // namespace slope::engine
