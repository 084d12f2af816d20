// The SLO scheduler of `slope serve`: admission by predicted TTFT, routing to the instance that
// meets the deadline with the most slack, earliest-deadline-first order per instance, batching
// of short prompts, and predictions corrected online from measured times. `fcfs` is the
// baseline a stock engine gives: one queue per instance in arrival order, no admission control.
//
// Pure logic: no threads, no I/O. Time comes from a Clock (a fake one in the tests); the server
// wraps the scheduler in a mutex and calls it from its HTTP and dispatch threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slope/model/config.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/hardware_profile.h"

namespace slope::serve {

using Clock = std::function<double()>;  // seconds, monotonic

enum class Policy { Slo, Fcfs };
Policy parse_policy(const std::string& name);  // "slo" | "fcfs"; throws slope::Error otherwise

// One engine instance as the scheduler sees it.
struct InstanceSpec {
  std::string name;          // "pp=1,ring=2,ulysses=1"
  planner::Mesh mesh;
  int64_t max_tokens = 0;    // the longest prompt it can run (memory, max_position)
  int64_t batch_tokens = 0;  // prompts up to this length may share a forward pass (0: none)
  int max_batch = 8;         // at most this many prompts in one pass
};

// Predicted seconds of one pass on an instance: the cost model for its mesh, times a
// correction factor learned per instance from measured passes (so that a profile 2x off
// converges). Every prediction the scheduler makes goes through it.
class Predictor {
 public:
  Predictor(model::ModelConfig model, planner::HardwareProfile profile, std::vector<InstanceSpec> instances,
            planner::CostOptions options = {});
  // Seconds to prefill prompts of these lengths in one pass on instance `i`.
  double pass_seconds(int i, const std::vector<int64_t>& lengths) const;
  // A measured pass: updates instance i's correction factor.
  void observe(int i, const std::vector<int64_t>& lengths, double measured_s);
  double correction(int i) const;
};

struct Job {
  uint64_t id = 0;
  int64_t tokens = 0;
  double arrival_s = 0;
  double slo_s = 0;          // TTFT target, from arrival
  bool best_effort = false;  // admitted even when the deadline cannot be met
  int priority = 0;          // higher first among equal deadlines
};

struct Admission {
  bool admitted = false;
  int instance = -1;
  double predicted_ttft_s = 0;  // queue ahead + own pass, from now
  std::string reason;           // why rejected: "no instance can run N tokens", "deadline"
  double retry_after_s = 0;     // when rejected for load: when the best instance frees up
};

// What an idle instance runs next: one prompt, or a batch of short ones.
struct Pass {
  int instance = -1;
  std::vector<Job> jobs;
  double predicted_s = 0;
};

class Scheduler {
 public:
  Scheduler(Predictor predictor, Policy policy, Clock clock);
  // Admission and routing. An admitted job is queued on Admission::instance.
  Admission submit(const Job& job);
  // Called when instance i is idle: the next pass (EDF order; no starvation), or nothing.
  std::optional<Pass> next(int i);
  // The pass started by next(i) finished after measured_s seconds.
  void complete(int i, const Pass& pass, double measured_s);
  // A queued job whose client went away: its slot is freed. False if not queued (running/done).
  bool cancel(uint64_t id);
  // Instance i failed (its passes are lost); `down` keeps new work off it until it is back.
  void set_available(int i, bool up);

  int queue_depth(int i) const;
  double predicted_backlog_s(int i) const;  // predicted seconds of work queued + running
  const Predictor& predictor() const;
};

}  // namespace slope::serve
