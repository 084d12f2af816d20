#include "slope/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/model/parallel_shape.h"
#include "slope/parallel/agreement.h"
#include "slope/parallel/cp_attention.h"

namespace slope::engine {
namespace {

// A shipped request: this header (point to point, so that waiting ranks can poll for it), then
// the prompt lengths and the ids (broadcasts, once every rank is listening).
struct ShippedHeader {
  int64_t kind = 0;  // 1: prefill, 0: shutdown, 2: release a kept KV shard
  int64_t prompts = 0, top_k = 0, keep_kv = 0, pp_chunk = -1, total_ids = 0;
  int64_t kv_id_bytes = 0;  // then broadcast: the kv_id's characters (prefill and release)
};
constexpr int64_t kShutdown = 0, kPrefill = 1, kReleaseKv = 2;
constexpr int64_t kMaxKvIdBytes = 256;

std::string gb(int64_t bytes) { return str_cat(double(bytes) / 1e9, " GB"); }

}  // namespace

PrefillEngine::PrefillEngine(const EngineConfig& config, parallel::Communicator& world)
    : config_(config), world_(world) {
  // The units of BF16's products, before any weight is packed for them: rank 0's choice on
  // every rank, so that no rank measures its way to other numbers than the rest.
  kernels::set_bf16_units(config.bf16_units);
  int64_t units = int64_t(kernels::bf16_units());
  if (world.size() > 1) world.broadcast(&units, 1, 0);
  bf16_units_ = kernels::Bf16Units(units);
  if (bf16_units_ != kernels::bf16_units()) kernels::set_bf16_units(bf16_units_);
  // First what may fail on some ranks only (checks, this rank's weights), with no communication;
  // then agreement, so that either every rank goes on to build the mesh or every rank throws
  // the same error (the lowest failing rank's).
  std::string error;
  try {
    SLOPE_CHECK(config.gemm_chunk > 0, "gemm chunk must be positive, got ", config.gemm_chunk);
    SLOPE_CHECK(config.moe_chunk > 0, "MoE chunk must be positive, got ", config.moe_chunk);
    SLOPE_CHECK(config.timeout_s > 0, "timeout must be positive, got ", config.timeout_s);
    const model::ModelConfig cfg = model::load_config(config.model_dir);
    const int64_t balance = std::max<int64_t>(1, config.balance_tokens);
    validate_shape(config.mesh, world.size(), cfg, balance);
    stage_bounds_ = balance_stages(cfg, config.mesh.pp, balance);
    // This rank's place (Topology's rank order): stage outermost, tensor rank innermost.
    const RankPlace place = place_of(world.rank(), config.mesh);  // as Topology will place it
    const int stage = place.stage;
    model::LoadOptions lo;
    lo.compute = config.compute;
    lo.first_layer = stage_bounds_[stage];
    lo.last_layer = stage_bounds_[stage + 1];
    lo.load_embedding = stage == 0;
    lo.load_head = stage == config.mesh.pp - 1 && place.tp_rank == 0;  // only tensor rank 0 reports logits
    lo.tp_rank = place.tp_rank;
    lo.tp_size = config.mesh.tp;
    lo.on_layer_loaded = config.on_layer_loaded;
    lo.check_weights = config.check_weights;
    lo.backend = config.backend;
    model_ = model::Model::load(config.model_dir, lo);
  } catch (const Error& e) {
    error = e.what();
  }
  const parallel::AgreedError agreed = parallel::agree_on_error(world, error);
  if (agreed.failed()) throw Error(agreed.message);
  if (config.threads > 0) set_num_threads(config.threads);
  world_.set_timeout(config.timeout_s);
  topo_ = std::make_unique<Topology>(world, config.mesh, config.data_plane);
  if (topo_->cp_mesh()) {
    parallel::CpOptions cpo;
    cpo.ops = &model_->ops();
    auto r = std::make_unique<parallel::ContextParallelAttention>(*topo_->cp_mesh(), cpo);
    cp_ = r.get();
    runner_ = std::move(r);
  } else {
    runner_ = std::make_unique<ops::LocalAttention>(model_->ops());
  }
}

PrefillEngine::~PrefillEngine() = default;

void PrefillEngine::validate(const PrefillRequest& r) const {
  const model::ModelConfig& cfg = model_->config();
  SLOPE_CHECK(!r.prompts.empty(), "the request has no prompt");
  SLOPE_CHECK(r.top_k >= 1 && r.top_k <= cfg.vocab_size, "top_k must be in [1, ", cfg.vocab_size, "], got ", r.top_k);
  SLOPE_CHECK(r.kv_id.size() <= size_t(kMaxKvIdBytes), "a kv_id is at most ", kMaxKvIdBytes, " bytes, got ",
              r.kv_id.size());
  SLOPE_CHECK(r.kv_id.empty() || !kept_kv(r.kv_id), "a KV shard is already kept under id '", r.kv_id,
              "'; release it first or use another id");
  SLOPE_CHECK(r.pp_chunk >= -1, "pp_chunk must be 0 (whole prompt), positive, or -1 (default), got ", r.pp_chunk);
  int64_t n_max = 0;
  for (const auto& p : r.prompts) {
    model::validate_token_ids(cfg, p);
    n_max = std::max<int64_t>(n_max, int64_t(p.size()));
  }
  if (config_.max_memory <= 0) return;
  MemoryQuery q;
  q.shape = config_.mesh;
  q.balance_tokens = std::max<int64_t>(1, config_.balance_tokens);  // the engine's stages, not the request's
  q.num_tokens = n_max;
  q.batch = int(r.prompts.size());
  q.pp_chunk = pipeline_chunk(r);
  q.gemm_chunk = config_.gemm_chunk;
  q.moe_chunk = config_.moe_chunk;
  q.bf16_weights = bf16_weights();
  int64_t worst = 0;
  for (const RankMemory& m : estimate_memory(cfg, q)) worst = std::max(worst, m.total());
  SLOPE_CHECK(worst <= config_.max_memory, "this request needs ", gb(worst), " on the mesh's largest rank, more than ",
              "the limit of ", gb(config_.max_memory), "; send a shorter prompt or fewer prompts at once");
}

int64_t PrefillEngine::pipeline_chunk(const PrefillRequest& r) const {
  return r.pp_chunk >= 0 ? r.pp_chunk : config_.mesh.pipeline_chunk(int64_t(r.prompts[0].size()));
}

PrefillOutput PrefillEngine::prefill(const PrefillRequest& request) {
  SLOPE_CHECK(broken_.empty(), "the engine is unusable after an error in the mesh (", broken_, "); restart it");
  validate(request);
  try {
    return run(request);
  } catch (const RequestError&) {
    throw;  // raised by every rank at the same point: the mesh is still in step
  } catch (const std::exception& e) {
    broken_ = e.what();  // ranks may be anywhere in the prefill: the mesh is out of step
    throw;
  }
}

PrefillOutput PrefillEngine::run(const PrefillRequest& request) {
  const model::ModelConfig& cfg = model_->config();
  const std::vector<std::vector<int32_t>>& prompts = request.prompts;
  PrefillOutput out;
  out.pp_chunk = pipeline_chunk(request);
  PrefillOptions po;
  po.chunk_tokens = config_.gemm_chunk;
  po.moe_chunk_tokens = config_.moe_chunk;
  po.top_k = request.top_k;
  po.keep_kv = request.keep_kv || !request.kv_id.empty();
  po.on_progress = request.on_progress;
  po.buffers = &buffers_;
  Ledger pipeline;
  if (cp_) cp_->reset_stats();
  const int64_t tp_bytes0 = topo_->tp_payload_bytes();

  world_.barrier();
  const double t0 = now_seconds();
  out.results = run_prefill(*model_, prompts, out.pp_chunk, topo_->stage_plan(), *runner_, po, &pipeline);
  for (PrefillResult& r : out.results) share_logits(r, world_, request.top_k);
  if (request.keep_kv && model_->ops().device() != Device::CPU)
    for (PrefillResult& r : out.results) kv_to_host(r, model_->ops());  // the KV shard is returned in host memory
  out.ttft_s = now_seconds() - t0;  // every prompt's first token known on every rank
  if (cp_) cp_->release_kv_cache();  // the chunked K/V cache of this request's prompts

  const model::TensorSlice& sl = model_->slice();
  out.kv.first_layer = model_->first_layer();
  out.kv.layers = model_->last_layer() - model_->first_layer();
  out.kv.kv_head0 = sl.kv_head0;
  out.kv.kv_heads = sl.kv_heads;
  // With replicated KV heads (tp > KV heads) only the first holder of a head owns it.
  out.kv.owner = sl.size == 1 || cfg.num_kv_heads >= sl.size || sl.rank % (sl.size / cfg.num_kv_heads) == 0;

  RankReport& mine = out.report;
  mine.rank = world_.rank();
  mine.stage = topo_->stage();
  for (const PrefillResult& res : out.results) {
    mine.tokens += res.shard.local_tokens();
    const Ledger& t = res.ledger;
    mine.prefill_seconds += res.seconds;
    mine.attention_seconds += t.seconds(Phase::Attention);
    mine.other_compute_seconds += t.sum(Phase::Embed, Phase::NormQkvRope, Phase::OProj, Phase::Mlp, Phase::LmHead);
    mine.tp_seconds += t.seconds(Phase::TpAllreduce);
    // The KV cache held during the prefill (kept afterwards only with keep_kv).
    mine.kv_bytes += res.shard.local_tokens() * out.kv.layers * 2 * sl.kv_heads * cfg.head_dim * int64_t(sizeof(float));
  }
  mine.weight_bytes = int64_t(model_->weight_bytes());
  mine.pipe_wait_seconds = pipeline.sum(Phase::PipeRecvWait, Phase::PipeSendWait);
  mine.bytes_sent = pipeline.bytes_sent();
  mine.bytes_received = pipeline.bytes_received();
  if (cp_) {
    const Ledger& cp = cp_->stats().ledger;
    mine.cp_compute_seconds = cp.seconds(Phase::AttnCompute);
    mine.cp_comm_seconds = cp.seconds(Phase::AttnComm);
    mine.cp_wait_seconds = cp.seconds(Phase::AttnWait);
    mine.bytes_sent += cp.bytes_sent();
    mine.bytes_received += cp.bytes_received();
  } else {
    mine.cp_compute_seconds = mine.attention_seconds;
  }
  const int64_t tp_bytes = topo_->tp_payload_bytes() - tp_bytes0;  // all-reduce payload, each way
  mine.bytes_sent += tp_bytes;
  mine.bytes_received += tp_bytes;
  mine.peak_rss_bytes = peak_rss_bytes();
  mine.rss_bytes = current_rss_bytes();
  // Activations are not tracked allocation by allocation: report the prediction (--dry-run's).
  MemoryQuery mq;
  mq.shape = config_.mesh;
  mq.balance_tokens = std::max<int64_t>(1, config_.balance_tokens);
  for (const auto& p : prompts) mq.num_tokens = std::max<int64_t>(mq.num_tokens, int64_t(p.size()));
  mq.batch = int(prompts.size());
  mq.pp_chunk = out.pp_chunk;
  mq.gemm_chunk = config_.gemm_chunk;
  mq.moe_chunk = config_.moe_chunk;
  mq.bf16_weights = bf16_weights();
  mine.activation_bytes = estimate_memory(cfg, mq).at(size_t(world_.rank())).activations;
  out.reports = gather_reports(mine, world_);
  if (!request.kv_id.empty()) keep_kv(request.kv_id, out);
  return out;
}

void PrefillEngine::kv_to_host(PrefillResult& r, const ops::Backend& ops) {
  for (std::vector<Tensor>* kv : {&r.k, &r.v})
    for (Tensor& t : *kv) {
      Tensor host(t.shape(), t.dtype());
      ops.to_host(t.data<float>(), t.numel(), host.data<float>());
      t = std::move(host);
    }
}

void PrefillEngine::keep_kv(const std::string& kv_id, PrefillOutput& out) {
  auto kept = std::make_shared<KeptKv>();
  for (PrefillResult& r : out.results) {
    for (const Tensor& t : r.k) kept->bytes += int64_t(t.nbytes());
    for (const Tensor& t : r.v) kept->bytes += int64_t(t.nbytes());
    kept->k.push_back(std::move(r.k));
    kept->v.push_back(std::move(r.v));
    kept->shards.push_back(r.shard);
    kept->first_tokens.push_back(r.first_token);
    r.k.clear();
    r.v.clear();
  }
  std::lock_guard lk(kept_mu_);
  kept_[kv_id] = std::move(kept);
}

void PrefillEngine::release_kv(const std::string& kv_id) {
  SLOPE_CHECK(world_.rank() == 0, "only rank 0 coordinates the mesh");
  SLOPE_CHECK(broken_.empty(), "the engine is unusable after an error in the mesh (", broken_, "); restart it");
  SLOPE_CHECK(kv_id.size() <= size_t(kMaxKvIdBytes), "a kv_id is at most ", kMaxKvIdBytes, " bytes, got ", kv_id.size());
  if (world_.size() > 1) {
    try {
      ship_release(kv_id);
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw;
    }
  }
  release_local(kv_id);
}

bool PrefillEngine::release_local(const std::string& kv_id) {
  std::lock_guard lk(kept_mu_);
  return kept_.erase(kv_id) > 0;
}

std::shared_ptr<const KeptKv> PrefillEngine::kept_kv(const std::string& kv_id) const {
  std::lock_guard lk(kept_mu_);
  auto it = kept_.find(kv_id);
  return it == kept_.end() ? nullptr : it->second;
}

std::vector<std::string> PrefillEngine::kept_kv_ids() const {
  std::lock_guard lk(kept_mu_);
  std::vector<std::string> ids;
  for (const auto& [id, kv] : kept_) ids.push_back(id);
  return ids;
}

void PrefillEngine::ship_release(const std::string& kv_id) {
  ShippedHeader h;
  h.kind = kReleaseKv;
  h.kv_id_bytes = int64_t(kv_id.size());
  std::vector<parallel::Request> sends;
  for (int r = 1; r < world_.size(); ++r) sends.push_back(world_.isend_bytes(&h, sizeof(h), r, parallel::Tag::Control));
  parallel::wait_all(sends);
  std::string id = kv_id;
  world_.broadcast(id.data(), id.size(), 0);
}

void PrefillEngine::ship(const PrefillRequest* request) {
  SLOPE_CHECK(world_.rank() == 0, "only rank 0 coordinates the mesh");
  ShippedHeader h;
  std::vector<int64_t> lengths;
  std::vector<int32_t> ids;
  if (request) {
    h.kind = kPrefill;
    h.prompts = int64_t(request->prompts.size());
    h.top_k = request->top_k;
    h.keep_kv = request->keep_kv;
    h.pp_chunk = request->pp_chunk;
    for (const auto& p : request->prompts) {
      lengths.push_back(int64_t(p.size()));
      ids.insert(ids.end(), p.begin(), p.end());
    }
    h.total_ids = int64_t(ids.size());
    h.kv_id_bytes = int64_t(request->kv_id.size());
  }
  std::vector<parallel::Request> sends;
  for (int r = 1; r < world_.size(); ++r) sends.push_back(world_.isend_bytes(&h, sizeof(h), r, parallel::Tag::Control));
  parallel::wait_all(sends);
  if (!request) return;
  world_.broadcast(lengths.data(), lengths.size(), 0);
  world_.broadcast(ids.data(), ids.size(), 0);
  std::string kv_id = request->kv_id;
  world_.broadcast(kv_id.data(), kv_id.size(), 0);
}

PrefillOutput PrefillEngine::submit(const PrefillRequest& request) {
  SLOPE_CHECK(broken_.empty(), "the engine is unusable after an error in the mesh (", broken_, "); restart it");
  validate(request);  // a bad request goes back to the caller; the other ranks never see it
  try {
    ship(&request);
    return run(request);
  } catch (const RequestError&) {
    throw;
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
}

void PrefillEngine::shutdown() {
  if (world_.size() > 1 && broken_.empty()) ship(nullptr);
}

void PrefillEngine::serve(const std::function<void(const PrefillOutput&)>& on_result) {
  SLOPE_CHECK(world_.rank() != 0, "rank 0 coordinates (submit, shutdown); the other ranks serve");
  for (;;) {
    ShippedHeader h;
    parallel::Request next = world_.irecv_bytes(&h, sizeof(h), 0, parallel::Tag::Control);
    // MPI's blocking waits spin on a core; an idle rank polls instead, sleeping between polls
    // (20 us growing to 2 ms: a request waits at most ~2 ms to start on an idle mesh).
    for (int us = 20; !next.test(); us = std::min(2 * us, 2000))
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    if (h.kind == kShutdown) return;
    SLOPE_CHECK(h.kv_id_bytes >= 0 && h.kv_id_bytes <= kMaxKvIdBytes, "rank ", world_.rank(),
                ": malformed request from rank 0");
    std::string kv_id(size_t(h.kv_id_bytes), '\0');
    if (h.kind == kReleaseKv) {
      world_.broadcast(kv_id.data(), kv_id.size(), 0);
      release_local(kv_id);
      continue;
    }
    SLOPE_CHECK(h.kind == kPrefill && h.prompts >= 1 && h.total_ids >= h.prompts, "rank ", world_.rank(),
                ": malformed request from rank 0");
    std::vector<int64_t> lengths(size_t(h.prompts));
    std::vector<int32_t> ids(size_t(h.total_ids));
    world_.broadcast(lengths.data(), lengths.size(), 0);
    world_.broadcast(ids.data(), ids.size(), 0);
    world_.broadcast(kv_id.data(), kv_id.size(), 0);
    PrefillRequest r;
    r.kv_id = kv_id;
    r.top_k = int(h.top_k);
    r.keep_kv = h.keep_kv != 0;
    r.pp_chunk = h.pp_chunk;
    size_t at = 0;
    for (int64_t len : lengths) {
      r.prompts.emplace_back(ids.begin() + int64_t(at), ids.begin() + int64_t(at) + len);
      at += size_t(len);
    }
    PrefillOutput out;
    try {
      out = run(r);  // rank 0 validated it
    } catch (const RequestError&) {
      continue;  // rank 0 gets the same error from submit(); wait for the next request
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw;
    }
    if (on_result) on_result(out);
  }
}

}  // namespace slope::engine
