// The planner on shipped profiles: what it lists fits memory and meets the SLO, the output
// parses, nothing that does not fit is chosen, and "nothing meets the SLO" is reported.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/plan.h"
#include "slope/planner/queueing.h"

namespace slope::planner {
namespace {

HardwareProfile shipped(const std::string& name) {
  return load_profile(testing::source_root() + "/profiles/" + name + ".json");
}

PlanOptions options(std::vector<int64_t> contexts, double slo) {
  PlanOptions o;
  o.contexts = std::move(contexts);
  o.ttft_slo_s = slo;
  o.max_listed = 1000;
  return o;
}

TEST(Plan, EveryListedDeploymentFitsAndMeetsTheSlo) {
  const auto cfg = testing::gpt_oss_120b();
  const auto hw = shipped("mi250-gcd");
  const Cluster cl{4, 8};
  Plan plan = make_plan(cfg, hw, cl, options({32768, 65536, 100000}, 2.0));
  ASSERT_EQ(plan.contexts.size(), 3u);

  nlohmann::json j = nlohmann::json::parse(plan_to_json(plan));
  ASSERT_EQ(j["contexts"].size(), 3u);
  for (const auto& c : j["contexts"]) {
    EXPECT_GT(c["considered"].get<int>(), 0);
    ASSERT_TRUE(c["meets_slo"].get<bool>()) << "no deployment meets 2 s at " << c["tokens"];
    double prev_rate = 1e300;
    for (const auto& d : c["deployments"]) {
      EXPECT_TRUE(d["meets_slo"].get<bool>());
      EXPECT_TRUE(d["fits"].get<bool>());
      EXPECT_LE(d["ttft_s"].get<double>(), 2.0);
      EXPECT_LE(d["memory_per_rank_bytes"]["total"].get<double>(), d["memory_per_rank_bytes"]["capacity"].get<double>());
      EXPECT_EQ(d["instances"].get<int>() * d["mesh"]["ranks"].get<int>(), 32) << d["name"];
      EXPECT_GT(d["max_rate_rps"].get<double>(), 0);
      EXPECT_LE(d["max_rate_rps"].get<double>(), prev_rate * (1 + 1e-12)) << "ranked by rate at the SLO";
      prev_rate = d["max_rate_rps"].get<double>();
      // At its listed rate the p90 TTFT of an instance is the SLO (or under it).
      const double lambda = d["max_rate_rps"].get<double>() / d["instances"].get<int>();
      EXPECT_LE(d["ttft_s"].get<double>() + md1_wait_quantile(lambda, d["service_s"].get<double>(), 0.9), 2.0 + 1e-6);
    }
    ASSERT_FALSE(c["tp_baseline"].is_null());
    EXPECT_EQ(c["tp_baseline"]["mesh"]["TP"].get<int>(), 8);
    EXPECT_EQ(c["tp_baseline"]["instances"].get<int>(), 4);
  }
}

TEST(Plan, DeploymentsThatDoNotFitAreNeverChosen) {
  const auto cfg = testing::gpt_oss_120b();
  const auto hw = shipped("mi250-gcd");
  // gpt-oss-120b (65 GB of weights) does not fit one 64 GB GCD: single-rank instances, and
  // any P1 TP1 layout, must be absent from the list.
  Plan plan = make_plan(cfg, hw, Cluster{1, 8}, options({32768}, 100.0));
  const ContextPlan& cp = plan.contexts[0];
  ASSERT_FALSE(cp.feasible.empty());
  EXPECT_LT(cp.fitting, cp.considered);
  for (const auto& d : cp.feasible) {
    EXPECT_TRUE(d.pred.fits);
    EXPECT_LE(d.pred.memory.total(), d.pred.memory_capacity);
    EXPECT_FALSE(d.mesh.pp == 1 && d.mesh.tp == 1) << d.name();
  }
  // Every deployment the enumeration marks as not fitting really exceeds the capacity.
  for (const auto& d : enumerate_deployments(cfg, hw, Cluster{1, 8}, 32768, options({32768}, 100.0)))
    EXPECT_EQ(d.pred.fits, d.pred.memory.total() <= d.pred.memory_capacity) << d.name();
}

TEST(Plan, SaysSoWhenNothingMeetsTheSlo) {
  const auto cfg = testing::gpt_oss_120b();
  Plan plan = make_plan(cfg, shipped("mi250-gcd"), Cluster{1, 8}, options({100000}, 0.05));
  const ContextPlan& cp = plan.contexts[0];
  EXPECT_TRUE(cp.feasible.empty());
  ASSERT_TRUE(cp.best_ttft.has_value());
  EXPECT_GT(cp.best_ttft->pred.ttft_s, 0.05);
  const std::string text = plan_to_text(plan);
  EXPECT_NE(text.find("no deployment meets"), std::string::npos) << text;
  EXPECT_NE(text.find(cp.best_ttft->name()), std::string::npos);
  // Nothing fits on a single GCD at all.
  Plan none = make_plan(cfg, shipped("mi250-gcd"), Cluster{1, 1}, options({32768}, 10.0));
  EXPECT_EQ(none.contexts[0].fitting, 0);
  EXPECT_FALSE(none.contexts[0].best_ttft.has_value());
  EXPECT_NE(plan_to_text(none).find("no deployment fits"), std::string::npos);
}

TEST(Plan, BestTtftIsAtLeastAsFastAsEveryListedOne) {
  const auto cfg = testing::gpt_oss_120b();
  Plan plan = make_plan(cfg, shipped("h100-sxm"), Cluster{2, 8}, options({65536}, 5.0));
  const ContextPlan& cp = plan.contexts[0];
  ASSERT_TRUE(cp.best_ttft.has_value());
  for (const auto& d : cp.feasible) EXPECT_LE(cp.best_ttft->pred.ttft_s, d.pred.ttft_s);
}

TEST(Plan, CurvesCsv) {
  const auto cfg = testing::gpt_oss_120b();
  Plan plan = make_plan(cfg, shipped("mi250-gcd"), Cluster{4, 8}, options({32768}, 1.0));
  std::ostringstream os;
  write_curves_csv(plan, os, 10);
  std::istringstream in(os.str());
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "context_tokens,deployment,kind,offered_rps,utilization,ttft_p50_s,ttft_p90_s");
  int rows = 0, baseline = 0;
  while (std::getline(in, line)) {
    ++rows;
    baseline += line.find(",tp_baseline,") != std::string::npos;
  }
  EXPECT_GT(rows, 10);
  EXPECT_GT(baseline, 0);
  // TTFT quantiles grow with load.
  const Deployment& d = plan.contexts[0].feasible.at(0);
  auto pts = ttft_curve(d, {0.0, 0.3 * d.capacity_rps(), 0.6 * d.capacity_rps(), 0.9 * d.capacity_rps()});
  ASSERT_EQ(pts.size(), 4u);
  EXPECT_DOUBLE_EQ(pts[0].ttft_p90_s, d.pred.ttft_s);
  for (size_t i = 1; i < pts.size(); ++i) {
    EXPECT_GE(pts[i].ttft_p90_s, pts[i - 1].ttft_p90_s);
    EXPECT_GE(pts[i].ttft_p90_s, pts[i].ttft_p50_s);
  }
}

TEST(Plan, BadInputsThrow) {
  const auto cfg = testing::gpt_oss_120b();
  const auto hw = shipped("mi250-gcd");
  EXPECT_THROW(make_plan(cfg, hw, Cluster{0, 8}, options({1024}, 1.0)), Error);
  EXPECT_THROW(make_plan(cfg, hw, Cluster{1, 8}, options({}, 1.0)), Error);
  EXPECT_THROW(make_plan(cfg, hw, Cluster{1, 8}, options({1024}, 0.0)), Error);
  EXPECT_THROW(make_plan(cfg, hw, Cluster{1, 8}, options({-5}, 1.0)), Error);
}

}  // namespace
}  // namespace slope::planner
