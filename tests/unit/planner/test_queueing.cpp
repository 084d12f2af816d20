// The M/D/1 formulas against their definitions and against a simulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "slope/planner/queueing.h"

namespace slope::planner {
namespace {

TEST(Queueing, MeanWaitIsPollaczekKhinchine) {
  // ρ = 0.5, S = 2: ρS / (2(1-ρ)) = 1.
  EXPECT_DOUBLE_EQ(md1_mean_wait(0.25, 2.0), 1.0);
  EXPECT_TRUE(std::isinf(md1_mean_wait(1.0, 1.0)));
  // Below ρ = 1 - q nobody waits at the q-quantile.
  EXPECT_EQ(md1_wait_quantile(0.05, 1.0, 0.9), 0);
}

TEST(Queueing, QuantilesMatchSimulation) {
  const double S = 1.0;
  for (double rho : {0.5, 0.8, 0.9}) {
    auto w = md1_simulated_waits(rho / S, S, 400000, 7);
    std::sort(w.begin(), w.end());
    double sim_p90 = w[size_t(0.9 * double(w.size()))];
    double mean = 0;
    for (double x : w) mean += x;
    mean /= double(w.size());
    EXPECT_NEAR(mean, md1_mean_wait(rho / S, S), 0.05 * md1_mean_wait(rho / S, S)) << rho;
    EXPECT_NEAR(md1_wait_quantile(rho / S, S, 0.9), sim_p90, 0.10 * sim_p90) << rho;
  }
}

TEST(Queueing, MaxRateMeetsTheSloExactly) {
  // Service 0.5 s, idle TTFT 0.8 s, SLO 2 s at p90.
  double lambda = md1_max_rate(0.5, 0.8, 2.0, 0.9);
  EXPECT_GT(lambda * 0.5, 0.1);
  EXPECT_LT(lambda * 0.5, 1.0);
  EXPECT_NEAR(0.8 + md1_wait_quantile(lambda, 0.5, 0.9), 2.0, 1e-6);
  EXPECT_EQ(md1_max_rate(0.5, 2.5, 2.0, 0.9), 0);  // idle TTFT already over the SLO
}

}  // namespace
}  // namespace slope::planner
