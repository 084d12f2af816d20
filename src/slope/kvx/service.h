// kvx::KvService: the KV transfer service of one rank (docs/kv-format.md, "Transfer protocol,
// version 1"). A TCP listener thread, and a thread per connection, serve the KV shards the
// rank's engine keeps under a request's kv_id: a pulling client says hello and gets the
// manifest, the tensors and, after its ack, the release of this rank's shard; a push request
// makes the rank dial a receiver and send it the same manifest and tensors. The engine's thread
// is never involved: a transfer runs while the next prefill computes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "slope/core/dtype.h"
#include "slope/engine/engine.h"
#include "slope/kvx/address_list.h"
#include "slope/kvx/protocol.h"

namespace slope::kvx {

// What the manifest says about the rank's shard, fixed for the life of the engine.
struct ShardDescription {
  std::string model_name, model_hash, architecture;
  int rank = 0, world_size = 1;
  int num_layers = 0, first_layer = 0, layers = 0;
  int64_t num_kv_heads = 0, kv_head0 = 0, kv_heads = 0, head_dim = 0;
  std::vector<int64_t> layer_window;  // per model layer: 0 = full attention, W > 0 = sliding window
};
ShardDescription describe_shard(const engine::PrefillEngine& engine, const std::string& model_name,
                                const std::string& model_hash);

struct ServiceOptions {
  std::string host = "127.0.0.1";  // where to listen; "0.0.0.0" for every interface
  int port = 0;                    // 0: any free port
  // SHA-256 (hex) of the API keys clients may send. Non-empty: every hello and push must carry
  // one of the keys ("api_key"), and the shard it names is looked up as owned_kv_id(kv_id,
  // sha256_hex(key)): a shard kept for one key is unknown to every other.
  std::vector<std::string> key_hashes;
  double io_timeout_s = 30;        // longest wait for one read or write of a peer
  double ack_timeout_s = 120;      // longest wait for the client's ack after the last tensor
  int max_connections = 64;        // more at once are refused with an error frame
  AddressList push_allow;          // non-empty: the only hosts a push may dial (address_list.h)
};

// The id a rank keeps a shard under: the client's kv_id, and the digest of the API key that made
// it (empty: no keys). The digest is fixed-length and last, so no kv_id a client sends with its
// own key can name a shard kept for another key.
std::string owned_kv_id(const std::string& kv_id, const std::string& owner_hash);

// Looks a kept shard up (nullptr: unknown, released or expired) and releases it (this rank).
using ShardLookup = std::function<std::shared_ptr<const engine::KeptKv>(const std::string& kv_id)>;
using ShardRelease = std::function<void(const std::string& kv_id)>;

struct SendOptions {
  DType dtype = DType::F32;  // F32 or BF16 (round to nearest even), converted while sending
  bool window_trim = true;   // sliding-window layers: only the last W positions
};

class KvService {
 public:
  // Listens at once (throws slope::Error naming host and port when it cannot).
  KvService(ShardDescription shard, ServiceOptions options, ShardLookup lookup, ShardRelease release);
  ~KvService();  // stops listening, ends the connections in flight and joins every thread
  KvService(const KvService&) = delete;
  KvService& operator=(const KvService&) = delete;

  int port() const { return port_; }
  // "host:port" a client on another node dials: the listen host, or this node's name when it
  // listens on every interface.
  std::string endpoint() const;

  // Serves one client connection on fd (taken: closed at the end) as the listener's threads do,
  // on the calling thread; the fuzz target hands it one end of a socketpair.
  void serve_connection(int fd);

  int64_t bytes_sent() const { return bytes_sent_.load(); }        // tensor payload, every transfer
  int64_t transfers_acked() const { return transfers_acked_.load(); }

 private:
  void accept_loop();
  void serve_connection(Connection& c);
  void pull(Connection& c, const nlohmann::json& hello);
  void push(Connection& c, const nlohmann::json& request);
  // Manifest, tensors, then the peer's ack and the release. Returns the tensor bytes sent.
  int64_t send_shard(Connection& c, const std::string& kv_id, const std::string& kept_id, const engine::KeptKv& kept,
                     const SendOptions& o);
  // The shard a hello or push names; kv_id is the client's, kept_id the rank's (owned_kv_id).
  std::shared_ptr<const engine::KeptKv> find(const nlohmann::json& request, const char* what, std::string& kv_id,
                                             std::string& kept_id, SendOptions& o) const;

  struct Worker {
    std::thread thread;
    int fd = -1;
    std::atomic<bool> done{false};
  };

  ShardDescription shard_;
  ServiceOptions opt_;
  ShardLookup lookup_;
  ShardRelease release_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> bytes_sent_{0}, transfers_acked_{0};
  std::mutex mu_;  // workers_
  std::list<Worker> workers_;
  std::thread acceptor_;
};

// One rank's entry of a KV handle's "ranks": where its shard sits and its service's endpoint.
// Fixed size, so that the ranks can allgather it.
struct RankLayout {
  int64_t rank, stage, cp_rank, tp_rank, first_layer, layers, kv_head0, kv_heads, owner;
  char endpoint[128];
};
// This rank's entry; `owner` is false on tensor ranks that hold a replica of another's heads.
RankLayout rank_layout(const engine::PrefillEngine& engine, const std::string& endpoint);
nlohmann::json layout_json(const std::vector<RankLayout>& ranks);

// The manifest of a rank's shard for these options (docs/kv-format.md). Tensors are listed in
// the order they are sent, each with its shape, bytes and CRC-32 of the bytes sent (crc32.h).
nlohmann::json make_manifest(const ShardDescription& shard, const std::string& kv_id, const engine::KeptKv& kept,
                             const SendOptions& o);

}  // namespace slope::kvx
