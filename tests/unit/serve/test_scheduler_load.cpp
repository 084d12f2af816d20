// The scheduler under load, in a discrete-event simulation on the fake clock: the issue's
// comparison (a 256-8K length mix at 1.5x the predicted capacity) with passes that take the
// cost model's time times a random factor. SLO mode must give at least 1.5x fcfs's goodput,
// and the requests it admits must meet their target at p90 or better.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <optional>
#include <vector>

#include "../planner/planner_fixtures.h"
#include "slope/serve/scheduler.h"

namespace slope::serve {
namespace {

// A small deterministic generator (splitmix64), so the arrivals are the same on every standard
// library: the comparison of the two policies runs on identical requests.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double exponential(double rate) { return -std::log(uniform()) / rate; }
  double normal() {  // Box-Muller; the two draws in a fixed order
    const double u = uniform(), v = uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * std::numbers::pi * v);
  }
};

struct Outcome {
  int sent = 0, admitted = 0, met = 0;
  int max_queue = 0;
  double window_s = 0;
  double goodput() const { return met / window_s; }
  double admitted_attainment() const { return admitted ? double(met) / admitted : 0; }
};

struct Arrival {
  double t;
  int64_t tokens;
  double noise;  // the pass's measured / predicted, if it runs alone
};

Outcome simulate(Policy policy, const std::vector<Arrival>& arrivals, double slo_s) {
  const auto cfg = planner::testing::gpt_oss_120b();
  const auto hw = planner::load_profile(planner::testing::source_root() + "/profiles/h100-sxm.json");
  double now = 0;
  const planner::Mesh one{1, 1, 1, 1, 0};
  Scheduler s(Predictor(cfg, hw, {{"a", one, 16384, 1024, 4}, {"b", one, 16384, 1024, 4}}), policy, [&] { return now; });

  Outcome out;
  out.window_s = arrivals.back().t;
  std::vector<std::optional<Pass>> running(2);
  std::vector<double> starts(2, 0), ends(2, 0);
  std::vector<double> noise_of(arrivals.size());
  size_t next_arrival = 0;
  for (;;) {
    // The next event: an arrival or the earliest end of a running pass.
    double t = next_arrival < arrivals.size() ? arrivals[next_arrival].t : INFINITY;
    int ending = -1;
    for (int i = 0; i < 2; ++i)
      if (running[size_t(i)] && ends[size_t(i)] <= t) t = ends[size_t(i)], ending = i;
    if (!std::isfinite(t)) break;
    now = t;
    if (ending >= 0) {
      Pass& p = *running[size_t(ending)];
      for (const Job& j : p.jobs) out.met += now <= j.arrival_s + j.slo_s + 1e-12;
      s.complete(ending, p, now - starts[size_t(ending)]);  // the pass's measured time
      running[size_t(ending)].reset();
    } else {
      const Arrival& a = arrivals[next_arrival];
      noise_of[next_arrival] = a.noise;
      Job j;
      j.id = next_arrival++;
      j.tokens = a.tokens;
      j.arrival_s = a.t;
      j.slo_s = slo_s;
      ++out.sent;
      out.admitted += s.submit(j).admitted;
    }
    for (int i = 0; i < 2; ++i) {
      out.max_queue = std::max(out.max_queue, s.queue_depth(i));
      if (running[size_t(i)]) continue;
      if (auto p = s.next(i)) {
        starts[size_t(i)] = now;
        // What the pass really takes: the cost model's time (not the scheduler's corrected
        // prediction) times this request's factor.
        std::vector<int64_t> lengths;
        for (const Job& j : p->jobs) lengths.push_back(j.tokens);
        ends[size_t(i)] = now + s.predictor().model_seconds(i, lengths) * noise_of[p->jobs.front().id];
        running[size_t(i)] = std::move(p);
      }
    }
  }
  return out;
}

TEST(ServeSchedulerLoad, SloGoodputIsAtLeastOneAndAHalfTimesFcfsAtOneAndAHalfTimesCapacity) {
  const auto cfg = planner::testing::gpt_oss_120b();
  const auto hw = planner::load_profile(planner::testing::source_root() + "/profiles/h100-sxm.json");
  const std::vector<int64_t> mix = {256, 512, 1024, 2048, 4096, 8192};
  // The planner's capacity: two instances, each busy for the mean service time per request.
  double mean_service = 0;
  for (int64_t n : mix) mean_service += planner::predict(cfg, hw, {1, 1, 1, 1, 0}, n).service_s / double(mix.size());
  const double capacity = 2 / mean_service;
  const double slo = 5 * planner::predict(cfg, hw, {1, 1, 1, 1, 0}, 8192).ttft_s;  // ~1 s

  Rng rng{42};
  std::vector<Arrival> arrivals;
  double t = 0;
  for (int k = 0; k < 3000; ++k) {
    t += rng.exponential(1.5 * capacity);
    // Passes take the cost model's time times a factor of spread 10% around 1.1: the profile is
    // 10% optimistic, and the correction has to learn it.
    arrivals.push_back({t, mix[rng.next() % mix.size()], 1.1 * std::exp(0.1 * rng.normal())});
  }
  const Outcome slo_mode = simulate(Policy::Slo, arrivals, slo);
  const Outcome fcfs = simulate(Policy::Fcfs, arrivals, slo);
  EXPECT_EQ(fcfs.admitted, fcfs.sent);
  EXPECT_LT(slo_mode.admitted, slo_mode.sent);
  EXPECT_GE(slo_mode.goodput(), 1.5 * fcfs.goodput())
      << "slo " << slo_mode.goodput() << " req/s, fcfs " << fcfs.goodput() << " req/s";
  EXPECT_GE(slo_mode.admitted_attainment(), 0.9);
  // Memory stays bounded: SLO mode only queues what it can finish in time; fcfs grows.
  EXPECT_LT(slo_mode.max_queue, 64);
  EXPECT_GT(fcfs.max_queue, 4 * slo_mode.max_queue);
  std::printf("capacity %.2f req/s, offered %.2f req/s: slo goodput %.2f req/s (%d of %d admitted, %.1f%% of them met), "
              "fcfs %.2f req/s; deepest queue %d vs %d\n",
              capacity, 1.5 * capacity, slo_mode.goodput(), slo_mode.admitted, slo_mode.sent,
              100 * slo_mode.admitted_attainment(), fcfs.goodput(), slo_mode.max_queue, fcfs.max_queue);
}

// Overload on a machine unlike its profile, the way the 2-core box of docs/serving.md is: a pass
// takes the cost model's time times `base` while the other instance is busy too (they share the
// cores and the memory bus) and 0.65 of that while it runs alone, times a lognormal noise of
// spread `sigma`; a share `stall_p` of the passes are stalled 2x (another process took the core).
// The instances start on the profile (correction 1), so the scheduler must learn all of it.
struct Machine {
  double base = 2.4, sigma = 0.05, stall_p = 0;
};

struct Overload {
  int sent = 0, admitted = 0, met = 0;
  double window_s = 0, admitted_p99_s = 0;
  double goodput() const { return met / window_s; }
};

Overload simulate_machine(const std::vector<Arrival>& arrivals, double slo_s, const Machine& m, uint64_t seed) {
  const auto cfg = planner::testing::gpt_oss_120b();
  const auto hw = planner::load_profile(planner::testing::source_root() + "/profiles/h100-sxm.json");
  double now = 0;
  const planner::Mesh one{1, 1, 1, 1, 0};
  Scheduler s(Predictor(cfg, hw, {{"a", one, 16384, 1024, 8}, {"b", one, 16384, 1024, 8}}), Policy::Slo,
              [&] { return now; });
  Rng rng{seed};
  Overload out;
  out.window_s = arrivals.back().t;
  std::vector<double> ttft;
  std::vector<std::optional<Pass>> running(2);
  std::vector<double> starts(2, 0), ends(2, 0);
  size_t next_arrival = 0;
  for (;;) {
    double t = next_arrival < arrivals.size() ? arrivals[next_arrival].t : INFINITY;
    int ending = -1;
    for (int i = 0; i < 2; ++i)
      if (running[size_t(i)] && ends[size_t(i)] <= t) t = ends[size_t(i)], ending = i;
    if (!std::isfinite(t)) break;
    now = t;
    if (ending >= 0) {
      Pass& p = *running[size_t(ending)];
      for (const Job& j : p.jobs) {
        ttft.push_back(now - j.arrival_s);
        out.met += now <= j.arrival_s + j.slo_s + 1e-12;
      }
      s.complete(ending, p, now - starts[size_t(ending)]);
      running[size_t(ending)].reset();
    } else {
      const Arrival& a = arrivals[next_arrival];
      Job j;
      j.id = next_arrival++;
      j.tokens = a.tokens;
      j.arrival_s = a.t;
      j.slo_s = slo_s;
      ++out.sent;
      out.admitted += s.submit(j).admitted;
    }
    for (int i = 0; i < 2; ++i) {
      if (running[size_t(i)]) continue;
      if (auto p = s.next(i)) {
        std::vector<int64_t> lengths;
        for (const Job& j : p->jobs) lengths.push_back(j.tokens);
        const bool shared = bool(running[size_t(1 - i)]);
        double factor = m.base * (shared ? 1.0 : 0.65) * std::exp(m.sigma * rng.normal());
        if (rng.uniform() < m.stall_p) factor *= 2;
        starts[size_t(i)] = now;
        ends[size_t(i)] = now + s.predictor().model_seconds(i, lengths) * factor;
        running[size_t(i)] = std::move(p);
      }
    }
  }
  std::sort(ttft.begin(), ttft.end());
  // Nearest rank, as bench_serve.py's p99 is near it for hundreds of requests.
  if (!ttft.empty()) out.admitted_p99_s = ttft[std::min(ttft.size() - 1, size_t(std::ceil(0.99 * double(ttft.size()))) - 1)];
  return out;
}

// The overload: 2x the planner's capacity for the mixed-256-8k mix, with the SLO at
// 1.86x the model's 8K time (5 s against 2.69 s in docs/serving.md: an 8K prompt cannot meet it
// once the correction has learnt the machine), for a quiet machine 2.4x slower than its profile
// and a busy one that is also noisy and stalls a pass in ten. The admitted requests' p99 TTFT
// must be within the SLO on both, and goodput must not fall below the planner's capacity for the
// machine as it really is (batching short prompts serves more than that). Under the old admission (the correction
// alone, an overrun pass counted as ending now, queueing on an unmeasured instance) the p99 is
// over the SLO on both machines.
TEST(ServeSchedulerLoad, AdmittedP99HoldsAtTwiceTheCapacityOnAMachineUnlikeItsProfile) {
  const auto cfg = planner::testing::gpt_oss_120b();
  const auto hw = planner::load_profile(planner::testing::source_root() + "/profiles/h100-sxm.json");
  const std::vector<int64_t> mix = {256, 512, 1024, 2048, 4096, 8192};
  double mean_service = 0;
  for (int64_t n : mix) mean_service += planner::predict(cfg, hw, {1, 1, 1, 1, 0}, n).service_s / double(mix.size());
  const double capacity = 2 / mean_service;
  const double slo = 1.86 * planner::predict(cfg, hw, {1, 1, 1, 1, 0}, 8192).ttft_s;
  Rng rng{7};
  std::vector<Arrival> arrivals;
  double t = 0;
  for (int k = 0; k < 4000; ++k) {
    t += rng.exponential(2 * capacity);
    arrivals.push_back({t, mix[rng.next() % mix.size()], 1});
  }
  for (const Machine& m : {Machine{2.4, 0.05, 0}, Machine{2.4, 0.2, 0.1}}) {
    const Overload o = simulate_machine(arrivals, slo, m, 11);
    // The planner's capacity on this machine: the profile's, divided by how much slower it is.
    const double machine_capacity = capacity / m.base;
    std::printf("machine %.1fx, noise %.2f, stalls %.0f%%: offered %.1f req/s (2x the planner's %.2f), %d of %d "
                "admitted, p99 %.3f s against the SLO %.3f s, goodput %.2f req/s (the planner's capacity on this "
                "machine: %.2f)\n",
                m.base, m.sigma, 100 * m.stall_p, 2 * capacity, capacity, o.admitted, o.sent, o.admitted_p99_s, slo,
                o.goodput(), machine_capacity);
    EXPECT_LE(o.admitted_p99_s, slo) << "machine " << m.base << "x, noise " << m.sigma;
    EXPECT_GE(o.goodput(), machine_capacity) << "machine " << m.base << "x, noise " << m.sigma;
    EXPECT_LT(o.admitted, o.sent);
  }
}

}  // namespace
}  // namespace slope::serve
