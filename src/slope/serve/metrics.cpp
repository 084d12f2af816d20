#include "slope/serve/metrics.h"

#include <cmath>
#include <sstream>

#include "slope/core/sys.h"

namespace slope::serve {
namespace {

constexpr double kRateWindowS = 60;  // tokens/s is measured over the last minute

std::string num(double x) {
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(10);
  os << x;
  return os.str();
}

std::string head(const std::string& name, const std::string& type, const std::string& help) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string label(const std::string& v) {  // a label value, escaped as the text format wants
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return "\"" + out + "\"";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
  size_t b = 0;
  while (b < bounds_.size() && x > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += x;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string s = head(name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    cumulative += counts_[b];
    s += name + "_bucket{le=\"" + (b < bounds_.size() ? num(bounds_[b]) : "+Inf") + "\"} " + std::to_string(cumulative) + "\n";
  }
  s += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return s;
}

Metrics::Metrics(double start_s)
    : start_s_(start_s),
      ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120}),
      queue_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}) {}

void Metrics::request(const std::string& endpoint, int status) { ++requests_[{endpoint, status}]; }
void Metrics::rejected(const std::string& reason) { ++rejected_[reason]; }

void Metrics::served(double ttft_s, double queue_s, bool slo_met, int64_t tokens, double now_s) {
  ttft_.observe(ttft_s);
  queue_.observe(queue_s);
  ++(slo_met ? slo_met_ : slo_missed_);
  tokens_ += uint64_t(tokens);
  recent_.emplace_back(now_s, tokens);
  while (!recent_.empty() && recent_.front().first < now_s - kRateWindowS) recent_.pop_front();
}

void Metrics::pass(int i, double predicted_s, double measured_s, double comm_share, double rss_bytes) {
  InstanceMetrics& m = instances_.at(size_t(i));
  const double err = measured_s > 0 ? std::abs(predicted_s - measured_s) / measured_s : 0;
  ++m.passes;
  m.busy_s += measured_s;
  m.prediction_error += (err - m.prediction_error) / double(m.passes);
  m.communication_share += (comm_share - m.communication_share) / double(m.passes);
  if (rss_bytes >= 0) m.rss_bytes = rss_bytes;
}

std::string Metrics::render(double now_s) const {
  std::string s;
  s += ttft_.render("slope_ttft_seconds", "time to first token of served requests, from arrival");
  s += queue_.render("slope_queue_seconds", "time served requests waited before their pass started");
  s += head("slope_requests_total", "counter", "API answers by endpoint and HTTP status");
  for (const auto& [key, n] : requests_)
    s += "slope_requests_total{endpoint=" + label(key.first) + ",code=\"" + std::to_string(key.second) + "\"} " +
         std::to_string(n) + "\n";
  s += head("slope_slo_met_total", "counter", "served requests whose TTFT met their ttft_slo_ms");
  s += "slope_slo_met_total " + std::to_string(slo_met_) + "\n";
  s += head("slope_slo_missed_total", "counter", "served requests whose TTFT exceeded their ttft_slo_ms");
  s += "slope_slo_missed_total " + std::to_string(slo_missed_) + "\n";
  s += head("slope_rejected_total", "counter", "requests refused before running, by reason (429s and draining)");
  for (const auto& [reason, n] : rejected_) s += "slope_rejected_total{reason=" + label(reason) + "} " + std::to_string(n) + "\n";
  s += head("slope_prompt_tokens_total", "counter", "prompt tokens prefilled for served requests");
  s += "slope_prompt_tokens_total " + std::to_string(tokens_) + "\n";
  int64_t recent = 0;
  for (const auto& [t, n] : recent_)
    if (t >= now_s - kRateWindowS) recent += n;
  const double window = std::min(kRateWindowS, std::max(1e-9, now_s - start_s_));
  s += head("slope_tokens_per_second", "gauge", "prompt tokens prefilled per second over the last minute");
  s += "slope_tokens_per_second " + num(double(recent) / window) + "\n";
  s += head("slope_kv_leases", "gauge", "KV caches kept on the instances' ranks under a lease");
  s += "slope_kv_leases " + std::to_string(kv_leases_) + "\n";
  s += head("slope_kv_leased_bytes", "gauge", "Bytes of the KV caches kept under a lease");
  s += "slope_kv_leased_bytes " + std::to_string(kv_leased_bytes_) + "\n";
  s += head("slope_front_resident_memory_bytes", "gauge", "resident memory of the server's front process");
  s += "slope_front_resident_memory_bytes " + num(double(current_rss_bytes())) + "\n";
  const double uptime = std::max(1e-9, now_s - start_s_);
  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const InstanceMetrics&, double);
  };
  const Gauge gauges[] = {
      {"slope_instance_up", "1 when the instance is ready, 0 while it starts or restarts",
       [](const InstanceMetrics& m, double) { return m.up ? 1.0 : 0.0; }},
      {"slope_instance_busy_fraction", "share of the server's uptime the instance spent running passes",
       [](const InstanceMetrics& m, double up) { return m.busy_s / up; }},
      {"slope_instance_queue_depth", "requests queued on the instance",
       [](const InstanceMetrics& m, double) { return double(m.queue_depth); }},
      {"slope_instance_prediction_error", "mean |predicted - measured| / measured pass time",
       [](const InstanceMetrics& m, double) { return m.prediction_error; }},
      {"slope_instance_communication_share", "mean share of the ranks' prefill time spent communicating",
       [](const InstanceMetrics& m, double) { return m.communication_share; }},
      {"slope_instance_restarts", "times the instance was restarted after a failure",
       [](const InstanceMetrics& m, double) { return double(m.restarts); }},
      {"slope_instance_resident_memory_bytes", "the instance's ranks' resident memory summed, after its last pass",
       [](const InstanceMetrics& m, double) { return m.rss_bytes; }},
  };
  for (const Gauge& g : gauges) {
    s += head(g.name, "gauge", g.help);
    for (size_t i = 0; i < instances_.size(); ++i)
      s += std::string(g.name) + "{instance=\"" + std::to_string(i) + "\",mesh=" + label(instances_[i].name) + "} " +
           num(g.value(instances_[i], uptime)) + "\n";
  }
  return s;
}

}  // namespace slope::serve
