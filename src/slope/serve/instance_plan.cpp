#include "slope/serve/instance_plan.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "slope/core/error.h"
#include "slope/serve/mesh_spec.h"

namespace slope::serve {
namespace {

std::string seconds(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << s << " s";
  return o.str();
}

planner::ContextPlan plan_for(const model::ModelConfig& cfg, const planner::HardwareProfile& hw,
                              const planner::Cluster& cluster, int64_t tokens, double slo_s) {
  planner::PlanOptions opt;
  opt.contexts = {tokens};
  opt.ttft_slo_s = slo_s;
  opt.max_listed = 1000;
  return planner::make_plan(cfg, hw, cluster, opt).contexts.at(0);
}

// A cluster of `devices` devices laid out as the profile's nodes: whole nodes when they divide,
// else one node of that many devices.
planner::Cluster sub_cluster(const planner::Cluster& c, int devices) {
  if (c.devices_per_node > 0 && devices % c.devices_per_node == 0) return {devices / c.devices_per_node, c.devices_per_node};
  return {1, devices};
}

}  // namespace

InstancePlan plan_instances(const model::ModelConfig& cfg, const planner::HardwareProfile& hw,
                            const planner::Cluster& cluster, std::vector<int64_t> lengths, double ttft_slo_s) {
  SLOPE_CHECK(!lengths.empty(), "--plan needs the expected prompt lengths (--plan-lengths 1k,8k)");
  SLOPE_CHECK(cluster.devices() > 0, "--plan needs at least one device");
  SLOPE_CHECK(ttft_slo_s > 0, "--plan needs a positive TTFT target (--slo-ms)");
  std::sort(lengths.begin(), lengths.end());
  InstancePlan out;
  const int64_t longest = lengths.back(), shortest = lengths.front();

  const planner::ContextPlan lp = plan_for(cfg, hw, cluster, longest, ttft_slo_s);
  if (lp.feasible.empty()) {
    std::string best = lp.best_ttft ? str_cat("; the best reachable is ", seconds(lp.best_ttft->pred.ttft_s), " with ",
                                              lp.best_ttft->name())
                                    : "; no mesh fits the model in memory";
    fail("--plan: no deployment of ", cluster.devices(), " device(s) meets a TTFT of ", seconds(ttft_slo_s), " at ",
         longest, " tokens", best, "; raise --slo-ms, lower the longest --plan-lengths, or add devices");
  }
  const planner::Deployment* large = &lp.feasible.front();
  for (const planner::Deployment& d : lp.feasible)
    if (d.mesh.size() < large->mesh.size()) large = &d;
  const int large_ranks = large->mesh.size();
  out.instances.push_back(mesh_spec(large->mesh));
  out.notes.push_back(str_cat("longest length ", longest, " tokens: ", mesh_spec(large->mesh), " (", large_ranks,
                              " rank(s), predicted TTFT ", seconds(large->pred.ttft_s), "), the smallest mesh that meets ",
                              seconds(ttft_slo_s)));

  int left = cluster.devices() - large_ranks;
  if (left > 0 && shortest < longest) {
    const planner::ContextPlan sp = plan_for(cfg, hw, sub_cluster(cluster, left), shortest, ttft_slo_s);
    if (!sp.feasible.empty()) {
      const planner::Deployment& small = sp.feasible.front();
      for (int i = 0; i < small.instances; ++i) out.instances.push_back(mesh_spec(small.mesh));
      left -= small.instances * small.mesh.size();
      out.notes.push_back(str_cat("shortest length ", shortest, " tokens on the other ", cluster.devices() - large_ranks,
                                  " device(s): ", small.instances, " x ", mesh_spec(small.mesh), " (predicted TTFT ",
                                  seconds(small.pred.ttft_s), ", the planner's best rate at the target)"));
    } else {
      out.notes.push_back(str_cat("shortest length ", shortest, " tokens: nothing meets the target on the other ", left,
                                  " device(s); they take copies of the large mesh"));
    }
  }
  while (left >= large_ranks) {
    out.instances.push_back(mesh_spec(large->mesh));
    left -= large_ranks;
  }
  if (left > 0) out.notes.push_back(str_cat(left, " device(s) left idle (no planned mesh fits them)"));
  return out;
}

}  // namespace slope::serve
