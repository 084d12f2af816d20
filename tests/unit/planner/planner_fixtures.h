// Small model configs and a round-number hardware profile whose costs can be worked out by
// hand, shared by the planner tests.
#pragma once

#include <string>

#include "slope/model/config.h"
#include "slope/planner/hardware_profile.h"

namespace slope::planner::testing {

// hidden 64, 4 query heads and 2 KV heads of 16, dense SwiGLU MLP of 32, 2 layers (layer 0
// sliding with window 4, layer 1 full), vocab 100, untied head, no biases.
inline model::ModelConfig tiny_dense() {
  model::ModelConfig c;
  c.arch = model::Arch::GptOss;
  c.architecture = "TinyDense";
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.layer_window = {4, 0};
  return c;
}

// The same with 8 experts of width 32, top-2, MXFP4 experts.
inline model::ModelConfig tiny_moe() {
  model::ModelConfig c = tiny_dense();
  c.architecture = "TinyMoe";
  c.num_experts = 8;
  c.experts_per_token = 2;
  c.mxfp4_experts = true;
  return c;
}

// gpt-oss-120b as in shared/reference/gpt-oss-model.md section 1.
inline model::ModelConfig gpt_oss_120b() {
  model::ModelConfig c;
  c.arch = model::Arch::GptOss;
  c.architecture = "GptOssForCausalLM";
  c.vocab_size = 201088;
  c.hidden_size = 2880;
  c.intermediate_size = 2880;
  c.num_layers = 36;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.qkv_bias = c.o_bias = c.sinks = true;
  for (int l = 0; l < 36; ++l) c.layer_window.push_back(l % 2 == 0 ? 128 : 0);
  c.num_experts = 128;
  c.experts_per_token = 4;
  c.mxfp4_experts = true;
  return c;
}

// 1 TFLOP/s matmul, 0.5 TFLOP/s attention, 1 TB/s memory, no launch cost, 8 devices per node;
// p2p 0.5 GB/s + 1 us, all-to-all 1 GB/s + 2 us, all-reduce bus 1 GB/s + 3 us; network
// 0.25 GB/s per device, 1 GB/s per node, 10 us.
inline std::string round_profile_json(double memory_gb = 1.0) {
  return R"({
    "schema": "slope-hardware-profile/1",
    "name": "round",
    "device": {
      "name": "round numbers", "memory_gb": )" +
         std::to_string(memory_gb) + R"(, "usable_memory_fraction": 1.0,
      "memory_bandwidth_gbs": 1000, "memory_efficiency": 1.0, "kernel_overhead_us": 0,
      "matmul": {"bf16": {"peak_tflops": 2.0, "efficiency": 0.5}},
      "attention": {"bf16": {"peak_tflops": 0.5, "efficiency": 1.0}}
    },
    "node": {
      "devices_per_node": 8,
      "p2p": {"bandwidth_gbs": 0.5, "latency_us": 1},
      "alltoall": {"bandwidth_gbs": 1, "latency_us": 2},
      "allreduce": {"bandwidth_gbs": 1, "latency_us": 3}
    },
    "network": {"description": "test", "bandwidth_gbs_per_node": 1, "bandwidth_gbs_per_device": 0.25,
                "latency_us": 10},
    "sources": [{"what": "everything", "value": "round numbers", "source": "this test"}]
  })";
}

inline HardwareProfile round_profile(double memory_gb = 1.0) {
  return parse_profile(round_profile_json(memory_gb), "round.json");
}

// The source tree's root (tests/reference/../..).
inline std::string source_root() { return std::string(SLOPE_REFERENCE_DIR) + "/../.."; }

}  // namespace slope::planner::testing
