#include "slope/serve/server.h"

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <httplib.h>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "slope/core/error.h"
#include "slope/core/sha256.h"
#include "slope/core/sys.h"
#include "slope/kernels/bf16_units.h"
#include "slope/kvx/protocol.h"
#include "slope/model/config.h"
#include "slope/model/parallel_shape.h"
#include "slope/serve/api.h"
#include "slope/serve/http_gate.h"
#include "slope/serve/mesh_spec.h"
#include "slope/serve/metrics.h"
#include "slope/serve/scheduler.h"
#include "slope/text/tokenizer.h"

namespace slope::serve {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

double wall_seconds() {  // for the API's timestamps (lease expiry, "created")
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// The socket of the connection a request came on, found by its two ports (httplib does not hand
// it to handlers), so that a handler can see its client leave. -1 when not found.
int connection_fd(const httplib::Request& req) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    auto port = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    if (port(peer) == req.remote_port && port(self) == req.local_port) {
      found = fd;
      break;
    }
  }
  ::closedir(d);
  return found;
}

bool client_gone(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// `digits` hex digits from the system's random source (a KV id must not be guessable: it is
// what lets a client pull the KV from the ranks).
std::string random_hex(int digits) {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard lk(mu);
  std::string s;
  for (int i = 0; i < digits; ++i) s += "0123456789abcdef"[rd() % 16];
  return s;
}

// The longest prompt one rank of `mesh` holds within `max_memory` bytes (predicted).
int64_t max_tokens_within(const model::ModelConfig& cfg, const engine::ParallelShape& mesh, int64_t max_memory, bool bf16) {
  auto fits = [&](int64_t n) {
    engine::MemoryQuery q;
    q.shape = mesh;
    q.num_tokens = n;
    q.pp_chunk = mesh.pp_chunk >= 0 ? mesh.pp_chunk : model::default_pipeline_chunk(mesh.pp, n);
    q.bf16_weights = bf16;
    int64_t worst = 0;
    for (const auto& m : engine::estimate_memory(cfg, q)) worst = std::max(worst, m.total());
    return worst <= max_memory;
  };
  int64_t lo = 0, hi = cfg.max_position_embeddings;
  if (max_memory <= 0 || fits(hi)) return hi;
  while (lo < hi) {  // largest n with fits(n)
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Pending {
  uint64_t id = 0;
  Endpoint endpoint = Endpoint::Completions;
  ApiRequest req;
  double arrival_s = 0, start_s = 0, end_s = 0;
  Admission admission;
  enum State { Queued, Running, Done } state = Queued;
  int status = 200;
  json error;          // error_body when status != 200
  json result;         // the instance's result for this prompt
  json engine_timings;
  std::string kv_id;
  std::string owner;   // the digest of the client's API key: the KV lease is its alone
  double kv_expiry_wall_s = 0;
  int64_t kv_bytes = 0;
  json kv_layout;      // the instance's ranks' shard layout, copied by its dispatch thread
  int instance = -1;
};

struct Lease {
  int instance = -1;
  double expiry_s = 0;  // now_seconds()
  int64_t bytes = 0;    // the KV kept on the instance's ranks
  std::string dtype;    // the pull's default (the request's kv_dtype)
  json layout;          // the instance's ranks and their KV endpoints when the KV was made
  std::string owner;    // the digest of the API key that made it ("" without keys)
};

struct Release {  // a KV lease to drop on its instance's ranks
  std::string kv_id, owner;
};

// The key of 'Authorization: Bearer KEY' ("" when absent).
std::string bearer_key(const httplib::Request& req) {
  const std::string h = req.get_header_value("Authorization");
  return h.rfind("Bearer ", 0) == 0 ? h.substr(7) : "";
}

json kv_not_found(const std::string& id) {  // an unknown id and another key's id get this alike
  return error_body(str_cat("no KV is kept under id '", id, "' (released, expired, or its instance restarted)"),
                    "invalid_request_error", "id", "kv_not_found");
}

class Server {
 public:
  explicit Server(const ServeOptions& o);
  int run();

 private:
  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  void dispatch(int i);
  void run_pass(int i, const Pass& pass);
  void restart(int i, const std::string& why);
  void finish(const std::shared_ptr<Pending>& p, int status, const json& error);
  void push_kv(const httplib::Request& req, httplib::Response& res);
  json health();
  // The digest of the request's API key: "" without keys; the pre-routing handler has checked it.
  std::string owner_of(const httplib::Request& req) const;
  bool lease_of(const std::string& id, const httplib::Request& req, Lease& lease);  // with mu_ held
  std::string token_text(int32_t id) const;

  ServeOptions opt_;
  model::ModelConfig cfg_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  ApiLimits limits_;
  std::vector<std::unique_ptr<InstanceProcess>> inst_;
  std::mutex mu_;  // everything below
  std::condition_variable work_cv_, done_cv_;
  std::unique_ptr<Scheduler> sched_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::map<std::string, Lease> leases_;
  std::vector<std::vector<Release>> releases_;  // per instance: KV leases to release
  Metrics metrics_;
  bool draining_ = false, stopping_ = false;
  uint64_t next_id_ = 1;
  std::vector<std::string> key_hashes_;  // SHA-256 of opt_.api_keys
  int port_ = 0;                         // the HTTP port, once bound
  httplib::Server http_;
};

Server::Server(const ServeOptions& o) : opt_(o), metrics_(now_seconds()) {
  SLOPE_CHECK(!o.instances.empty(), "give at least one --instance MESH (e.g. --instance \"ring=1\")");
  SLOPE_CHECK(o.slo_ms > 0, "--slo-ms must be positive, got ", o.slo_ms);
  SLOPE_CHECK(o.kv_lease_s > 0 && o.kv_lease_s <= o.max_kv_lease_s, "--kv-lease-s must be in (0, ", o.max_kv_lease_s,
              "], got ", o.kv_lease_s);
  SLOPE_CHECK(o.http_threads >= 1, "--http-threads must be at least 1");
  SLOPE_CHECK(o.http_read_timeout_s > 0, "--http-read-timeout-s must be positive, got ", o.http_read_timeout_s);
  for (const std::string& k : o.api_keys) {
    SLOPE_CHECK(!k.empty(), "an API key is empty; give keys of at least one character");
    key_hashes_.push_back(sha256_hex(k));
  }
  const Policy policy = parse_policy(o.scheduler);
  cfg_ = model::load_config(o.model_dir);
  const std::string tok_path = (std::filesystem::path(o.model_dir) / "tokenizer.json").string();
  if (std::filesystem::exists(tok_path)) tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(tok_path));
  std::string profile_path = o.profile;
  if (!std::filesystem::exists(profile_path) && !find_data_path(profile_path).empty()) profile_path = find_data_path(profile_path);
  const planner::HardwareProfile profile = planner::load_profile(profile_path);

  // The units are chosen once, here (auto probes this CPU), and the instances are told that choice
  // rather than auto, so their memory is what the admission limits below were sized for: on the
  // f32 units a bf16 instance holds f32 weights.
  kernels::set_bf16_units(kernels::parse_bf16_units(o.launch.bf16_units));
  const bool bf16_weights = engine::bf16_weights(
      o.launch.dtype == "bf16" ? kernels::ComputeType::BF16 : kernels::ComputeType::F32, kernels::bf16_units());
  std::vector<InstanceSpec> specs;
  int64_t longest = 0;
  int kv_ports = 0;
  for (size_t i = 0; i < o.instances.size(); ++i) {
    const engine::ParallelShape mesh = parse_mesh_spec(o.instances[i]);
    engine::validate_shape(mesh, mesh.size(), cfg_, 1);
    LaunchOptions launch = o.launch;
    launch.bf16_units = kernels::bf16_units_name(kernels::bf16_units());
    if (launch.kv_port_base > 0) launch.kv_port_base += kv_ports;  // each rank of each instance its own port
    kv_ports += mesh.size();
    inst_.push_back(std::make_unique<InstanceProcess>(int(i), mesh, launch));
    InstanceSpec s;
    s.name = mesh_spec(mesh);
    // Several instances of one mesh (a scale-out, or --plan's copies): "...,tp=1#2", "#3", ...
    int same = 1;
    for (const InstanceSpec& earlier : specs) same += earlier.mesh.str() == mesh.str() ? 1 : 0;
    if (same > 1) s.name += str_cat("#", same);
    s.mesh = mesh;
    s.max_tokens = max_tokens_within(cfg_, mesh, o.launch.max_memory, bf16_weights);
    SLOPE_CHECK(s.max_tokens > 0, "instance ", s.name, " cannot hold even one token within --max-memory ",
                o.launch.max_memory, " bytes");
    s.batch_tokens = o.batch_tokens;
    longest = std::max(longest, s.max_tokens);
    specs.push_back(s);
    metrics_.instances().push_back(InstanceMetrics{s.name});
  }
  releases_.resize(inst_.size());
  planner::CostOptions co;
  co.compute_dtype = o.launch.dtype == "f32" ? "fp32" : o.launch.dtype;
  sched_ = std::make_unique<Scheduler>(Predictor(cfg_, profile, specs, co), policy, [] { return now_seconds(); });
  limits_.model_name = o.model_name.empty() ? std::filesystem::path(o.model_dir).filename().string() : o.model_name;
  if (limits_.model_name.empty()) limits_.model_name = std::filesystem::path(o.model_dir).parent_path().filename().string();
  limits_.vocab_size = cfg_.vocab_size;
  limits_.max_position = cfg_.max_position_embeddings;
  limits_.max_prompt_tokens = longest;
  limits_.max_prompt_bytes = o.max_prompt_bytes;
  limits_.default_slo_ms = o.slo_ms;
  limits_.default_kv_lease_s = o.kv_lease_s;
  limits_.max_kv_lease_s = o.max_kv_lease_s;
  limits_.tokenizer = tokenizer_.get();
}

std::string Server::token_text(int32_t id) const {
  if (tokenizer_ && id >= 0 && id < tokenizer_->vocab_size()) {
    try {
      return tokenizer_->decode({id}, false);
    } catch (const Error&) {
    }
  }
  return str_cat(id);  // no tokenizer: the id, as text (docs/serving.md)
}

void Server::finish(const std::shared_ptr<Pending>& p, int status, const json& error) {
  p->status = status;
  p->error = error;
  p->state = Pending::Done;
  p->end_s = now_seconds();
}

json Server::health() {
  json list = json::array();
  bool all = true, any = false;
  for (size_t i = 0; i < inst_.size(); ++i) {
    const InstanceProcess& in = *inst_[i];
    const bool ready = in.state() == InstanceState::Ready;
    all = all && ready;
    any = any || ready;
    list.push_back({{"index", i}, {"mesh", in.name()}, {"ranks", in.mesh().size()}, {"state", state_name(in.state())},
                    {"restarts", in.restarts()}, {"queue_depth", sched_->queue_depth(int(i))},
                    {"pids", in.state() == InstanceState::Ready ? json(in.rank_pids()) : json::array()},
                    {"bf16_units", in.state() == InstanceState::Ready ? in.hello().value("bf16_units", "") : ""}});
  }
  return {{"status", draining_ ? "draining" : all ? "ok" : any ? "degraded" : "unavailable"},
          {"model", limits_.model_name},
          {"instances", list}};
}

std::string Server::owner_of(const httplib::Request& req) const {
  return key_hashes_.empty() ? "" : sha256_hex(bearer_key(req));
}

bool Server::lease_of(const std::string& id, const httplib::Request& req, Lease& lease) {
  auto it = leases_.find(id);
  if (it == leases_.end() || !constant_time_equal(it->second.owner, owner_of(req))) return false;
  lease = it->second;
  return true;
}

void Server::routes() {
  http_.set_payload_max_length(opt_.max_body_bytes);
  http_.new_task_queue = [this] {  // slow clients wait in the gate, not on a worker (http_gate.h)
    GateOptions g;
    g.port = port_;
    g.threads = opt_.http_threads;
    g.read_timeout_s = opt_.http_read_timeout_s;
    g.max_header_bytes = opt_.max_header_bytes;
    return new RequestGate(g);
  };
  http_.set_post_routing_handler([](const httplib::Request&, httplib::Response&) { RequestGate::arm(); });
  // Every path, known or not, needs a key when there are keys (a 404 would tell which exist).
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    bool known = key_hashes_.empty();
    const std::string digest = owner_of(req);
    for (const std::string& h : key_hashes_) known = constant_time_equal(digest, h) || known;  // each compared in full
    if (known) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_content(error_body(req.has_header("Authorization") ? "the API key is wrong"
                                                               : "this server needs an API key: send 'Authorization: Bearer KEY'",
                               "invalid_request_error", "", "invalid_api_key").dump(),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = str_cat("HTTP ", res.status);
    std::string code;
    if (res.status == 413)
      message = str_cat("the body is over the limit of ", opt_.max_body_bytes, " bytes; send less, or start the server ",
                        "with a larger --max-body-bytes"),
      code = "body_too_large";
    else if (res.status == 414)
      message = "the request line is over 8192 bytes (cpp-httplib's fixed limit); no path of this API needs as much",
      code = "uri_too_long";
    else if (res.status == 404)
      message = str_cat("no endpoint ", req.method, " ", req.path, "; see GET /v1/models, POST /v1/completions, ",
                        "POST /v1/prefill, DELETE /v1/kv/{id}, POST /v1/kv/{id}/push, GET /health, GET /metrics"),
      code = "not_found";
    else if (res.status == 400)
      message = "malformed HTTP request", code = "bad_request";
    res.set_content(error_body(message, "invalid_request_error", "", code).dump(), "application/json");
  });
  // Each handler starts once its request has arrived whole: from then on it may take its time.
  auto arrived = [](auto handler) {
    return [handler](const httplib::Request& q, httplib::Response& r) {
      RequestGate::disarm();
      handler(q, r);
    };
  };
  http_.Post("/v1/completions", arrived([this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::Completions); }));
  http_.Post("/v1/prefill", arrived([this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::Prefill); }));
  http_.Delete(R"(/v1/kv/([^/]+))", arrived([this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    std::lock_guard lk(mu_);
    Lease lease;
    if (!lease_of(id, req, lease)) {  // another key's lease is as unknown as a made-up id
      res.status = 404;
      res.set_content(kv_not_found(id).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    } else {
      releases_[size_t(lease.instance)].push_back({id, lease.owner});
      leases_.erase(id);
      work_cv_.notify_all();
      res.status = 200;  // httplib sets it only after the handler: the metric needs it now
      res.set_content(json{{"id", id}, {"object", "kv"}, {"deleted", true}}.dump(), "application/json");
    }
    metrics_.request("kv_delete", res.status);
  }));
  http_.Post(R"(/v1/kv/([^/]+)/push)", arrived([this](const httplib::Request& req, httplib::Response& res) { push_kv(req, res); }));
  http_.Get("/health", arrived([this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lk(mu_);
    const json h = health();
    res.status = h["status"] == "unavailable" || h["status"] == "draining" ? 503 : 200;
    res.set_content(h.dump(), "application/json");
  }));
  http_.Get("/v1/models", arrived([this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", limits_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "slope"},
              {"max_model_len", limits_.max_prompt_tokens}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  }));
  http_.Get("/metrics", arrived([this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < inst_.size(); ++i) {
      metrics_.instances()[i].queue_depth = sched_->queue_depth(int(i));
      metrics_.instances()[i].up = inst_[i]->state() == InstanceState::Ready;
      metrics_.instances()[i].restarts = inst_[i]->restarts();
    }
    int64_t kv_bytes = 0;
    for (const auto& [id, lease] : leases_) kv_bytes += lease.bytes;
    metrics_.leases(leases_.size(), kv_bytes);
    res.set_content(metrics_.render(now_seconds()), "text/plain; version=0.0.4");
  }));
}

// POST /v1/kv/{id}/push {"targets": [{"rank": r, "endpoint": "host:port"}...], "dtype", "window_trim"}:
// each named rank dials its target and sends it the same manifest and tensors a pull gets
// (docs/kv-format.md), then waits for the receiver's ack and releases its shard. The front asks
// each rank's KV service over its own connection, all at once, and answers when every rank is
// done: 200 with the bytes per rank, or 502 naming the first rank that failed.
void Server::push_kv(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto answer = [&](int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    std::lock_guard lk(mu_);
    metrics_.request("kv_push", status);
  };
  Lease lease;
  bool found;
  {
    std::lock_guard lk(mu_);
    found = lease_of(id, req, lease);
  }
  if (!found) return answer(404, kv_not_found(id));  // answer() takes mu_ itself
  PushRequest push;
  try {
    push = parse_push_request(req.body, int(lease.layout.size()), lease.dtype);
  } catch (const ApiError& e) {
    return answer(e.status, error_body(e.what(), e.type, e.param, e.code));
  }
  const std::string& dtype = push.dtype;
  const bool trim = push.window_trim;
  struct Target {
    int rank;
    std::string service, target;
  };
  std::vector<Target> targets;
  for (const PushTarget& t : push.targets)
    targets.push_back({t.rank, lease.layout[size_t(t.rank)].value("endpoint", ""), t.endpoint});
  const std::string client_key = bearer_key(req);
  std::vector<json> results(targets.size());
  std::vector<std::thread> threads;
  for (size_t j = 0; j < targets.size(); ++j)
    threads.emplace_back([&, j] {
      const Target& t = targets[j];
      try {
        const auto [host, port] = kvx::parse_endpoint(t.service);
        kvx::Connection c(kvx::connect_tcp(host, port, 10), 600);  // the push itself may take long
        json q = {{"kv_id", id}, {"target", t.target}, {"dtype", dtype}, {"window_trim", trim}};
        if (!key_hashes_.empty()) q["api_key"] = client_key;  // the rank checks the lease is this key's too
        c.write_json(kvx::FrameType::Push, q);
        const json done = c.expect_json(kvx::FrameType::Done);
        results[j] = {{"rank", t.rank}, {"endpoint", t.target}, {"bytes", done.value("bytes", int64_t(0))}};
      } catch (const std::exception& e) {
        results[j] = {{"rank", t.rank}, {"endpoint", t.target}, {"error", e.what()}};
      }
    });
  for (std::thread& t : threads) t.join();
  for (const json& r : results)
    if (r.contains("error") && r["error"].get<std::string>().find("[not_allowed]") != std::string::npos)
      return answer(403, error_body(str_cat("rank ", r["rank"].get<int>(), " may not push its KV to ",
                                            r["endpoint"].get<std::string>(), ": ", r["error"].get<std::string>(),
                                            "; the server's --kv-push-allow lists the hosts it may"),
                                    "invalid_request_error", "targets", "push_not_allowed"));
  for (const json& r : results)
    if (r.contains("error"))
      return answer(502, error_body(str_cat("rank ", r["rank"].get<int>(), " could not push its KV to ",
                                            r["endpoint"].get<std::string>(), ": ", r["error"].get<std::string>()),
                                    "server_error", "targets", "push_failed"));
  answer(200, {{"id", id}, {"object", "kv.push"}, {"dtype", dtype}, {"window_trim", trim}, {"ranks", results}});
}

void Server::completion(const httplib::Request& http_req, httplib::Response& res, Endpoint ep) {
  const std::string endpoint = ep == Endpoint::Completions ? "completions" : "prefill";
  auto answer = [&](int status, const json& body, bool counted = true) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    if (counted) {
      std::lock_guard lk(mu_);
      metrics_.request(endpoint, status);
    }
  };
  auto p = std::make_shared<Pending>();
  try {
    p->req = parse_request(http_req.body, ep, limits_);
  } catch (const ApiError& e) {
    return answer(e.status, error_body(e.what(), e.type, e.param, e.code));
  }
  p->endpoint = ep;
  p->owner = owner_of(http_req);
  {
    std::lock_guard lk(mu_);
    if (draining_) {
      metrics_.rejected("draining");
      metrics_.request(endpoint, 503);
      res.status = 503;
      res.set_content(error_body("the server is shutting down; send the request elsewhere", "server_error", "",
                                 "draining").dump(),
                      "application/json");
      return;
    }
    p->id = next_id_++;
    p->arrival_s = now_seconds();
    if (ep == Endpoint::Prefill) p->kv_id = str_cat("kv-", p->id, "-", random_hex(32));  // 128 random bits
    Job job;
    job.id = p->id;
    job.tokens = int64_t(p->req.prompt.size());
    job.arrival_s = p->arrival_s;
    job.slo_s = p->req.ttft_slo_ms / 1e3;
    job.best_effort = p->req.best_effort;
    job.priority = p->req.priority;
    p->admission = sched_->submit(job);
    if (!p->admission.admitted) {
      const Admission& a = p->admission;
      const char* reason = a.rejection == Rejection::TooLong       ? "too_long"
                           : a.rejection == Rejection::Unreachable ? "unreachable"
                           : a.rejection == Rejection::Unavailable ? "unavailable"
                                                                   : "deadline";
      metrics_.rejected(reason);
      json body;
      if (a.rejection == Rejection::TooLong) {
        res.status = 400;
        body = error_body(str_cat("the prompt cannot run on any instance: ", a.reason), "invalid_request_error", "prompt",
                          "context_length_exceeded");
      } else if (a.rejection == Rejection::Unavailable) {
        res.status = 503;
        body = error_body(str_cat("no instance can take the request now: ", a.reason, "; retry shortly"), "server_error",
                          "", "unavailable");
      } else {
        res.status = 429;
        if (a.rejection == Rejection::Deadline)
          res.set_header("Retry-After", std::to_string(int64_t(std::ceil(std::max(1.0, a.retry_after_s)))));
        body = error_body(str_cat("cannot meet the TTFT target of ", p->req.ttft_slo_ms, " ms: ", a.reason,
                                  a.rejection == Rejection::Deadline ? "; retry later, relax ttft_slo_ms, or send best_effort: true"
                                                                     : "; relax ttft_slo_ms or send best_effort: true"),
                          "rate_limit_error", "ttft_slo_ms", reason);
      }
      metrics_.request(endpoint, res.status);
      res.set_content(body.dump(), "application/json");
      return;
    }
    pending_[p->id] = p;
    work_cv_.notify_all();
  }
  // Wait for the pass; a client that leaves while its request is queued frees the slot.
  const int fd = connection_fd(http_req);
  {
    std::unique_lock lk(mu_);
    while (p->state != Pending::Done) {
      done_cv_.wait_for(lk, milliseconds(50));
      if (p->state == Pending::Queued && client_gone(fd) && sched_->cancel(p->id)) {
        pending_.erase(p->id);
        metrics_.rejected("client_gone");
        metrics_.request(endpoint, 499);
        done_cv_.notify_all();
        return;
      }
    }
    pending_.erase(p->id);
    done_cv_.notify_all();
  }
  if (p->status != 200) return answer(p->status, p->error);

  const json& r = p->result;
  const int32_t first = r.at("first_token").get<int32_t>();
  const int64_t n = int64_t(p->req.prompt.size());
  const double ttft_s = p->end_s - p->arrival_s;
  json ext = {{"ttft_ms", ttft_s * 1e3},
              {"queue_ms", (p->start_s - p->arrival_s) * 1e3},
              {"predicted_ttft_ms", p->admission.predicted_ttft_s * 1e3},
              {"instance", p->instance},
              {"instance_mesh", inst_[size_t(p->instance)]->name()},
              {"ttft_slo_ms", p->req.ttft_slo_ms},
              {"slo_met", ttft_s * 1e3 <= p->req.ttft_slo_ms},
              {"first_token", first},
              {"top_logprobs", r.at("top_logprobs")},
              {"engine", p->engine_timings}};
  for (const auto& [k, v] : p->engine_timings.items()) ext[k] = v;
  if (r.contains("logits")) ext["logits"] = r["logits"];
  const int k = p->req.logprobs;
  json top_list = json::array();
  for (const auto& t : r.at("top_logprobs")) {
    if (int(top_list.size()) >= std::max(k, 1)) break;
    top_list.push_back(t);
  }
  const json usage = {{"prompt_tokens", n}, {"completion_tokens", 1}, {"total_tokens", n + 1}};
  const int64_t created = int64_t(wall_seconds());
  if (ep == Endpoint::Completions) {
    json logprobs;  // OpenAI's legacy completions format: one entry per generated token
    if (k >= 0) {
      json top = json::object();
      for (int j = 0; j < k && j < int(top_list.size()); ++j) top[token_text(top_list[j][0].get<int32_t>())] = top_list[j][1];
      logprobs = {{"tokens", {token_text(first)}},
                  {"token_logprobs", {r.at("top_logprobs")[0][1]}},
                  {"top_logprobs", json::array({top})},
                  {"text_offset", {0}}};
    }
    json choice = {{"text", token_text(first)}, {"index", 0}, {"logprobs", logprobs}, {"finish_reason", "length"}};
    return answer(200, {{"id", str_cat("cmpl-", p->id)}, {"object", "text_completion"}, {"created", created},
                        {"model", limits_.model_name}, {"choices", json::array({choice})}, {"usage", usage},
                        {"slope", ext}});
  }
  json tops = json::array();
  for (const auto& t : top_list) tops.push_back({{"token", t[0]}, {"text", token_text(t[0].get<int32_t>())}, {"logprob", t[1]}});
  const InstanceProcess& in = *inst_[size_t(p->instance)];
  json kv = {{"id", p->kv_id}, {"lease_s", p->req.kv_lease_s}, {"lease_expires_at", p->kv_expiry_wall_s},
             {"instance", p->instance}, {"mesh", in.name()}, {"num_tokens", n}, {"bytes", p->kv_bytes},
             {"dtype", p->req.kv_dtype}, {"first_token", first}, {"protocol", kvx::kProtocolVersion},
             {"ranks", p->kv_layout}};
  answer(200, {{"id", str_cat("prefill-", p->id)}, {"object", "prefill"}, {"created", created},
               {"model", limits_.model_name}, {"first_token", first}, {"first_token_text", token_text(first)},
               {"top_logprobs", tops}, {"kv", kv}, {"usage", usage}, {"slope", ext}});
}

void Server::dispatch(int i) {
  InstanceProcess& in = *inst_[size_t(i)];
  for (;;) {
    std::optional<Pass> pass;
    std::vector<Release> releases;
    {
      std::unique_lock lk(mu_);
      if (stopping_) return;
      const double now = now_seconds();
      for (auto it = leases_.begin(); it != leases_.end();) {  // expired leases of this instance
        if (it->second.instance == i && it->second.expiry_s <= now) {
          releases_[size_t(i)].push_back({it->first, it->second.owner});
          it = leases_.erase(it);
        } else {
          ++it;
        }
      }
      releases.swap(releases_[size_t(i)]);
      if (in.state() == InstanceState::Ready) pass = sched_->next(i);
      if (!pass && releases.empty()) {
        work_cv_.wait_for(lk, milliseconds(200));
        if (!pass && in.state() == InstanceState::Ready && !in.alive()) {
          lk.unlock();
          restart(i, str_cat("instance ", in.name(), " stopped while idle (", in.exit_reason(), ")"));
        }
        continue;
      }
      if (pass)
        for (const Job& j : pass->jobs) {
          const std::shared_ptr<Pending>& p = pending_.at(j.id);
          p->state = Pending::Running;
          p->start_s = now;
          p->instance = i;
        }
    }
    try {
      for (const Release& r : releases) {
        const json reply = in.call({{"op", "release"}, {"kv_id", r.kv_id}, {"kv_owner", r.owner}});
        if (!reply.value("ok", false))
          std::cerr << "slope serve: releasing KV " << r.kv_id << " on " << in.name() << ": " << reply.value("error", "") << "\n";
      }
      if (pass) run_pass(i, *pass);
    } catch (const InstanceFailure& e) {
      {
        std::lock_guard lk(mu_);
        const json body = error_body(str_cat(e.what(), "; the instance is restarting, retry the request"), "server_error",
                                     "", "instance_failed");
        for (const Job& j : pass ? pass->jobs : std::vector<Job>{}) {
          auto it = pending_.find(j.id);
          if (it != pending_.end() && it->second->state != Pending::Done) finish(it->second, 503, body);
        }
        done_cv_.notify_all();
      }
      restart(i, e.what());
    }
  }
}

// One pass: prompts that want a KV lease run alone (the lease is per request); the others
// share one engine request (a batch).
void Server::run_pass(int i, const Pass& pass) {
  InstanceProcess& in = *inst_[size_t(i)];
  std::vector<std::vector<std::shared_ptr<Pending>>> groups(1);
  {
    std::lock_guard lk(mu_);
    for (const Job& j : pass.jobs) {
      const std::shared_ptr<Pending>& p = pending_.at(j.id);
      if (p->kv_id.empty()) groups[0].push_back(p);
      else groups.push_back({p});
    }
  }
  const double t0 = now_seconds();
  double comm_share = 0, rss_bytes = -1;
  for (const auto& group : groups) {
    if (group.empty()) continue;
    json prompts = json::array();
    int top_k = 1;
    bool logits = false;
    for (const auto& p : group) {
      prompts.push_back(p->req.prompt);
      top_k = std::max(top_k, p->req.logprobs);
      logits = logits || p->req.return_logits;
    }
    json request = {{"op", "prefill"}, {"prompts", prompts}, {"top_k", top_k}, {"logits", logits}};
    if (!group[0]->kv_id.empty()) {
      request["kv_id"] = group[0]->kv_id;
      request["kv_owner"] = group[0]->owner;  // the digest, never the key: the ranks keep the shard for it
    }
    const double g0 = now_seconds();
    const json reply = in.call(request);
    const double g1 = now_seconds();
    if (reply.value("broken", false))
      throw InstanceFailure(str_cat("instance ", in.name(), " failed: ", reply.value("error", "")));
    std::lock_guard lk(mu_);
    if (!reply.value("ok", false)) {
      const json body = error_body(reply.value("error", "the engine refused the request"), "invalid_request_error",
                                   "prompt", "engine_refused");
      for (const auto& p : group) finish(p, 400, body);
      continue;
    }
    json timings = reply.value("timings", json::object());
    timings["pass_ms"] = (g1 - g0) * 1e3;
    timings["batch"] = group.size();
    comm_share = std::max(comm_share, timings.value("communication_share", 0.0));
    rss_bytes = reply.value("rss_bytes", -1.0);
    for (size_t b = 0; b < group.size(); ++b) {
      const std::shared_ptr<Pending>& p = group[b];
      p->result = reply.at("results").at(b);
      p->engine_timings = timings;
      if (!p->kv_id.empty()) {
        p->kv_expiry_wall_s = wall_seconds() + p->req.kv_lease_s;
        p->kv_bytes = int64_t(reply.value("kv_bytes", 0.0));
        // hello() changes only on this thread; a restarted instance's ranks have new endpoints.
        p->kv_layout = in.hello().value("layout", json::array());
        leases_[p->kv_id] = Lease{i, now_seconds() + p->req.kv_lease_s, p->kv_bytes, p->req.kv_dtype, p->kv_layout, p->owner};
      }
      finish(p, 200, json());
      const double ttft = p->end_s - p->arrival_s;
      metrics_.served(ttft, p->start_s - p->arrival_s, ttft * 1e3 <= p->req.ttft_slo_ms, int64_t(p->req.prompt.size()),
                      p->end_s);
    }
    done_cv_.notify_all();
  }
  std::lock_guard lk(mu_);
  const double measured = now_seconds() - t0;
  sched_->complete(i, pass, measured);
  metrics_.pass(i, pass.predicted_s, measured, comm_share, rss_bytes);
  done_cv_.notify_all();
}

void Server::restart(int i, const std::string& why) {
  InstanceProcess& in = *inst_[size_t(i)];
  std::cerr << "slope serve: " << why << "; restarting instance " << in.name() << "\n";
  {
    std::lock_guard lk(mu_);
    sched_->set_available(i, false);
    const json body = error_body(str_cat(why, "; the instance is restarting, retry the request"), "server_error", "",
                                 "instance_failed");
    for (uint64_t id : sched_->take_dropped()) {  // its running pass and its queue
      auto it = pending_.find(id);
      if (it != pending_.end() && it->second->state != Pending::Done) finish(it->second, 503, body);
    }
    done_cv_.notify_all();
    in.set_state(InstanceState::Restarting);
    for (auto it = leases_.begin(); it != leases_.end();)  // its KV shards died with it
      it = it->second.instance == i ? leases_.erase(it) : std::next(it);
    releases_[size_t(i)].clear();
  }
  in.kill();
  in.count_restart();
  for (double backoff = 1;; backoff = std::min(30.0, 2 * backoff)) {
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
    }
    try {
      in.start();
      break;
    } catch (const InstanceFailure& e) {
      std::cerr << "slope serve: " << e.what() << "; trying again in " << backoff << " s\n";
      std::this_thread::sleep_for(milliseconds(int64_t(backoff * 1000)));
    }
  }
  std::lock_guard lk(mu_);
  in.set_state(InstanceState::Ready);
  metrics_.instances()[size_t(i)].rss_bytes = in.hello().value("rss_bytes", 0.0);
  sched_->set_available(i, true);
  std::cerr << "slope serve: instance " << in.name() << " is back (restart " << in.restarts() << ")\n";
  work_cv_.notify_all();
}

int Server::run() {
  // SIGTERM and SIGINT are taken by sigwait below, on this thread only (the threads started
  // from here inherit the mask; the instances' jobs get a clean one, see InstanceProcess).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  for (size_t i = 0; i < inst_.size(); ++i) {
    InstanceProcess& in = *inst_[i];
    std::cerr << "slope serve: starting instance " << in.name() << " (" << in.mesh().size() << " ranks)\n";
    in.start();  // InstanceFailure is a slope::Error: the message says which instance and why
    in.set_state(InstanceState::Ready);
    metrics_.instances()[i].rss_bytes = in.hello().value("rss_bytes", 0.0);
  }
  routes();
  int port = opt_.port;
  if (port == 0) port = http_.bind_to_any_port(opt_.host);
  else if (!http_.bind_to_port(opt_.host, port)) port = -1;
  port_ = port;
  SLOPE_CHECK(port > 0, "cannot listen on ", opt_.host, ":", opt_.port, " (in use, or not an address of this machine); ",
              "choose another --port or --host");
  std::vector<std::thread> threads;
  for (size_t i = 0; i < inst_.size(); ++i) threads.emplace_back([this, i] { dispatch(int(i)); });
  std::thread listener([this] { http_.listen_after_bind(); });
  std::cout << "slope serve: listening on http://" << opt_.host << ":" << port << " (model " << limits_.model_name
            << ", " << inst_.size() << " instance(s), scheduler " << opt_.scheduler << ")" << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "slope serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining " << pending_.size()
            << " request(s) in flight\n";
  {
    std::unique_lock lk(mu_);
    draining_ = true;
    done_cv_.wait_for(lk, std::chrono::duration<double>(opt_.drain_s), [this] { return pending_.empty(); });
    if (!pending_.empty()) std::cerr << "slope serve: " << pending_.size() << " request(s) did not finish in time\n";
    for (auto& [id, p] : pending_) {
      if (p->state == Pending::Done) continue;
      if (p->state == Pending::Queued) sched_->cancel(id);
      finish(p, 503, error_body(str_cat("the server shut down before the request ran (--drain-s ", opt_.drain_s, ")"),
                                "server_error", "", "draining"));
    }
    done_cv_.notify_all();
  }
  http_.stop();
  listener.join();
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    work_cv_.notify_all();
  }
  for (std::thread& t : threads) t.join();
  for (auto& in : inst_) in->stop();
  std::cerr << "slope serve: stopped\n";
  return 0;
}

}  // namespace

int run_server(const ServeOptions& options) {
  Server server(options);
  return server.run();
}

}  // namespace slope::serve
