// `slope serve --plan`: the instances chosen for a machine, an expected length mix and a target
// follow the rule in serve/instance_plan.h, checked against the planner's own predictions.
#include <gtest/gtest.h>

#include <algorithm>

#include "../planner/planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/engine/topology.h"
#include "slope/planner/cost_model.h"
#include "slope/serve/instance_plan.h"
#include "slope/serve/mesh_spec.h"

namespace slope::serve {
namespace {

model::ModelConfig gpt_oss_120b() { return model::load_config(planner::testing::source_root() + "/configs/gpt-oss-120b"); }
planner::HardwareProfile mi250() {
  return planner::load_profile(planner::testing::source_root() + "/profiles/mi250-gcd.json");
}

TEST(InstancePlan, LargeInstanceMeetsTheLongestLengthAndSmallOnesTakeTheRest) {
  const model::ModelConfig cfg = gpt_oss_120b();
  const planner::HardwareProfile hw = mi250();
  const planner::Cluster cluster{4, 8};
  const double slo = 2.0;
  const InstancePlan p = plan_instances(cfg, hw, cluster, {8192, 65536}, slo);
  ASSERT_GE(p.instances.size(), 2u);
  int ranks = 0;
  for (const std::string& spec : p.instances) {
    const engine::ParallelShape m = parse_mesh_spec(spec);
    EXPECT_NO_THROW(engine::validate_shape(m, m.size(), cfg, 65536)) << spec;
    ranks += m.size();
  }
  EXPECT_LE(ranks, cluster.devices());
  // The large instance meets the target at the longest length by the cost model, and no mesh
  // with fewer ranks does.
  const engine::ParallelShape large = parse_mesh_spec(p.instances[0]);
  const planner::Prediction lp = planner::predict(cfg, hw, large, 65536);
  EXPECT_TRUE(lp.fits);
  EXPECT_LE(lp.ttft_s, slo);
  for (const planner::Deployment& d : planner::enumerate_deployments(cfg, hw, cluster, 65536, {}))
    if (d.pred.fits && d.pred.ttft_s <= slo) {
      EXPECT_GE(d.mesh.size(), large.size()) << d.name();
    }
  // Every other instance meets the target at the shortest length, and is smaller than the large one.
  for (size_t i = 1; i < p.instances.size(); ++i) {
    const engine::ParallelShape m = parse_mesh_spec(p.instances[i]);
    const planner::Prediction sp = planner::predict(cfg, hw, m, 8192);
    EXPECT_TRUE(sp.fits) << p.instances[i];
    EXPECT_LE(sp.ttft_s, slo) << p.instances[i];
    EXPECT_LE(m.size(), large.size()) << p.instances[i];
  }
  EXPECT_FALSE(p.notes.empty());
}

TEST(InstancePlan, OneLengthFillsTheMachineWithTheLargeMesh) {
  const planner::Cluster cluster{4, 8};
  const InstancePlan p = plan_instances(gpt_oss_120b(), mi250(), cluster, {32768}, 1.0);
  ASSERT_FALSE(p.instances.empty());
  for (const std::string& s : p.instances) EXPECT_EQ(s, p.instances[0]);
  EXPECT_GT(int(p.instances.size()) * parse_mesh_spec(p.instances[0]).size(), cluster.devices() / 2);
}

TEST(InstancePlan, ATargetNothingMeetsIsAClearError) {
  try {
    plan_instances(gpt_oss_120b(), mi250(), {1, 8}, {102400}, 0.01);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no deployment"), std::string::npos) << m;
    EXPECT_NE(m.find("best reachable"), std::string::npos) << m;
  }
  EXPECT_THROW(plan_instances(gpt_oss_120b(), mi250(), {1, 8}, {}, 1.0), Error);
}

}  // namespace
}  // namespace slope::serve
