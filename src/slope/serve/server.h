// `slope serve`: the front process. It starts one MPI job per instance (serve/instance_process.h),
// routes requests with the SLO scheduler (serve/scheduler.h), serves the HTTP API
// (docs/serving.md), supervises and restarts failed instances, expires KV leases, and on
// SIGTERM or SIGINT drains the work in flight, then shuts the instances down.
#pragma once

#include <string>
#include <vector>

#include "slope/serve/instance_process.h"

namespace slope::serve {

struct ServeOptions {
  std::string model_dir;
  std::string model_name;              // the id /v1/models lists; default: the model directory's name
  std::vector<std::string> instances;  // meshes, "pp=1,ring=2,ulysses=1,tp=1"
  std::string host = "127.0.0.1";
  int port = 8000;                     // 0: any free port (printed)
  std::string profile = "profiles/cpu-zen4-2c.json";
  std::string scheduler = "slo";
  double slo_ms = 5000;                // default ttft_slo_ms
  std::vector<std::string> api_keys;   // clients' keys (--api-key, --api-key-file); none: no key needed
  double kv_lease_s = 60;              // default lease of /v1/prefill
  double max_kv_lease_s = 3600;
  size_t max_body_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;  // the request line and headers
  size_t max_prompt_bytes = 8u << 20;   // a text prompt, before the tokenizer
  double http_read_timeout_s = 30;      // a request's header, then its body, must arrive within this
  int64_t batch_tokens = 1024;         // prompts up to this length may share a pass
  int http_threads = 64;
  double drain_s = 300;                // SIGTERM: at most this long for work in flight
  LaunchOptions launch;
};

// Runs until SIGTERM/SIGINT. Returns the exit code; throws slope::Error for a bad option or an
// instance that cannot start.
int run_server(const ServeOptions& options);

}  // namespace slope::serve
