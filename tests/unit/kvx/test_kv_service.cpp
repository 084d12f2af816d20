// The KV transfer service over real loopback TCP, against a hand-made shard: which rows each
// layer sends (zigzag segments, window_trim), the bytes in f32 and bf16 against values computed
// from the positions, the checksums, the release on ack, and the error frames a bad client gets.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <set>

#include "slope/core/half.h"
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

  explicit Fixture(const std::string& key = "") {
    kept["a"] = make_kept();
    ServiceOptions o;
    o.api_key = key;
    o.io_timeout_s = 5;
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
  Fixture f("secret");
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
  EXPECT_EQ(f.kept.count("a"), 1u);
}

}  // namespace
}  // namespace slope::kvx
