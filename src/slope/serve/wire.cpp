#include "slope/serve/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "slope/core/error.h"
#include "slope/core/sys.h"

namespace slope::serve {
namespace {

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    SLOPE_CHECK(w > 0, "the peer closed the connection (", std::strerror(errno), ")");
    p += w;
    n -= size_t(w);
  }
}

// Reads exactly n bytes; false on end of stream before the first byte (when allowed).
bool read_all(int fd, char* p, size_t n, double deadline, const std::function<bool()>& keep_waiting, bool eof_ok) {
  size_t got = 0;
  while (got < n) {
    const double left = deadline < 0 ? 0.2 : std::min(0.2, deadline - now_seconds());
    SLOPE_CHECK(deadline < 0 || left > 0, "no reply within the time limit");
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, int(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      SLOPE_CHECK(!keep_waiting || keep_waiting(), "the peer stopped while a reply was awaited");
      continue;
    }
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0 && got == 0 && eof_ok) return false;
    SLOPE_CHECK(r > 0, "the connection ended in the middle of a message");
    got += size_t(r);
  }
  return true;
}

}  // namespace

void write_frame(int fd, const nlohmann::json& message) {
  const std::string body = message.dump();
  SLOPE_CHECK(body.size() <= kMaxFrameBytes, "a message of ", body.size(), " bytes is over the frame limit");
  const uint32_t n = uint32_t(body.size());
  const unsigned char len[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
  write_all(fd, reinterpret_cast<const char*>(len), 4);
  write_all(fd, body.data(), body.size());
}

std::optional<nlohmann::json> read_frame(int fd, double timeout_s, const std::function<bool()>& keep_waiting) {
  const double deadline = timeout_s < 0 ? -1 : now_seconds() + timeout_s;
  unsigned char len[4];
  if (!read_all(fd, reinterpret_cast<char*>(len), 4, deadline, keep_waiting, true)) return std::nullopt;
  const uint32_t n = uint32_t(len[0]) | uint32_t(len[1]) << 8 | uint32_t(len[2]) << 16 | uint32_t(len[3]) << 24;
  SLOPE_CHECK(n <= kMaxFrameBytes, "a frame of ", n, " bytes is over the limit of ", kMaxFrameBytes);
  std::string body(n, '\0');
  read_all(fd, body.data(), n, deadline, keep_waiting, false);
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    fail("a frame is not JSON: ", e.what());
  }
}

int listen_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  SLOPE_CHECK(path.size() < sizeof(addr.sun_path), "the socket path ", path, " is longer than ",
              sizeof(addr.sun_path) - 1, " bytes; use a shorter --socket-dir");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SLOPE_CHECK(fd >= 0, "cannot create a unix socket: ", std::strerror(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    fail("cannot listen on ", path, ": ", why);
  }
  return fd;
}

int connect_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  SLOPE_CHECK(path.size() < sizeof(addr.sun_path), "the socket path ", path, " is too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SLOPE_CHECK(fd >= 0, "cannot create a unix socket: ", std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    fail("cannot connect to the front's socket ", path, ": ", why);
  }
  return fd;
}

}  // namespace slope::serve
