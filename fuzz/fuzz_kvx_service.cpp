// The rank side of the KV transfer protocol (src/slope/kvx/service.h, docs/kv-format.md
// "Transfer protocol, version 1"): the input is what a client sends (hello, push request, ack,
// garbage), written into one end of a socketpair and closed; the real service's connection
// handler serves the other end. The first byte picks the service (bit 0: one with an API key,
// "fuzz-key"), the rest is the client's bytes. The service keeps one small shard under kv_id
// "a" (two layers, one of them sliding-window, a zigzag of rows), as the unit tests do.
//
// Beyond a crash, a sanitizer report or a hang, a finding is a reply that breaks the protocol:
// every frame the service sends back must have a good header, JSON frames must hold an object,
// an error frame a string "error" and "code", and tensor frames the bytes the manifest listed.
//
// A push request makes the service dial its "target": the process first moves into a network
// namespace of its own (no interface up), so that nothing is dialed outside it. Where that
// cannot be done (not root), inputs that start with a push request are skipped.
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "slope/core/sha256.h"
#include "slope/kvx/service.h"

namespace {

using namespace slope;
using nlohmann::json;

bool isolated = false;

std::shared_ptr<const engine::KeptKv> make_kept() {
  constexpr int64_t kHeads = 2, kDim = 3;
  auto kept = std::make_shared<engine::KeptKv>();
  kept->k.resize(1);
  kept->v.resize(1);
  kept->shards = {ops::SequenceShard{12, {{0, 2}, {9, 3}}}};
  kept->first_tokens = {7};
  for (int layer = 0; layer < 2; ++layer) {
    Tensor k({5, kHeads, kDim}, DType::F32), v({5, kHeads, kDim}, DType::F32);
    for (int64_t i = 0; i < 5 * kHeads * kDim; ++i) {
      k.data<float>()[i] = float(i) * 0.25f + float(layer);
      v.data<float>()[i] = -float(i);
    }
    kept->k[0].push_back(std::move(k));
    kept->v[0].push_back(std::move(v));
  }
  return kept;
}

std::unique_ptr<kvx::KvService> make_service(const std::string& key) {
  static const std::shared_ptr<const engine::KeptKv> kept = make_kept();
  kvx::ShardDescription d;
  d.model_name = "fuzz";
  d.model_hash = "0123456789abcdef";
  d.architecture = "GptOssForCausalLM";
  d.num_layers = d.layers = 2;
  d.num_kv_heads = d.kv_heads = 2;
  d.head_dim = 3;
  d.layer_window = {4, 0};
  kvx::ServiceOptions o;
  o.key_hashes = key.empty() ? std::vector<std::string>{} : std::vector<std::string>{sha256_hex(key)};
  o.io_timeout_s = 1;  // the client's end is closed: a read never waits for more
  o.ack_timeout_s = 1;
  // The shard is kept for the id "a" and this service's key (none: the id alone).
  const std::string owned = kvx::owned_kv_id("a", o.key_hashes.empty() ? "" : o.key_hashes[0]);
  return std::make_unique<kvx::KvService>(
      d, o, [owned](const std::string& id) { return id == owned ? kept : nullptr; }, [](const std::string&) {});
}

// Reads every byte the service sent back (the service has returned and closed its end).
std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
  return out;
}

// The service's reply must be whole, well-formed frames.
void check_reply(const std::string& r) {
  size_t at = 0;
  std::vector<uint64_t> tensor_bytes;
  size_t next_tensor = 0;
  while (at < r.size()) {
    if (r.size() - at < kvx::kFrameHeaderBytes || r.compare(at, 4, "SKVT") != 0 || r[at + 4] != 1 || r[at + 5] != 0 ||
        r[at + 7] != 0)
      __builtin_trap();  // a torn or malformed header
    const uint8_t type = uint8_t(r[at + 6]);
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t(uint8_t(r[at + 8 + size_t(i)])) << (8 * i);
    at += kvx::kFrameHeaderBytes;
    if (length > r.size() - at) __builtin_trap();  // a frame cut short
    const std::string payload = r.substr(at, size_t(length));
    at += size_t(length);
    if (type == uint8_t(kvx::FrameType::Tensor)) {
      if (next_tensor >= tensor_bytes.size() || tensor_bytes[next_tensor++] != length) __builtin_trap();
      continue;
    }
    const json j = json::parse(payload, nullptr, false);
    if (!j.is_object()) __builtin_trap();
    if (type == uint8_t(kvx::FrameType::Error) && !(j.contains("error") && j["error"].is_string() &&
                                                    j.contains("code") && j["code"].is_string()))
      __builtin_trap();
    if (type == uint8_t(kvx::FrameType::Manifest))
      for (const json& t : j.at("tensors")) tensor_bytes.push_back(t.at("bytes").get<uint64_t>());
  }
}

}  // namespace

// kvx/service.cpp's rank_layout (what a rank tells the front) places the rank in the engine's
// mesh; the target links no engine, and the connection handler never calls it.
namespace slope::engine {
RankPlace place_of(int, const ParallelShape&) { __builtin_trap(); }
}  // namespace slope::engine

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  isolated = ::unshare(CLONE_NEWNET) == 0;
  if (!isolated)
    std::fprintf(stderr, "fuzz_kvx_service: cannot make a network namespace (%s; not root?): push requests are skipped\n",
                 std::strerror(errno));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<kvx::KvService> open = make_service(""), keyed = make_service("fuzz-key");
  if (size < 1) return 0;
  const uint8_t* bytes = data + 1;
  const size_t n = size - 1;
  if (!isolated && n > 6 && bytes[6] == uint8_t(kvx::FrameType::Push)) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) __builtin_trap();
  for (size_t off = 0; off < n;) {  // the socket buffer holds a fuzz input whole
    const ssize_t w = ::write(fds[0], bytes + off, n - off);
    if (w <= 0) __builtin_trap();
    off += size_t(w);
  }
  ::shutdown(fds[0], SHUT_WR);
  (data[0] & 1 ? keyed : open)->serve_connection(fds[1]);  // closes fds[1]
  check_reply(read_all(fds[0]));
  ::close(fds[0]);
  return 0;
}
