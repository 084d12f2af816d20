// The KV transfer service over real loopback TCP, against a hand-made shard: which rows each
// layer sends (zigzag segments, window_trim), the bytes in f32 and bf16 against values computed
// from the positions, the checksums, the release on ack, and the error frames a bad client gets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <chrono>
#include <set>
#include <thread>

#include "slope/core/half.h"
#include "slope/core/sha256.h"
#include "slope/core/sys.h"
#include "slope/kvx/crc32.h"
#include "slope/kvx/service.h"

namespace slope::kvx {
namespace {

using nlohmann::json;

constexpr int64_t kTokens = 20, kHeads = 2, kDim = 3;
// A ring rank's zigzag shard: positions 0..2 and 15..19, in that row order.
const ops::SequenceShard kShard{kTokens, {{0, 3}, {15, 5}}};

// The value of K at (layer, position, head, d); V is twice it. Exact in bf16 (at most 8
// significant bits), so both dtypes compare exactly.
float k_value(int layer, int64_t pos, int64_t h, int64_t d) {
  const float x = float(pos) + 0.5f * float(h) + 0.125f * float(d);
  return layer == 0 ? x : -x;
}

std::shared_ptr<engine::KeptKv> make_kept() {
  auto kept = std::make_shared<engine::KeptKv>();
  kept->k.resize(1);
  kept->v.resize(1);
  kept->shards = {kShard};
  kept->first_tokens = {7};
  const std::vector<int64_t> positions = kShard.positions();
  for (int layer = 0; layer < 2; ++layer) {
    Tensor k({int64_t(positions.size()), kHeads, kDim}, DType::F32), v({int64_t(positions.size()), kHeads, kDim}, DType::F32);
    for (size_t r = 0; r < positions.size(); ++r)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t d = 0; d < kDim; ++d) {
          k.data<float>()[(int64_t(r) * kHeads + h) * kDim + d] = k_value(layer, positions[r], h, d);
          v.data<float>()[(int64_t(r) * kHeads + h) * kDim + d] = 2 * k_value(layer, positions[r], h, d);
        }
    kept->k[0].push_back(std::move(k));
    kept->v[0].push_back(std::move(v));
  }
  return kept;
}

ShardDescription description() {
  ShardDescription d;
  d.model_name = "test";
  d.model_hash = "0123456789abcdef";
  d.architecture = "GptOssForCausalLM";
  d.num_layers = 2;
  d.layers = 2;
  d.num_kv_heads = kHeads;
  d.kv_heads = kHeads;
  d.head_dim = kDim;
  d.layer_window = {4, 0};  // layer 0 slides over 4 keys, layer 1 is full
  return d;
}

struct Fixture {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const engine::KeptKv>> kept;
  std::vector<std::string> released;
  std::unique_ptr<KvService> service;

  // keys: the API keys the service takes; the shard "a" is kept for the first (as `slope serve`
  // keeps a shard for the key that asked for it).
  explicit Fixture(const std::vector<std::string>& keys = {}, double io_timeout_s = 5, int max_connections = 64) {
    kept[owned_kv_id("a", keys.empty() ? "" : sha256_hex(keys[0]))] = make_kept();
    ServiceOptions o;
    for (const std::string& k : keys) o.key_hashes.push_back(sha256_hex(k));
    o.io_timeout_s = io_timeout_s;
    o.max_connections = max_connections;
    service = std::make_unique<KvService>(
        description(), o,
        [this](const std::string& id) -> std::shared_ptr<const engine::KeptKv> {
          std::lock_guard lk(mu);
          auto it = kept.find(id);
          return it == kept.end() ? nullptr : it->second;
        },
        [this](const std::string& id) {
          std::lock_guard lk(mu);
          kept.erase(id);
          released.push_back(id);
        });
  }
  std::unique_ptr<Connection> dial() {
    return std::make_unique<Connection>(connect_tcp("127.0.0.1", service->port(), 5), 5);
  }
};

json error_of(Connection& c) {
  const auto [type, length] = c.read_header();
  EXPECT_EQ(type, FrameType::Error);
  return c.read_json(length);
}

void pull_and_check(Fixture& f, const std::string& dtype, bool trim) {
  auto c = f.dial();
  c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"dtype", dtype}, {"window_trim", trim}});
  const json m = c->expect_json(FrameType::Manifest);
  EXPECT_EQ(m["num_tokens"], kTokens);
  EXPECT_EQ(m["first_token"], 7);
  // Layer 0 (window 4) sends positions 16..19 only under trim; layer 1 both runs.
  const json want0 = trim ? json::array({json::array({16, 4})}) : json::array({json::array({0, 3}), json::array({15, 5})});
  EXPECT_EQ(m["layers"][0]["ranges"], want0);
  EXPECT_EQ(m["layers"][1]["ranges"], json::array({json::array({0, 3}), json::array({15, 5})}));
  const size_t elem = dtype == "f32" ? 4 : 2;
  int64_t total = 0;
  for (size_t t = 0; t < 4; ++t) {
    const json& e = m["tensors"][t];
    const int layer = int(t / 2);
    const bool is_v = t % 2 == 1;
    EXPECT_EQ(e["name"], str_cat("layers.", layer, is_v ? ".v" : ".k"));
    const auto [type, length] = c->read_header();
    ASSERT_EQ(type, FrameType::Tensor);
    ASSERT_EQ(length, e["bytes"].get<uint64_t>());
    std::vector<unsigned char> bytes(length);
    c->read_bytes(bytes.data(), bytes.size());
    EXPECT_EQ(hex32(crc32(bytes.data(), bytes.size())), e["crc32"]);
    total += int64_t(length);
    size_t at = 0;
    for (const json& range : m["layers"][layer]["ranges"])
      for (int64_t p = range[0]; p < range[0].get<int64_t>() + range[1].get<int64_t>(); ++p)
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t d = 0; d < kDim; ++d, ++at) {
            float got;
            if (elem == 4) {
              std::memcpy(&got, &bytes[at * 4], 4);
            } else {
              uint16_t u;
              std::memcpy(&u, &bytes[at * 2], 2);
              got = bf16_to_f32(u);
            }
            ASSERT_EQ(got, (is_v ? 2 : 1) * k_value(layer, p, h, d)) << e["name"] << " position " << p;
          }
    EXPECT_EQ(at * elem, length);
  }
  EXPECT_EQ(m["bytes"], total);
  EXPECT_EQ(m["untrimmed_bytes"].get<int64_t>(), 2 * 2 * 8 * kHeads * kDim * int64_t(elem));
  c->write_json(FrameType::Ack, {{"ok", true}});
  const json released = c->expect_json(FrameType::Ack);
  EXPECT_TRUE(released["released"].get<bool>());
}

TEST(Crc32, MatchesZlib) {
  // The check value of CRC-32/ISO-HDLC, and zlib.crc32 of longer inputs (computed by Python's
  // zlib), whole and continued in pieces that cross the 8-byte steps.
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("", 0), 0u);
  std::string s;
  for (int i = 0; i < 1000; ++i) s += char(i * 7 + 3);
  const uint32_t whole = crc32(s.data(), s.size());
  EXPECT_EQ(whole, 0x17BC2A46u);
  uint32_t pieces = 0;
  for (size_t at = 0; at < s.size(); at += 13) pieces = crc32(s.data() + at, std::min<size_t>(13, s.size() - at), pieces);
  EXPECT_EQ(pieces, whole);
}

TEST(KvService, SendsTheWindowAndReleasesOnAck) {
  for (const char* dtype : {"f32", "bf16"})
    for (bool trim : {true, false}) {
      Fixture f;
      pull_and_check(f, dtype, trim);
      EXPECT_EQ(f.released, std::vector<std::string>{"a"});
      auto c = f.dial();  // acked: the next pull is refused
      c->write_json(FrameType::Hello, {{"kv_id", "a"}});
      EXPECT_EQ(error_of(*c)["code"], "unknown_kv");
    }
}

TEST(KvService, AClientThatFindsABadChecksumLeavesTheShard) {
  Fixture f;
  {
    auto c = f.dial();
    c->write_json(FrameType::Hello, {{"kv_id", "a"}});
    const json m = c->expect_json(FrameType::Manifest);
    for (const json& e : m["tensors"]) {
      const auto [type, length] = c->read_header();
      ASSERT_EQ(type, FrameType::Tensor);
      std::vector<char> bytes(length);
      c->read_bytes(bytes.data(), bytes.size());
      (void)e;
    }
    c->write_error("checksum", "layers.0.k does not match");  // instead of the ack
  }
  EXPECT_TRUE(f.released.empty());
  pull_and_check(f, "f32", true);  // the shard is still there for another pull
  EXPECT_EQ(f.released, std::vector<std::string>{"a"});
}

TEST(KvService, RefusesBadClientsAndKeepsServing) {
  Fixture f({"secret"});
  {
    auto c = f.dial();
    c->write_json(FrameType::Hello, {{"kv_id", "a"}});
    EXPECT_EQ(error_of(*c)["code"], "unauthorized");
  }
  {
    auto c = f.dial();
    c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "wrong"}});
    EXPECT_EQ(error_of(*c)["code"], "unauthorized");
  }
  {
    auto c = f.dial();
    c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "secret"}, {"dtype", "f16"}});
    EXPECT_EQ(error_of(*c)["code"], "bad_dtype");
  }
  {
    auto c = f.dial();
    const unsigned char v2[16] = {'S', 'K', 'V', 'T', 2, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0};
    c->write_bytes(v2, sizeof(v2));
    const json e = error_of(*c);
    EXPECT_EQ(e["code"], "bad_version");
    EXPECT_NE(e["error"].get<std::string>().find("version 2"), std::string::npos);
  }
  {
    auto c = f.dial();
    c->write_header(FrameType::Ack, 2);  // not a hello
    c->write_bytes("{}", 2);
    EXPECT_EQ(error_of(*c)["code"], "bad_frame");
  }
  {
    auto c = f.dial();  // a truncated hello, and the client leaves
    c->write_header(FrameType::Hello, 100);
    c->write_bytes("{\"kv", 4);
  }
  auto stalled = f.dial();  // a client that stays silent mid-frame holds only its own thread
  stalled->write_header(FrameType::Hello, 100);
  auto c = f.dial();
  c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "secret"}});
  EXPECT_EQ(c->expect_json(FrameType::Manifest)["kv_id"], "a");
  c.reset();  // left before the ack: nothing released
  EXPECT_TRUE(f.released.empty());
  EXPECT_EQ(f.kept.count(owned_kv_id("a", sha256_hex("secret"))), 1u);
}

// Two clients' keys: the shard belongs to the key that made it. The other key's pull and push
// get the answer an unknown id gets (nothing tells the id exists), and a kv_id that spells the
// owner's digest does not reach it either; the owner's pull works and releases the owned id.
TEST(KvService, AShardIsOnlyFoundWithTheKeyThatMadeIt) {
  Fixture f({"alice-key", "bob-key"});
  auto unknown = [&](FrameType type, const json& q) {
    auto c = f.dial();
    c->write_json(type, q);
    const json e = error_of(*c);
    EXPECT_EQ(e["code"], "unknown_kv") << q.dump();
    return e["error"].get<std::string>();
  };
  const std::string never = unknown(FrameType::Hello, {{"kv_id", "never-made"}, {"api_key", "bob-key"}});
  const std::string theirs = unknown(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "bob-key"}});
  EXPECT_EQ(theirs.substr(0, theirs.find('\'')), never.substr(0, never.find('\'')));  // alike, but for the id
  unknown(FrameType::Push, {{"kv_id", "a"}, {"api_key", "bob-key"}, {"target", "127.0.0.1:1"}});
  unknown(FrameType::Hello, {{"kv_id", "a/" + sha256_hex("alice-key")}, {"api_key", "bob-key"}});
  {
    auto c = f.dial();
    c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "carol-key"}});
    EXPECT_EQ(error_of(*c)["code"], "unauthorized");
  }
  EXPECT_TRUE(f.released.empty());
  auto c = f.dial();
  c->write_json(FrameType::Hello, {{"kv_id", "a"}, {"api_key", "alice-key"}});
  EXPECT_EQ(c->expect_json(FrameType::Manifest)["kv_id"], "a");  // the client's id, not the rank's
  for (int t = 0; t < 4; ++t) {
    const auto [type, length] = c->read_header();
    ASSERT_EQ(type, FrameType::Tensor);
    std::vector<char> bytes(length);
    c->read_bytes(bytes.data(), bytes.size());
  }
  c->write_json(FrameType::Ack, {{"ok", true}});
  EXPECT_TRUE(c->expect_json(FrameType::Ack)["released"].get<bool>());
  EXPECT_EQ(f.released, std::vector<std::string>{owned_kv_id("a", sha256_hex("alice-key"))});
}

// Slow clients: a hello dribbled a byte at a time is cut when its frame's deadline (the I/O
// timeout, for the whole frame, not per byte) passes, and connections over the limit are
// refused with "busy" at once. A normal pull works as soon as the slow ones are cut.
TEST(KvService, SlowClientsAreCutAtTheFrameDeadline) {
  Fixture f({}, /*io_timeout_s=*/1.0, /*max_connections=*/2);
  const std::string hello = json{{"kv_id", "a"}}.dump();
  std::vector<std::unique_ptr<Connection>> slow;
  for (int i = 0; i < 2; ++i) {
    slow.push_back(f.dial());
    slow.back()->write_header(FrameType::Hello, hello.size());
  }
  {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto c = f.dial();  // over the limit: refused before it says anything
    EXPECT_EQ(error_of(*c)["code"], "busy");
  }
  const double t0 = now_seconds();
  bool cut = false;
  for (size_t i = 0; i < hello.size() && !cut; ++i) {  // a byte every 0.2 s: each read would be in time
    for (auto& s : slow) {
      try {
        s->write_bytes(&hello[i], 1);
      } catch (const Error&) {
        cut = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    char probe;
    if (::recv(slow[0]->fd(), &probe, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) cut = true;  // an error frame, or closed
  }
  const double waited = now_seconds() - t0;
  EXPECT_TRUE(cut) << "the slow hello was never cut";
  EXPECT_LT(waited, 2.5) << "the slow hello held its connection for " << waited << " s (deadline 1 s)";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the acceptor reaps the finished workers
  pull_and_check(f, "f32", true);
}

sockaddr_storage address(const char* text) {
  sockaddr_storage s{};
  if (::inet_pton(AF_INET, text, &reinterpret_cast<sockaddr_in&>(s).sin_addr) == 1) s.ss_family = AF_INET;
  else if (::inet_pton(AF_INET6, text, &reinterpret_cast<sockaddr_in6&>(s).sin6_addr) == 1) s.ss_family = AF_INET6;
  return s;
}

TEST(AddressList, MatchesBlocksAddressesAndNames) {
  const AddressList l({"10.1.0.0/16", "192.168.7.9", "fd00::/8", "Decode-Node.example", "172.16.0.0/12"});
  auto allows = [&](const char* a) {
    const sockaddr_storage s = address(a);
    return l.allows(reinterpret_cast<const sockaddr*>(&s));
  };
  EXPECT_TRUE(allows("10.1.2.3"));
  EXPECT_TRUE(allows("10.1.255.255"));
  EXPECT_FALSE(allows("10.2.0.1"));
  EXPECT_TRUE(allows("192.168.7.9"));
  EXPECT_FALSE(allows("192.168.7.10"));
  EXPECT_TRUE(allows("172.31.0.1"));   // /12: 172.16 to 172.31
  EXPECT_FALSE(allows("172.32.0.1"));
  EXPECT_TRUE(allows("fd12::1"));
  EXPECT_FALSE(allows("fe80::1"));
  EXPECT_TRUE(allows("::ffff:10.1.0.7"));  // an IPv4-mapped address is its IPv4 one
  EXPECT_FALSE(allows("::ffff:127.0.0.1"));
  EXPECT_FALSE(allows("127.0.0.1"));
  EXPECT_TRUE(l.names("decode-node.EXAMPLE"));
  EXPECT_FALSE(l.names("decode-node.example.evil"));
  EXPECT_TRUE(AddressList().empty());
  for (const char* bad : {"10.0.0.0/33", "10.0.0.0/", "fd00::/129", "a b", "host/8", ""})
    EXPECT_THROW(AddressList({bad}), Error) << bad;
}

// A push to a target outside the list is refused before any connection is made.
TEST(KvService, APushOutsideTheAllowListIsRefused) {
  Fixture f;
  const auto [listen_fd, port] = listen_tcp("127.0.0.1", 0);
  ServiceOptions o;
  o.push_allow = AddressList({"10.0.0.0/8"});
  KvService service(description(), o, [&f](const std::string& id) { return f.kept.count(id) ? f.kept[id] : nullptr; },
                    [](const std::string&) {});
  Connection c(connect_tcp("127.0.0.1", service.port(), 5), 5);
  c.write_json(FrameType::Push, {{"kv_id", "a"}, {"target", str_cat("127.0.0.1:", port)}});
  const json e = error_of(c);
  EXPECT_EQ(e["code"], "not_allowed");
  EXPECT_NE(e["error"].get<std::string>().find("--kv-push-allow"), std::string::npos);
  pollfd p{listen_fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 200), 0) << "the rank dialed the target";
  ::close(listen_fd);
}

}  // namespace
}  // namespace slope::kvx
