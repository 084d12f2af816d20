// The KV transfer protocol, version 1 (docs/kv-format.md, "Transfer protocol, version 1"):
// frames over TCP, each a 16-byte header (magic "SKVT", u16 version, u8 type, u8 zero, u64
// payload length, little endian) and its payload. Hello, manifest, ack and error payloads are
// JSON; a tensor frame's payload is the tensor's bytes. Every read and write has a deadline,
// so a peer that stops mid-frame cannot hold a thread forever.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "slope/core/error.h"

namespace slope::kvx {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr uint64_t kMaxJsonFrameBytes = 16u << 20;  // hello, manifest, ack, error

enum class FrameType : uint8_t {
  Hello = 1,     // client -> rank: which KV, key, dtype, window_trim
  Manifest = 2,  // rank -> client: what follows
  Tensor = 3,    // rank -> client: one tensor's bytes, in manifest order
  Ack = 4,       // client -> rank: every checksum matched, release; rank -> client: released
  Error = 5,     // either way: {"error": message, "code": short key}; the connection then ends
  Push = 6,      // controller -> rank: dial a receiver and send it the KV (push mode)
  Done = 7,      // rank -> controller: the push finished (bytes, ack)
};
const char* frame_type_name(FrameType t);

// A connected TCP socket (owned: closed on destruction) with a per-operation timeout.
class Connection {
 public:
  Connection(int fd, double timeout_s);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  void set_timeout(double s) { timeout_s_ = s; }

  void write_header(FrameType type, uint64_t length);
  void write_bytes(const void* data, size_t n);
  void write_json(FrameType type, const nlohmann::json& body);
  void write_error(const std::string& code, const std::string& message);

  // The next frame's header. Throws ProtocolError on a bad magic or version, slope::Error on a
  // timeout or a closed connection.
  std::pair<FrameType, uint64_t> read_header();
  void read_bytes(void* data, size_t n);
  // A JSON frame's payload (length at most kMaxJsonFrameBytes).
  nlohmann::json read_json(uint64_t length);
  // The next frame, which must be JSON of type `want` (an Error frame throws its message).
  nlohmann::json expect_json(FrameType want);

 private:
  int fd_;
  double timeout_s_;
};

// A frame that breaks the protocol: the peer gets an error frame with `code`.
struct ProtocolError : Error {
  ProtocolError(std::string code, const std::string& message) : Error(message), code(std::move(code)) {}
  std::string code;
};

// "host:port" -> (host, port). Throws slope::Error naming the text.
std::pair<std::string, int> parse_endpoint(const std::string& endpoint);
// A TCP socket listening on host:port (port 0: any). Returns (fd, the port bound).
std::pair<int, int> listen_tcp(const std::string& host, int port);
// Connects to host:port within timeout_s. Throws slope::Error naming the endpoint. With
// `allowed`, only the resolved addresses it accepts are dialed; none: ProtocolError "not_allowed".
int connect_tcp(const std::string& host, int port, double timeout_s,
                const std::function<bool(const sockaddr*)>& allowed = {});

}  // namespace slope::kvx
