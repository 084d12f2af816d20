#include "slope/planner/queueing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "slope/core/error.h"

namespace slope::planner {

double md1_mean_wait(double lambda, double service_s) {
  const double rho = lambda * service_s;
  if (rho >= 1) return std::numeric_limits<double>::infinity();
  return rho * service_s / (2 * (1 - rho));
}

double md1_wait_quantile(double lambda, double service_s, double q) {
  SLOPE_CHECK(q > 0 && q < 1, "quantile must be in (0, 1), got ", q);
  const double rho = lambda * service_s;
  if (rho >= 1) return std::numeric_limits<double>::infinity();
  if (rho <= 1 - q) return 0;  // P(W > 0) = ρ <= 1 - q
  return md1_mean_wait(lambda, service_s) / rho * std::log(rho / (1 - q));
}

double md1_max_rate(double service_s, double fixed_s, double slo_s, double q) {
  if (fixed_s > slo_s || service_s <= 0) return 0;
  // w_q grows with ρ from 0 at ρ = 1 - q to infinity at ρ = 1: bisect on ρ.
  double lo = 1 - q, hi = 1;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (fixed_s + md1_wait_quantile(mid / service_s, service_s, q) <= slo_s)
      lo = mid;
    else
      hi = mid;
  }
  return lo / service_s;
}

std::vector<double> md1_simulated_waits(double lambda, double service_s, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(lambda);
  std::vector<double> w(static_cast<size_t>(n), 0.0);
  // Lindley: W_{i+1} = max(0, W_i + S - A_{i+1}).
  for (int64_t i = 1; i < n; ++i) w[i] = std::max(0.0, w[i - 1] + service_s - gap(rng));
  return w;
}

}  // namespace slope::planner
