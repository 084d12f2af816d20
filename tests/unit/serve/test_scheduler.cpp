// The SLO scheduler against a fake clock. Every expected time is computed here from
// planner::predict (the cost model the scheduler is meant to use), never read back from the
// scheduler, so a wrong backlog, order or correction shows up as a wrong admission or order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../error_of.h"
#include "slope/core/error.h"
#include "../planner/planner_fixtures.h"
#include "slope/serve/scheduler.h"

namespace slope::serve {
namespace {

using planner::Mesh;
using slope::testing::error_of;

// gpt-oss-120b on the H100 profile: 8192 tokens take ~0.21 s on one rank and ~0.055 s on a
// ring of 4, so both the idle times and the queueing are of a realistic size.
struct Fixture {
  model::ModelConfig cfg = planner::testing::gpt_oss_120b();
  planner::HardwareProfile hw = planner::load_profile(planner::testing::source_root() + "/profiles/h100-sxm.json");
  double now = 100.0;
  Clock clock = [this] { return now; };

  // The cost model's idle TTFT, straight from the planner.
  double ttft(const Mesh& mesh, int64_t tokens) const { return planner::predict(cfg, hw, mesh, tokens).ttft_s; }
};

const Mesh kOneRank{1, 1, 1, 1, 0};
const Mesh kRing4{1, 4, 1, 1, 0};

InstanceSpec small_instance(int64_t batch_tokens = 0, int max_batch = 8) {
  return {"ring=1", kOneRank, 16384, batch_tokens, max_batch};
}
InstanceSpec big_instance() { return {"ring=4", kRing4, 131072, 0, 8}; }

Job job(uint64_t id, int64_t tokens, double arrival, double slo, int priority = 0, bool best_effort = false) {
  Job j;
  j.id = id;
  j.tokens = tokens;
  j.arrival_s = arrival;
  j.slo_s = slo;
  j.priority = priority;
  j.best_effort = best_effort;
  return j;
}

// The first passes measured on each instance exactly as the cost model predicts: the correction
// and the admission bound stay 1, so every time below is the cost model's, and the instances are
// past their calibration (before it, an instance takes one job at a time).
Predictor calibrated(Predictor p) {
  for (int i = 0; i < int(p.instances().size()); ++i)
    for (int k = 0; k < Predictor::kCalibrationPasses; ++k) p.observe(i, {1024}, p.model_seconds(i, {1024}));
  return p;
}

std::vector<uint64_t> ids_of(const Pass& p) {
  std::vector<uint64_t> out;
  for (const Job& j : p.jobs) out.push_back(j.id);
  return out;
}

// Runs every queued pass on instance i, each taking exactly its predicted time on the fake
// clock, and returns the job ids in the order they ran.
std::vector<uint64_t> drain(Scheduler& s, Fixture& f, int i) {
  std::vector<uint64_t> order;
  while (auto p = s.next(i)) {
    for (uint64_t id : ids_of(*p)) order.push_back(id);
    f.now += p->predicted_s;
    s.complete(i, *p, p->predicted_s);
  }
  return order;
}

TEST(ServePolicy, ParsesTheTwoNames) {
  EXPECT_EQ(parse_policy("slo"), Policy::Slo);
  EXPECT_EQ(parse_policy("fcfs"), Policy::Fcfs);
  EXPECT_HAS(error_of([] { parse_policy("edf"); }), "unknown scheduler 'edf'");
}

TEST(ServePredictor, OnePromptIsTheCostModel) {
  Fixture f;
  Predictor p(f.cfg, f.hw, {small_instance(), big_instance()});
  EXPECT_DOUBLE_EQ(p.pass_seconds(0, {8192}), f.ttft(kOneRank, 8192));
  EXPECT_DOUBLE_EQ(p.pass_seconds(1, {65536}), f.ttft(kRing4, 65536));
  EXPECT_DOUBLE_EQ(p.correction(0), 1.0);
}

TEST(ServePredictor, ABatchCountsTokenWorkAtTheSumAndAttentionPerPrompt) {
  Fixture f;
  Predictor p(f.cfg, f.hw, {small_instance(2048)});
  const auto whole = planner::predict(f.cfg, f.hw, kOneRank, 3000);
  const auto a = planner::predict(f.cfg, f.hw, kOneRank, 1000);
  const auto b = planner::predict(f.cfg, f.hw, kOneRank, 2000);
  const double want = whole.ttft_s - whole.phases.attention - whole.phases.lm_head + a.phases.attention +
                      a.phases.lm_head + b.phases.attention + b.phases.lm_head;
  EXPECT_NEAR(p.pass_seconds(0, {1000, 2000}), want, 1e-12);
  // Sharing the pass is cheaper than two passes, and dearer than the longer prompt alone.
  EXPECT_LT(p.pass_seconds(0, {1000, 2000}), a.ttft_s + b.ttft_s);
  EXPECT_GT(p.pass_seconds(0, {1000, 2000}), b.ttft_s);
}

TEST(ServePredictor, RejectsBadInstancesAndMeasurements) {
  Fixture f;
  EXPECT_HAS(error_of([&] { Predictor(f.cfg, f.hw, {}); }), "at least one instance");
  EXPECT_HAS(error_of([&] { Predictor(f.cfg, f.hw, {{"a", kOneRank, 1024, 2048, 8}}); }), "batch_tokens");
  EXPECT_HAS(error_of([&] { Predictor(f.cfg, f.hw, {{"a", kOneRank, 0, 0, 8}}); }), "max_tokens");
  EXPECT_HAS(error_of([&] { Predictor(f.cfg, f.hw, {small_instance(), small_instance()}); }), "given twice");
  EXPECT_HAS(error_of([&] { Predictor(f.cfg, f.hw, {{"u3", Mesh{1, 1, 3, 1, 0}, 1024, 0, 8}}); }), "cannot run");
  Predictor p(f.cfg, f.hw, {small_instance()});
  EXPECT_HAS(error_of([&] { p.observe(0, {1024}, NAN); }), "finite");
  EXPECT_HAS(error_of([&] { p.pass_seconds(0, {20000}); }), "1 to 16384 tokens");
  EXPECT_HAS(error_of([&] { p.pass_seconds(3, {100}); }), "instance 3 does not exist");
}

// A profile 2x too optimistic: every pass measures twice the cost model. After 6 passes the
// prediction is within 10% of the truth; after 1 it is not yet (so the test tells a correction
// that does nothing from one that converges, and one that jumps from one that smooths).
TEST(ServePredictor, CorrectionConvergesFromAProfileTwiceOff) {
  for (double truth_factor : {2.0, 0.5}) {
    Fixture f;
    Scheduler s(Predictor(f.cfg, f.hw, {small_instance()}), Policy::Slo, f.clock);
    const std::vector<int64_t> lengths = {1024, 8192, 4096, 2048, 8192, 1024};
    for (size_t k = 0; k < lengths.size(); ++k) {
      ASSERT_TRUE(s.submit(job(k, lengths[k], f.now, 1e6)).admitted);
      auto p = s.next(0);
      ASSERT_TRUE(p);
      const double measured = truth_factor * f.ttft(kOneRank, lengths[k]);
      f.now += measured;
      s.complete(0, *p, measured);
      const double err = s.predictor().pass_seconds(0, {3000}) / (truth_factor * f.ttft(kOneRank, 3000)) - 1;
      if (k == 0) {
        EXPECT_GT(std::abs(err), 0.1) << "factor " << truth_factor;
      }
      if (k == lengths.size() - 1) {
        EXPECT_LT(std::abs(err), 0.1) << "factor " << truth_factor;
      }
    }
    EXPECT_NEAR(s.predictor().correction(0), truth_factor, 0.1 * truth_factor);
  }
}

// The admission bound is the nearest-rank 0.99 quantile of the last 32 measured / model ratios:
// with 32 at most, their largest. Worked out here from the list of ratios fed in: the largest,
// old ratios leave the window, and it is never below the correction.
TEST(ServePredictor, BoundIsTheSlowestOfTheRecentRatios) {
  Fixture f;
  Predictor p(f.cfg, f.hw, {small_instance()});
  const double m = p.model_seconds(0, {1024});
  EXPECT_DOUBLE_EQ(p.bound(0), 1.0);  // nothing measured: the cost model as is
  EXPECT_EQ(p.observed(0), 0);
  std::vector<double> fed;
  auto feed = [&](double ratio, int times) {
    for (int k = 0; k < times; ++k) {
      p.observe(0, {1024}, ratio * m);
      fed.push_back(ratio);
    }
  };
  auto slowest = [&] {  // the reference: the largest of the last 32
    return *std::max_element(fed.end() - std::min<ptrdiff_t>(32, ptrdiff_t(fed.size())), fed.end());
  };
  feed(1.0, 10);
  feed(3.0, 1);
  EXPECT_NEAR(p.bound(0), 3.0, 1e-12);
  EXPECT_LT(p.correction(0), 1.5);  // while the mean has moved a little
  feed(1.0, 31);                    // the 3 is the oldest of the 32
  EXPECT_NEAR(slowest(), 3.0, 1e-12);
  EXPECT_NEAR(p.bound(0), 3.0, 1e-12);
  feed(1.2, 1);  // and now it has left the window
  EXPECT_NEAR(slowest(), 1.2, 1e-12);
  EXPECT_NEAR(p.bound(0), 1.2, 1e-12);
  feed(0.5, 32);  // a machine that became faster: the bound follows once the window is full of it
  EXPECT_NEAR(p.bound(0), std::max(p.correction(0), 0.5), 1e-12);
  EXPECT_NEAR(p.bound(0), 0.5, 1e-3);
  feed(0.05 / 10, 1);  // clamped like the correction
  EXPECT_NEAR(p.bound(0), std::max(p.correction(0), 0.5), 1e-12);
  EXPECT_EQ(p.observed(0), int64_t(fed.size()));
}

// Recent passes ran at the cost model's time, one before them at twice it: the correction is
// back near 1, but admission holds against the 2x that the window has seen. A job that fits
// under the correction and not under 2x is refused; one that fits under 2x is admitted.
TEST(ServeScheduler, AdmitsUnderTheBoundNotUnderTheMean) {
  for (double factor : {1.5, 2.05}) {
    Fixture f;
    Predictor p = calibrated(Predictor(f.cfg, f.hw, {small_instance()}));
    p.observe(0, {4096}, 2 * f.ttft(kOneRank, 4096));
    for (int k = 0; k < 5; ++k) p.observe(0, {4096}, f.ttft(kOneRank, 4096));
    ASSERT_LT(p.correction(0), 1.05);
    Scheduler s(std::move(p), Policy::Slo, f.clock);
    ASSERT_TRUE(s.submit(job(1, 4096, f.now, 100)).admitted);
    ASSERT_TRUE(s.next(0));
    const double sum = f.ttft(kOneRank, 4096) + f.ttft(kOneRank, 2048);  // the running pass, then its own
    const Admission a = s.submit(job(2, 2048, f.now, factor * sum));
    EXPECT_EQ(a.admitted, factor > 2) << a.reason;
    EXPECT_NEAR(a.predicted_ttft_s, s.predictor().correction(0) * sum, 1e-9);  // what it is told: the mean
    if (!a.admitted) {
      EXPECT_EQ(a.rejection, Rejection::Deadline);
      EXPECT_HAS(a.reason, "with the margin of");
    }
  }
}

// A running pass that has overrun its bound by x is expected to take x more, not to end now.
TEST(ServeScheduler, APassThatOverranIsExpectedToGoOnAsLongAgain) {
  for (double extra : {0.5, 1.05}) {
    Fixture f;
    Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
    const double t8 = f.ttft(kOneRank, 8192), t1 = f.ttft(kOneRank, 1024);
    ASSERT_TRUE(s.submit(job(1, 8192, f.now, 100)).admitted);
    ASSERT_TRUE(s.next(0));
    f.now += 2 * t8;  // it should have ended t8 ago
    const Admission a = s.submit(job(2, 1024, f.now, t1 + extra * t8));
    EXPECT_EQ(a.admitted, extra > 1) << a.reason;
  }
}

// Until it has measured kCalibrationPasses passes an instance knows too little of the machine:
// it takes a job only when idle. After them (each measured twice the model) it queues again,
// on the measurements.
TEST(ServeScheduler, AnInstanceTakesOneJobAtATimeUntilItHasMeasuredItsFirstPasses) {
  Fixture f;
  Scheduler s(Predictor(f.cfg, f.hw, {small_instance()}), Policy::Slo, f.clock);
  const double t1 = f.ttft(kOneRank, 1024);
  for (int k = 0; k < Predictor::kCalibrationPasses; ++k) {
    ASSERT_TRUE(s.submit(job(10 * k + 1, 1024, f.now, 10)).admitted);
    const Admission second = s.submit(job(10 * k + 2, 1024, f.now, 10));
    EXPECT_FALSE(second.admitted);
    EXPECT_EQ(second.rejection, Rejection::Deadline);
    EXPECT_HAS(second.reason, str_cat("has measured ", k, " of the ", Predictor::kCalibrationPasses, " passes"));
    EXPECT_GE(second.retry_after_s, 1.0);
    auto p = s.next(0);
    ASSERT_TRUE(p);
    f.now += 2 * t1;
    s.complete(0, *p, 2 * t1);
  }
  EXPECT_TRUE(s.submit(job(101, 1024, f.now, 4.5 * t1)).admitted);
  EXPECT_TRUE(s.submit(job(102, 1024, f.now, 4.5 * t1)).admitted);
  EXPECT_EQ(s.queue_depth(0), 2);
  // Its bound is the measured 2x: behind the two, a third 1024 finishes at 6 t1, not at the
  // correction's 3 · 2^(1 − 0.7^4) t1 = 5.07 t1.
  EXPECT_NEAR(s.predictor().correction(0), std::pow(2.0, 1 - std::pow(0.7, 4)), 1e-9);
  EXPECT_FALSE(s.submit(job(103, 1024, f.now, 5.5 * t1)).admitted);
  EXPECT_TRUE(s.submit(job(104, 1024, f.now, 6 * t1 + 1e-6)).admitted);
}

TEST(ServeScheduler, EarliestDeadlineFirstThenPriorityThenArrival) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  // Generous targets so that every job is admitted; deadlines in scrambled order.
  ASSERT_TRUE(s.submit(job(1, 1024, f.now, 50)).admitted);
  ASSERT_TRUE(s.submit(job(2, 1024, f.now, 20)).admitted);
  ASSERT_TRUE(s.submit(job(3, 1024, f.now, 40)).admitted);
  ASSERT_TRUE(s.submit(job(4, 1024, f.now, 30)).admitted);
  // Equal deadlines: the higher priority first, then the earlier arrival.
  ASSERT_TRUE(s.submit(job(5, 1024, f.now - 1, 31)).admitted);  // deadline now + 30, arrived first
  ASSERT_TRUE(s.submit(job(6, 1024, f.now, 30, 1)).admitted);   // deadline now + 30, priority 1
  EXPECT_EQ(s.queue_depth(0), 6);
  EXPECT_EQ(drain(s, f, 0), (std::vector<uint64_t>{2, 6, 5, 4, 3, 1}));
  EXPECT_EQ(s.queue_depth(0), 0);
}

// The admission boundary, worked out from the cost model: one pass of 8192 tokens has run for
// 0.1 s, a 4096-token job with an earlier deadline is queued, and a 2048-token job arrives. Its
// predicted TTFT is the running pass's remainder + the 4096 pass + its own 2048 pass.
TEST(ServeScheduler, AdmitsAtTheBoundaryAndRejectsJustPastIt) {
  for (double eps : {1e-7, -1e-7}) {
    Fixture f;
    Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
    ASSERT_TRUE(s.submit(job(1, 8192, f.now, 10)).admitted);
    auto running = s.next(0);
    ASSERT_TRUE(running);
    f.now += 0.1;
    const double left = f.ttft(kOneRank, 8192) - 0.1;
    ASSERT_TRUE(s.submit(job(2, 4096, f.now, left + f.ttft(kOneRank, 4096) + 0.01)).admitted);
    const double boundary = left + f.ttft(kOneRank, 4096) + f.ttft(kOneRank, 2048);
    ASSERT_GT(boundary, left + f.ttft(kOneRank, 4096) + 0.01);  // job 2 is ahead of job 3
    const Admission a = s.submit(job(3, 2048, f.now, boundary + eps));
    EXPECT_NEAR(s.predicted_backlog_s(0), a.admitted ? boundary : boundary - f.ttft(kOneRank, 2048), 1e-9);
    if (eps > 0) {
      EXPECT_TRUE(a.admitted) << a.reason;
      EXPECT_EQ(a.instance, 0);
      EXPECT_NEAR(a.predicted_ttft_s, boundary, 1e-9);
    } else {
      EXPECT_FALSE(a.admitted);
      EXPECT_EQ(a.rejection, Rejection::Deadline);
      EXPECT_EQ(a.reason.rfind("deadline: ", 0), 0u) << a.reason;
      EXPECT_NEAR(a.predicted_ttft_s, boundary, 1e-9);
      // Retry-After: when the backlog (running + queued + own) has drained to the target.
      EXPECT_EQ(a.retry_after_s, 1.0);
      EXPECT_EQ(s.queue_depth(0), 1);
    }
  }
}

TEST(ServeScheduler, RetryAfterIsWhenTheBacklogHasDrained) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  // About 4 s of work, each job due 0.02 s after its predicted finish: the new job can neither
  // go ahead of them (it would push them over) nor meet its target behind them.
  double queued = 0;
  for (uint64_t id = 1; id <= 20; ++id) {
    queued += f.ttft(kOneRank, 8192);
    ASSERT_TRUE(s.submit(job(id, 8192, f.now, queued + 0.02)).admitted);
  }
  ASSERT_LT(0.02, f.ttft(kOneRank, 2048));
  const double slo = 0.5;
  const Admission a = s.submit(job(99, 2048, f.now, slo));
  ASSERT_FALSE(a.admitted);
  EXPECT_EQ(a.rejection, Rejection::Deadline);
  EXPECT_EQ(a.retry_after_s, std::ceil(queued + f.ttft(kOneRank, 2048) - slo));
  EXPECT_GE(a.retry_after_s, 3.0);
}

TEST(ServeScheduler, AnSloBelowTheIdleTimeIsUnreachable) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  const Admission a = s.submit(job(1, 8192, f.now, f.ttft(kOneRank, 8192) / 2));
  EXPECT_FALSE(a.admitted);
  EXPECT_EQ(a.rejection, Rejection::Unreachable);
  EXPECT_HAS(a.reason, "unreachable: 8192 tokens");
  EXPECT_EQ(a.retry_after_s, 0.0);
}

// A job that would meet its own deadline is still refused when it would push a job queued
// behind it (later deadline, met so far) past that job's deadline.
TEST(ServeScheduler, DoesNotAdmitAJobThatMakesAQueuedOneMiss) {
  for (double margin : {+1e-3, -1e-3}) {
    Fixture f;
    Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
    // Job 1 (8192) meets with `slack` to spare; job 2 (1024, earlier deadline) goes ahead of it.
    const double t1 = f.ttft(kOneRank, 8192), t2 = f.ttft(kOneRank, 1024);
    const double slack = t2 + margin;  // job 2 fits in it when margin > 0
    ASSERT_TRUE(s.submit(job(1, 8192, f.now, t1 + slack)).admitted);
    const Admission a = s.submit(job(2, 1024, f.now, t2 + 1e-3));
    EXPECT_EQ(a.admitted, margin > 0) << a.reason;
    if (margin < 0) {
      EXPECT_EQ(a.rejection, Rejection::Deadline);
      EXPECT_HAS(a.reason, "only by making an admitted request miss its own");
    }
    if (margin > 0) {
      EXPECT_EQ(drain(s, f, 0), (std::vector<uint64_t>{2, 1}));
    }
  }
}

TEST(ServeScheduler, RoutesByLengthToTheInstanceThatMeetsIt) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance(), big_instance()})), Policy::Slo, f.clock);
  // Both meet a short prompt: the small instance takes it, though the big one is faster.
  ASSERT_LT(f.ttft(kRing4, 1024), f.ttft(kOneRank, 1024));
  Admission a = s.submit(job(1, 1024, f.now, 1.0));
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.instance, 0);
  // Only the big instance can run 65536 tokens.
  a = s.submit(job(2, 65536, f.now, 5.0));
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.instance, 1);
  // 8192 tokens in 0.1 s: the small instance is too slow even idle; on the big one it goes
  // ahead of the queued 65536-token job (deadline 5 s, which it still meets).
  ASSERT_GT(f.ttft(kOneRank, 8192), 0.1);
  ASSERT_LT(f.ttft(kRing4, 8192), 0.1);
  a = s.submit(job(3, 8192, f.now, 0.1));
  EXPECT_TRUE(a.admitted) << a.reason;
  EXPECT_EQ(a.instance, 1);
  EXPECT_NEAR(a.predicted_ttft_s, f.ttft(kRing4, 8192), 1e-9);  // EDF: ahead of the 65536 one
  // No instance runs 200000 tokens: a reason of its own.
  a = s.submit(job(4, 200000, f.now, 100));
  EXPECT_FALSE(a.admitted);
  EXPECT_EQ(a.rejection, Rejection::TooLong);
  EXPECT_HAS(a.reason, "too long: no instance can run 200000 tokens (the longest prompt an instance takes is 131072)");
  // A short prompt that the busy small instance can no longer meet goes to the big one.
  Fixture g;
  Scheduler t(calibrated(Predictor(g.cfg, g.hw, {small_instance(), big_instance()})), Policy::Slo, g.clock);
  // 0.21 s queued on the small one, due 0.01 s after its predicted finish (so the short job
  // cannot pass it there either).
  ASSERT_TRUE(t.submit(job(10, 8192, g.now, g.ttft(kOneRank, 8192) + 0.01)).admitted);
  a = t.submit(job(11, 1024, g.now, 0.1));
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.instance, 1);
  EXPECT_EQ(t.queue_depth(0), 1);
  EXPECT_EQ(t.queue_depth(1), 1);
}

TEST(ServeScheduler, EqualInstancesShareTheLoad) {
  Fixture f;
  InstanceSpec a = small_instance(), b = small_instance();
  b.name = "ring=1 #2";
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {a, b})), Policy::Slo, f.clock);
  std::vector<int> where;
  for (uint64_t id = 0; id < 4; ++id) where.push_back(s.submit(job(id, 4096, f.now, 10)).instance);
  EXPECT_EQ(where, (std::vector<int>{0, 1, 0, 1}));
}

// A best-effort job that cannot meet its target waits, but not for ever: its relaxed deadline is
// fixed, so the stream of later arrivals (deadline = arrival + 1 s) stops passing it.
TEST(ServeScheduler, BestEffortJobsAgeInsteadOfStarving) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  const double t = f.ttft(kOneRank, 4096);
  ASSERT_TRUE(s.submit(job(1, 4096, f.now, 1.0)).admitted);
  ASSERT_TRUE(s.submit(job(2, 4096, f.now, 1.0)).admitted);
  Admission be = s.submit(job(1000, 4096, f.now, 1e-3, 0, true));
  ASSERT_TRUE(be.admitted);
  EXPECT_NEAR(be.predicted_ttft_s, 3 * t, 1e-9);  // behind everything admitted before it
  ASSERT_FALSE(s.submit(job(1001, 4096, f.now, 1e-3)).admitted);  // the same without best effort
  int passes = 0;
  bool ran = false;
  uint64_t id = 3;
  while (!ran && passes < 50) {
    // One arrival per pass, as fast as the instance serves: it never runs dry.
    const Admission a = s.submit(job(id++, 4096, f.now, 1.0));
    ASSERT_TRUE(a.admitted) << "an admitted stream job was refused at pass " << passes << ": " << a.reason;
    auto p = s.next(0);
    ASSERT_TRUE(p);
    for (const Job& j : p->jobs) {
      ran = ran || j.id == 1000;
      // Every admitted job meets its deadline: the best-effort job pushed none over.
      if (j.id != 1000) {
        EXPECT_LE(f.now + p->predicted_s, j.arrival_s + j.slo_s + 1e-9) << "job " << j.id;
      }
    }
    f.now += p->predicted_s;
    s.complete(0, *p, p->predicted_s);
    ++passes;
  }
  EXPECT_TRUE(ran) << "the best-effort job never ran";
  EXPECT_LE(passes, 3 + int(std::ceil(1.0 / t)) + 1);
}

TEST(ServeScheduler, BatchesShortPromptsWhileTheirDeadlinesHold) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance(2048, 4)})), Policy::Slo, f.clock);
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_TRUE(s.submit(job(id, 1024, f.now, 10 + double(id))).admitted);
  ASSERT_TRUE(s.submit(job(6, 4096, f.now, 20)).admitted);
  ASSERT_TRUE(s.submit(job(7, 1024, f.now, 21)).admitted);
  auto p = s.next(0);
  ASSERT_TRUE(p);
  EXPECT_EQ(ids_of(*p), (std::vector<uint64_t>{1, 2, 3, 4}));  // max_batch
  EXPECT_NEAR(p->predicted_s, s.predictor().pass_seconds(0, {1024, 1024, 1024, 1024}), 1e-12);
  EXPECT_HAS(error_of([&] { s.next(0); }), "still running");
  s.complete(0, *p, p->predicted_s);
  p = s.next(0);
  EXPECT_EQ(ids_of(*p), (std::vector<uint64_t>{5}));  // the long prompt after it is not short
  s.complete(0, *p, p->predicted_s);
  p = s.next(0);
  EXPECT_EQ(ids_of(*p), (std::vector<uint64_t>{6}));  // long prompts run alone
  s.complete(0, *p, p->predicted_s);

  // A short job whose deadline holds alone but not in the larger pass is left for the next one.
  Fixture g;
  Scheduler t(calibrated(Predictor(g.cfg, g.hw, {small_instance(2048, 4)})), Policy::Slo, g.clock);
  const double one = t.predictor().pass_seconds(0, {1024});
  const double two = t.predictor().pass_seconds(0, {1024, 1024});
  ASSERT_LT(one + 1e-3, two);
  ASSERT_TRUE(t.submit(job(1, 1024, g.now, one + 1e-4)).admitted);
  ASSERT_TRUE(t.submit(job(2, 1024, g.now, 10)).admitted);
  p = t.next(0);
  EXPECT_EQ(ids_of(*p), (std::vector<uint64_t>{1}));
}

TEST(ServeScheduler, CancelFreesAQueuedSlotOnly) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  ASSERT_TRUE(s.submit(job(1, 8192, f.now, 10)).admitted);
  ASSERT_TRUE(s.submit(job(2, 8192, f.now, 11)).admitted);
  ASSERT_TRUE(s.submit(job(3, 8192, f.now, 12)).admitted);
  auto p = s.next(0);
  EXPECT_EQ(ids_of(*p), (std::vector<uint64_t>{1}));
  EXPECT_FALSE(s.cancel(1));  // running
  EXPECT_TRUE(s.cancel(2));
  EXPECT_FALSE(s.cancel(2));   // already gone
  EXPECT_FALSE(s.cancel(42));  // never seen
  EXPECT_EQ(s.queue_depth(0), 1);
  EXPECT_NEAR(s.predicted_backlog_s(0), 2 * f.ttft(kOneRank, 8192), 1e-9);
  f.now += p->predicted_s;
  s.complete(0, *p, p->predicted_s);
  EXPECT_EQ(drain(s, f, 0), (std::vector<uint64_t>{3}));
  // A cancelled id may be used again.
  EXPECT_TRUE(s.submit(job(2, 1024, f.now, 10)).admitted);
}

TEST(ServeScheduler, FcfsAdmitsEverythingInArrivalOrder) {
  Fixture f;
  Scheduler s(Predictor(f.cfg, f.hw, {small_instance()}), Policy::Fcfs, f.clock);
  ASSERT_TRUE(s.submit(job(1, 8192, f.now, 50)).admitted);
  ASSERT_TRUE(s.submit(job(2, 8192, f.now + 1e-3, 1e-3)).admitted);  // hopeless: still admitted
  ASSERT_TRUE(s.submit(job(3, 1024, f.now + 2e-3, 20)).admitted);
  const Admission a = s.submit(job(4, 1024, f.now, 0));  // arrived with job 1, submitted last
  EXPECT_TRUE(a.admitted);
  EXPECT_NEAR(a.predicted_ttft_s, 2 * f.ttft(kOneRank, 8192) + 2 * f.ttft(kOneRank, 1024), 1e-9);
  EXPECT_EQ(s.submit(job(5, 20000, f.now, 100)).rejection, Rejection::TooLong);
  EXPECT_EQ(drain(s, f, 0), (std::vector<uint64_t>{1, 4, 2, 3}));
}

TEST(ServeScheduler, FcfsRoutesToTheShortestPredictedBacklog) {
  Fixture f;
  InstanceSpec b = small_instance();
  b.name = "ring=1 #2";
  Scheduler s(Predictor(f.cfg, f.hw, {small_instance(), b}), Policy::Fcfs, f.clock);
  EXPECT_EQ(s.submit(job(1, 8192, f.now, 1)).instance, 0);
  EXPECT_EQ(s.submit(job(2, 1024, f.now, 1)).instance, 1);
  EXPECT_EQ(s.submit(job(3, 1024, f.now, 1)).instance, 1);  // 2 x 1024 < 8192
  EXPECT_EQ(s.submit(job(4, 8192, f.now, 1)).instance, 1);
  EXPECT_EQ(s.submit(job(5, 1024, f.now, 1)).instance, 0);
}

TEST(ServeScheduler, AnInstanceGoingDownReturnsItsJobs) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance(), big_instance()})), Policy::Slo, f.clock);
  ASSERT_EQ(s.submit(job(1, 1024, f.now, 10)).instance, 0);
  ASSERT_EQ(s.submit(job(2, 1024, f.now, 11)).instance, 0);
  ASSERT_EQ(s.submit(job(3, 1024, f.now, 12)).instance, 0);
  auto p = s.next(0);
  ASSERT_TRUE(p);
  s.set_available(0, false);
  EXPECT_FALSE(s.available(0));
  EXPECT_EQ(s.take_dropped(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(s.take_dropped().empty());
  EXPECT_EQ(s.queue_depth(0), 0);
  EXPECT_FALSE(s.next(0).has_value());
  s.complete(0, *p, 0.01);  // the lost pass's late completion is ignored
  EXPECT_EQ(s.predictor().correction(0), 1.0);
  EXPECT_FALSE(s.cancel(2));
  // New work goes to the other instance; what only the down one could run is refused.
  Admission a = s.submit(job(4, 1024, f.now, 10));
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.instance, 1);
  s.set_available(1, false);
  a = s.submit(job(5, 1024, f.now, 10));
  EXPECT_EQ(a.rejection, Rejection::Unavailable);
  EXPECT_GE(a.retry_after_s, 1.0);
  EXPECT_EQ(s.take_dropped(), (std::vector<uint64_t>{4}));
  // Back up: it takes work again; mark_down returns the ids directly.
  s.set_available(0, true);
  a = s.submit(job(6, 1024, f.now, 10));
  EXPECT_EQ(a.instance, 0);
  EXPECT_EQ(s.mark_down(0), (std::vector<uint64_t>{6}));
  EXPECT_TRUE(s.take_dropped().empty());
}

TEST(ServeScheduler, BadCallsAreClearErrors) {
  Fixture f;
  Scheduler s(calibrated(Predictor(f.cfg, f.hw, {small_instance()})), Policy::Slo, f.clock);
  EXPECT_HAS(error_of([&] { s.submit(job(1, 0, f.now, 1)); }), "at least 1 token");
  EXPECT_HAS(error_of([&] { s.submit(job(1, 10, f.now, -1)); }), "TTFT target");
  EXPECT_HAS(error_of([&] { s.submit(job(1, 10, f.now, NAN)); }), "TTFT target");
  ASSERT_TRUE(s.submit(job(1, 10, f.now, 1)).admitted);
  EXPECT_HAS(error_of([&] { s.submit(job(1, 10, f.now, 1)); }), "already queued or running");
  EXPECT_HAS(error_of([&] { s.next(1); }), "instance 1 does not exist");
  auto p = s.next(0);
  ASSERT_TRUE(p);
  EXPECT_HAS(error_of([&] { s.next(0); }), "call complete() before next()");
  // A bad measurement is an error, and the pass is over all the same.
  EXPECT_HAS(error_of([&] { s.complete(0, *p, -1); }), "non-negative");
  EXPECT_EQ(s.predictor().correction(0), 1.0);
  EXPECT_FALSE(s.next(0).has_value());  // idle, nothing queued
}

}  // namespace
}  // namespace slope::serve
