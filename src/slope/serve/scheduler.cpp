// The SLO scheduler. The rules, and why each was chosen, are in docs/serving-scheduler.md; the
// comments here say how the code implements them.
#include "slope/serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "slope/core/error.h"

namespace slope::serve {

Policy parse_policy(const std::string& name) {
  if (name == "slo") return Policy::Slo;
  if (name == "fcfs") return Policy::Fcfs;
  fail("unknown scheduler '", name, "': use --scheduler slo (admission by predicted TTFT) or fcfs (first come, first served)");
}

// ---- Predictor --------------------------------------------------------------------------------

Predictor::Predictor(model::ModelConfig model, planner::HardwareProfile profile, std::vector<InstanceSpec> instances,
                     planner::CostOptions options)
    : model_(std::move(model)), profile_(std::move(profile)), instances_(std::move(instances)),
      options_(std::move(options)), log_correction_(instances_.size(), 0.0), ratios_(instances_.size()),
      observed_(instances_.size(), 0) {
  SLOPE_CHECK(!instances_.empty(), "the scheduler needs at least one instance; pass --instance MESH");
  std::set<std::string> names;
  for (const InstanceSpec& s : instances_) {
    SLOPE_CHECK(names.insert(s.name).second, "instance name '", s.name, "' is given twice; each instance needs its own name");
    const std::string problem = planner::mesh_problem(model_, profile_, s.mesh);
    SLOPE_CHECK(problem.empty(), "instance '", s.name, "': mesh ", planner::mesh_name(s.mesh), " cannot run ",
                model_.architecture, ": ", problem);
    SLOPE_CHECK(s.max_tokens >= 1 && s.max_tokens <= planner::kMaxContextTokens, "instance '", s.name,
                "': max_tokens must be between 1 and ", planner::kMaxContextTokens, ", got ", s.max_tokens);
    SLOPE_CHECK(s.batch_tokens >= 0 && s.batch_tokens <= s.max_tokens, "instance '", s.name,
                "': batch_tokens must be between 0 (no batching) and max_tokens (", s.max_tokens, "), got ",
                s.batch_tokens);
    SLOPE_CHECK(s.max_batch >= 1, "instance '", s.name, "': max_batch must be at least 1, got ", s.max_batch);
  }
}

const InstanceSpec& Predictor::spec(int i) const {
  SLOPE_CHECK(i >= 0 && i < int(instances_.size()), "instance ", i, " does not exist; there are ", instances_.size());
  return instances_[size_t(i)];
}

// One prompt: the cost model's TTFT on an idle instance. A batch: the engine runs the prompts
// one after another through the same layers (micro-batches, each with its own causal mask), so
// the token-local work (projections, MLP / experts, element-wise, communication volume, the
// pipeline fill) is the cost model at the summed length, while attention and the lm_head row
// are per prompt: T = P(ΣL) − attn(ΣL) − head(ΣL) + Σ_b (attn(L_b) + head(L_b)). Predicting
// attention at ΣL instead would count pairs across prompts that the engine never computes.
double Predictor::model_seconds(int i, const std::vector<int64_t>& lengths) const {
  const InstanceSpec& s = spec(i);
  SLOPE_CHECK(!lengths.empty(), "a pass has at least one prompt");
  int64_t sum = 0;
  for (int64_t n : lengths) {
    SLOPE_CHECK(n >= 1 && n <= s.max_tokens, "instance '", s.name, "' runs prompts of 1 to ", s.max_tokens,
                " tokens, got ", n);
    sum += n;
  }
  const planner::Prediction whole = planner::predict(model_, profile_, s.mesh, sum, options_);
  if (lengths.size() == 1) return whole.ttft_s;
  double t = whole.ttft_s - whole.phases.attention - whole.phases.lm_head;
  for (int64_t n : lengths) {
    const planner::Prediction one = planner::predict(model_, profile_, s.mesh, n, options_);
    t += one.phases.attention + one.phases.lm_head;
  }
  return t;
}

double Predictor::pass_seconds(int i, const std::vector<int64_t>& lengths) const {
  return model_seconds(i, lengths) * correction(i);
}

double Predictor::correction(int i) const {
  spec(i);
  return std::exp(log_correction_[size_t(i)]);
}

void Predictor::observe(int i, const std::vector<int64_t>& lengths, double measured_s) {
  SLOPE_CHECK(std::isfinite(measured_s) && measured_s >= 0, "a measured pass takes a finite, non-negative time, got ",
              measured_s, " s");
  const double model_s = model_seconds(i, lengths);
  if (!(model_s > 0)) return;  // nothing to scale
  const double ratio = std::clamp(measured_s / model_s, kMinCorrection, kMaxCorrection);
  double& c = log_correction_[size_t(i)];
  c = (1 - kCorrectionWeight) * c + kCorrectionWeight * std::log(ratio);
  std::deque<double>& window = ratios_[size_t(i)];
  window.push_back(ratio);
  if (int(window.size()) > kBoundWindow) window.pop_front();
  ++observed_[size_t(i)];
}

// The empirical kBoundQuantile of the window by nearest rank: the ceil(q·n)-th smallest of n
// ratios. With q = 0.99 and a window of 32 that is the largest: a job waits for several passes
// and admission packs the queue up to the deadline, so a p99 of TTFT needs nearly every pass
// within the bound, and a lower quantile (0.95, the second largest) let the simulated busy
// machine of test_scheduler_load.cpp miss at p99.
double Predictor::bound(int i) const {
  const double corr = correction(i);
  const std::deque<double>& window = ratios_[size_t(i)];
  if (window.empty()) return corr;
  std::vector<double> sorted(window.begin(), window.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const size_t rank = std::clamp<size_t>(size_t(std::ceil(kBoundQuantile * double(n) - 1e-9)), 1, n);
  return std::max(corr, sorted[rank - 1]);
}

int64_t Predictor::observed(int i) const {
  spec(i);
  return observed_[size_t(i)];
}

// ---- Scheduler --------------------------------------------------------------------------------

namespace {

std::vector<int64_t> lengths_of(const std::vector<Job>& jobs) {
  std::vector<int64_t> out;
  out.reserve(jobs.size());
  for (const Job& j : jobs) out.push_back(j.tokens);
  return out;
}

// Retry-After is whole seconds, at least 1.
double retry_seconds(double s) { return std::max(1.0, std::ceil(s)); }

}  // namespace

Scheduler::Scheduler(Predictor predictor, Policy policy, Clock clock)
    : predictor_(std::move(predictor)), policy_(policy), clock_(std::move(clock)),
      state_(predictor_.instances().size()) {
  SLOPE_CHECK(bool(clock_), "the scheduler needs a clock");
}

const Predictor& Scheduler::predictor() const { return predictor_; }

void Scheduler::check_instance(int i) const {
  SLOPE_CHECK(i >= 0 && i < int(state_.size()), "instance ", i, " does not exist; there are ", state_.size());
}

bool Scheduler::available(int i) const {
  check_instance(i);
  return state_[size_t(i)].up;
}

// Slo: earliest deadline first, then higher priority, then earlier arrival, then submission.
// Fcfs: arrival, then submission.
bool Scheduler::before(const Queued& a, const Queued& b) const {
  if (policy_ == Policy::Slo) {
    if (a.deadline_s != b.deadline_s) return a.deadline_s < b.deadline_s;
    if (a.job.priority != b.job.priority) return a.job.priority > b.job.priority;
  }
  if (a.job.arrival_s != b.job.arrival_s) return a.job.arrival_s < b.job.arrival_s;
  return a.seq < b.seq;
}

// The running pass's predicted end, from the clock. A pass that overran its prediction is
// counted as ending now: how much longer it takes is unknown, and the correction learns the
// overrun when it completes.
double Scheduler::running_left_s(int i, double now) const {
  const InstanceState& st = state_[size_t(i)];
  if (!st.running) return 0;
  const double end = st.running->start_s + st.running->model_s * predictor_.correction(i);
  return std::max(0.0, end - now);
}

// The running pass's end under the admission bound. A pass that has overrun even that is
// expected to go on for as long again as it has overrun so far: something is slowing the
// machine (another process on its cores, a stall), nothing says for how long, and the time it
// has lasted is the best guess of how much longer it lasts. Counting the pass as ending now
// would admit work behind a pass that is known to be late.
double Scheduler::running_bound_s(int i, double now) const {
  const InstanceState& st = state_[size_t(i)];
  if (!st.running) return 0;
  const double end = st.running->start_s + st.running->model_s * predictor_.bound(i);
  return now <= end ? end - now : now - end;
}

double Scheduler::queued_s(int i) const {
  double s = 0;
  for (const Queued& q : state_[size_t(i)].queue) s += q.model_s;
  return s * predictor_.correction(i);
}

void Scheduler::enqueue(int i, Queued q) {
  std::vector<Queued>& queue = state_[size_t(i)].queue;
  auto at = std::upper_bound(queue.begin(), queue.end(), q,
                             [this](const Queued& a, const Queued& b) { return before(a, b); });
  where_[q.job.id] = i;
  queue.insert(at, std::move(q));
}

Admission Scheduler::submit(const Job& job) {
  SLOPE_CHECK(job.tokens >= 1, "job ", job.id, ": a prompt has at least 1 token, got ", job.tokens);
  SLOPE_CHECK(std::isfinite(job.arrival_s), "job ", job.id, ": the arrival time must be finite");
  SLOPE_CHECK(std::isfinite(job.slo_s) && job.slo_s >= 0, "job ", job.id,
              ": the TTFT target must be a finite, non-negative number of seconds, got ", job.slo_s);
  SLOPE_CHECK(!where_.count(job.id), "job id ", job.id, " is already queued or running; each job needs its own id");

  const double now = clock_();
  int64_t longest = 0;
  bool any_runs = false;
  std::vector<int> candidates;  // up and long enough
  for (int i = 0; i < int(state_.size()); ++i) {
    const InstanceSpec& s = predictor_.instances()[size_t(i)];
    longest = std::max(longest, s.max_tokens);
    if (s.max_tokens < job.tokens) continue;
    any_runs = true;
    if (state_[size_t(i)].up) candidates.push_back(i);
  }
  Admission a;
  if (!any_runs) {
    a.rejection = Rejection::TooLong;
    a.reason = str_cat("too long: no instance can run ", job.tokens, " tokens (the longest prompt an instance takes is ",
                       longest, ")");
    return a;
  }
  if (candidates.empty()) {
    a.rejection = Rejection::Unavailable;
    a.reason = str_cat("unavailable: every instance that can run ", job.tokens, " tokens is down; retry shortly");
    a.retry_after_s = 1;
    return a;
  }
  return policy_ == Policy::Slo ? submit_slo(job, candidates, now) : submit_fcfs(job, candidates, now);
}

// For each candidate: the job's place in the EDF queue, its predicted TTFT (the running pass's
// remainder, the queued passes ahead of it, its own pass) and whether a guaranteed job behind
// it would go from meeting its deadline to missing it. Among the instances where the job meets
// its deadline without pushing anyone over, take the smallest (fewest ranks: a short prompt
// gains least from a big mesh and would hold all of its ranks, which long prompts need), then
// the one that leaves the job the most slack (the least loaded of equal instances).
//
// "Meets" is decided under the instance's bound (Predictor::bound: a high quantile of its
// recent measured / model), applied to every pass the job waits for and to its own, not under
// the correction: the correction is a mean, so a job admitted on it misses whenever the passes
// ahead run slower than average, and a few fast passes pull it down just before slow ones.
// An instance that has measured fewer than kCalibrationPasses passes knows too little of the
// machine: it takes a job only when it is idle, and the job's pass teaches it.
Admission Scheduler::submit_slo(const Job& job, const std::vector<int>& candidates, double now) {
  const double left = job.arrival_s + job.slo_s - now;  // seconds until the deadline
  Queued q{job, job.arrival_s + job.slo_s, true, 0, next_seq_};

  struct Option {
    int instance = -1;
    double ttft = 0, own = 0;  // the corrected prediction: what the job is told
    double ttft_bound = 0, own_bound = 0, total = 0;  // under the bound; total: all its work, then the job's pass
    bool meets = false, uncalibrated = false;
  };
  std::vector<Option> options;
  for (int i : candidates) {
    const InstanceState& st = state_[size_t(i)];
    const double corr = predictor_.correction(i), bound = predictor_.bound(i);
    Option o;
    o.instance = i;
    q.model_s = predictor_.model_seconds(i, {job.tokens});
    o.own = q.model_s * corr;
    o.own_bound = q.model_s * bound;
    double finish = now + running_left_s(i, now);  // of the queued job being walked over
    double finish_bound = now + running_bound_s(i, now);
    bool pushes = false;
    bool placed = false;
    for (const Queued& other : st.queue) {
      if (!placed && before(q, other)) {
        placed = true;
        o.ttft = finish - now + o.own;
        o.ttft_bound = finish_bound - now + o.own_bound;
      }
      finish += other.model_s * corr;
      finish_bound += other.model_s * bound;
      if (placed && other.guaranteed && finish_bound <= other.deadline_s &&
          finish_bound + o.own_bound > other.deadline_s)
        pushes = true;
    }
    if (!placed) {
      o.ttft = finish - now + o.own;
      o.ttft_bound = finish_bound - now + o.own_bound;
    }
    o.total = finish_bound - now + o.own_bound;
    o.uncalibrated = predictor_.observed(i) < Predictor::kCalibrationPasses && (st.running || !st.queue.empty());
    o.meets = left - o.ttft_bound >= 0 && !pushes && !o.uncalibrated;
    options.push_back(o);
  }

  const Option* best = nullptr;
  for (const Option& o : options) {
    if (!o.meets) continue;
    if (!best) {
      best = &o;
      continue;
    }
    const int ranks = predictor_.instances()[size_t(o.instance)].mesh.size();
    const int best_ranks = predictor_.instances()[size_t(best->instance)].mesh.size();
    if (ranks != best_ranks ? ranks < best_ranks : o.ttft_bound < best->ttft_bound) best = &o;
  }

  Admission a;
  if (best) {
    q.model_s = predictor_.model_seconds(best->instance, {job.tokens});
    ++next_seq_;
    enqueue(best->instance, q);
    a.admitted = true;
    a.instance = best->instance;
    a.predicted_ttft_s = best->ttft;
    return a;
  }

  if (job.best_effort) {
    // Best effort past its deadline: the instance that would finish it first if it went last,
    // under a relaxed deadline no earlier than that finish and than any deadline queued there.
    // So it runs after all the work already admitted (no one queued misses because of it),
    // and later arrivals only pass it while their own deadlines are earlier: with its deadline
    // fixed, arrivals stop passing it once time reaches it, so it ages and cannot starve.
    const Option* least = &options.front();
    for (const Option& o : options)
      if (o.total < least->total) least = &o;
    const int i = least->instance;
    q.model_s = predictor_.model_seconds(i, {job.tokens});
    q.guaranteed = false;
    q.deadline_s = std::max(q.deadline_s, now + least->total);
    for (const Queued& other : state_[size_t(i)].queue) q.deadline_s = std::max(q.deadline_s, other.deadline_s);
    ++next_seq_;
    enqueue(i, q);
    a.admitted = true;
    a.instance = i;
    a.predicted_ttft_s = least->total;
    return a;
  }

  // Rejected. Retry-After: when the soonest instance whose idle TTFT fits the SLO has drained
  // enough of its work (queued + running) that the job's own pass fits before the deadline,
  // counting no new arrivals.
  double fastest = options.front().own_bound;
  double wait = INFINITY;
  for (const Option& o : options) {
    fastest = std::min(fastest, o.own_bound);
    if (o.own_bound <= job.slo_s) wait = std::min(wait, o.total - job.slo_s);
  }
  if (!std::isfinite(wait)) {
    a.rejection = Rejection::Unreachable;
    a.reason = str_cat("unreachable: ", job.tokens, " tokens take ", fastest * 1e3,
                       " ms on the fastest idle instance, over the TTFT target of ", job.slo_s * 1e3,
                       " ms; raise ttft_slo_ms or send it as best effort");
    return a;
  }
  const Option* soonest = &options.front();
  for (const Option& o : options)
    if (o.ttft_bound < soonest->ttft_bound) soonest = &o;
  a.rejection = Rejection::Deadline;
  a.predicted_ttft_s = soonest->ttft;
  a.retry_after_s = retry_seconds(wait);
  const std::string& name = predictor_.instances()[size_t(soonest->instance)].name;
  const double margin = predictor_.bound(soonest->instance) / predictor_.correction(soonest->instance);
  if (soonest->uncalibrated)
    a.reason = str_cat("deadline: the soonest instance ('", name,
                       "') has measured ", predictor_.observed(soonest->instance), " of the ", Predictor::kCalibrationPasses,
                       " passes it needs to predict under load, and takes one request at a time until then");
  else if (left - soonest->ttft_bound >= 0)  // it would meet its own deadline, but not without pushing others over
    a.reason = str_cat("deadline: on the soonest instance ('", name, "') its predicted TTFT of ", soonest->ttft * 1e3,
                       " ms meets the target of ", job.slo_s * 1e3,
                       " ms only by making an admitted request miss its own; the instances are full");
  else
    a.reason = str_cat("deadline: predicted TTFT ", soonest->ttft * 1e3, " ms on the soonest instance ('", name,
                       "'), ", soonest->ttft_bound * 1e3, " ms with the margin of ", margin,
                       "x for its recent prediction error, misses the target of ", job.slo_s * 1e3,
                       " ms at the current load");
  return a;
}

// The stock engine's queue: no admission control; the instance that would finish it first
// (its predicted backlog plus the job's own pass); arrival order.
Admission Scheduler::submit_fcfs(const Job& job, const std::vector<int>& candidates, double now) {
  int best = -1;
  double best_total = 0, best_model = 0;
  for (int i : candidates) {
    const double model_s = predictor_.model_seconds(i, {job.tokens});
    const double total = running_left_s(i, now) + queued_s(i) + model_s * predictor_.correction(i);
    if (best < 0 || total < best_total) {
      best = i;
      best_total = total;
      best_model = model_s;
    }
  }
  enqueue(best, Queued{job, job.arrival_s + job.slo_s, true, best_model, next_seq_++});
  Admission a;
  a.admitted = true;
  a.instance = best;
  a.predicted_ttft_s = best_total;
  return a;
}

// The head of the queue, and after it consecutive short prompts while the pass stays within
// max_batch prompts and the instance's max_tokens in all, and (Slo) no job in the pass that met
// its deadline in the smaller pass misses it in the larger one.
std::optional<Pass> Scheduler::next(int i) {
  check_instance(i);
  InstanceState& st = state_[size_t(i)];
  if (st.running)
    fail("instance ", i, " is still running a pass of ", st.running->pass.jobs.size(),
         " job(s); call complete() before next()");
  if (!st.up || st.queue.empty()) return std::nullopt;

  const InstanceSpec& spec = predictor_.instances()[size_t(i)];
  const double now = clock_();
  const auto is_short = [&](const Queued& q) { return spec.batch_tokens > 0 && q.job.tokens <= spec.batch_tokens; };

  size_t taken = 1;
  std::vector<Job> jobs{st.queue.front().job};
  std::vector<int64_t> lengths{st.queue.front().job.tokens};
  int64_t sum = lengths.front();
  double pass_s = predictor_.pass_seconds(i, lengths);
  // Deadlines are checked under the bound, as admission checked them.
  const double bound = predictor_.bound(i);
  double pass_bound = predictor_.model_seconds(i, lengths) * bound;
  if (is_short(st.queue.front())) {
    while (taken < st.queue.size() && int(jobs.size()) < spec.max_batch) {
      const Queued& cand = st.queue[taken];
      if (!is_short(cand) || sum + cand.job.tokens > spec.max_tokens) break;
      std::vector<int64_t> more = lengths;
      more.push_back(cand.job.tokens);
      const double more_model = predictor_.model_seconds(i, more);
      const double more_s = more_model * predictor_.correction(i), more_bound = more_model * bound;
      bool holds = true;
      if (policy_ == Policy::Slo) {
        for (size_t k = 0; k <= taken && holds; ++k) {
          const double d = st.queue[k].deadline_s;
          if (k < taken ? now + pass_bound <= d && now + more_bound > d : now + more_bound > d) holds = false;
        }
      }
      if (!holds) break;
      jobs.push_back(cand.job);
      lengths = std::move(more);
      sum += cand.job.tokens;
      pass_s = more_s;
      pass_bound = more_bound;
      ++taken;
    }
  }

  st.queue.erase(st.queue.begin(), st.queue.begin() + int64_t(taken));
  Pass pass{i, std::move(jobs), pass_s};
  st.running = Running{pass, now, predictor_.model_seconds(i, lengths)};
  return pass;
}

void Scheduler::complete(int i, const Pass& pass, double measured_s) {
  check_instance(i);
  InstanceState& st = state_[size_t(i)];
  // A pass dropped by mark_down (the instance failed while it ran) is no longer running: its
  // completion, if the front still reports one, is ignored.
  if (!st.running || lengths_of(st.running->pass.jobs) != lengths_of(pass.jobs) ||
      !std::equal(pass.jobs.begin(), pass.jobs.end(), st.running->pass.jobs.begin(),
                  [](const Job& a, const Job& b) { return a.id == b.id; }))
    return;
  // The pass is over whatever the measurement says: drop it first, so that a bad measurement
  // (the error observe() throws) cannot leave the instance busy for ever.
  for (const Job& j : pass.jobs) where_.erase(j.id);
  st.running.reset();
  predictor_.observe(i, lengths_of(pass.jobs), measured_s);
}

bool Scheduler::cancel(uint64_t id) {
  auto w = where_.find(id);
  if (w == where_.end()) return false;
  std::vector<Queued>& queue = state_[size_t(w->second)].queue;
  auto it = std::find_if(queue.begin(), queue.end(), [id](const Queued& q) { return q.job.id == id; });
  if (it == queue.end()) return false;  // running
  queue.erase(it);
  where_.erase(w);
  return true;
}

std::vector<uint64_t> Scheduler::mark_down(int i) {
  check_instance(i);
  InstanceState& st = state_[size_t(i)];
  st.up = false;
  std::vector<uint64_t> ids;
  if (st.running)
    for (const Job& j : st.running->pass.jobs) ids.push_back(j.id);
  for (const Queued& q : st.queue) ids.push_back(q.job.id);
  for (uint64_t id : ids) where_.erase(id);
  st.running.reset();
  st.queue.clear();
  return ids;
}

void Scheduler::set_available(int i, bool up) {
  check_instance(i);
  if (up) {
    state_[size_t(i)].up = true;
    return;
  }
  std::vector<uint64_t> ids = mark_down(i);
  dropped_.insert(dropped_.end(), ids.begin(), ids.end());
}

std::vector<uint64_t> Scheduler::take_dropped() { return std::exchange(dropped_, {}); }

int Scheduler::queue_depth(int i) const {
  check_instance(i);
  return int(state_[size_t(i)].queue.size());
}

double Scheduler::predicted_backlog_s(int i) const {
  check_instance(i);
  return running_left_s(i, clock_()) + queued_s(i);
}

}  // namespace slope::serve
