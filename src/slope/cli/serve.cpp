// `slope serve`: the HTTP prefill server (serve/server.h, docs/serving.md). The flags are
// parsed and checked here; each --instance becomes its own MPI job.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fcntl.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/core/sha256.h"
#include "slope/core/sys.h"
#include "slope/kvx/address_list.h"
#include "slope/model/config.h"
#include "slope/planner/hardware_profile.h"
#include "slope/planner/parse.h"
#include "slope/serve/instance_plan.h"
#include "slope/serve/server.h"

namespace slope::cli {

int cmd_serve(int argc, char** argv) {
  serve::ServeOptions o;
  CLI::App app{"Serve prefills over HTTP (OpenAI-style /v1/completions, /v1/prefill with KV leases, /health,\n"
               "/metrics), with an SLO scheduler over engine instances of different meshes, each its own\n"
               "MPI job. See docs/serving.md.", "slope serve"};
  setup_app(app);
  app.add_option("--model", o.model_dir, "HF model directory (config.json + safetensors; tokenizer.json for text)")->required();
  auto* inst = app.add_option("--instance", o.instances, "an instance's mesh, e.g. \"pp=1,ring=2,ulysses=1\" (keys pp, ring, "
                 "ulysses, tp; absent = 1); repeat for several instances");
  bool plan = false;
  std::string plan_lengths = "1k,8k";
  int plan_nodes = 1, plan_devices = 0;
  auto* plan_flag = app.add_flag("--plan", plan, "let the planner choose the instances (instead of --instance), for "
                                 "--plan-lengths, --slo-ms and the --profile's machine; see docs/serving.md");
  app.add_option("--plan-lengths", plan_lengths, "with --plan: the prompt lengths expected, comma-separated (k = 1024)");
  app.add_option("--plan-nodes", plan_nodes, "with --plan: nodes to plan for");
  app.add_option("--plan-devices-per-node", plan_devices, "with --plan: devices per node (default: the profile's)");
  inst->excludes(plan_flag);
  app.add_option("--served-model-name", o.model_name, "the model id of /v1/models and of requests' \"model\" (default: the directory's name)");
  app.add_option("--host", o.host, "address to listen on");
  app.add_option("--port", o.port, "port to listen on (0: any free port, printed at start)");
  app.add_option("--profile", o.profile, "hardware profile the scheduler predicts TTFT with (a JSON file or profiles/NAME.json)");
  app.add_option("--scheduler", o.scheduler, "slo (admission by predicted TTFT, EDF) or fcfs (first come, first served)");
  app.add_option("--slo-ms", o.slo_ms, "default TTFT target of a request (ttft_slo_ms), milliseconds");
  app.add_option("--api-key", o.api_keys, "require 'Authorization: Bearer KEY' on every endpoint; repeat for several "
                 "clients' keys (a KV lease is then the key's that made it)")->take_all();
  std::string key_file;
  app.add_option("--api-key-file", key_file, "a file of API keys, one a line (blank lines and lines from '#' skipped), "
                 "taken with those of --api-key");
  app.add_option("--kv-lease-s", o.kv_lease_s, "default KV lease of /v1/prefill, seconds");
  app.add_option("--max-kv-lease-s", o.max_kv_lease_s, "the longest kv_lease_s a request may ask for, seconds");
  app.add_option("--max-body-bytes", o.max_body_bytes, "requests with a larger body get 413");
  app.add_option("--max-header-bytes", o.max_header_bytes, "requests whose request line and headers are larger get 431");
  app.add_option("--max-prompt-bytes", o.max_prompt_bytes, "text prompts longer than this (bytes, before the tokenizer) get 400");
  app.add_option("--http-read-timeout-s", o.http_read_timeout_s, "a request's header must arrive within this of the "
                 "connection (or of the last response), then its body within this of a worker taking it: slower "
                 "clients get 408 or are cut");
  app.add_option("--batch-tokens", o.batch_tokens, "prompts up to this many tokens may share a forward pass (0: never)");
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads (requests waiting at once)");
  app.add_option("--drain-s", o.drain_s, "on SIGTERM, wait at most this long for requests in flight");
  app.add_option("--threads-per-rank", o.launch.threads_per_rank, "OpenMP threads per rank (0: the node's cores shared by its ranks)");
  app.add_option("--dtype", o.launch.dtype, "compute type: bf16 or f32");
  app.add_option("--bf16-units", o.launch.bf16_units,
                 "where bf16's products run in the instances: bf16, f32 (twice the weight memory) or auto (slope run --bf16-units)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  app.add_option("--timeout", o.launch.timeout_s, "seconds an instance's rank waits for a peer before the instance fails");
  app.add_option("--max-memory", o.launch.max_memory, "bytes a rank may need (predicted); longer prompts are refused (0: no limit)");
  app.add_option("--start-timeout", o.launch.start_timeout_s, "seconds an instance may take to load the model");
  app.add_option("--launcher", o.launch.launcher, "the command that starts an instance's ranks, before `slope instance ...`; "
                 "{np} is its rank count (e.g. \"srun -n {np}\", \"mpirun --hostfile H -np {np}\")");
  app.add_option("--kv-host", o.launch.kv_host, "address each rank's KV transfer service listens on (0.0.0.0: every "
                 "interface; the handle then names the node)");
  app.add_option("--kv-port-base", o.launch.kv_port_base, "the ranks' KV services listen on consecutive ports from this "
                 "one (instance by instance, rank by rank; 0: any free port)");
  app.add_option("--kv-push-allow", o.launch.kv_push_allow, "the only hosts POST /v1/kv/{id}/push may make the ranks dial: "
                 "CIDR blocks, addresses or host names, comma-separated or repeated (default: any)")
      ->delimiter(',');
  app.add_option("--socket-dir", o.launch.socket_dir, "directory for the instances' unix sockets (default: a new one in $TMPDIR)");
  if (const int code = parse_args(app, argc, argv, "serve"); code >= 0) return code;
  if (!key_file.empty()) {
    std::ifstream in(key_file);
    SLOPE_CHECK(in, "cannot read the --api-key-file ", key_file);
    size_t keys = 0;
    for (std::string line; std::getline(in, line);) {
      const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
      if (b == std::string::npos || line[b] == '#') continue;
      o.api_keys.push_back(line.substr(b, e - b + 1));
      ++keys;
    }
    SLOPE_CHECK(keys > 0, "the --api-key-file ", key_file, " holds no key (one a line)");
  }
  return_large_frees_to_system();
  SLOPE_CHECK(plan || !o.instances.empty(), "give the instances to start (--instance MESH, repeated) or --plan");
  if (plan) {
    std::string profile_path = o.profile;
    if (!std::filesystem::exists(profile_path) && !find_data_path(profile_path).empty())
      profile_path = find_data_path(profile_path);
    const planner::HardwareProfile hw = planner::load_profile(profile_path);
    const planner::Cluster cluster{plan_nodes, plan_devices > 0 ? plan_devices : hw.node.devices_per_node};
    SLOPE_CHECK(cluster.nodes >= 1 && cluster.devices_per_node >= 1, "--plan needs at least one node and one device per node");
    const serve::InstancePlan p = serve::plan_instances(model::load_config(o.model_dir), hw, cluster,
                                                        planner::parse_contexts(plan_lengths), o.slo_ms / 1e3);
    for (const std::string& note : p.notes) std::cout << "plan: " << note << "\n";
    o.instances = p.instances;
  }
  o.launch.model_dir = o.model_dir;
  o.launch.dtype = compute_dtype_name(parse_compute_dtype(o.launch.dtype));
  SLOPE_CHECK(o.launch.timeout_s > 0, "--timeout must be a positive number of seconds, got ", o.launch.timeout_s);
  SLOPE_CHECK(o.launch.threads_per_rank >= 0, "--threads-per-rank must be 0 or positive");
  SLOPE_CHECK(o.port >= 0 && o.port <= 65535, "--port must be in [0, 65535], got ", o.port);
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  SLOPE_CHECK(n > 0, "cannot find this executable (/proc/self/exe) to start the instances");
  o.launch.slope_binary = std::string(self, size_t(n));
  bool own_dir = false;
  if (o.launch.socket_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/slope-serve-XXXXXX";
    SLOPE_CHECK(::mkdtemp(templ.data()) != nullptr, "cannot create a socket directory in ", templ);
    o.launch.socket_dir = templ;
    own_dir = true;
  }
  (void)kvx::AddressList(o.launch.kv_push_allow);  // a bad entry fails here, not in every rank
  SLOPE_CHECK(o.launch.kv_port_base >= 0 && o.launch.kv_port_base <= 65535, "--kv-port-base must be in [0, 65535]");
  int code = kExitError;
  try {
    if (!o.api_keys.empty()) {  // the ranks' KV services check the keys' digests; a file, not argv (ps shows argv)
      o.launch.kv_key_file = o.launch.socket_dir + "/kv.key";
      const int fd = ::open(o.launch.kv_key_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      SLOPE_CHECK(fd >= 0, "cannot write the KV key file ", o.launch.kv_key_file);
      std::string lines;
      for (const std::string& k : o.api_keys) lines += sha256_hex(k) + "\n";
      const bool ok = ::write(fd, lines.data(), lines.size()) == ssize_t(lines.size());
      ::close(fd);
      SLOPE_CHECK(ok, "cannot write the KV key file ", o.launch.kv_key_file);
    }
    code = serve::run_server(o);
  } catch (...) {
    if (!o.launch.kv_key_file.empty()) ::unlink(o.launch.kv_key_file.c_str());
    if (own_dir) std::filesystem::remove_all(o.launch.socket_dir);
    throw;
  }
  if (!o.launch.kv_key_file.empty()) ::unlink(o.launch.kv_key_file.c_str());
  if (own_dir) std::filesystem::remove_all(o.launch.socket_dir);
  return code;
}

}  // namespace slope::cli
