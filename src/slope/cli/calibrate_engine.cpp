// `slope calibrate --model`: how SLOPE's own kernels run on this machine at one model's shapes,
// written as the profile's "engine" object (planner::EngineSpec, docs/planner.md):
//   - the element-wise kernels of one decoder layer on one block of rows (norms, q/k/v split,
//     RoPE, bf16 copies of GEMM inputs, routing, MoE gather, SwiGLU, scatter-add), as GB/s of
//     the bytes planner::elementwise_bytes_per_token counts;
//   - causal flash attention at the model's head shape over growing lengths (the curve);
//   - first-touch zero fill of fresh buffers (SLOPE's Tensor memsets every allocation).
//   - the GEMM rate: the model's own first layers through decoder_layer_forward, less the
//     element-wise time, against their GEMM FLOPs.
// The element-wise sequence mirrors model/layers.cpp (decoder_layer_forward, moe_mlp,
// dense_mlp): change one, change the other.
#include "slope/cli/calibrate_engine.h"

#include <algorithm>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/gemm.h"
#include "slope/kernels/moe.h"
#include "slope/kernels/norm.h"
#include "slope/kernels/rope.h"
#include "slope/ops/attention_runner.h"
#include "slope/model/layers.h"
#include "slope/model/model.h"
#include "slope/planner/cost_model.h"

namespace slope::cli {
namespace {

// Seconds of one layer's element-wise work on `rows` tokens, in the engine's order.
double elementwise_seconds(const model::ModelConfig& c, bool bf16, int64_t rows, int reps) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const int64_t qw = Hq * D, kw = Hkv * D, width = qw + 2 * kw, I = c.intermediate_size;
  const float eps = float(c.rms_norm_eps);
  const DType act = DType::F32;
  std::vector<float> h = random_floats(size_t(rows * H), 11), norm_w(size_t(H), 1.f),
                     qkv = random_floats(size_t(rows * width), 12), attn = random_floats(size_t(rows * qw), 13),
                     head_norm_w(size_t(D), 1.f);
  std::vector<float> x(size_t(rows * H)), q(size_t(rows * qw)), k(size_t(rows * kw)), v(size_t(rows * kw));
  std::vector<uint16_t> bf(size_t(rows * std::max({H, qw, I})));
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = r;
  const kernels::Rope rope(c.rope);
  auto to_bf16 = [&](const float* src, int64_t n) {
    if (bf16) kernels::to_bf16(src, bf.data(), n);
  };
  // MoE: uniform random router logits (GEMM outputs stay as allocated: the kernels' speed
  // does not depend on the values).
  const int64_t E = c.num_experts;
  const int topk = int(c.experts_per_token);
  std::vector<float> logits = c.is_moe() ? random_floats(size_t(rows * E), 14) : std::vector<float>{};

  auto layer = [&] {
    // norm_qkv_rope: input norm, (qkv GEMM input to bf16), split, qk-norm, RoPE.
    kernels::rmsnorm(h.data(), norm_w.data(), x.data(), rows, H, eps, c.norm_order, act);
    to_bf16(x.data(), rows * H);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(q.data() + r * qw, qkv.data() + r * width, size_t(qw) * sizeof(float));
      std::memcpy(k.data() + r * kw, qkv.data() + r * width + qw, size_t(kw) * sizeof(float));
      std::memcpy(v.data() + r * kw, qkv.data() + r * width + qw + kw, size_t(kw) * sizeof(float));
    }
    if (c.qk_norm) {
      kernels::rmsnorm(q.data(), head_norm_w.data(), q.data(), rows * Hq, D, eps, c.norm_order, act);
      kernels::rmsnorm(k.data(), head_norm_w.data(), k.data(), rows * Hkv, D, eps, c.norm_order, act);
    }
    rope.apply(q.data(), rows, Hq, pos.data());
    rope.apply(k.data(), rows, Hkv, pos.data());
    // o_proj input to bf16, post-attention norm.
    to_bf16(attn.data(), rows * qw);
    kernels::rmsnorm(h.data(), norm_w.data(), x.data(), rows, H, eps, c.norm_order, act);
    if (!c.is_moe()) {  // dense_mlp
      to_bf16(x.data(), rows * H);
      Tensor gu({rows, 2 * I}, DType::F32), a({rows, I}, DType::F32);
      kernels::silu_mul(gu.data<float>(), rows, I, a.data<float>());
      to_bf16(a.data<float>(), rows * I);
      return;
    }
    // moe_mlp: router input to bf16, top-k routing, grouping, per expert gather, (bf16),
    // SwiGLU, (bf16), weighted scatter-add.
    to_bf16(x.data(), rows * H);
    std::vector<int32_t> ids(size_t(rows * topk));
    std::vector<float> weights(size_t(rows * topk));
    kernels::route_topk_softmax(logits.data(), rows, E, topk, ids.data(), weights.data());
    kernels::ExpertGroups g = kernels::group_by_expert(ids.data(), weights.data(), rows, topk, E);
    int64_t max_rows = 0;
    for (int64_t e = 0; e < E; ++e) max_rows = std::max(max_rows, g.offsets[e + 1] - g.offsets[e]);
    Tensor xin({max_rows, H}, DType::F32), gu({max_rows, 2 * I}, DType::F32), a({max_rows, I}, DType::F32),
        y({max_rows, H}, DType::F32);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = g.offsets[e], n = g.offsets[e + 1] - r0;
      if (n == 0) continue;
      kernels::gather_rows(x.data(), g.token.data() + r0, n, H, xin.data<float>());
      to_bf16(xin.data<float>(), n * H);
      kernels::swiglu_oai(gu.data<float>(), n, I, float(c.swiglu_alpha), float(c.swiglu_limit), a.data<float>());
      to_bf16(a.data<float>(), n * I);
      kernels::scatter_add_rows(y.data<float>(), g.token.data() + r0, g.weight.data() + r0, n, H, h.data());
    }
  };
  return best_seconds(reps, layer);
}

// Seconds per layer of the token-local work (everything but attention) of the model's own
// first layers, loaded as `slope run` loads them, through decoder_layer_forward on one rank
// over one block of `rows` random tokens: GEMMs and element-wise kernels as they interleave in
// a run, with the routing real hidden states give (random activations route differently and
// ran the MoE 8% faster than a run). Blocks of `chunk` rows, MoE calls of `moe_chunk`.
double real_layer_seconds(const model::Model& m, int64_t rows, int64_t chunk, int64_t moe_chunk, int reps) {
  const model::ModelConfig& c = m.config();
  Ledger times;
  model::LayerContext ctx = m.layer_context(chunk, &times);
  ctx.moe_chunk = moe_chunk;
  model::LayerBuffers buffers;
  ctx.buffers = &buffers;
  ops::LocalAttention runner;
  const ops::SequenceShard shard = ops::SequenceShard::whole(rows);
  // The residual stream of random tokens, as a run starts it (routing then spreads tokens over
  // the experts as it does in a run).
  std::vector<float> h0(size_t(rows * c.hidden_size));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  std::mt19937 rng{52};
  for (auto& id : ids) id = int32_t(rng() % uint32_t(c.vocab_size));
  m.embed(ids.data(), rows, h0.data());
  std::vector<float> h(h0.size()), k(size_t(rows * c.num_kv_heads * c.head_dim)), v(k.size());
  const int layers = m.last_layer() - m.first_layer();
  double best = 0;
  for (int i = 0; i <= reps; ++i) {  // the first run warms up; the fastest of the rest is kept
    std::copy(h0.begin(), h0.end(), h.begin());
    const double attn0 = times.seconds(Phase::Attention), t0 = now_seconds();
    for (int l = m.first_layer(); l < m.last_layer(); ++l)
      model::decoder_layer_forward(ctx, l, m.layer(l), h.data(), shard, runner, k.data(), v.data(), 0, shard);
    const double t = (now_seconds() - t0 - (times.seconds(Phase::Attention) - attn0)) / layers;
    if (i == 1 || (i > 1 && t < best)) best = t;
  }
  return best;
}

// One thread writing zeros into fresh pages (first touch, page faults included), GB/s: what
// a buffer the process has not used before costs (the K/V cache of a prefill).
double zero_fill_gbs(int reps) {
  const size_t bytes = size_t(128) << 20;
  return double(bytes) / best_seconds(reps, [&] {
           void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
           SLOPE_CHECK(p != MAP_FAILED, "calibrate: cannot map 128 MiB for the zero-fill measurement");
           std::memset(p, 0, bytes);
           asm volatile("" : : "r"(p) : "memory");  // the fill must happen
           munmap(p, bytes);
         }) / 1e9;
}

}  // namespace

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string engine_attention_dtype(const std::string& compute_dtype) {
  return compute_dtype == "bf16" && kernels::bf16_attention_supported() &&
                 kernels::bf16_units() == kernels::Bf16Units::Bf16
             ? "bf16"
             : "fp32";
}

kernels::ComputeType attention_compute(const std::string& attention_dtype) {
  return attention_dtype == "bf16" ? kernels::ComputeType::BF16 : kernels::ComputeType::F32;
}

double causal_attention_gflops(const kernels::AttentionShape& shape, int64_t n, int reps, kernels::ComputeType ct,
                               int64_t rows) {
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t nq = (rows >= 1 && rows < n) ? rows : n, q0 = n - nq;
  const std::vector<float> q = random_floats(size_t(nq * Hq * D), 21), k = random_floats(size_t(n * Hkv * D), 22),
                           v = random_floats(size_t(n * Hkv * D), 23);
  std::vector<float> out(q.size()), lse(size_t(nq * Hq));
  const kernels::AttentionMask mask{true, 0};
  const double s = best_seconds(reps, [&] {
    kernels::flash_attention({.q = q.data(), .nq = nq, .q_pos0 = q0, .k = k.data(), .v = v.data(),
                              .nk = n, .kv_pos0 = 0, .shape = shape, .mask = mask,
                              .scale = 1.f / std::sqrt(float(D)), .compute = ct, .sinks = nullptr,
                              .out = out.data(), .lse = lse.data()});
  });
  return kernels::attention_flops(nq, q0, n, 0, shape, mask) / s / 1e9;
}

std::unique_ptr<model::Model> load_calibration_layers(const std::string& model_dir, const std::string& compute_dtype) {
  model::LoadOptions lo;
  lo.compute = compute_dtype == "bf16" ? kernels::ComputeType::BF16 : kernels::ComputeType::F32;
  lo.load_head = false;
  try {
    const model::ModelConfig probe = model::load_config(model_dir);
    // Up to 4 layers (both attention kinds of an alternating model), at most ~2 GB of weights.
    model::ModelConfig bf16 = probe;
    bf16.mxfp4_experts = false;  // the engine holds experts in bf16
    const double layer_bytes = planner::weight_bytes(bf16).per_layer();
    lo.last_layer = int(std::clamp<int64_t>(int64_t(2e9 / layer_bytes), 1, std::min<int64_t>(4, probe.num_layers)));
    return model::Model::load(model_dir, lo);
  } catch (const Error& e) {
    fail("--model '", model_dir, "': the engine calibration runs the model's own layers, so it needs the "
         "weights, not only config.json (slope make-model writes a model of any preset): ", e.what());
  }
}

void check_engine_options(const EngineOptions& opt) {
  SLOPE_CHECK(opt.compute_dtype == "fp32" || opt.compute_dtype == "bf16", "--dtype must be f32 or bf16, got '",
              opt.compute_dtype, "'");
  SLOPE_CHECK(opt.block_rows >= 1, "--block-rows must be at least 1, got ", opt.block_rows);
  SLOPE_CHECK(opt.moe_rows >= 1, "--moe-rows must be at least 1, got ", opt.moe_rows);
  SLOPE_CHECK(opt.attention_max_tokens >= 1024, "--attention-max-tokens must be at least 1024, got ",
              opt.attention_max_tokens);
}

EngineFigures measure_engine(const model::Model& model, const EngineOptions& opt, parallel::Communicator& world) {
  const model::ModelConfig& cfg = model.config();
  EngineFigures f;
  f.block_rows = opt.block_rows;
  f.moe_rows = opt.moe_rows;
  f.compute_dtype = opt.compute_dtype;
  f.attention_dtype = engine_attention_dtype(opt.compute_dtype);
  const kernels::ComputeType attn_ct = attention_compute(f.attention_dtype);

  world.barrier();
  const double t_ew = elementwise_seconds(cfg, f.compute_dtype == "bf16", opt.block_rows, std::max(3, opt.reps));
  f.elementwise_bytes_per_token =
      planner::elementwise_bytes_per_token(cfg, 1, f.compute_dtype, /*unfused=*/true);
  f.elementwise_gbs = f.elementwise_bytes_per_token * double(opt.block_rows) / t_ew / 1e9;

  // The GEMM rate: a real layer's token-local time less its element-wise part, against the
  // layer's GEMM FLOPs. What the engine loses between kernels (thread wake-ups, cold inputs,
  // primitive look-ups) lands here, at the rate the model prices GEMMs with.
  world.barrier();
  // A MoE layer over one MoE call's rows (o_proj, router and experts run on the call, norm and
  // QKV on blocks), as in a prompt at least that long.
  f.layer_rows = cfg.is_moe() ? std::max(opt.block_rows, opt.moe_rows) : opt.block_rows;
  const double t_layer =
      real_layer_seconds(model, f.layer_rows, opt.block_rows, opt.moe_rows, std::max(3, opt.reps));
  f.layer_seconds = t_layer;
  f.elementwise_seconds = t_ew * double(f.layer_rows) / double(opt.block_rows);  // of those rows
  const double gemm_flops = planner::linear_flops_per_token_layer(cfg) * double(f.layer_rows);
  f.layer_gemm_gflops = gemm_flops / std::max(t_layer - f.elementwise_seconds, 0.5 * t_layer) / 1e9;

  world.barrier();
  f.zero_fill_gbs = zero_fill_gbs(std::max(3, opt.reps));

  f.attention_kv_heads = cfg.num_kv_heads;
  const kernels::AttentionShape shape{cfg.num_heads, cfg.num_kv_heads, cfg.head_dim};
  // Each point is the call a chunked prefill makes at n keys: one block of rows (the last
  // block_rows queries) against all n keys. That is what the engine runs, and it is short (32K
  // keys at the bench shape: ~0.5 s on 2 threads against ~15 s for the whole causal 32K), so
  // every point is the fastest of several runs: a disturbance only slows one down.
  f.attention_curve_query_rows = opt.block_rows;
  for (int64_t n = 1024; n <= opt.attention_max_tokens; n *= 2) {
    world.barrier();
    f.attention_curve.push_back({n, causal_attention_gflops(shape, n, std::max(3, opt.reps), attn_ct, opt.block_rows)});
  }
  world.barrier();
  return f;
}

}  // namespace slope::cli
