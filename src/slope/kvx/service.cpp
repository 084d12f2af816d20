#include "slope/kvx/service.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "slope/core/half.h"
#include "slope/core/sha256.h"
#include "slope/core/sys.h"
#include "slope/kvx/crc32.h"

namespace slope::kvx {
namespace {

using nlohmann::json;

// A run of rows sent together: global positions [position, position + count), which are rows
// [row, row + count) of the rank's buffer (segments in buffer order, see ops::SequenceShard).
struct RowBlock {
  int64_t position, row, count;
};

// The rows a layer sends: every row the rank holds or, for a sliding-window layer of window W
// under window_trim, only those at positions >= N - W (the keys a decode step still attends to).
std::vector<RowBlock> row_blocks(const ops::SequenceShard& shard, int64_t window, bool trim) {
  const int64_t lo = trim && window > 0 ? std::max<int64_t>(0, shard.total_tokens - window) : 0;
  std::vector<RowBlock> blocks;
  int64_t row = 0;
  for (const ops::Segment& s : shard.segments) {
    const int64_t begin = std::max(s.start, lo), end = s.start + s.length;
    if (begin < end) blocks.push_back({begin, row + (begin - s.start), end - begin});
    row += s.length;
  }
  return blocks;
}

// Streams rows of a [rows, heads, head_dim] f32 tensor in `dtype` through `sink` in pieces of
// at most ~1 MiB (the conversion buffer): the bytes are never all copied at once.
template <class Sink>
void for_each_piece(const Tensor& t, const std::vector<RowBlock>& blocks, DType dtype, Sink&& sink) {
  const int64_t row_floats = t.dim(1) * t.dim(2);
  const float* base = t.data<float>();
  const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, row_floats));
  std::vector<uint16_t> half;
  for (const RowBlock& b : blocks)
    for (int64_t r = 0; r < b.count; r += rows_per_piece) {
      const int64_t n = std::min(rows_per_piece, b.count - r) * row_floats;
      const float* src = base + (b.row + r) * row_floats;
      if (dtype == DType::F32) {
        sink(src, size_t(n) * sizeof(float));
      } else {
        half.resize(size_t(n));
        for (int64_t i = 0; i < n; ++i) half[size_t(i)] = f32_to_bf16(src[i]);
        sink(half.data(), size_t(n) * sizeof(uint16_t));
      }
    }
}

void check_kept(const ShardDescription& d, const engine::KeptKv& kept) {
  SLOPE_CHECK(kept.k.size() == 1 && kept.shards.size() == 1, "the KV kept under this id holds ", kept.k.size(),
              " prompts; the transfer serves one-prompt requests");
  SLOPE_CHECK(int(kept.k[0].size()) == d.layers, "the kept KV holds ", kept.k[0].size(), " layers, the rank ", d.layers);
  for (const Tensor& t : kept.k[0])
    SLOPE_CHECK(t.dtype() == DType::F32 && t.rank() == 3, "the kept KV is not f32 [rows, heads, head_dim]");
}

}  // namespace

std::string owned_kv_id(const std::string& kv_id, const std::string& owner_hash) {
  return owner_hash.empty() ? kv_id : kv_id + "/" + owner_hash;
}

ShardDescription describe_shard(const engine::PrefillEngine& engine, const std::string& model_name,
                                const std::string& model_hash) {
  const model::ModelConfig& cfg = engine.model_config();
  const model::Model& m = engine.model();
  ShardDescription d;
  d.model_name = model_name;
  d.model_hash = model_hash;
  d.architecture = cfg.architecture;
  d.rank = engine.rank();
  d.world_size = engine.config().mesh.size();
  d.num_layers = int(cfg.num_layers);
  d.first_layer = m.first_layer();
  d.layers = m.last_layer() - m.first_layer();
  d.num_kv_heads = cfg.num_kv_heads;
  d.kv_head0 = m.slice().kv_head0;
  d.kv_heads = m.slice().kv_heads;
  d.head_dim = cfg.head_dim;
  d.layer_window = cfg.layer_window;
  return d;
}

RankLayout rank_layout(const engine::PrefillEngine& engine, const std::string& endpoint) {
  const model::Model& m = engine.model();
  const engine::RankPlace place = engine::place_of(engine.rank(), engine.config().mesh);
  const int64_t H = engine.model_config().num_kv_heads;
  const model::TensorSlice& sl = m.slice();
  const bool owner = sl.size == 1 || H >= sl.size || sl.rank % (sl.size / H) == 0;
  RankLayout r{engine.rank(), place.stage, place.cp_rank, place.tp_rank, m.first_layer(),
               m.last_layer() - m.first_layer(), sl.kv_head0, sl.kv_heads, owner ? 1 : 0, {}};
  SLOPE_CHECK(endpoint.size() < sizeof(r.endpoint), "the KV endpoint ", endpoint, " is too long");
  std::memcpy(r.endpoint, endpoint.c_str(), endpoint.size() + 1);
  return r;
}

json layout_json(const std::vector<RankLayout>& all) {
  json l = json::array();
  for (const RankLayout& r : all)
    l.push_back({{"rank", r.rank}, {"stage", r.stage}, {"cp_rank", r.cp_rank}, {"tp_rank", r.tp_rank},
                 {"first_layer", r.first_layer}, {"layers", r.layers}, {"kv_head0", r.kv_head0},
                 {"kv_heads", r.kv_heads}, {"owner", r.owner != 0},
                 {"endpoint", std::string(r.endpoint, strnlen(r.endpoint, sizeof(r.endpoint)))}});
  return l;
}

json make_manifest(const ShardDescription& d, const std::string& kv_id, const engine::KeptKv& kept, const SendOptions& o) {
  check_kept(d, kept);
  const ops::SequenceShard& shard = kept.shards[0];
  const size_t elem = o.dtype == DType::F32 ? 4 : 2;
  json layers = json::array(), tensors = json::array();
  int64_t total = 0, untrimmed = 0;
  for (int l = 0; l < d.layers; ++l) {
    const int layer = d.first_layer + l;
    const int64_t window = d.layer_window.at(size_t(layer));
    const std::vector<RowBlock> blocks = row_blocks(shard, window, o.window_trim);
    json ranges = json::array();
    int64_t rows = 0;
    for (const RowBlock& b : blocks) {
      ranges.push_back({b.position, b.count});
      rows += b.count;
    }
    layers.push_back({{"layer", layer}, {"window", window}, {"ranges", ranges}, {"rows", rows}});
    for (const char* kind : {"k", "v"}) {
      const Tensor& t = (kind[0] == 'k' ? kept.k : kept.v)[0][size_t(l)];
      uint32_t crc = 0;
      for_each_piece(t, blocks, o.dtype, [&](const void* p, size_t n) { crc = crc32(p, n, crc); });
      const int64_t bytes = rows * d.kv_heads * d.head_dim * int64_t(elem);
      tensors.push_back({{"name", str_cat("layers.", layer, ".", kind)}, {"layer", layer}, {"kind", kind},
                         {"shape", {rows, d.kv_heads, d.head_dim}}, {"bytes", bytes}, {"crc32", hex32(crc)}});
      total += bytes;
      untrimmed += shard.local_tokens() * d.kv_heads * d.head_dim * int64_t(elem);
    }
  }
  return {{"version", kProtocolVersion},
          {"kv_id", kv_id},
          {"model", d.model_name},
          {"model_hash", d.model_hash},
          {"architecture", d.architecture},
          {"dtype", o.dtype == DType::F32 ? "f32" : "bf16"},
          {"window_trim", o.window_trim},
          {"num_tokens", shard.total_tokens},
          {"first_token", kept.first_tokens.at(0)},
          {"rank", d.rank},
          {"world_size", d.world_size},
          {"num_layers", d.num_layers},
          {"first_layer", d.first_layer},
          {"layer_count", d.layers},
          {"num_kv_heads", d.num_kv_heads},
          {"kv_head0", d.kv_head0},
          {"kv_heads", d.kv_heads},
          {"head_dim", d.head_dim},
          {"layers", layers},
          {"tensors", tensors},
          {"bytes", total},
          {"untrimmed_bytes", untrimmed}};
}

KvService::KvService(ShardDescription shard, ServiceOptions options, ShardLookup lookup, ShardRelease release)
    : shard_(std::move(shard)), opt_(std::move(options)), lookup_(std::move(lookup)), release_(std::move(release)) {
  SLOPE_CHECK(opt_.io_timeout_s > 0 && opt_.ack_timeout_s > 0, "the KV service's timeouts must be positive");
  std::tie(listen_fd_, port_) = listen_tcp(opt_.host, opt_.port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

KvService::~KvService() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard lk(mu_);
    for (Worker& w : workers_)
      if (!w.done) ::shutdown(w.fd, SHUT_RDWR);  // a read or write in flight returns at once
  }
  for (Worker& w : workers_) w.thread.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string KvService::endpoint() const {
  std::string host = opt_.host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    char name[256] = {};
    host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "127.0.0.1";
  }
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port_) : str_cat(host, ":", port_);
}

void KvService::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lk(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {  // reap finished connections
      if (it->done) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    if (int(workers_.size()) >= opt_.max_connections) {
      Connection c(fd, 1);
      try {
        c.write_error("busy", str_cat("rank ", shard_.rank, " already serves ", workers_.size(),
                                      " KV connections; retry shortly"));
      } catch (const Error&) {
      }
      continue;
    }
    Worker& w = workers_.emplace_back();
    w.fd = fd;
    w.thread = std::thread([this, &w] {
      serve_connection(w.fd);
      w.done = true;
    });
  }
}

void KvService::serve_connection(int fd) {
  Connection c(fd, opt_.io_timeout_s);
  serve_connection(c);
}

void KvService::serve_connection(Connection& c) {
  try {
    const auto [type, length] = c.read_header();
    if (type == FrameType::Hello) pull(c, c.read_json(length));
    else if (type == FrameType::Push) push(c, c.read_json(length));
    else throw ProtocolError("bad_frame", str_cat("the first frame must be a hello (or a push request), got a ",
                                                  frame_type_name(type), " frame"));
  } catch (const ProtocolError& e) {
    try {
      c.write_error(e.code, e.what());
    } catch (const Error&) {
    }
  } catch (const std::exception& e) {  // the peer left or timed out, or the shard is unusable
    try {
      c.write_error("failed", e.what());
    } catch (const Error&) {
    }
  }
}

std::shared_ptr<const engine::KeptKv> KvService::find(const json& q, const char* what, std::string& kv_id,
                                                      std::string& kept_id, SendOptions& o) const {
  auto field = [&](const char* name, json::value_t type, const json& fallback) {
    if (!q.contains(name)) {
      if (fallback.is_null()) throw ProtocolError("bad_frame", str_cat("the ", what, " has no \"", name, "\""));
      return fallback;
    }
    const json& v = q.at(name);
    if (v.type() != type && !(type == json::value_t::string && v.is_string()))
      throw ProtocolError("bad_frame", str_cat("the ", what, "'s \"", name, "\" has the wrong type"));
    return v;
  };
  std::string owner;
  if (!opt_.key_hashes.empty()) {
    const json key = q.contains("api_key") ? q["api_key"] : json();
    if (!key.is_string()) throw ProtocolError("unauthorized", "this KV service needs the server's API key (\"api_key\")");
    owner = sha256_hex(key.get<std::string>());
    bool known = false;  // every digest compared in full, whichever matches
    for (const std::string& h : opt_.key_hashes) known = constant_time_equal(owner, h) || known;
    if (!known) throw ProtocolError("unauthorized", "the API key is wrong");
  }
  kv_id = field("kv_id", json::value_t::string, json()).get<std::string>();
  kept_id = owned_kv_id(kv_id, owner);
  const std::string dtype = field("dtype", json::value_t::string, "f32").get<std::string>();
  if (dtype != "f32" && dtype != "bf16")
    throw ProtocolError("bad_dtype", str_cat("dtype '", dtype, "' is not served; ask for f32 or bf16"));
  o.dtype = dtype == "f32" ? DType::F32 : DType::BF16;
  o.window_trim = field("window_trim", json::value_t::boolean, true).get<bool>();
  std::shared_ptr<const engine::KeptKv> kept = lookup_(kept_id);  // another key's shard: unknown, alike
  if (!kept)
    throw ProtocolError("unknown_kv", str_cat("rank ", shard_.rank, " keeps no KV under id '", kv_id,
                                              "' (never made, already pulled and acked, released, or its lease expired)"));
  return kept;
}

int64_t KvService::send_shard(Connection& c, const std::string& kv_id, const std::string& kept_id,
                              const engine::KeptKv& kept, const SendOptions& o) {
  const json manifest = make_manifest(shard_, kv_id, kept, o);
  c.write_json(FrameType::Manifest, manifest);
  const ops::SequenceShard& shard = kept.shards[0];
  int64_t sent = 0;
  for (int l = 0; l < shard_.layers; ++l) {
    const std::vector<RowBlock> blocks =
        row_blocks(shard, shard_.layer_window.at(size_t(shard_.first_layer + l)), o.window_trim);
    for (const auto* kv : {&kept.k, &kept.v}) {
      const json& entry = manifest["tensors"][size_t(2 * l + (kv == &kept.v))];
      c.write_header(FrameType::Tensor, entry["bytes"].get<uint64_t>());
      for_each_piece((*kv)[0][size_t(l)], blocks, o.dtype, [&](const void* p, size_t n) {
        c.write_bytes(p, n);
        sent += int64_t(n);
      });
    }
  }
  bytes_sent_ += sent;
  c.set_timeout(opt_.ack_timeout_s);
  const json ack = c.expect_json(FrameType::Ack);
  c.set_timeout(opt_.io_timeout_s);
  release_(kept_id);
  ++transfers_acked_;
  c.write_json(FrameType::Ack, {{"released", true}, {"rank", shard_.rank}, {"kv_id", kv_id}});
  (void)ack;
  return sent;
}

void KvService::pull(Connection& c, const json& hello) {
  std::string kv_id, kept_id;
  SendOptions o;
  const std::shared_ptr<const engine::KeptKv> kept = find(hello, "hello", kv_id, kept_id, o);  // held until the end
  send_shard(c, kv_id, kept_id, *kept, o);
}

void KvService::push(Connection& c, const json& request) {
  std::string kv_id, kept_id;
  SendOptions o;
  const std::shared_ptr<const engine::KeptKv> kept = find(request, "push request", kv_id, kept_id, o);
  if (!request.contains("target") || !request["target"].is_string())
    throw ProtocolError("bad_frame", "the push request has no \"target\" (\"host:port\" of the receiver)");
  const std::string target = request["target"].get<std::string>();
  const auto [host, port] = parse_endpoint(target);
  int64_t sent = 0;
  try {
    std::function<bool(const sockaddr*)> allowed;  // a listed name is allowed whatever it resolves to
    if (!opt_.push_allow.empty() && !opt_.push_allow.names(host))
      allowed = [this](const sockaddr* a) { return opt_.push_allow.allows(a); };
    Connection out(connect_tcp(host, port, opt_.io_timeout_s, allowed), opt_.io_timeout_s);
    sent = send_shard(out, kv_id, kept_id, *kept, o);
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw ProtocolError("push_failed", str_cat("rank ", shard_.rank, " pushing to ", target, ": ", e.what()));
  }
  c.write_json(FrameType::Done, {{"ok", true}, {"rank", shard_.rank}, {"target", target}, {"bytes", sent}});
}

}  // namespace slope::kvx
