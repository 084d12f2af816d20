#include "slope/planner/hardware_profile.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/core/file_io.h"
#include "slope/core/sys.h"

namespace slope::planner {
namespace {

using nlohmann::json;

// Field readers that name the file and the JSON path of anything wrong, and say what a
// valid value looks like.
struct Reader {
  std::string source;

  const json& object(const json& parent, const std::string& key, const std::string& path) const {
    auto it = parent.find(key);
    SLOPE_CHECK(it != parent.end(), source, ": missing object \"", path, key,
                "\"; see docs/planner.md (profile schema) for the fields it needs");
    SLOPE_CHECK(it->is_object(), source, ": \"", path, key, "\" must be a JSON object");
    return *it;
  }

  double number(const json& parent, const std::string& key, const std::string& path, double lo,
                double hi, bool lo_open = false) const {
    auto it = parent.find(key);
    SLOPE_CHECK(it != parent.end(), source, ": missing number \"", path, key,
                "\"; see docs/planner.md (profile schema)");
    SLOPE_CHECK(it->is_number(), source, ": \"", path, key, "\" must be a number, got ",
                it->dump());
    double v = it->get<double>();
    bool ok = (lo_open ? v > lo : v >= lo) && v <= hi;
    SLOPE_CHECK(ok, source, ": \"", path, key, "\" = ", v, " is out of range; expected ",
                lo_open ? "(" : "[", lo, ", ", hi, "]");
    return v;
  }

  double number_or(const json& parent, const std::string& key, const std::string& path,
                   double dflt, double lo, double hi) const {
    if (!parent.contains(key)) return dflt;
    return number(parent, key, path, lo, hi);
  }

  std::string text(const json& parent, const std::string& key, const std::string& path,
                   bool required = true) const {
    auto it = parent.find(key);
    if (it == parent.end()) {
      SLOPE_CHECK(!required, source, ": missing string \"", path, key, "\"");
      return "";
    }
    SLOPE_CHECK(it->is_string(), source, ": \"", path, key, "\" must be a string");
    return it->get<std::string>();
  }

  ComputeRate rate(const json& j, const std::string& path) const {
    SLOPE_CHECK(j.is_object(), source, ": \"", path, "\" must be an object like ",
                "{\"peak_tflops\": 181.0, \"efficiency\": 0.55}");
    ComputeRate r;
    r.peak_tflops = number(j, "peak_tflops", path + ".", 0, 1e6, true);
    r.efficiency = number(j, "efficiency", path + ".", 0, 1, true);
    return r;
  }

  std::map<std::string, ComputeRate> rates(const json& parent, const std::string& key,
                                           const std::string& path) const {
    const json& o = object(parent, key, path);
    std::map<std::string, ComputeRate> out;
    for (auto it = o.begin(); it != o.end(); ++it) out[it.key()] = rate(it.value(), path + key + "." + it.key());
    SLOPE_CHECK(!out.empty(), source, ": \"", path, key, "\" lists no dtype; give at least ",
                "\"bf16\": {\"peak_tflops\": ..., \"efficiency\": ...}");
    return out;
  }

  LinkRate link(const json& parent, const std::string& key, const std::string& path) const {
    const json& o = object(parent, key, path);
    LinkRate l;
    l.bandwidth_gbs = number(o, "bandwidth_gbs", path + key + ".", 0, 1e5, true);
    l.latency_us = number(o, "latency_us", path + key + ".", 0, 1e6);
    return l;
  }
};

}  // namespace

namespace {
// The rate for dtype; a profile measured on a CPU (slope calibrate) may only have "fp32".
std::map<std::string, ComputeRate>::const_iterator find_rate(const std::map<std::string, ComputeRate>& m,
                                                             const std::string& dtype) {
  auto it = m.find(dtype);
  if (it == m.end() && dtype == "bf16") it = m.find("fp32");
  return it;
}
}  // namespace

const ComputeRate& HardwareProfile::matmul(const std::string& dtype) const {
  auto it = find_rate(device.matmul, dtype);
  SLOPE_CHECK(it != device.matmul.end(), "hardware profile '", name, "' has no matmul rate for dtype '",
              dtype, "'; add device.matmul.", dtype, " to ", origin.empty() ? "the profile" : origin);
  return it->second;
}

const ComputeRate& HardwareProfile::attention(const std::string& dtype) const {
  auto it = find_rate(device.attention, dtype);
  SLOPE_CHECK(it != device.attention.end(), "hardware profile '", name,
              "' has no attention rate for dtype '", dtype, "'; add device.attention.", dtype, " to ",
              origin.empty() ? "the profile" : origin);
  return it->second;
}

HardwareProfile parse_profile(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e999
    fail(source, ": not valid JSON (", e.what(), "); fix the syntax or the number at the byte it names");
  }
  Reader r{source};
  SLOPE_CHECK(j.is_object(), source, ": a hardware profile is a JSON object; see docs/planner.md");
  const std::string schema = r.text(j, "schema", "");
  SLOPE_CHECK(schema == "slope-hardware-profile/1", source, ": \"schema\" is \"", schema,
              "\"; this SLOPE reads \"slope-hardware-profile/1\"");

  HardwareProfile p;
  p.origin = source;
  p.name = r.text(j, "name", "");
  SLOPE_CHECK(!p.name.empty(), source, ": \"name\" must not be empty");
  p.description = r.text(j, "description", "", false);

  const json& d = r.object(j, "device", "");
  p.device.name = r.text(d, "name", "device.");
  p.device.memory_gb = r.number(d, "memory_gb", "device.", 0, 1e5, true);
  p.device.usable_memory_fraction = r.number_or(d, "usable_memory_fraction", "device.", 0.9, 0.05, 1.0);
  p.device.memory_bandwidth_gbs = r.number(d, "memory_bandwidth_gbs", "device.", 0, 1e6, true);
  p.device.memory_efficiency = r.number_or(d, "memory_efficiency", "device.", 0.8, 0.01, 1.0);
  p.device.kernel_overhead_us = r.number_or(d, "kernel_overhead_us", "device.", 0.0, 0.0, 1e5);
  p.device.matmul = r.rates(d, "matmul", "device.");
  p.device.attention = r.rates(d, "attention", "device.");

  const json& n = r.object(j, "node", "");
  p.node.devices_per_node = static_cast<int>(r.number(n, "devices_per_node", "node.", 1, 4096));
  SLOPE_CHECK(n["devices_per_node"].is_number_integer(), source,
              ": \"node.devices_per_node\" must be a whole number");
  p.node.p2p = r.link(n, "p2p", "node.");
  p.node.alltoall = r.link(n, "alltoall", "node.");
  p.node.allreduce = r.link(n, "allreduce", "node.");

  const json& w = r.object(j, "network", "");
  p.network.description = r.text(w, "description", "network.");
  p.network.bandwidth_gbs_per_node = r.number(w, "bandwidth_gbs_per_node", "network.", 0, 1e5, true);
  p.network.bandwidth_gbs_per_device =
      r.number(w, "bandwidth_gbs_per_device", "network.", 0, 1e5, true);
  p.network.latency_us = r.number(w, "latency_us", "network.", 0, 1e6);

  if (auto e = j.find("engine"); e != j.end()) {
    SLOPE_CHECK(e->is_object(), source, ": \"engine\" must be a JSON object; see docs/planner.md (profile schema)");
    EngineSpec& g = p.engine;
    g.present = true;
    g.attention_dtype = r.text(*e, "attention_dtype", "engine.", false);
    g.wire_bytes = r.number_or(*e, "wire_bytes", "engine.", 0.0, 0.0, 16.0);
    g.gemm_rows = int64_t(r.number_or(*e, "gemm_rows", "engine.", 0.0, 0.0, 1e9));
    g.moe_rows = int64_t(r.number_or(*e, "moe_rows", "engine.", 0.0, 0.0, 1e9));
    if (auto u = e->find("unfused_elementwise"); u != e->end()) {
      SLOPE_CHECK(u->is_boolean(), source, ": \"engine.unfused_elementwise\" must be true or false");
      g.unfused_elementwise = u->get<bool>();
    }
    g.attention_block_q = int64_t(r.number_or(*e, "attention_block_q", "engine.", 0.0, 0.0, 1e6));
    g.attention_block_k = int64_t(r.number_or(*e, "attention_block_k", "engine.", 0.0, 0.0, 1e6));
    SLOPE_CHECK((g.attention_block_q > 0) == (g.attention_block_k > 0), source,
                ": \"engine.attention_block_q\" and \"engine.attention_block_k\" go together (both > 0, or neither)");
    // The cost model walks the tiles of a call one query block at a time: tiles of fewer than 8
    // rows (no real kernel's) and calibration lengths above 2^24 tokens would make one
    // prediction take seconds.
    SLOPE_CHECK(g.attention_block_q == 0 || (g.attention_block_q >= 8 && g.attention_block_k >= 8), source,
                ": \"engine.attention_block_q\" and \"engine.attention_block_k\" must be at least 8 (the kernel's tile "
                "rows and keys; slope calibrate writes them)");
    g.attention_row_overhead = r.number_or(*e, "attention_row_overhead", "engine.", 0.0, 0.0, 1e6);
    g.attention_calibrated_tokens =
        int64_t(r.number_or(*e, "attention_calibrated_tokens", "engine.", 0.0, 0.0, double(1 << 24)));
    g.message_overhead_us = r.number_or(*e, "message_overhead_us", "engine.", 0.0, 0.0, 1e6);
    g.elementwise_gbs = r.number_or(*e, "elementwise_gbs", "engine.", 0.0, 0.0, 1e5);
    g.zero_fill_gbs = r.number_or(*e, "zero_fill_gbs", "engine.", 0.0, 0.0, 1e5);
    if (auto c = e->find("attention_curve"); c != e->end()) {
      SLOPE_CHECK(c->is_array() && !c->empty(), source,
                  ": \"engine.attention_curve\" must be a non-empty array of {\"tokens\": N, \"gflops\": rate}");
      for (size_t i = 0; i < c->size(); ++i) {
        const std::string path = "engine.attention_curve[" + std::to_string(i) + "].";
        SLOPE_CHECK((*c)[i].is_object(), source, ": \"", path, "\" must be an object");
        const int64_t n = int64_t(r.number((*c)[i], "tokens", path, 1, double(1 << 24)));
        const double gf = r.number((*c)[i], "gflops", path, 0, 1e9, true);
        SLOPE_CHECK(g.attention_curve.empty() || n > g.attention_curve.back().first, source, ": \"", path,
                    "tokens\" must increase along the curve");
        g.attention_curve.push_back({n, gf});
      }
      g.attention_curve_kv_heads = int64_t(r.number(*e, "attention_curve_kv_heads", "engine.", 1, 1e6));
      g.attention_curve_query_rows =
          int64_t(r.number_or(*e, "attention_curve_query_rows", "engine.", 0.0, 0.0, double(1 << 24)));
      SLOPE_CHECK(g.attention_block_q > 0, source,
                  ": \"engine.attention_curve\" needs the tiles (engine.attention_block_q / _k)");
    }
    if (!g.attention_dtype.empty())
      SLOPE_CHECK(p.device.attention.count(g.attention_dtype) != 0, source, ": \"engine.attention_dtype\" is \"",
                  g.attention_dtype, "\" but device.attention has no rate for it");
  }

  auto src = j.find("sources");
  SLOPE_CHECK(src != j.end() && src->is_array() && !src->empty(), source,
              ": \"sources\" must be a non-empty array of {\"what\", \"value\", \"source\"}; ",
              "a profile without sources is not trusted by the planner");
  for (size_t i = 0; i < src->size(); ++i) {
    const json& s = (*src)[i];
    std::string path = "sources[" + std::to_string(i) + "].";
    SLOPE_CHECK(s.is_object(), source, ": \"", path, "\" must be an object");
    p.sources.push_back({r.text(s, "what", path), r.text(s, "value", path), r.text(s, "source", path)});
  }
  if (auto a = j.find("assumptions"); a != j.end()) {
    SLOPE_CHECK(a->is_array(), source, ": \"assumptions\" must be an array of strings");
    for (const auto& s : *a) {
      SLOPE_CHECK(s.is_string(), source, ": \"assumptions\" must be an array of strings");
      p.assumptions.push_back(s.get<std::string>());
    }
  }
  return p;
}

HardwareProfile load_profile(const std::string& path) {
  std::string file = path;
  const bool bare = path.find('/') == std::string::npos && path.find(".json") == std::string::npos;
  if (bare) {
    file = find_data_path("profiles/" + path + ".json");
    if (file.empty()) {
      std::string where;
      for (const std::string& d : data_dirs()) where += (where.empty() ? "" : ", ") + d + "/profiles";
      fail("no hardware profile named '", path, "': a bare name is looked up as NAME.json in ", where,
           "; pass the path of a profile JSON file, or install SLOPE (cmake --install) so that its "
           "profiles are found from anywhere");
    }
  }
  SLOPE_CHECK(std::filesystem::exists(file), "cannot read hardware profile '", file, "'; pass the path of a profile ",
              "JSON file, e.g. profiles/mi250-gcd.json, or a bare name such as mi250-gcd");
  return parse_profile(read_regular_file(file, "hardware profile"), file);
}

HardwareProfile scale_efficiency(HardwareProfile p, double factor) {
  SLOPE_CHECK(factor > 0, "efficiency scale must be positive, got ", factor);
  for (auto* m : {&p.device.matmul, &p.device.attention})
    for (auto& [dtype, r] : *m) r.efficiency = std::min(1.0, r.efficiency * factor);
  return p;
}

}  // namespace slope::planner
