// serve::RequestGate: the HTTP server's connection queue (an httplib::TaskQueue), which keeps
// slow clients from holding its worker threads.
//
// cpp-httplib 0.11 gives each connection a worker thread from accept to close, and its read
// timeout is per recv: a client that sends a byte every few seconds ("slowloris") holds its
// worker forever, and --http-threads of them stop the server. The gate fixes that in two steps:
//   1. A new connection waits in the gate, not on a worker: one gate thread watches every waiting
//      socket (poll, then MSG_PEEK, so httplib still reads every byte) and hands the connection
//      to a worker only once its request header is complete ("\r\n\r\n") and, for a request of
//      at most 32 KiB (most: 5,000 token ids), its body too. A request not there within the read
//      timeout gets 408, a header over max_header_bytes 431, and the gate closes the connection
//      itself; no worker ever sees it.
//   2. On a worker, the rest of a larger request (its body) must arrive within the read timeout
//      of the worker taking it, and after each response the next request on a kept-alive
//      connection too (arm()/disarm() around the handler). Past that, the gate thread shuts the
//      socket down, and httplib's blocked recv returns at once. (A client dribbling a large
//      body holds a worker for at most the read timeout.)
// A handler may run as long as it needs (disarmed). The gate finds the socket httplib accepted
// (its closure does not say) as the one connection to the server's port it does not know yet.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace slope::serve {

struct GateOptions {
  int port = 0;                     // the port the server listens on
  int threads = 64;                 // workers (--http-threads)
  double read_timeout_s = 30;       // --http-read-timeout-s
  size_t max_header_bytes = 65536;  // --max-header-bytes
  int max_waiting = 512;            // connections waiting in the gate at once; more get 503
};

class RequestGate : public httplib::TaskQueue {
 public:
  explicit RequestGate(const GateOptions& o);
  ~RequestGate() override;
  RequestGate(const RequestGate&) = delete;
  RequestGate& operator=(const RequestGate&) = delete;

  void enqueue(std::function<void()> fn) override;  // httplib's listener thread, after accept
  void shutdown() override;

  // On a worker thread, for the connection it serves: disarm() when a handler starts (the
  // request has arrived whole), arm() when the response is ready (the next one must come in
  // time). No effect off a worker.
  static void disarm();
  static void arm();

  int64_t refused() const;  // connections cut or refused by the gate (408, 431, 503, deadline)

  struct Conn;  // one connection (http_gate.cpp)

 private:
  void watch();
  void dispatch(const std::shared_ptr<Conn>& c);
  void refuse(const std::shared_ptr<Conn>& c, int status, const std::string& message, const std::string& code);
  int find_socket();

  GateOptions opt_;
  std::unique_ptr<httplib::ThreadPool> pool_;
  int wake_[2] = {-1, -1};
  mutable std::mutex mu_;  // below
  std::list<std::shared_ptr<Conn>> waiting_, working_;
  bool stopping_ = false;
  int64_t refused_ = 0;
  std::thread watcher_;
};

}  // namespace slope::serve
