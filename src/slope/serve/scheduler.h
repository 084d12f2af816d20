// The SLO scheduler of `slope serve`: admission by predicted TTFT, routing to the instance that
// meets the deadline with the most slack, earliest-deadline-first order per instance, batching
// of short prompts, and predictions corrected online from measured times. `fcfs` is the
// baseline a stock engine gives: one queue per instance in arrival order, no admission control.
//
// Pure logic: no threads, no I/O. Time comes from a Clock (a fake one in the tests); the server
// wraps the scheduler in a mutex and calls it from its HTTP and dispatch threads.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
  // The same without the correction: the cost model alone.
  double model_seconds(int i, const std::vector<int64_t>& lengths) const;
  // A measured pass: updates instance i's correction factor and its admission bound.
  void observe(int i, const std::vector<int64_t>& lengths, double measured_s);
  double correction(int i) const;
  // The factor admission multiplies the cost model by: a high quantile of measured / model over
  // instance i's last kBoundWindow passes (the kBoundQuantile one by nearest rank: with 0.99
  // and 32 passes, the largest), never below correction(i). Before any pass, correction(i).
  double bound(int i) const;
  // Passes measured on instance i since the start (a restart keeps them: same machine).
  int64_t observed(int i) const;
  const std::vector<InstanceSpec>& instances() const { return instances_; }

  // The correction is an EWMA of log(measured / model) with weight kCorrectionWeight per pass,
  // each ratio clamped to [kMinCorrection, kMaxCorrection]: a profile 2x off is within 10%
  // after 6 passes (0.7^6 · ln 2 < ln 1.1), and one outlier moves it by at most 0.3 in log.
  static constexpr double kCorrectionWeight = 0.3;
  static constexpr double kMinCorrection = 0.05, kMaxCorrection = 20;
  // The correction is the best single guess of the next pass; admission must hold for nearly
  // every pass, so it takes a high quantile of the recent ratios instead. 32 passes are a few
  // seconds to a minute of load: long enough to hold a bad spell of a busy machine, short
  // enough to follow a machine that has become faster for good.
  static constexpr int kBoundWindow = 32;
  static constexpr double kBoundQuantile = 0.99;
  // The largest of n ratios is exceeded by the next one with chance 1/(n+1): until an instance
  // has measured this many passes its bound says little, and it takes a job only when idle.
  static constexpr int kCalibrationPasses = 4;

 private:
  const InstanceSpec& spec(int i) const;
  model::ModelConfig model_;
  planner::HardwareProfile profile_;
  std::vector<InstanceSpec> instances_;
  planner::CostOptions options_;
  std::vector<double> log_correction_;  // per instance; 0 = the cost model as is
  std::vector<std::deque<double>> ratios_;  // per instance: the last kBoundWindow measured / model
  std::vector<int64_t> observed_;
};

struct Job {
  uint64_t id = 0;
  int64_t tokens = 0;
  double arrival_s = 0;
  double slo_s = 0;          // TTFT target, from arrival
  bool best_effort = false;  // admitted even when the deadline cannot be met
  int priority = 0;          // higher first among equal deadlines
};

// Why a job was not admitted. The front answers TooLong with a 4xx (no retry helps), Deadline
// with 429 and Retry-After, Unreachable (the SLO is below the job's TTFT on every idle instance
// that can run it) with 429 and no Retry-After, Unavailable (every instance that could run it
// is down) with 503.
enum class Rejection { None, TooLong, Deadline, Unreachable, Unavailable };

struct Admission {
  bool admitted = false;
  Rejection rejection = Rejection::None;
  int instance = -1;
  double predicted_ttft_s = 0;  // queue ahead + own pass, from now
  // Why rejected, starting with a fixed key ("too long: ", "deadline: ", "unreachable: ",
  // "unavailable: ") and going on with the numbers, e.g. "too long: no instance can run 9000
  // tokens (the longest prompt an instance takes is 8192)".
  std::string reason;
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
  // Going down drops its running pass and queued jobs as mark_down does; their ids wait for
  // take_dropped().
  void set_available(int i, bool up);
  // Instance i is down: no new work goes to it, and the ids of the jobs it loses (the running
  // pass's first, then the queued ones in the order they would have run) are returned so that
  // the front can fail them (5xx). set_available(i, true) brings it back.
  std::vector<uint64_t> mark_down(int i);
  // The ids dropped by set_available(i, false) since the last call.
  std::vector<uint64_t> take_dropped();

  int queue_depth(int i) const;
  double predicted_backlog_s(int i) const;  // predicted seconds of work queued + running
  const Predictor& predictor() const;
  int instances() const { return int(state_.size()); }
  bool available(int i) const;

 private:
  struct Queued {
    Job job;
    double deadline_s = 0;  // the order key: arrival + SLO, or a best-effort job's relaxed one
    bool guaranteed = true; // admitted on a met deadline (best-effort overflow: false)
    double model_s = 0;     // its own pass, uncorrected
    uint64_t seq = 0;       // submission order
  };
  struct Running {
    Pass pass;
    double start_s = 0;
    double model_s = 0;
  };
  struct InstanceState {
    bool up = true;
    std::vector<Queued> queue;  // in the order it runs (policy_'s)
    std::optional<Running> running;
  };

  bool before(const Queued& a, const Queued& b) const;  // runs earlier under policy_
  void check_instance(int i) const;
  double running_left_s(int i, double now) const;
  double running_bound_s(int i, double now) const;  // the same under Predictor::bound
  double queued_s(int i) const;  // corrected seconds of the whole queue
  Admission submit_slo(const Job& job, const std::vector<int>& candidates, double now);
  Admission submit_fcfs(const Job& job, const std::vector<int>& candidates, double now);
  void enqueue(int i, Queued q);

  Predictor predictor_;
  Policy policy_;
  Clock clock_;
  std::vector<InstanceState> state_;
  std::map<uint64_t, int> where_;  // queued or running job id -> instance
  std::vector<uint64_t> dropped_;
  uint64_t next_seq_ = 0;
};

}  // namespace slope::serve
