#include "slope/planner/plan.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/planner/queueing.h"

namespace slope::planner {

using model::ModelConfig;

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Pipeline chunk sizes tried for P > 1: the whole prompt (plain layer split) and P·2^i chunks
// (i = 0..3, at most 64 chunks), each a multiple of the 2R·U zigzag pieces and at least 1024
// tokens, so that per-rank GEMMs stay reasonably shaped.
std::vector<int64_t> chunk_candidates(int64_t tokens, const Mesh& m) {
  std::vector<int64_t> out{0};
  if (m.pp == 1) return out;
  const int64_t align = int64_t(m.ring) * m.ulysses * 2;  // zigzag: 2R pieces, each split over U
  for (int64_t c = m.pp; c <= 8LL * m.pp && c <= 64; c *= 2) {
    int64_t size = (tokens + c - 1) / c;
    size = (size + align - 1) / align * align;
    if (size < tokens && size >= std::max<int64_t>(1024, align * 8)) out.push_back(size);
  }
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Ordering of deployments: meeting the SLO first; then more requests per second at the SLO;
// then lower TTFT.
bool better(const Deployment& a, const Deployment& b) {
  if (a.meets_slo != b.meets_slo) return a.meets_slo;
  if (a.meets_slo && std::abs(a.max_rate_rps - b.max_rate_rps) > 1e-12 * std::max(a.max_rate_rps, b.max_rate_rps))
    return a.max_rate_rps > b.max_rate_rps;
  return a.pred.ttft_s < b.pred.ttft_s;
}

Deployment evaluate(const ModelConfig& cfg, const HardwareProfile& hw, int instances, const Mesh& m, int64_t tokens,
                    const PlanOptions& opt) {
  Deployment d;
  d.instances = instances;
  d.mesh = m;
  d.pred = predict(cfg, hw, m, tokens, opt.cost);
  d.mesh.pp_chunk = d.pred.chunks > 1 ? m.pp_chunk : 0;
  d.pred.mesh = d.mesh;
  d.meets_slo = d.pred.fits && d.pred.ttft_s <= opt.ttft_slo_s;
  if (d.meets_slo)
    d.max_rate_rps = instances * md1_max_rate(d.pred.service_s, d.pred.ttft_s, opt.ttft_slo_s, opt.slo_quantile);
  return d;
}

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

std::string gb(double bytes) { return fmt(bytes / 1e9, 1); }

nlohmann::json deployment_json(const Deployment& d, double slo_quantile) {
  const Prediction& p = d.pred;
  nlohmann::json j;
  j["name"] = d.name();
  j["instances"] = d.instances;
  j["mesh"] = {{"U", d.mesh.ulysses}, {"R", d.mesh.ring}, {"P", d.mesh.pp}, {"TP", d.mesh.tp}, {"chunk", d.mesh.pp_chunk},
               {"ranks", d.mesh.size()}};
  j["ttft_s"] = p.ttft_s;
  j["service_s"] = p.service_s;
  j["meets_slo"] = d.meets_slo;
  j["max_rate_rps"] = d.max_rate_rps;
  j["max_tokens_per_s"] = d.max_rate_rps * double(p.tokens);
  j["capacity_rps"] = d.capacity_rps();
  j["slo_quantile"] = slo_quantile;
  const PhaseTimes& t = p.phases;
  j["phases_s"] = {{"linear", t.linear},         {"elementwise", t.elementwise}, {"attention", t.attention},
                   {"ulysses", t.ulysses},       {"ring_exposed", t.ring_exposed}, {"halo", t.halo},
                   {"tp_allreduce", t.tp_allreduce}, {"overhead", t.overhead},   {"lm_head", t.lm_head},
                   {"pipeline_fill", t.pipeline_fill}};
  j["flops_per_rank"] = p.flops_per_rank;
  j["bytes_sent_per_rank"] = {{"ulysses", p.ulysses_bytes}, {"ring", p.ring_bytes}, {"halo", p.halo_bytes},
                              {"pipeline", p.pipeline_bytes}, {"allreduce", p.allreduce_bytes}};
  j["memory_per_rank_bytes"] = {{"weights", p.memory.weights},
                                {"kv_cache", p.memory.kv_cache},
                                {"attention_workspace", p.memory.attention_workspace},
                                {"activations", p.memory.activations},
                                {"total", p.memory.total()},
                                {"capacity", p.memory_capacity}};
  j["fits"] = p.fits;
  return j;
}

}  // namespace

std::string Deployment::name() const { return std::to_string(instances) + "x " + mesh_name(mesh); }

std::vector<Deployment> enumerate_deployments(const ModelConfig& cfg, const HardwareProfile& hw, const Cluster& cl,
                                              int64_t tokens, const PlanOptions& opt) {
  const int D = cl.devices_per_node, total = cl.devices();
  std::vector<Deployment> out;
  for (int s : divisors(total)) {
    // Instances pack whole nodes, or a whole number of them fill a node.
    if (s < D ? D % s != 0 : s % D != 0) continue;
    const int instances = total / s;
    for (int tp : divisors(D))
      for (int u : divisors(D / tp)) {
        if (s % (u * tp) != 0) continue;
        for (int p : divisors(s / (u * tp))) {
          Mesh m{p, s / (u * tp * p), u, tp, 0};
          if (!mesh_problem(cfg, hw, m).empty()) continue;
          std::optional<Deployment> best;
          for (int64_t c : chunk_candidates(tokens, m)) {
            m.pp_chunk = c;
            Deployment d = evaluate(cfg, hw, instances, m, tokens, opt);
            if (!best || (d.pred.fits && !best->pred.fits) || (d.pred.fits == best->pred.fits && better(d, *best)))
              best = d;
          }
          out.push_back(*best);
        }
      }
  }
  return out;
}

Plan make_plan(const ModelConfig& cfg, const HardwareProfile& hw, const Cluster& cl, const PlanOptions& opt,
               const std::string& model_name) {
  SLOPE_CHECK(cl.nodes >= 1, "--nodes must be at least 1, got ", cl.nodes);
  SLOPE_CHECK(cl.devices_per_node >= 1, "--devices-per-node must be at least 1, got ", cl.devices_per_node);
  SLOPE_CHECK(cl.devices_per_node <= kMaxMeshDegree && int64_t(cl.nodes) * cl.devices_per_node <= kMaxMeshRanks,
              "a cluster of ", cl.nodes, " nodes of ", cl.devices_per_node, " devices is more than the planner models (",
              kMaxMeshDegree, " devices per node, ", kMaxMeshRanks, " in all)");
  SLOPE_CHECK(!opt.contexts.empty(), "no context lengths given; pass e.g. --context 32k,64k,100k");
  SLOPE_CHECK(opt.ttft_slo_s > 0, "the TTFT SLO must be positive seconds, got ", opt.ttft_slo_s);
  SLOPE_CHECK(opt.slo_quantile > 0 && opt.slo_quantile < 1, "the SLO quantile must be in (0, 1), got ",
              opt.slo_quantile);
  // The cluster's node size decides placement; the profile's per-device link rates are kept
  // even when it describes a different node size.
  HardwareProfile h = hw;
  h.node.devices_per_node = cl.devices_per_node;

  Plan plan;
  plan.model = model_name.empty() ? cfg.architecture : model_name;
  plan.hardware = hw.name;
  plan.cluster = cl;
  plan.options = opt;
  for (int64_t n : opt.contexts) {
    SLOPE_CHECK(n >= 1 && n <= kMaxContextTokens, "context lengths must be between 1 and ", kMaxContextTokens,
                " tokens, got ", n);
    ContextPlan cp;
    cp.tokens = n;
    std::vector<Deployment> all = enumerate_deployments(cfg, h, cl, n, opt);
    cp.considered = int(all.size());
    for (const auto& d : all) {
      if (!d.pred.fits) continue;
      ++cp.fitting;
      if (!cp.best_ttft || d.pred.ttft_s < cp.best_ttft->pred.ttft_s) cp.best_ttft = d;
      if (d.meets_slo) cp.feasible.push_back(d);
    }
    std::sort(cp.feasible.begin(), cp.feasible.end(), better);
    cp.feasible_total = int(cp.feasible.size());
    if (int(cp.feasible.size()) > opt.max_listed) cp.feasible.resize(std::max(0, opt.max_listed));

    Mesh tp{1, 1, 1, cl.devices_per_node, 0};
    if (auto why = mesh_problem(cfg, h, tp); !why.empty()) {
      cp.tp_baseline_note = "TP" + std::to_string(cl.devices_per_node) + " is not a valid layout: " + why;
    } else {
      cp.tp_baseline = evaluate(cfg, h, cl.nodes, tp, n, opt);
      if (!cp.tp_baseline->pred.fits) cp.tp_baseline_note = "does not fit device memory";
    }
    plan.contexts.push_back(std::move(cp));
  }
  return plan;
}

std::vector<CurvePoint> ttft_curve(const Deployment& d, const std::vector<double>& offered_rps) {
  std::vector<CurvePoint> out;
  const double S = d.pred.service_s;
  for (double rate : offered_rps) {
    const double lambda = rate / d.instances;  // random split over identical instances
    const double rho = lambda * S;
    if (rho > 0.95) continue;  // past this the curve is a wall
    out.push_back({rate, rho, d.pred.ttft_s + md1_wait_quantile(lambda, S, 0.5),
                   d.pred.ttft_s + md1_wait_quantile(lambda, S, 0.9)});
  }
  return out;
}

void write_curves_csv(const Plan& plan, std::ostream& os, int points) {
  os << "context_tokens,deployment,kind,offered_rps,utilization,ttft_p50_s,ttft_p90_s\n";
  for (const auto& cp : plan.contexts) {
    std::vector<std::pair<const Deployment*, std::string>> series;
    for (size_t i = 0; i < cp.feasible.size() && i < 4; ++i) series.push_back({&cp.feasible[i], "planned"});
    if (cp.feasible.empty() && cp.best_ttft) series.push_back({&*cp.best_ttft, "best_ttft"});
    if (cp.tp_baseline && cp.tp_baseline->pred.fits) series.push_back({&*cp.tp_baseline, "tp_baseline"});
    double top = 0;
    for (const auto& [d, kind] : series) top = std::max(top, d->capacity_rps());
    std::vector<double> loads;
    for (int i = 0; i <= points; ++i) loads.push_back(top * i / points);
    for (const auto& [d, kind] : series)
      for (const auto& pt : ttft_curve(*d, loads))
        os << cp.tokens << "," << d->name() << "," << kind << "," << pt.offered_rps << "," << pt.utilization << ","
           << pt.ttft_p50_s << "," << pt.ttft_p90_s << "\n";
  }
}

std::string plan_to_text(const Plan& plan) {
  std::ostringstream os;
  const auto& o = plan.options;
  const int q = int(std::lround(o.slo_quantile * 100));
  os << "SLOPE plan: " << plan.model << " on " << plan.cluster.nodes << " nodes x " << plan.cluster.devices_per_node
     << " devices (" << plan.hardware << "), TTFT SLO " << fmt(o.ttft_slo_s, 3) << " s at p" << q << "\n"
     << "legend: deployment = instances x mesh, mesh = U Ulysses degree, R ring degree, P pipeline stages, TP\n"
     << "  tensor-parallel degree (1 when absent), chunk = tokens per pipeline chunk; TTFT s = one request alone;\n"
     << "  req/s@SLO = highest arrival rate (all instances) at which p" << q << " TTFT stays within the SLO;\n"
     << "  tok/s@SLO = that rate x the context; cap req/s = instances / service time; GB/rank = peak memory\n"
     << "  per device. Contexts are exact token counts (k = 1024: 100k = 102,400 tokens).\n";
  for (const auto& cp : plan.contexts) {
    os << "\ncontext " << cp.tokens << " tokens: " << cp.considered << " deployments, " << cp.fitting
       << " fit memory, " << cp.feasible_total << " meet the SLO\n";
    auto row = [&](const Deployment& d) {
      os << "  " << std::left << std::setw(30) << d.name() << std::right << std::setw(9) << fmt(d.pred.ttft_s, 3)
         << std::setw(12) << fmt(d.max_rate_rps, 3) << std::setw(13) << fmt(d.max_rate_rps * double(cp.tokens), 0)
         << std::setw(11) << fmt(d.capacity_rps(), 3) << std::setw(10) << gb(d.pred.memory.total()) << "\n";
    };
    auto header = [&] {
      os << "  " << std::left << std::setw(30) << "deployment" << std::right << std::setw(9) << "TTFT s" << std::setw(12)
         << "req/s@SLO" << std::setw(13) << "tok/s@SLO" << std::setw(11) << "cap req/s" << std::setw(10) << "GB/rank"
         << "\n";
    };
    if (!cp.feasible.empty()) {
      header();
      for (const auto& d : cp.feasible) row(d);
      const Deployment& b = cp.feasible.front();
      const PhaseTimes& t = b.pred.phases;
      os << "  best: " << b.name() << ": linear " << fmt(t.linear, 3) << ", attention " << fmt(t.attention, 3)
         << ", elementwise " << fmt(t.elementwise, 3) << ", ulysses " << fmt(t.ulysses, 3) << ", ring exposed "
         << fmt(t.ring_exposed, 3) << ", halo " << fmt(t.halo, 4) << ", tp all-reduce " << fmt(t.tp_allreduce, 3)
         << ", launches " << fmt(t.overhead, 3) << ", pipeline fill " << fmt(t.pipeline_fill, 3) << " s\n";
    } else if (cp.best_ttft) {
      os << "  no deployment meets the " << fmt(o.ttft_slo_s, 3) << " s SLO; the best reachable TTFT is "
         << fmt(cp.best_ttft->pred.ttft_s, 3) << " s with " << cp.best_ttft->name() << "\n";
    } else {
      os << "  no deployment fits device memory; add devices or use a larger-memory profile\n";
    }
    if (cp.tp_baseline) {
      const Deployment& b = *cp.tp_baseline;
      os << "  baseline " << b.name() << ": TTFT " << fmt(b.pred.ttft_s, 3) << " s, "
         << (b.meets_slo ? "meets the SLO, " + fmt(b.max_rate_rps, 3) + " req/s at the SLO"
                         : (b.pred.fits ? std::string("misses the SLO") : cp.tp_baseline_note))
         << ", capacity " << fmt(b.capacity_rps(), 3) << " req/s, " << gb(b.pred.memory.total()) << " GB/rank\n";
    } else {
      os << "  baseline: " << cp.tp_baseline_note << "\n";
    }
  }
  return os.str();
}

std::string plan_to_json(const Plan& plan) {
  nlohmann::json j;
  j["model"] = plan.model;
  j["hardware"] = plan.hardware;
  j["cluster"] = {{"nodes", plan.cluster.nodes}, {"devices_per_node", plan.cluster.devices_per_node}};
  j["ttft_slo_s"] = plan.options.ttft_slo_s;
  j["slo_quantile"] = plan.options.slo_quantile;
  j["contexts"] = nlohmann::json::array();
  for (const auto& cp : plan.contexts) {
    nlohmann::json c;
    c["tokens"] = cp.tokens;
    c["considered"] = cp.considered;
    c["fitting"] = cp.fitting;
    c["feasible_total"] = cp.feasible_total;
    c["deployments"] = nlohmann::json::array();
    for (const auto& d : cp.feasible) c["deployments"].push_back(deployment_json(d, plan.options.slo_quantile));
    c["meets_slo"] = !cp.feasible.empty();
    c["best_ttft"] = cp.best_ttft ? deployment_json(*cp.best_ttft, plan.options.slo_quantile) : nlohmann::json();
    c["tp_baseline"] = cp.tp_baseline ? deployment_json(*cp.tp_baseline, plan.options.slo_quantile) : nlohmann::json();
    c["tp_baseline_note"] = cp.tp_baseline_note;
    j["contexts"].push_back(c);
  }
  return j.dump(2);
}

}  // namespace slope::planner
