// A hardware profile: what one device, one node and the network between nodes can do, as the
// cost model needs it. Profiles are data (profiles/*.json, schema in docs/planner.md); every
// number in a shipped profile names its source, and every efficiency is marked as an
// assumption until `slope calibrate` or a measurement replaces it.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace slope::planner {

// Throughput of one kind of kernel in one dtype: a roofline whose compute roof is
// peak_tflops · efficiency (the fraction reached on large, well-shaped problems).
struct ComputeRate {
  double peak_tflops = 0;  // datasheet dense peak of one device
  double efficiency = 0;   // achieved fraction, (0, 1]
  double flops_per_s() const { return peak_tflops * 1e12 * efficiency; }
};

// A link or collective: effective bandwidth per device and per direction, plus the fixed
// latency of one message (or one step of a collective).
struct LinkRate {
  double bandwidth_gbs = 0;  // GB/s = 1e9 B/s
  double latency_us = 0;
  double bytes_per_s() const { return bandwidth_gbs * 1e9; }
  double latency_s() const { return latency_us * 1e-6; }
};

struct DeviceSpec {
  std::string name;
  double memory_gb = 0;                 // capacity, 1e9 B
  double usable_memory_fraction = 0.9;  // the rest is runtime, allocator slack, fragmentation
  double memory_bandwidth_gbs = 0;      // datasheet HBM bandwidth
  double memory_efficiency = 0.8;       // achieved fraction on streaming reads
  double kernel_overhead_us = 0;        // launch + sync cost per kernel
  // Keyed by dtype: "bf16", "fp16", "fp32", and "mxfp4" (GEMMs whose weights are MXFP4,
  // on hardware without an FP4 path dequantized on the fly into the bf16 units).
  std::map<std::string, ComputeRate> matmul;
  std::map<std::string, ComputeRate> attention;  // flash attention, QK and PV together

  double usable_memory_bytes() const { return memory_gb * 1e9 * usable_memory_fraction; }
  double memory_bytes_per_s() const { return memory_bandwidth_gbs * 1e9 * memory_efficiency; }
};

struct NodeSpec {
  int devices_per_node = 0;
  LinkRate p2p;        // one device to one neighbour (ring step, pipeline hop, halo)
  LinkRate alltoall;   // per device, effective send bandwidth of an all-to-all inside the node
  LinkRate allreduce;  // bus bandwidth of an all-reduce over the whole node
};

struct NetworkSpec {
  std::string description;          // e.g. "4x Slingshot-11 200 Gb/s per node"
  double bandwidth_gbs_per_node = 0;    // all NICs of a node together, per direction
  double bandwidth_gbs_per_device = 0;  // the most one device's traffic reaches
  double latency_us = 0;
};

struct Source {
  std::string what;    // the quantity
  std::string value;   // the value as the source states it
  std::string source;  // where it comes from (doc, repository path, URL)
};

struct HardwareProfile {
  std::string name;
  std::string description;
  DeviceSpec device;
  NodeSpec node;
  NetworkSpec network;
  std::vector<Source> sources;
  std::vector<std::string> assumptions;
  std::string origin;  // file it was read from

  // Rates by dtype ("bf16" falls back to "fp32" when only that was measured, as on a CPU);
  // throw slope::Error naming the profile and the missing key.
  const ComputeRate& matmul(const std::string& dtype) const;
  const ComputeRate& attention(const std::string& dtype) const;
};

// Parses and validates a profile (JSON text). Every problem throws slope::Error naming the
// field, the file and what a valid value looks like.
HardwareProfile parse_profile(const std::string& json_text, const std::string& source = "profile");
// Reads PATH; a bare name (no '/', no ".json", e.g. "mi250-gcd") is read from
// profiles/NAME.json under the current directory.
HardwareProfile load_profile(const std::string& path);

// Scales every compute efficiency (matmul and attention) by `factor`, capped at 1: the
// sensitivity knob of `slope plan --efficiency-scale`.
HardwareProfile scale_efficiency(HardwareProfile p, double factor);

}  // namespace slope::planner
