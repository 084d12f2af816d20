// The server's metrics, rendered in Prometheus text format (GET /metrics). Not thread-safe:
// the server holds its lock around every call. docs/serving.md lists each metric.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slope::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  // `# TYPE name histogram` and its _bucket{le=...}, _sum and _count lines.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct InstanceMetrics {
  std::string name;       // the instance's mesh ("pp=1,ring=2,ulysses=1,tp=1")
  bool up = false;
  int queue_depth = 0;
  int restarts = 0;
  double busy_s = 0;      // seconds running passes since the server started
  double prediction_error = 0;     // mean |predicted - measured| / measured over passes
  double communication_share = 0;  // mean over passes: ranks' time communicating / prefilling
  uint64_t passes = 0;
  double rss_bytes = 0;   // its ranks' resident memory summed, after its last pass
};

class Metrics {
 public:
  explicit Metrics(double start_s);
  void request(const std::string& endpoint, int status);      // every HTTP answer of the API
  void rejected(const std::string& reason);                    // the scheduler's (429) and draining
  void served(double ttft_s, double queue_s, bool slo_met, int64_t tokens, double now_s);
  // rss_bytes: the ranks' resident memory after the pass, < 0 if not known (a failed pass).
  void pass(int instance, double predicted_s, double measured_s, double comm_share, double rss_bytes);
  std::vector<InstanceMetrics>& instances() { return instances_; }
  void leases(size_t count, int64_t bytes) { kv_leases_ = count, kv_leased_bytes_ = bytes; }  // KV held now
  std::string render(double now_s) const;

 private:
  double start_s_;
  Histogram ttft_, queue_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> rejected_;
  uint64_t slo_met_ = 0, slo_missed_ = 0, tokens_ = 0;
  std::deque<std::pair<double, int64_t>> recent_;  // (time, tokens) of the last minute's requests
  std::vector<InstanceMetrics> instances_;
  size_t kv_leases_ = 0;
  int64_t kv_leased_bytes_ = 0;
};

}  // namespace slope::serve
