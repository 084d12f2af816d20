// `slope calibrate --model`: how SLOPE's own kernels run on this machine at one model's shapes,
// written as the profile's "engine" object (planner::EngineSpec, docs/planner.md):
//   - the element-wise kernels of one decoder layer on one block of rows (norms, q/k/v split,
//     RoPE, bf16 copies of GEMM inputs, routing, MoE gather, SwiGLU, scatter-add), as GB/s of
//     the bytes planner::elementwise_bytes_per_token counts;
//   - causal flash attention at the model's head shape over growing lengths (the curve);
//   - first-touch zero fill of fresh buffers (SLOPE's Tensor memsets every allocation).
// The element-wise sequence mirrors model/layers.cpp (decoder_layer_forward, moe_mlp,
// dense_mlp): change one, change the other.
#include "slope/cli/calibrate_engine.h"

#include <algorithm>
#include <sys/mman.h>

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
#include "slope/planner/cost_model.h"

namespace slope::cli {
namespace {

// Key-equivalents of per-row work in flash_attention (softmax rescale, output update),
// fitted to bench_attention's 1K and 16K causal points (docs/planner.md section 6).
constexpr double kAttentionRowOverhead = 56;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Median of `reps` timed runs after one warm-up run; one untimed-warm-up-free run when reps is 0
// (long attention calls).
template <typename F>
double median_time(int reps, F&& fn) {
  if (reps <= 0) {
    const double t0 = now_seconds();
    fn();
    return now_seconds() - t0;
  }
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    fn();
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

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
  return median_time(reps, layer);
}

// The GEMMs of one layer on one block of `rows` tokens, in the engine's order and shapes:
// q/k/v, o, router, and for an MoE the experts a block feeds (up to 8, each with rows·k/E
// rows and its own weights, so they stream from memory as in a run). GFLOP/s over the layer.
double layer_gemm_gflops(const model::ModelConfig& c, kernels::ComputeType ct, int64_t rows, int reps) {
  const int64_t H = c.hidden_size, D = c.head_dim, qw = c.num_heads * D, kvw = c.num_kv_heads * D;
  const int64_t I = c.intermediate_size;
  struct Call {
    kernels::Linear lin;
    int64_t m;
  };
  std::vector<Call> calls;
  uint32_t seed = 31;
  auto add = [&](int64_t out, int64_t in, int64_t m) {
    const std::vector<float> w = random_floats(size_t(out * in), seed++);
    calls.push_back({kernels::Linear(w.data(), DType::F32, kernels::WeightLayout::OutIn, out, in, nullptr, ct), m});
  };
  add(qw + 2 * kvw, H, rows);
  add(H, qw, rows);
  if (c.is_moe()) {
    add(c.num_experts, H, rows);
    const int64_t m = std::max<int64_t>(1, rows * c.experts_per_token / c.num_experts);
    for (int64_t e = 0; e < std::min<int64_t>(c.num_experts, 8); ++e) {
      add(2 * I, H, m);
      add(H, I, m);
    }
  } else {
    add(2 * I, H, rows);
    add(H, I, rows);
  }
  int64_t max_in = 0, max_out = 0;
  double flops = 0;
  for (const Call& call : calls) {
    max_in = std::max(max_in, call.m * call.lin.in_features());
    max_out = std::max(max_out, call.m * call.lin.out_features());
    flops += 2.0 * double(call.m) * double(call.lin.in_features()) * double(call.lin.out_features());
  }
  const std::vector<float> x = random_floats(size_t(max_in), 41);
  std::vector<float> y(static_cast<size_t>(max_out));
  const double s = median_time(reps, [&] {
    for (const Call& call : calls) call.lin.forward(x.data(), call.m, y.data());
  });
  return flops / s / 1e9;
}

// Causal self-attention at the model's head shape, GFLOP/s of exact pairs.
double attention_gflops_at(const model::ModelConfig& c, int64_t n, int reps) {
  const kernels::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim};
  const std::vector<float> q = random_floats(size_t(n * c.num_heads * c.head_dim), 21),
                           k = random_floats(size_t(n * c.num_kv_heads * c.head_dim), 22),
                           v = random_floats(size_t(n * c.num_kv_heads * c.head_dim), 23);
  std::vector<float> out(q.size()), lse(size_t(n * c.num_heads));
  const kernels::AttentionMask mask{true, 0};
  const double s = median_time(reps, [&] {
    kernels::flash_attention(q.data(), n, 0, k.data(), v.data(), n, 0, shape, mask,
                             float(c.attention_scale()), nullptr, out.data(), lse.data());
  });
  return kernels::attention_flops(n, 0, n, 0, shape, mask) / s / 1e9;
}

// One thread writing zeros into fresh pages (first touch, page faults included), GB/s: what
// a buffer the process has not used before costs (the K/V cache of a prefill).
double zero_fill_gbs(int reps) {
  const size_t bytes = size_t(128) << 20;
  return double(bytes) / median_time(reps, [&] {
           void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
           SLOPE_CHECK(p != MAP_FAILED, "calibrate: cannot map 128 MiB for the zero-fill measurement");
           std::memset(p, 0, bytes);
           asm volatile("" : : "r"(p) : "memory");  // the fill must happen
           munmap(p, bytes);
         }) / 1e9;
}

}  // namespace

void check_engine_options(const EngineOptions& opt) {
  SLOPE_CHECK(opt.compute_dtype == "fp32" || opt.compute_dtype == "bf16", "--dtype must be fp32 or bf16, got '",
              opt.compute_dtype, "'");
  SLOPE_CHECK(opt.block_rows >= 1, "--block-rows must be at least 1, got ", opt.block_rows);
  SLOPE_CHECK(opt.attention_max_tokens >= 1024, "--attention-max-tokens must be at least 1024, got ",
              opt.attention_max_tokens);
}

EngineFigures measure_engine(const model::ModelConfig& cfg, const EngineOptions& opt, parallel::Communicator& world) {
  check_engine_options(opt);
  EngineFigures f;
  f.block_rows = opt.block_rows;
  f.attention_block_q = kernels::kAttentionBlockQ;
  f.attention_block_k = kernels::kAttentionBlockK;
  f.attention_row_overhead = kAttentionRowOverhead;
  f.compute_dtype = opt.compute_dtype;

  world.barrier();
  f.layer_gemm_gflops = layer_gemm_gflops(
      cfg, f.compute_dtype == "bf16" ? kernels::ComputeType::BF16 : kernels::ComputeType::F32, opt.block_rows,
      std::max(3, opt.reps));

  world.barrier();
  const double t_ew = elementwise_seconds(cfg, f.compute_dtype == "bf16", opt.block_rows, std::max(3, opt.reps));
  f.elementwise_bytes_per_token =
      planner::elementwise_bytes_per_token(cfg, 1, f.compute_dtype, /*unfused=*/true);
  f.elementwise_gbs = f.elementwise_bytes_per_token * double(opt.block_rows) / t_ew / 1e9;

  world.barrier();
  f.zero_fill_gbs = zero_fill_gbs(std::max(3, opt.reps));

  f.attention_kv_heads = cfg.num_kv_heads;
  for (int64_t n = 1024; n <= opt.attention_max_tokens; n *= 2) {
    world.barrier();
    // Long calls are timed once (32K at the bench shape is ~15 s on 2 threads).
    const int reps = n <= 8192 ? std::max(1, opt.reps / 2) : 0;
    f.attention_curve.push_back({n, attention_gflops_at(cfg, n, reps)});
  }
  world.barrier();
  return f;
}

}  // namespace slope::cli
