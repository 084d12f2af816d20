#include "slope/serve/instance_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/serve/mesh_spec.h"
#include "slope/serve/wire.h"

namespace slope::serve {

const char* state_name(InstanceState s) {
  switch (s) {
    case InstanceState::Starting: return "starting";
    case InstanceState::Ready: return "ready";
    case InstanceState::Restarting: return "restarting";
    case InstanceState::Stopped: return "stopped";
  }
  return "unknown";
}

InstanceProcess::InstanceProcess(int index, engine::ParallelShape mesh, LaunchOptions options)
    : index_(index), mesh_(mesh), opt_(std::move(options)) {
  socket_path_ = str_cat(opt_.socket_dir, "/instance", index_, ".sock");
}

InstanceProcess::~InstanceProcess() {
  kill();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::unlink(socket_path_.c_str());
}

std::string InstanceProcess::name() const { return mesh_spec(mesh_); }

std::vector<std::string> InstanceProcess::command() const {
  std::vector<std::string> argv;
  std::istringstream words(opt_.launcher);
  for (std::string w; words >> w;) {
    for (size_t at; (at = w.find("{np}")) != std::string::npos;) w.replace(at, 4, std::to_string(mesh_.size()));
    argv.push_back(w);
  }
  // As root, Open MPI's mpirun refuses to start without this (the tests run as root in CI).
  if (::geteuid() == 0 && !argv.empty() && argv[0].find("mpirun") != std::string::npos)
    argv.insert(argv.begin() + 1, "--allow-run-as-root");
  for (const std::string& a :
       {opt_.slope_binary, std::string("instance"), std::string("--model"), opt_.model_dir, std::string("--mesh"),
        name(), std::string("--socket"), socket_path_, std::string("--dtype"), opt_.dtype, std::string("--bf16-units"),
        opt_.bf16_units, std::string("--threads"),
        std::to_string(opt_.threads_per_rank), std::string("--timeout"), str_cat(opt_.timeout_s),
        std::string("--max-memory"), std::to_string(opt_.max_memory), std::string("--kv-host"), opt_.kv_host,
        std::string("--kv-port-base"), std::to_string(opt_.kv_port_base)})
    argv.push_back(a);
  if (!opt_.kv_key_file.empty()) {
    argv.push_back("--kv-key-file");
    argv.push_back(opt_.kv_key_file);
  }
  if (!opt_.kv_push_allow.empty()) {
    std::string list;
    for (const std::string& e : opt_.kv_push_allow) list += (list.empty() ? "" : ",") + e;
    argv.push_back("--kv-push-allow");
    argv.push_back(list);
  }
  return argv;
}

void InstanceProcess::start() {
  close_socket();
  hello_ = nlohmann::json();
  if (listen_fd_ < 0) listen_fd_ = listen_unix(socket_path_);
  const std::vector<std::string> argv = command();
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t pid = ::fork();
  SLOPE_CHECK(pid >= 0, "cannot fork to start instance ", name(), ": ", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);   // the job is one process group: kill() reaches every rank
    sigset_t none;     // the front blocks SIGTERM for its sigwait; the job must not inherit that
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(2, 1);      // the instance's output goes to the front's stderr
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "slope serve: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  pid_ = pid;
  exit_reason_.clear();
  const double deadline = now_seconds() + opt_.start_timeout_s;
  while (fd_ < 0) {
    if (!alive())
      throw InstanceFailure(str_cat("instance ", name(), " exited while starting (", exit_reason_,
                                    "); its messages are above"));
    if (now_seconds() > deadline) {
      kill();
      throw InstanceFailure(str_cat("instance ", name(), " did not start within ", opt_.start_timeout_s, " s"));
    }
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 200) > 0) fd_ = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  }
  try {
    std::optional<nlohmann::json> hello = read_frame(fd_, opt_.start_timeout_s, [this] { return alive(); });
    SLOPE_CHECK(hello && hello->value("op", "") == "hello", "no hello from the instance");
    // The server sized the instance's memory for these units (its weights are twice as large on
    // the f32 units), so an instance on others is refused rather than served.
    const std::string units = hello->value("bf16_units", "");
    SLOPE_CHECK(opt_.bf16_units == "auto" || units == opt_.bf16_units, "it runs bf16 on the ", units,
                " units, not the ", opt_.bf16_units, " units it was asked for");
    hello_ = *hello;
  } catch (const Error& e) {
    kill();
    throw InstanceFailure(str_cat("instance ", name(), " failed while starting: ", e.what()));
  }
}

nlohmann::json InstanceProcess::call(const nlohmann::json& request) {
  if (fd_ < 0 || !alive()) throw InstanceFailure(str_cat("instance ", name(), " is not running (", exit_reason_, ")"));
  try {
    write_frame(fd_, request);
    std::optional<nlohmann::json> reply = read_frame(fd_, -1, [this] { return alive(); });
    SLOPE_CHECK(reply.has_value(), "its connection closed");
    return *reply;
  } catch (const Error& e) {
    const std::string why = exit_reason_.empty() ? e.what() : str_cat(e.what(), "; ", exit_reason_);
    kill();
    throw InstanceFailure(str_cat("instance ", name(), " failed during the request: ", why));
  }
}

bool InstanceProcess::alive() {
  if (pid_ < 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) {
    exit_reason_ = WIFEXITED(status)     ? str_cat("its job exited with code ", WEXITSTATUS(status))
                   : WIFSIGNALED(status) ? str_cat("its job was killed by signal ", WTERMSIG(status))
                                         : "its job ended";
  }
  ::kill(-pid_, SIGKILL);  // whatever of the job is left (ranks of a failed mesh)
  pid_ = -1;
  close_socket();
  return false;
}

void InstanceProcess::stop(double grace_s) {
  if (fd_ >= 0 && alive()) {
    try {
      write_frame(fd_, {{"op", "shutdown"}});
      read_frame(fd_, grace_s, [this] { return alive(); });
    } catch (const Error&) {
    }
  }
  close_socket();
  for (const double end = now_seconds() + grace_s; alive() && now_seconds() < end;)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill();
  state_ = InstanceState::Stopped;
}

void InstanceProcess::kill() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    for (int pid : rank_pids()) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    if (exit_reason_.empty()) exit_reason_ = "killed by the front";
    pid_ = -1;
  }
  close_socket();
}

std::vector<int> InstanceProcess::rank_pids() const {
  return hello_.is_object() && hello_.contains("pids") ? hello_["pids"].get<std::vector<int>>() : std::vector<int>{};
}

void InstanceProcess::close_socket() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace slope::serve
