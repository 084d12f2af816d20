// The front's side of one engine instance: its MPI job (started with a launcher template,
// by default `mpirun --oversubscribe -np {np}`), the unix socket its rank 0 connects to, and one
// request at a time over serve/wire.h. Used by one thread (the instance's dispatch thread);
// state() may be read from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/topology.h"

namespace slope::serve {

struct LaunchOptions {
  std::string slope_binary;  // this executable
  // The command before `slope instance ...`; {np} is replaced by the instance's rank count.
  std::string launcher = "mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none -np {np}";
  std::string model_dir, dtype = "bf16", socket_dir;
  std::string bf16_units = "auto";  // the instances' --bf16-units (kernels/bf16_units.h)
  int threads_per_rank = 0;
  double timeout_s = 300;      // a rank waits this long for a peer (the instance's --timeout)
  double start_timeout_s = 600;  // loading the model
  int64_t max_memory = 0;
  // Each rank's KV transfer service (docs/kv-format.md): where it listens, rank r on
  // kv_port_base + r when kv_port_base > 0 (else any free port), and the file holding the API
  // keys' digests clients must send one of (empty: none), and the hosts a push may dial.
  std::string kv_host = "127.0.0.1", kv_key_file;
  int kv_port_base = 0;
  std::vector<std::string> kv_push_allow;  // empty: any (see kvx/address_list.h)
};

// The instance failed (its job died, its socket closed, or it said the mesh is broken).
struct InstanceFailure : Error {
  using Error::Error;
};

enum class InstanceState { Starting, Ready, Restarting, Stopped };
const char* state_name(InstanceState s);

class InstanceProcess {
 public:
  InstanceProcess(int index, engine::ParallelShape mesh, LaunchOptions options);
  ~InstanceProcess();
  InstanceProcess(const InstanceProcess&) = delete;
  InstanceProcess& operator=(const InstanceProcess&) = delete;

  // Starts the job and waits for rank 0's hello. Throws InstanceFailure with the reason.
  void start();
  // Sends one request and waits for its reply (no time limit: the ranks' --timeout bounds a
  // stuck mesh). Throws InstanceFailure when the job dies or the connection ends first.
  nlohmann::json call(const nlohmann::json& request);
  // True while the job runs (reaps it when it has exited).
  bool alive();
  // Asks rank 0 to shut the mesh down, waits up to `grace_s`, then kills the job.
  void stop(double grace_s = 10);
  void kill();  // SIGKILL to the whole job

  int index() const { return index_; }
  const engine::ParallelShape& mesh() const { return mesh_; }
  std::string name() const;
  InstanceState state() const { return state_.load(); }
  void set_state(InstanceState s) { state_.store(s); }
  const nlohmann::json& hello() const { return hello_; }  // ranks, pids, KV layout
  std::vector<int> rank_pids() const;
  int restarts() const { return restarts_; }
  void count_restart() { ++restarts_; }
  std::string exit_reason() const { return exit_reason_; }

 private:
  void close_socket();
  std::vector<std::string> command() const;

  int index_;
  engine::ParallelShape mesh_;
  LaunchOptions opt_;
  std::string socket_path_;
  pid_t pid_ = -1;
  int listen_fd_ = -1, fd_ = -1;
  nlohmann::json hello_;
  std::atomic<InstanceState> state_{InstanceState::Starting};
  int restarts_ = 0;
  std::string exit_reason_;
};

}  // namespace slope::serve
