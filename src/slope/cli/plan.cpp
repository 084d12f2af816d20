// `slope plan`: which deployments of a cluster meet a TTFT SLO at each context length, ranked
// by the request rate they sustain at the SLO, beside the TP-inside-a-node baseline.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/model/config.h"
#include "slope/planner/hardware_profile.h"
#include "slope/planner/plan.h"

namespace slope::cli {
namespace {

// "32k" = 32768, "1m" = 1048576 (binary multiples, as context windows are usually quoted);
// plain integers are exact, so "100000" is 100,000 tokens.
std::vector<int64_t> parse_contexts(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string s;
    for (char c : item)
      if (!std::isspace(static_cast<unsigned char>(c))) s += char(std::tolower(static_cast<unsigned char>(c)));
    SLOPE_CHECK(!s.empty(), "--context '", text, "' has an empty entry; write e.g. 32k,64k,100000");
    int64_t mult = 1;
    if (s.back() == 'k') mult = 1024, s.pop_back();
    else if (s.back() == 'm') mult = 1024 * 1024, s.pop_back();
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SLOPE_CHECK(used == s.size() && !s.empty() && v > 0, "--context entry '", item,
                "' is not a positive token count; write e.g. 32k,64k,100000 (k = 1024)");
    out.push_back(v * mult);
  }
  SLOPE_CHECK(!out.empty(), "--context is empty; write e.g. 32k,64k,100000");
  return out;
}

model::ModelConfig read_model(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return model::load_config(path);
  std::ifstream in(path);
  SLOPE_CHECK(in, "cannot read model config '", path,
              "'; pass a HF config.json or the directory holding it, e.g. configs/gpt-oss-120b");
  std::stringstream ss;
  ss << in.rdbuf();
  return model::parse_config(ss.str(), path);
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  CLI::App app{"Pick parallel configurations and instance counts that meet a TTFT SLO.\n"
               "Predictions come from the cost model in docs/planner.md; datasheet profiles carry\n"
               "assumed efficiencies until calibrated.",
               "slope plan"};
  std::string model_path, profile_path, contexts_text, curve_out;
  int nodes = 0, devices = 0, max_listed = 10;
  double slo = 0, quantile = 0.9, eff_scale = 1.0;
  bool json = false;
  app.add_option("--model", model_path, "HF config.json, or the model directory holding it")->required();
  app.add_option("--hardware", profile_path, "hardware profile: a JSON file or a name in profiles/")->required();
  app.add_option("--nodes", nodes, "number of nodes")->required();
  app.add_option("--devices-per-node", devices, "devices per node (default: the profile's)");
  app.add_option("--context", contexts_text, "prompt lengths, comma-separated: 32k,64k,100000 (k = 1024)")
      ->required();
  app.add_option("--ttft-slo", slo, "TTFT target in seconds")->required();
  app.add_option("--slo-quantile", quantile, "fraction of requests that must meet the SLO under load (0.9)");
  app.add_option("--efficiency-scale", eff_scale, "multiply every compute efficiency of the profile (sensitivity)");
  app.add_option("--list", max_listed, "deployments listed per context (10)");
  app.add_flag("--json", json, "print the plan as JSON");
  app.add_option("--curve-out", curve_out, "write TTFT p50/p90 against offered load as CSV to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  SLOPE_CHECK(nodes >= 1, "--nodes must be at least 1, got ", nodes);
  SLOPE_CHECK(slo > 0, "--ttft-slo must be a positive number of seconds, got ", slo);
  SLOPE_CHECK(quantile > 0 && quantile < 1, "--slo-quantile must be in (0, 1), e.g. 0.9; got ", quantile);
  SLOPE_CHECK(eff_scale > 0, "--efficiency-scale must be positive, got ", eff_scale);
  SLOPE_CHECK(devices >= 0, "--devices-per-node must be positive, got ", devices);
  SLOPE_CHECK(max_listed >= 1, "--list must be at least 1, got ", max_listed);

  model::ModelConfig cfg = read_model(model_path);
  planner::HardwareProfile hw = planner::load_profile(profile_path);
  if (eff_scale != 1.0) hw = planner::scale_efficiency(hw, eff_scale);
  planner::Cluster cluster{nodes, devices > 0 ? devices : hw.node.devices_per_node};

  planner::PlanOptions opt;
  opt.contexts = parse_contexts(contexts_text);
  opt.ttft_slo_s = slo;
  opt.slo_quantile = quantile;
  opt.max_listed = max_listed;
  planner::Plan plan = planner::make_plan(cfg, hw, cluster, opt, model_path);

  if (json)
    std::cout << planner::plan_to_json(plan) << "\n";
  else
    std::cout << planner::plan_to_text(plan);
  if (!curve_out.empty()) {
    std::ofstream out(curve_out);
    SLOPE_CHECK(out, "cannot write --curve-out file '", curve_out, "'; check the directory exists and is writable");
    planner::write_curves_csv(plan, out);
    SLOPE_CHECK(out.good(), "writing '", curve_out, "' failed (disk full?)");
    if (!json) std::cout << "\ncurves written to " << curve_out << " (plot: scripts/plot_planner_curves.sh " << curve_out << ")\n";
  }
  return 0;
}

}  // namespace slope::cli
