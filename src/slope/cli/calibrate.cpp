// `slope calibrate`: measure this machine into a hardware profile (profiles schema,
// docs/planner.md) so the cost model predicts what the engine really does here. A "device" is
// one rank with --threads threads. Compute: the engine's own GEMM (f32, bf16) and attention
// kernels at prefill shapes; memory: a streaming triad; links (under mpirun, 2+ ranks): MPI
// point-to-point between ranks 0 and 1 and an all-to-all over all ranks, on whatever transport
// mpirun selected (shared memory by default, TCP with --mca btl tcp,self).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>
#include <vector>

#include "slope/cli/calibrate_engine.h"
#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/gemm.h"
#include "slope/parallel/mpi_comm.h"

namespace slope::cli {
namespace {

double gemm_gflops(kernels::ComputeType ct, int64_t M, int64_t N, int64_t K, int reps) {
  auto w = random_floats(size_t(N * K), 1), x = random_floats(size_t(M * K), 2);
  std::vector<float> y(size_t(M * N));
  kernels::Linear lin(w.data(), DType::F32, kernels::WeightLayout::OutIn, N, K, nullptr, ct);
  const double s = best_seconds(reps, [&] { lin.forward(x.data(), M, y.data()); });
  return 2.0 * M * N * K / s / 1e9;
}

// Triad a = b + s·c over arrays far larger than the caches; counts 3 arrays of traffic.
double triad_gbs(int reps) {
  const size_t n = size_t(64) << 20;  // 256 MB per array
  std::vector<float> a(n), b(n, 1.f), c(n, 2.f);
  const double s = best_seconds(reps, [&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
  });
  return 3.0 * n * sizeof(float) / s / 1e9;
}

struct LinkFigures {
  double p2p_gbs = 0, p2p_latency_us = 0, alltoall_gbs = 0, alltoall_latency_us = 0;
};

// Rank 0 <-> rank 1 ping-pong (latency: 8 bytes; bandwidth: 16 MiB one way), and an
// all-to-all with 4 MiB per peer over every rank (per-rank send bandwidth).
LinkFigures measure_links(parallel::Communicator& world, int reps) {
  LinkFigures f;
  const int r = world.rank();
  auto pingpong = [&](size_t bytes) {
    std::vector<uint8_t> buf(bytes);
    return best_seconds(reps, [&] {
      if (r == 0) {
        world.isend_bytes(buf.data(), bytes, 1, parallel::Tag::Test).wait();
        world.irecv_bytes(buf.data(), bytes, 1, parallel::Tag::Test).wait();
      } else if (r == 1) {
        world.irecv_bytes(buf.data(), bytes, 0, parallel::Tag::Test).wait();
        world.isend_bytes(buf.data(), bytes, 0, parallel::Tag::Test).wait();
      }
    }) / 2;  // one way
  };
  const double lat = pingpong(8);
  const size_t big = size_t(16) << 20;
  const double t_big = pingpong(big);
  f.p2p_latency_us = lat * 1e6;
  f.p2p_gbs = double(big) / std::max(1e-9, t_big - lat) / 1e9;

  const int P = world.size();
  const int64_t per_peer = int64_t(1) << 20;  // floats = 4 MiB
  std::vector<float> send(size_t(per_peer * P)), recv(send.size());
  std::vector<int64_t> counts(P, per_peer), displs(P);
  for (int i = 0; i < P; ++i) displs[i] = i * per_peer;
  const double t_a2a = best_seconds(reps, [&] {
    world.alltoallv(send.data(), counts, displs, recv.data(), counts, displs);
  });
  std::vector<int64_t> one(P, 1), odispl(P);
  for (int i = 0; i < P; ++i) odispl[i] = i;
  std::vector<float> s1(P), r1(P);
  const double t_small = best_seconds(reps, [&] {
    world.alltoallv(s1.data(), one, odispl, r1.data(), one, odispl);
  });
  f.alltoall_latency_us = t_small * 1e6;
  f.alltoall_gbs = double(per_peer * (P - 1) * sizeof(float)) / std::max(1e-9, t_a2a - t_small) / 1e9;
  // Every rank takes the slowest rank's view, so the profile is one number.
  double v[4] = {f.p2p_gbs, f.p2p_latency_us, f.alltoall_gbs, f.alltoall_latency_us};
  world.broadcast(v, 4, 0);
  return {v[0], v[1], v[2], v[3]};
}

// The profile's "engine" object: measured figures plus what the engine's code fixes.
void write_engine(nlohmann::json& j, const EngineFigures& f, const model::ModelConfig& cfg,
                  const std::string& model_path, int threads, int ranks) {
  nlohmann::json curve = nlohmann::json::array();
  std::string curve_text;
  for (const auto& [n, gf] : f.attention_curve) {
    curve.push_back({{"tokens", n}, {"gflops", gf}});
    curve_text += str_cat(curve_text.empty() ? "" : ", ", n, ": ", gf);
  }
  j["engine"] = {{"attention_dtype", f.attention_dtype},
                 {"wire_bytes", 4},
                 {"gemm_rows", f.block_rows},
                 {"moe_rows", f.moe_rows},
                 {"unfused_elementwise", true},
                 {"elementwise_gbs", f.elementwise_gbs},
                 {"attention_block_q", kernels::kAttentionBlockQ},
                 {"attention_block_k", kernels::kAttentionBlockK},
                 {"attention_row_overhead", kAttentionRowOverhead},
                 {"attention_calibrated_tokens", kAttentionCalibratedTokens},
                 {"zero_fill_gbs", f.zero_fill_gbs},
                 {"attention_curve", curve},
                 {"attention_curve_kv_heads", f.attention_kv_heads},
                 {"attention_curve_query_rows", f.attention_curve_query_rows}};
  const std::string who = str_cat(ranks, " rank(s) x ", threads, " thread(s), all ranks at once");
  auto& src = j["sources"];
  // GEMMs at the model's shapes replace the 2048^3 figure for the dtype the engine runs.
  auto& mm = j["device"]["matmul"][f.compute_dtype];
  mm["efficiency"] = std::min(1.0, f.layer_gemm_gflops / 1e3 / mm["peak_tflops"].get<double>());
  src.push_back({{"what", str_cat(f.compute_dtype, " GEMMs of the model's own first layers in decoder_layer_forward on ",
                                  f.layer_rows, " rows (blocks of ", f.block_rows, ", MoE calls of ", f.moe_rows,
                                  "): (token-local time - element-wise time) / GEMM FLOPs, ", who)},
                 {"value", str_cat(f.layer_gemm_gflops, " GFLOP/s (layer ", f.layer_seconds * 1e3, " ms, element-wise ",
                                   f.elementwise_seconds * 1e3, " ms); used as the matmul rate")},
                 {"source", "slope calibrate --model"}});
  src.push_back({{"what", str_cat("element-wise kernels of one ", cfg.architecture, " layer (", model_path, ", ",
                                  f.compute_dtype, "), block of ", f.block_rows, " rows, ", who)},
                 {"value", str_cat(f.elementwise_gbs, " GB/s of ", f.elementwise_bytes_per_token,
                                   " counted bytes per token and layer")},
                 {"source", "slope calibrate --model (src/slope/cli/calibrate_engine.cpp)"}});
  src.push_back({{"what", str_cat("causal flash attention (", f.attention_dtype, " kernel), Hq ", cfg.num_heads,
                                  " Hkv ", cfg.num_kv_heads, " D ", cfg.head_dim, ", the last ",
                                  f.attention_curve_query_rows, " queries against all keys, exact pairs, ", who)},
                 {"value", str_cat(curve_text, " GFLOP/s")},
                 {"source", "slope calibrate --model"}});
  src.push_back({{"what", "first-touch zero fill, 1 thread, fresh 128 MiB buffers"},
                 {"value", str_cat(f.zero_fill_gbs, " GB/s")},
                 {"source", "slope calibrate --model"}});
  src.push_back({{"what", "engine behaviour"},
                 {"value", str_cat(f.attention_dtype, " attention in ", f.compute_dtype,
                                   " mode; fp32 K/V, activations and all-reduce payloads; token-local "
                           "work in blocks of --chunk rows; unfused element-wise kernels; Tensor zero-fills every "
                           "allocation; attention tiles 64 x 64 with a per-row cost of 56 key-equivalents (fitted to "
                           "bench_attention's 1K and 16K causal points)")},
                 {"source", "src/slope/model/layers.cpp, src/slope/kernels/attention.h, src/slope/core/tensor.cpp"}});
}

}  // namespace

int cmd_calibrate(int argc, char** argv) {
  std::string out, name = "this-machine", link = "intra";
  int threads = 0, reps = 5;
  double fp32_peak_per_thread = 224.0, bf16_peak_per_thread = 448.0;
  CLI::App app{"Measure this machine into a hardware profile for `slope plan` and the cost model", "slope calibrate"};
  setup_app(app);
  app.add_option("--out", out, "profile JSON to write (updated in place if it exists)")->required();
  app.add_option("--name", name, "profile name");
  app.add_option("--threads", threads, "threads per rank (a 'device'); 0: the node's cores shared by its ranks");
  app.add_option("--reps", reps, "repetitions per measurement (the fastest is kept)");
  app.add_option("--link", link, "which links the MPI figures describe: intra (inside a node) or inter (between nodes)");
  app.add_option("--fp32-peak-per-thread", fp32_peak_per_thread,
                 "GFLOP/s peak of one core in fp32 (default: Zen 5, 2x512-bit FMA at 3.5 GHz)");
  app.add_option("--bf16-peak-per-thread", bf16_peak_per_thread, "GFLOP/s peak of one core in bf16 (vdpbf16ps)");
  std::string model_path;
  EngineOptions eng_opt;
  app.add_option("--model", model_path,
                 "model directory or config.json: also time the engine's element-wise kernels, attention "
                 "over lengths and zero fill at its shapes (the profile's \"engine\" object)");
  std::string dtype = kDefaultComputeDtype;
  app.add_option("--dtype", dtype, "with --model: GEMM dtype the engine runs, bf16 or f32 (slope run --dtype)");
  app.add_option("--block-rows", eng_opt.block_rows, "with --model: rows per block of token-local work (slope run --chunk)");
  app.add_option("--moe-rows", eng_opt.moe_rows, "with --model: rows per MoE call (slope run --moe-chunk)");
  app.add_option("--attention-max-tokens", eng_opt.attention_max_tokens,
                 "with --model: longest causal attention timed for the curve (doubling from 1024)");
  // MPI first, so that under mpirun one rank prints a mistake instead of every rank.
  parallel::MpiRuntime mpi(&argc, &argv);
  if (const int code = parse_args(app, argc, argv, "calibrate", mpi.world_rank() == 0); code >= 0) return code;
  auto world = mpi.world();
  // The model's layers load before anything is measured, so a bad --model fails at once.
  std::unique_ptr<model::Model> layers;
  const bool ok = on_every_rank(*world, "calibrate", [&] {
    // The profile's keys name dtypes as the planner does (fp32, bf16).
    eng_opt.compute_dtype = parse_compute_dtype(dtype) == kernels::ComputeType::BF16 ? "bf16" : "fp32";
    SLOPE_CHECK(link == "intra" || link == "inter", "--link must be intra or inter, got '", link, "'");
    SLOPE_CHECK(reps >= 1, "--reps must be at least 1");
    eng_opt.reps = reps;
    if (!model_path.empty()) {
      check_engine_options(eng_opt);
      layers = load_calibration_layers(model_path, eng_opt.compute_dtype);
    }
  });
  if (!ok) return kExitError;
  const int P = world->size();
  if (threads <= 0) threads = mpi.default_threads_per_rank();
  set_num_threads(threads);

  nlohmann::json j;
  if (std::ifstream f(out); f) {
    try {
      j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail("existing profile '", out, "' is not valid JSON (", e.what(), "); remove it or fix it");
    }
  }
  const bool full = world->size() == 1 || link == "intra";
  if (full) {
    // Compute and memory: every rank measures at once (as in a run), rank 0's figures are kept.
    world->barrier();
    const double f32 = gemm_gflops(kernels::ComputeType::F32, 2048, 2048, 2048, reps);
    const double bf16 = gemm_gflops(kernels::ComputeType::BF16, 2048, 2048, 2048, reps);
    const double attn = causal_attention_gflops({8, 2, 64}, kAttentionCalibratedTokens, std::max(1, reps / 2),
                                                kernels::ComputeType::F32);
    // The bf16 kernel where the engine runs it (else compute = BF16 is the f32 kernel: no entry).
    const bool bf16_attn = engine_attention_dtype("bf16") == "bf16";
    const double attn_bf16 = bf16_attn ? causal_attention_gflops({8, 2, 64}, kAttentionCalibratedTokens,
                                                                 std::max(1, reps / 2), kernels::ComputeType::BF16)
                                       : 0.0;
    const double mem = triad_gbs(reps);
    const double f32_peak = fp32_peak_per_thread * threads, bf16_peak = bf16_peak_per_thread * threads;
    j["schema"] = "slope-hardware-profile/1";
    j["name"] = name;
    j["description"] = str_cat("this machine, measured by slope calibrate: one device = one rank with ",
                               threads, " thread(s), ", P, " rank(s) measured together");
    auto& d = j["device"];
    d["name"] = str_cat("CPU rank x ", threads, " thread(s)");
    d["memory_gb"] = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / 1e9 / P;
    d["usable_memory_fraction"] = 0.8;
    d["memory_bandwidth_gbs"] = mem;
    d["memory_efficiency"] = 1.0;
    d["kernel_overhead_us"] = 0.0;
    d["matmul"] = {{"fp32", {{"peak_tflops", f32_peak / 1e3}, {"efficiency", std::min(1.0, f32 / f32_peak)}}},
                   {"bf16", {{"peak_tflops", bf16_peak / 1e3}, {"efficiency", std::min(1.0, bf16 / bf16_peak)}}}};
    d["attention"] = {{"fp32", {{"peak_tflops", f32_peak / 1e3}, {"efficiency", std::min(1.0, attn / f32_peak)}}}};
    if (bf16_attn)
      d["attention"]["bf16"] = {{"peak_tflops", bf16_peak / 1e3}, {"efficiency", std::min(1.0, attn_bf16 / bf16_peak)}};
    j["sources"] = nlohmann::json::array(
        {{{"what", bf16_attn ? "fp32 / bf16 GEMM 2048^3, attention 4096 causal hd64 fp32 / bf16"
                             : "fp32 / bf16 GEMM 2048^3, attention 4096 causal hd64 (fp32; no bf16 kernel on this CPU)"},
          {"value", str_cat(f32, " / ", bf16, " / ", attn, bf16_attn ? str_cat(" / ", attn_bf16) : std::string(),
                            " GFLOP/s")},
          {"source", "slope calibrate (engine kernels, fastest of reps)"}},
         {{"what", "memory triad"}, {"value", str_cat(mem, " GB/s")}, {"source", "slope calibrate"}},
         {{"what", "per-core peaks"},
          {"value", str_cat(fp32_peak_per_thread, " fp32 / ", bf16_peak_per_thread, " bf16 GFLOP/s")},
          {"source", "--fp32-peak-per-thread / --bf16-peak-per-thread (defaults: the Zen 5 asm peaks of "
                     "shared/reference/machine-limits.md, 3.5 GHz)"}}});
    j["assumptions"] = nlohmann::json::array({"a device is one MPI rank with the stated threads"});
    if (!j.contains("node")) j["node"] = nlohmann::json::object();
    j["node"]["devices_per_node"] = P;
    if (!j.contains("network"))
      j["network"] = {{"description", "not measured: run with --link inter over the inter-node transport"},
                      {"bandwidth_gbs_per_node", 1.0}, {"bandwidth_gbs_per_device", 1.0}, {"latency_us", 50.0}};
  }
  EngineFigures ef;
  const bool engine = full && !model_path.empty();
  if (engine) ef = measure_engine(*layers, eng_opt, *world);
  LinkFigures lf;
  if (P > 1) lf = measure_links(*world, reps);
  if (world->rank() != 0) return 0;
  if (P > 1) {
    if (link == "intra") {
      j["node"]["p2p"] = {{"bandwidth_gbs", lf.p2p_gbs}, {"latency_us", lf.p2p_latency_us}};
      j["node"]["alltoall"] = {{"bandwidth_gbs", lf.alltoall_gbs}, {"latency_us", lf.alltoall_latency_us}};
      j["node"]["allreduce"] = {{"bandwidth_gbs", lf.alltoall_gbs}, {"latency_us", lf.alltoall_latency_us}};
    } else {
      SLOPE_CHECK(j.contains("device"), "--link inter updates an existing profile; run with --link intra first");
      j["network"] = {{"description", "measured by slope calibrate --link inter"},
                      {"bandwidth_gbs_per_node", lf.p2p_gbs},
                      {"bandwidth_gbs_per_device", lf.p2p_gbs},
                      {"latency_us", lf.p2p_latency_us}};
    }
    j["sources"].push_back({{"what", str_cat("MPI ", link, " p2p / all-to-all (", P, " ranks)")},
                            {"value", str_cat(lf.p2p_gbs, " GB/s, ", lf.p2p_latency_us, " us / ",
                                              lf.alltoall_gbs, " GB/s, ", lf.alltoall_latency_us, " us")},
                            {"source", "slope calibrate (16 MiB ping-pong, 4 MiB/peer all-to-all)"}});
  } else if (full) {
    for (const char* key : {"p2p", "alltoall", "allreduce"})
      if (!j["node"].contains(key)) j["node"][key] = {{"bandwidth_gbs", 10.0}, {"latency_us", 5.0}};
    j["assumptions"].push_back("links not measured (one rank): run under mpirun -np 2 or more");
  }
  if (engine) write_engine(j, ef, layers->config(), model_path, threads, P);
  std::ofstream f(out);
  SLOPE_CHECK(f, "cannot write '", out, "'");
  f << j.dump(2) << "\n";
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace slope::cli
