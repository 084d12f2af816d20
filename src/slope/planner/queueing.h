// Queueing of prefill requests on one engine instance. An instance runs one prompt at a time
// (long prompts do not batch profitably), so with Poisson arrivals and a fixed prompt length
// it is an M/D/1 queue: arrival rate λ, deterministic service time S (the busiest pipeline
// stage's occupancy per request), FCFS.
//
// Mean wait (Pollaczek–Khinchine, c_s² = 0):  E[W] = ρS / (2(1 − ρ)),  ρ = λS.
// Quantiles use the standard M/G/1 approximation: an arrival waits with probability ρ, and the
// conditional wait is exponential with mean E[W]/ρ:
//   P(W > w) ≈ ρ·exp(−ρw/E[W])  ⇒  w_q = (E[W]/ρ)·ln(ρ/(1 − q))  for ρ > 1 − q, else 0.
// Against a simulation (md1_simulated_waits) its p90 is within 7% for ρ ∈ [0.3, 0.95]
// (docs/planner.md); the test suite checks it.
#pragma once

#include <cstdint>
#include <vector>

namespace slope::planner {

double md1_mean_wait(double lambda, double service_s);
// q-quantile of the waiting time, q in (0, 1); infinity when ρ >= 1.
double md1_wait_quantile(double lambda, double service_s, double q);
// Largest arrival rate λ at which fixed_s + w_q(λ) <= slo_s; 0 when fixed_s > slo_s.
double md1_max_rate(double service_s, double fixed_s, double slo_s, double q);
// Waiting times of n consecutive arrivals (Lindley recursion), for checking the approximation.
std::vector<double> md1_simulated_waits(double lambda, double service_s, int64_t n, uint64_t seed);

}  // namespace slope::planner
