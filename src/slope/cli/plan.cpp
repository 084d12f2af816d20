// `slope plan`: which deployments of a cluster meet a TTFT SLO at each context length, ranked
// by the request rate they sustain at the SLO, beside the TP-inside-a-node baseline.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/file_io.h"
#include "slope/core/sys.h"
#include "slope/core/error.h"
#include "slope/model/config.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/hardware_profile.h"
#include "slope/planner/parse.h"
#include "slope/planner/plan.h"

#include <nlohmann/json.hpp>

namespace slope::cli {
namespace {

// A config.json, the directory holding it, or the name of a shipped config (configs/NAME, found
// in the data directories: the current one, the installed share/slope, the source tree).
model::ModelConfig read_model(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path) && path.find('/') == std::string::npos) {
    const std::string shipped = find_data_path("configs/" + path);
    if (!shipped.empty()) return model::load_config(shipped);
  }
  if (fs::is_directory(path)) return model::load_config(path);
  SLOPE_CHECK(fs::exists(path), "cannot read model config '", path,
              "'; pass a HF config.json, the directory holding it, or a shipped config's name such as "
              "gpt-oss-120b (see configs/)");
  return model::parse_config(read_regular_file(path, "model config"), path);
}

// Lengths beyond the model's position limit are refused, as `slope run` refuses such prompts.
void check_contexts(const std::vector<int64_t>& contexts, const model::ModelConfig& cfg, const std::string& model) {
  for (int64_t n : contexts)
    SLOPE_CHECK(n <= cfg.max_position_embeddings, "--context ", n, " tokens is longer than ", model,
                " allows (max_position_embeddings ", cfg.max_position_embeddings,
                "); plan for at most that many tokens (k = 1024)");
}

// --dtype as `slope run` spells it (f32, bf16; also f16), named as the profiles' keys (fp32, ...).
std::string profile_dtype(const std::string& v) {
  if (v == "f16" || v == "fp16" || v == "float16") return "fp16";
  return parse_compute_dtype(v) == kernels::ComputeType::BF16 ? "bf16" : "fp32";
}

std::string seconds(double s) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(s < 10 ? 4 : 2);
  os << s;
  return os.str();
}

// `slope plan --predict`: the cost model for one mesh and one or more prompt lengths.
int cmd_predict(int argc, char** argv) {
  CLI::App app{"Predict TTFT, its per-phase breakdown and memory per rank for one parallel layout\n"
               "with the cost model of docs/planner.md.",
               "slope plan --predict"};
  setup_app(app);
  std::string model_path, profile_path, contexts_text, mesh_text, dtype_flag = kDefaultComputeDtype;
  bool predict_flag = false, json = false, no_engine = false;
  double eff_scale = 1.0;
  app.add_flag("--predict", predict_flag, "predict one configuration (this mode)");
  app.add_option("--model", model_path, "HF config.json, or the model directory holding it")->required();
  app.add_option("--hardware", profile_path, "hardware profile: a JSON file or a name in profiles/")->required();
  app.add_option("--mesh", mesh_text,
                 "U,R,P,TP[,chunk]: Ulysses, ring, pipeline stages, tensor parallel, tokens per pipeline "
                 "chunk (default for P > 1: the engine's max(256, ceil(N/(4P))); 0 = whole prompt)")
      ->required();
  app.add_option("--context", contexts_text, "prompt lengths, comma-separated: 4096,32k (k = 1024)")->required();
  app.add_option("--dtype", dtype_flag, "compute dtype of the GEMMs: bf16, f32 or f16 (as slope run --dtype)");
  app.add_option("--efficiency-scale", eff_scale, "multiply every compute efficiency of the profile (sensitivity)");
  app.add_flag("--no-engine-spec", no_engine, "ignore the profile's \"engine\" object (generic kernels)");
  app.add_flag("--json", json, "print one JSON object per length, one per line");
  if (const int code = parse_args(app, argc, argv, "plan --predict"); code >= 0) return code;
  const std::string dtype = profile_dtype(dtype_flag);
  SLOPE_CHECK(eff_scale > 0, "--efficiency-scale must be positive, got ", eff_scale);
  model::ModelConfig cfg = read_model(model_path);
  planner::HardwareProfile hw = planner::load_profile(profile_path);
  if (eff_scale != 1.0) hw = planner::scale_efficiency(hw, eff_scale);
  planner::CostOptions opt;
  opt.compute_dtype = dtype;
  opt.use_engine_spec = !no_engine;
  const std::vector<int64_t> contexts = planner::parse_contexts(contexts_text);
  check_contexts(contexts, cfg, model_path);
  for (int64_t n : contexts) {
    const planner::Mesh mesh = planner::parse_mesh(mesh_text, n);
    const planner::Prediction p = planner::predict(cfg, hw, mesh, n, opt);
    const planner::PhaseTimes& ph = p.phases;
    const std::pair<const char*, double> phases[] = {
        {"linear", ph.linear},           {"elementwise", ph.elementwise}, {"attention", ph.attention},
        {"ulysses", ph.ulysses},         {"ring_exposed", ph.ring_exposed}, {"halo", ph.halo},
        {"tp_allreduce", ph.tp_allreduce}, {"overhead", ph.overhead},     {"lm_head", ph.lm_head},
        {"pipeline_fill", ph.pipeline_fill}};
    if (json) {
      nlohmann::json j;
      j["model"] = model_path;
      j["hardware"] = hw.name;
      j["mesh"] = {{"U", mesh.ulysses}, {"R", mesh.ring}, {"P", mesh.pp}, {"TP", mesh.tp}, {"chunk", mesh.pp_chunk}};
      j["mesh_name"] = planner::mesh_name(mesh);
      j["dtype"] = dtype;
      j["tokens"] = n;
      j["chunks"] = p.chunks;
      j["ttft_s"] = p.ttft_s;
      j["service_s"] = p.service_s;
      for (const auto& [k, v] : phases) j["phases_s"][k] = v;
      j["flops_per_rank"] = p.flops_per_rank;
      j["flops_total"] = p.flops_total;
      j["bytes_sent_per_rank"] = {{"ulysses", p.ulysses_bytes}, {"ring", p.ring_bytes}, {"halo", p.halo_bytes},
                                  {"pipeline", p.pipeline_bytes}, {"allreduce", p.allreduce_bytes}};
      j["memory_bytes"] = {{"weights", p.memory.weights}, {"kv_cache", p.memory.kv_cache},
                           {"attention_workspace", p.memory.attention_workspace},
                           {"activations", p.memory.activations}, {"total", p.memory.total()},
                           {"capacity", p.memory_capacity}};
      j["fits"] = p.fits;
      std::cout << j.dump() << "\n";
    } else {
      if (n == contexts.front())
        std::cout << "mesh: U Ulysses degree, R ring degree, P pipeline stages, TP tensor-parallel degree "
                     "(1 when absent), chunk = tokens per pipeline chunk; service = time the mesh is busy\n\n";
      std::cout << cfg.architecture << " on " << hw.name << ", " << planner::mesh_name(mesh) << ", " << n << " tokens ("
                << p.chunks << " chunk" << (p.chunks == 1 ? "" : "s") << ", " << dtype_flag << ")\n";
      std::cout << "  TTFT " << seconds(p.ttft_s) << " s   service " << seconds(p.service_s) << " s   "
                << p.flops_per_rank / 1e9 << " GFLOP on the busiest rank\n";
      for (const auto& [k, v] : phases)
        if (v > 0) std::cout << "  " << k << std::string(15 - std::string(k).size(), ' ') << seconds(v) << " s\n";
      std::cout << "  memory per rank " << p.memory.total() / 1e9 << " GB of " << p.memory_capacity / 1e9
                << " GB usable" << (p.fits ? "" : "  (DOES NOT FIT)") << "\n";
    }
  }
  return 0;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--predict") return cmd_predict(argc, argv);
  CLI::App app{"Pick parallel configurations and instance counts that meet a TTFT SLO.\n"
               "Predictions come from the cost model in docs/planner.md; datasheet profiles carry\n"
               "assumed efficiencies until calibrated. `slope plan --predict --mesh U,R,P,TP[,chunk]`\n"
               "predicts one configuration (see `slope plan --predict --help`).",
               "slope plan"};
  setup_app(app);
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
  if (const int code = parse_args(app, argc, argv, "plan"); code >= 0) return code;

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
  opt.contexts = planner::parse_contexts(contexts_text);
  check_contexts(opt.contexts, cfg, model_path);
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
