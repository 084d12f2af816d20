#include "slope/serve/http_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/serve/api.h"

namespace slope::serve {

struct RequestGate::Conn {
  int fd = -1;
  std::string peer;  // "address port": tells a reused descriptor from this connection
  std::function<void()> fn;
  double deadline = 0;           // waiting: when the header must be complete
  size_t peeked = 0;             // waiting: bytes of the header seen so far
  std::atomic<double> armed{0};  // on a worker: 0, or when to cut the connection
};

namespace {

thread_local std::shared_ptr<RequestGate::Conn>* current_conn = nullptr;
thread_local RequestGate* current_gate = nullptr;

int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t l = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

std::string peer_of(int fd) {  // "" when fd is not a connected IP socket
  sockaddr_storage a{};
  socklen_t l = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &l) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &in.sin6_addr, host, sizeof(host));
    port = ntohs(in.sin6_port);
  } else {
    return "";
  }
  return str_cat(host, " ", port);
}

// A request whose header and body are at most this many bytes waits in the gate until all of it
// has come: a socket's receive buffer (128 KiB by default on Linux, about half of it for data)
// always holds that much, so a client sending it at speed is never held back by its window.
constexpr size_t kGatedRequestBytes = 32 << 10;

// Whether the `n` bytes peeked at `p` are a request ready for a worker: the header is complete
// and, when it declares a Content-Length that keeps the request within kGatedRequestBytes, the
// body too. A larger or chunked body is read on the worker, under the read timeout.
size_t header_end(std::string_view s) {  // where the blank line after the header starts, or npos
  const size_t end = s.find("\r\n\r\n");
  return end == std::string_view::npos ? s.find("\n\n") : end;
}

bool request_ready(const char* p, size_t n) {
  const std::string_view s(p, n);
  const size_t end = header_end(s);
  if (end == std::string_view::npos) return false;
  const size_t body_at = end + (s[end] == '\r' ? 4 : 2);
  std::string head(s.substr(0, end));
  for (char& c : head) c = char(std::tolower(static_cast<unsigned char>(c)));
  // "Expect: 100-continue": the client sends the body only after the server's go-ahead (httplib's).
  if (head.find("\nexpect:") != std::string::npos) return true;
  const size_t at = head.find("\ncontent-length:");
  if (at == std::string::npos) return true;
  const uint64_t length = std::strtoull(head.c_str() + at + 16, nullptr, 10);
  if (length > kGatedRequestBytes || body_at + length > kGatedRequestBytes) return true;
  return n >= body_at + length;
}

}  // namespace

RequestGate::RequestGate(const GateOptions& o) : opt_(o) {
  SLOPE_CHECK(o.threads >= 1, "--http-threads must be at least 1");
  SLOPE_CHECK(o.read_timeout_s > 0, "--http-read-timeout-s must be positive, got ", o.read_timeout_s);
  SLOPE_CHECK(o.max_header_bytes >= 1024, "--max-header-bytes must be at least 1024, got ", o.max_header_bytes);
  SLOPE_CHECK(::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0, "cannot make the HTTP gate's pipe: ", std::strerror(errno));
  pool_ = std::make_unique<httplib::ThreadPool>(size_t(o.threads));
  watcher_ = std::thread([this] { watch(); });
}

RequestGate::~RequestGate() {
  shutdown();
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

void RequestGate::disarm() {
  if (current_conn) (*current_conn)->armed = 0;
}

void RequestGate::arm() {
  if (current_conn) (*current_conn)->armed = now_seconds() + current_gate->opt_.read_timeout_s;
}

int64_t RequestGate::refused() const {
  std::lock_guard lk(mu_);
  return refused_;
}

// The socket httplib just accepted: connected to our port, and neither waiting nor working.
int RequestGate::find_socket() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1, count = 0;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || local_port(fd) != opt_.port) continue;
    const std::string peer = peer_of(fd);
    if (peer.empty()) continue;  // the listening socket
    bool known = false;
    for (const auto* list : {&waiting_, &working_})
      for (const auto& c : *list) known = known || (c->fd == fd && c->peer == peer);
    if (!known) found = fd, ++count;
  }
  ::closedir(d);
  return count == 1 ? found : -1;
}

void RequestGate::enqueue(std::function<void()> fn) {
  auto c = std::make_shared<Conn>();
  c->fn = std::move(fn);
  std::lock_guard lk(mu_);
  c->fd = find_socket();
  if (c->fd < 0) {  // not expected; the connection is served ungated rather than dropped
    std::cerr << "slope serve: the HTTP gate could not tell which socket was accepted; serving it ungated\n";
    working_.push_back(c);
    dispatch(c);
    return;
  }
  c->peer = peer_of(c->fd);
  if (int(waiting_.size()) >= opt_.max_waiting) {
    refuse(c, 503, str_cat(waiting_.size(), " connections are already waiting to send their request; retry shortly"),
           "too_many_connections");
    return;
  }
  c->deadline = now_seconds() + opt_.read_timeout_s;
  waiting_.push_back(c);
  const char b = 1;
  (void)!::write(wake_[1], &b, 1);
}

// With mu_ held; c is already in working_.
void RequestGate::dispatch(const std::shared_ptr<Conn>& c) {
  pool_->enqueue([this, c] {
    auto self = c;
    current_conn = &self;
    current_gate = this;
    self->armed = now_seconds() + opt_.read_timeout_s;  // the body must follow in time
    self->fn();                                         // httplib's: serves, then closes the socket
    current_conn = nullptr;
    current_gate = nullptr;
    std::lock_guard lk(mu_);
    working_.remove(self);
  });
}

// With mu_ held: answers the connection itself and closes it; httplib never sees it.
void RequestGate::refuse(const std::shared_ptr<Conn>& c, int status, const std::string& message, const std::string& code) {
  const std::string body = error_body(message, "invalid_request_error", "", code).dump();
  const char* reason = status == 408 ? "Request Timeout" : status == 431 ? "Request Header Fields Too Large" : "Service Unavailable";
  const std::string response = str_cat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: application/json\r\nContent-Length: ",
                                       body.size(), "\r\nConnection: close\r\n\r\n", body);
  (void)!::send(c->fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(c->fd, SHUT_WR);
  char sink[4096];  // what the client sent, read away so that closing does not reset the answer
  for (int i = 0; i < 64 && ::recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  ::close(c->fd);
  c->fd = -1;
  ++refused_;
}

void RequestGate::watch() {
  std::vector<char> peek(std::max(opt_.max_header_bytes + 1, kGatedRequestBytes));
  std::vector<pollfd> fds;
  for (;;) {
    bool partial = false;
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      for (const auto& c : waiting_) {
        if (c->peeked == 0) fds.push_back(pollfd{c->fd, POLLIN, 0});
        else partial = true;
      }
    }
    // Waiting sockets that already hold part of a header stay readable: poll would return at
    // once, so they are peeked again on a 20 ms tick instead. Working sockets' deadlines are
    // checked on the same tick, at most 200 ms late.
    (void)::poll(fds.data(), fds.size(), partial ? 20 : 200);
    if (fds[0].revents & POLLIN) {
      char buf[256];
      while (::read(wake_[0], buf, sizeof(buf)) > 0) {
      }
    }
    std::lock_guard lk(mu_);
    if (stopping_) return;
    const double now = now_seconds();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const std::shared_ptr<Conn>& c = *it;
      const ssize_t n = ::recv(c->fd, peek.data(), peek.size(), MSG_PEEK | MSG_DONTWAIT);
      const bool gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      const size_t end = n > 0 ? header_end({peek.data(), size_t(n)}) : std::string_view::npos;
      if (gone) {
        ::close(c->fd);  // the client left before sending a request
        it = waiting_.erase(it);
      } else if (n > 0 && (end == std::string_view::npos ? size_t(n) : end) > opt_.max_header_bytes) {
        refuse(c, 431, str_cat("the request's header is over the limit of ", opt_.max_header_bytes,
                               " bytes; send less, or start the server with a larger --max-header-bytes"),
               "header_too_large");
        it = waiting_.erase(it);
      } else if (n > 0 && request_ready(peek.data(), size_t(n))) {
        working_.push_back(c);
        dispatch(c);
        it = waiting_.erase(it);
      } else if (now >= c->deadline) {
        refuse(c, 408, str_cat("the request did not arrive within ", opt_.read_timeout_s,
                               " s; send it at once, or start the server with a larger --http-read-timeout-s"),
               "request_timeout");
        it = waiting_.erase(it);
      } else {
        c->peeked = n > 0 ? size_t(n) : 0;
        ++it;
      }
    }
    for (const auto& c : working_) {
      const double armed = c->armed;
      if (armed > 0 && now >= armed && c->fd >= 0 && peer_of(c->fd) == c->peer) {
        ::shutdown(c->fd, SHUT_RDWR);  // httplib's recv or send returns; it closes the socket
        c->armed = 0;
        ++refused_;
      }
    }
  }
}

void RequestGate::shutdown() {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (const auto& c : waiting_) ::close(c->fd);
    waiting_.clear();
  }
  const char b = 1;
  (void)!::write(wake_[1], &b, 1);
  if (watcher_.joinable()) watcher_.join();
  pool_->shutdown();  // the connections on workers end (httplib's listener is closed by now)
}

}  // namespace slope::serve
