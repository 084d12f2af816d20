#include "slope/kvx/protocol.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "slope/core/sys.h"

namespace slope::kvx {
namespace {

constexpr char kMagic[4] = {'S', 'K', 'V', 'T'};

// Waits until fd is readable (POLLIN) or writable (POLLOUT) before `deadline`.
void wait_ready(int fd, short events, double deadline, const char* what) {
  for (;;) {
    const double left = deadline - now_seconds();
    SLOPE_CHECK(left > 0, "the KV peer sent or took nothing for too long while ", what, " (timed out)");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    SLOPE_CHECK(r >= 0, "poll failed while ", what, ": ", std::strerror(errno));
    if (r > 0) return;
  }
}

}  // namespace

const char* frame_type_name(FrameType t) {
  switch (t) {
    case FrameType::Hello: return "hello";
    case FrameType::Manifest: return "manifest";
    case FrameType::Tensor: return "tensor";
    case FrameType::Ack: return "ack";
    case FrameType::Error: return "error";
    case FrameType::Push: return "push";
    case FrameType::Done: return "done";
  }
  return "unknown";
}

Connection::Connection(int fd, double timeout_s) : fd_(fd), timeout_s_(timeout_s) {
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

void Connection::write_bytes(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  const double deadline = now_seconds() + timeout_s_;
  while (n > 0) {
    const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_ready(fd_, POLLOUT, deadline, "sending");
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    SLOPE_CHECK(w > 0, "the KV peer closed the connection (", std::strerror(errno), ")");
    p += w;
    n -= size_t(w);
  }
}

void Connection::read_bytes(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  const double deadline = now_seconds() + timeout_s_;
  while (n > 0) {
    wait_ready(fd_, POLLIN, deadline, "receiving");
    const ssize_t r = ::recv(fd_, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    SLOPE_CHECK(r != 0, "the KV peer closed the connection in the middle of a frame");
    SLOPE_CHECK(r > 0, "receiving from the KV peer failed: ", std::strerror(errno));
    p += r;
    n -= size_t(r);
  }
}

void Connection::write_header(FrameType type, uint64_t length) {
  unsigned char h[kFrameHeaderBytes] = {};
  std::memcpy(h, kMagic, 4);
  h[4] = uint8_t(kProtocolVersion);
  h[5] = uint8_t(kProtocolVersion >> 8);
  h[6] = uint8_t(type);
  for (int i = 0; i < 8; ++i) h[8 + i] = uint8_t(length >> (8 * i));
  write_bytes(h, sizeof(h));
}

void Connection::write_json(FrameType type, const nlohmann::json& body) {
  const std::string s = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  write_header(type, s.size());
  write_bytes(s.data(), s.size());
}

void Connection::write_error(const std::string& code, const std::string& message) {
  write_json(FrameType::Error, {{"error", message}, {"code", code}});
}

std::pair<FrameType, uint64_t> Connection::read_header() {
  unsigned char h[kFrameHeaderBytes];
  read_bytes(h, sizeof(h));
  if (std::memcmp(h, kMagic, 4) != 0)
    throw ProtocolError("bad_magic", "not a SLOPE KV frame (the first 4 bytes are not \"SKVT\")");
  const uint16_t version = uint16_t(h[4] | h[5] << 8);
  if (version != kProtocolVersion)
    throw ProtocolError("bad_version", str_cat("KV transfer protocol version ", version, " is not supported; this side speaks version ",
                                               kProtocolVersion, " (upgrade the older side)"));
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(h[8 + i]) << (8 * i);
  const uint8_t type = h[6];
  if (type < uint8_t(FrameType::Hello) || type > uint8_t(FrameType::Done) || h[7] != 0)
    throw ProtocolError("bad_frame", str_cat("unknown frame type ", int(type)));
  return {FrameType(type), length};
}

nlohmann::json Connection::read_json(uint64_t length) {
  if (length > kMaxJsonFrameBytes)
    throw ProtocolError("bad_frame", str_cat("a JSON frame of ", length, " bytes is over the limit of ", kMaxJsonFrameBytes));
  std::string s(size_t(length), '\0');
  read_bytes(s.data(), s.size());
  try {
    nlohmann::json j = nlohmann::json::parse(s);
    if (!j.is_object()) throw ProtocolError("bad_frame", "a JSON frame must hold an object");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError("bad_frame", str_cat("a frame is not JSON: ", e.what()));
  }
}

nlohmann::json Connection::expect_json(FrameType want) {
  const auto [type, length] = read_header();
  if (type == FrameType::Error) {
    const nlohmann::json e = read_json(length);
    fail("the KV peer refused: ", e.value("error", std::string("(no message)")), " [", e.value("code", std::string()), "]");
  }
  if (type != want)
    throw ProtocolError("bad_frame", str_cat("expected a ", frame_type_name(want), " frame, got ", frame_type_name(type)));
  return read_json(length);
}

std::pair<std::string, int> parse_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  SLOPE_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < endpoint.size(), "the endpoint '", endpoint,
              "' is not HOST:PORT");
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : endpoint.substr(colon + 1)) {
    SLOPE_CHECK(c >= '0' && c <= '9' && port < 65536, "the endpoint '", endpoint, "' has a bad port");
    port = port * 10 + (c - '0');
  }
  SLOPE_CHECK(port > 0 && port <= 65535, "the endpoint '", endpoint, "' has a bad port");
  return {host, port};
}

std::pair<int, int> listen_tcp(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  SLOPE_CHECK(rc == 0, "cannot resolve the KV service host '", host, "': ", ::gai_strerror(rc), "; check --kv-host");
  int fd = -1;
  std::string why;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  SLOPE_CHECK(fd >= 0, "cannot listen for KV transfers on ", host, ":", port, " (", why,
              "); choose another --kv-port-base (or 0 for any free port) or --kv-host");
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int got = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
  return {fd, got};
}

int connect_tcp(const std::string& host, int port, double timeout_s, const std::function<bool(const sockaddr*)>& allowed) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  SLOPE_CHECK(rc == 0, "cannot resolve '", host, "': ", ::gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  bool any_allowed = false;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    if (allowed && !allowed(a->ai_addr)) continue;
    any_allowed = true;
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof(err);
    if (::poll(&p, 1, int(timeout_s * 1000)) <= 0) err = ETIMEDOUT;
    else ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      why = std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (!any_allowed)
    throw ProtocolError("not_allowed", str_cat("no address of ", host, " is one this rank may dial (--kv-push-allow)"));
  SLOPE_CHECK(fd >= 0, "cannot connect to ", host, ":", port, ": ", why);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace slope::kvx
