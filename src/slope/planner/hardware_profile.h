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

// How SLOPE's own kernels run on this device, where that differs from what the cost model
// assumes by default (optional "engine" object of a profile; absent on datasheet profiles).
// Measured or read from the engine's code, never tuned to a TTFT.
struct EngineSpec {
  bool present = false;
  // The dtype attention computes in when the GEMMs run in bf16: SLOPE's CPU engine runs its bf16
  // flash attention kernel where the CPU has AVX512-BF16 ("bf16"), else the fp32 one ("fp32").
  // fp32 GEMMs always take fp32 attention, and attention_curve prices only attention of this
  // dtype. Empty: the model's compute dtype.
  std::string attention_dtype;
  // Bytes per element of activations and K/V on the wire (SLOPE's CPU engine sends fp32: 4).
  // 0: the cost options' value (2, bf16).
  double wire_bytes = 0;
  // Rows per call of the token-local work (slope run --chunk, 1024): GEMMs, norms and the MoE
  // run on blocks of this many tokens, so expert GEMMs see chunk·k/E rows and TP all-reduces
  // happen once per block. 0: the whole shard at once.
  int64_t gemm_rows = 0;
  // Rows per MoE call (slope run --moe-chunk, 4096; at least gemm_rows): the router, o_proj and
  // the experts of a MoE layer run on blocks of this many tokens, so each touched expert's
  // weights are read once per block and its GEMMs see moe_rows·k/E rows. 0: gemm_rows.
  int64_t moe_rows = 0;
  // Element-wise work counted as the unfused CPU engine does it (fp32 activations between
  // kernels, bf16 conversion of every GEMM input, MoE gather / scatter-add, SwiGLU, RoPE,
  // the q/k/v split): bytes per token and layer in cost_model.cpp. False: fused kernels.
  bool unfused_elementwise = false;
  // GB/s (of the bytes elementwise_bytes_per_token counts) at which the engine's element-wise
  // kernels run, timed by `slope calibrate --model` on one block of gemm_rows tokens. They do
  // not stream at the triad rate: SwiGLU is exp-bound, the scatter-add is serial, blocks fit
  // in cache. 0: the memory bandwidth.
  double elementwise_gbs = 0;
  // Flash-attention tiling: query rows and keys per tile. Work is counted per visited tile
  // (diagonal and window-edge tiles computed in full), plus a fixed cost per query row and
  // visited key block (softmax rescale, output update), in key-equivalents. The profile's
  // attention rate was measured by `slope calibrate` on a causal self-attention of
  // `attention_calibrated_tokens` tokens counting exact pairs; the model converts it to the
  // per-tile rate with the same count. 0 tiles: exact pairs at the profile's rate.
  int64_t attention_block_q = 0, attention_block_k = 0;
  double attention_row_overhead = 0;  // key-equivalents per query row
  int64_t attention_calibrated_tokens = 0;
  // First touch: the K/V cache of the rank's layers and the layer buffers are memory the
  // process has not used before; filling it (page faults included) runs at `zero_fill_gbs`
  // on one thread. Each layer also clears its attention output at the memory bandwidth.
  // 0: not modelled.
  double zero_fill_gbs = 0;
  // Attention rate against context length for full (causal) layers: GFLOP/s in exact pairs
  // of a causal self-attention of `tokens` tokens with `attention_curve_kv_heads` KV heads
  // (the engine's kernel at the model's head shape), or, with `attention_curve_query_rows` R
  // > 0, of its last R queries only against all `tokens` keys (one chunk's call of a chunked
  // prefill). The kernel slows down as the K/V it streams per head outgrows the caches and
  // TLB, so the model reads the rate at the number of keys of each call, log-interpolated,
  // clamped at the ends (the KV heads say at which shape the curve was measured). Empty: the
  // single calibrated rate.
  std::vector<std::pair<int64_t, double>> attention_curve;
  int64_t attention_curve_kv_heads = 0;
  int64_t attention_curve_query_rows = 0;
  // Fixed cost of one MPI message or collective call beyond the link latency, e.g. progress
  // polling; 0 = none.
  double message_overhead_us = 0;
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
  EngineSpec engine;
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
