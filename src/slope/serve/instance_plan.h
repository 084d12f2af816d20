// `slope serve --plan`: the planner picks the instances to start, given the machine's profile,
// the prompt lengths expected and the TTFT target. The rule (docs/serving.md, "--plan"):
//  1. The longest expected length decides the large instance: of the deployments the planner
//     finds meeting the target at that length, the mesh with the fewest ranks (it meets the
//     target alone and leaves the most devices for the rest).
//  2. The devices left go to the shortest expected length: the planner's best deployment for it
//     on those devices (its instances, each of its mesh), the small instances that keep short
//     prompts off the large one. If nothing meets the target there, they go to more copies of
//     the large mesh, and any remainder stays idle (said in the plan's notes).
// The scheduler then routes each request by its length (serve/scheduler.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slope/model/config.h"
#include "slope/planner/hardware_profile.h"
#include "slope/planner/plan.h"

namespace slope::serve {

struct InstancePlan {
  std::vector<std::string> instances;  // --instance specs, large instance first
  std::vector<std::string> notes;      // one line per decision, for the log
};

// Throws slope::Error naming the best reachable TTFT when no deployment meets the target at the
// longest length, or for empty lengths or a non-positive device count.
InstancePlan plan_instances(const model::ModelConfig& cfg, const planner::HardwareProfile& hw,
                            const planner::Cluster& cluster, std::vector<int64_t> lengths, double ttft_slo_s);

}  // namespace slope::serve
