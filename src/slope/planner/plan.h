// The SLO planner: enumerate how a cluster of N nodes × D devices can be split into identical
// engine instances and how each instance is laid out (U, R, P, TP, chunk), predict TTFT with
// the cost model, keep what fits memory and meets the TTFT SLO at the requested quantile under
// queueing, and rank by the request rate the cluster sustains at the SLO.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "slope/model/config.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/hardware_profile.h"

namespace slope::planner {

struct Cluster {
  int nodes = 1;
  int devices_per_node = 8;
  int devices() const { return nodes * devices_per_node; }
};

struct PlanOptions {
  std::vector<int64_t> contexts;  // prompt lengths, tokens
  double ttft_slo_s = 1.0;
  double slo_quantile = 0.9;      // the SLO holds for this quantile of requests under load
  int max_listed = 10;            // deployments listed per context
  CostOptions cost;
};

struct Deployment {
  int instances = 1;     // identical engine instances the cluster is split into
  Mesh mesh;             // each instance's layout
  Prediction pred;       // one request on an idle instance
  double max_rate_rps = 0;  // cluster-wide request rate at which the SLO quantile still holds
  bool meets_slo = false;   // fits memory and idle TTFT <= SLO
  double capacity_rps() const { return pred.service_s > 0 ? instances / pred.service_s : 0; }
  std::string name() const;  // "2x U8 R2 P2 chunk 12800"
};

struct ContextPlan {
  int64_t tokens = 0;
  int considered = 0;                 // deployments evaluated (valid meshes)
  int fitting = 0;                    // of those, fitting memory
  std::vector<Deployment> feasible;   // fit and meet the SLO, best first (up to max_listed)
  int feasible_total = 0;
  std::optional<Deployment> best_ttft;  // the fastest deployment that fits, met or not
  std::optional<Deployment> tp_baseline;  // TP = D inside each node, one instance per node
  std::string tp_baseline_note;           // why there is none, or that it does not fit
};

struct Plan {
  std::string model;     // config source
  std::string hardware;  // profile name
  Cluster cluster;
  PlanOptions options;
  std::vector<ContextPlan> contexts;
};

// All valid (instances, mesh) deployments of the cluster for one prompt length, each with the
// best chunk size among the candidates; SLO-independent apart from the max-rate column.
std::vector<Deployment> enumerate_deployments(const model::ModelConfig& cfg, const HardwareProfile& hw,
                                              const Cluster& cluster, int64_t tokens, const PlanOptions& opt);

Plan make_plan(const model::ModelConfig& cfg, const HardwareProfile& hw, const Cluster& cluster,
               const PlanOptions& opt, const std::string& model_name = "");

// TTFT quantiles against offered load, per deployment, with requests split evenly at random
// over the instances (each an M/D/1 queue); loads above 95% utilisation are left out.
struct CurvePoint {
  double offered_rps = 0;  // cluster-wide
  double utilization = 0;
  double ttft_p50_s = 0;
  double ttft_p90_s = 0;
};
std::vector<CurvePoint> ttft_curve(const Deployment& d, const std::vector<double>& offered_rps);

// Writes `context_tokens,deployment,kind,offered_rps,utilization,ttft_p50_s,ttft_p90_s` rows for
// the listed deployments (up to 4 per context), the best-TTFT one when none meets the SLO, and
// the TP baseline.
void write_curves_csv(const Plan& plan, std::ostream& os, int points = 40);

std::string plan_to_text(const Plan& plan);
std::string plan_to_json(const Plan& plan);  // pretty-printed; schema in docs/planner.md

}  // namespace slope::planner
