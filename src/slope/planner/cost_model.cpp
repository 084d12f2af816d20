#include "slope/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "slope/core/error.h"
#include "slope/kernels/attention.h"

namespace slope::planner {

using model::ModelConfig;

namespace {

// Kernels one layer launches besides attention (norms, projections, RoPE, router, top-k,
// expert GEMMs, SwiGLU, residual adds); attention adds one per ring step plus a merge.
constexpr double kKernelsPerLayer = 12;
// e2m1 values plus one e8m0 scale per 32: 4 + 8/32 bits.
constexpr double kMxfp4BytesPerParam = 4.25 / 8;

double bf16_bytes(double params) { return 2 * params; }

// Roofline time of a kernel: the slower of its arithmetic and its memory traffic.
double roof(double flops, double flop_rate, double bytes, double byte_rate) {
  return std::max(flops / flop_rate, bytes / byte_rate);
}

// Heads per rank. TP splits query heads evenly and KV heads when it can, otherwise each rank
// keeps the one KV head its query heads use (replication); Ulysses does the same on top.
struct HeadSplit {
  double q_tp, kv_tp;  // per TP rank
  double q_u, kv_u;    // per Ulysses rank within a TP rank (full-attention layers)
};
HeadSplit head_split(const ModelConfig& cfg, const Mesh& m) {
  HeadSplit h;
  h.q_tp = double(cfg.num_heads) / m.tp;
  h.kv_tp = m.tp <= cfg.num_kv_heads ? double(cfg.num_kv_heads) / m.tp : 1.0;
  h.q_u = h.q_tp / m.ulysses;
  h.kv_u = m.ulysses <= h.kv_tp ? h.kv_tp / m.ulysses : 1.0;
  return h;
}

// Where the mesh's transfers go: a ring hop and a pipeline hop leave the node or stay in it.
struct Links {
  double ring_bw = 0, ring_lat = 0;  // per rank
  double pp_intra_bw = 0, pp_intra_lat = 0, pp_net_bw = 0, pp_net_lat = 0;
};
Links links_of(const HardwareProfile& hw, const Mesh& m) {
  const int D = hw.node.devices_per_node;
  const int st = m.stage_size();
  const int group = m.ulysses * m.tp;  // ranks at one ring position
  const double node_bw = hw.network.bandwidth_gbs_per_node * 1e9;
  const double dev_bw = hw.network.bandwidth_gbs_per_device * 1e9;
  Links l;
  bool ring_in_node = st <= D && D % st == 0;
  if (ring_in_node) {
    l.ring_bw = hw.node.p2p.bytes_per_s();
    l.ring_lat = hw.node.p2p.latency_s();
  } else {
    // One ring position per node sends off-node each step: its U·TP ranks share the NICs.
    l.ring_bw = std::min({hw.node.p2p.bytes_per_s(), dev_bw, node_bw / group});
    l.ring_lat = hw.network.latency_us * 1e-6;
  }
  l.pp_intra_bw = hw.node.p2p.bytes_per_s();
  l.pp_intra_lat = hw.node.p2p.latency_s();
  // A stage boundary that is a node boundary: min(st, D) ranks of the node send at once.
  l.pp_net_bw = std::min(dev_bw, node_bw / std::min(st, D));
  l.pp_net_lat = hw.network.latency_us * 1e-6;
  return l;
}

// Cost of one stage for one chunk, split into phases; bytes sent per rank by kind.
struct StageCost {
  PhaseTimes t;
  double flops = 0;
  double ulysses_bytes = 0, ring_bytes = 0, halo_bytes = 0, allreduce_bytes = 0;
};

void add_scaled(StageCost& a, const StageCost& b, double n) {
  PhaseTimes& x = a.t;
  const PhaseTimes& y = b.t;
  x.linear += n * y.linear, x.elementwise += n * y.elementwise, x.attention += n * y.attention;
  x.ulysses += n * y.ulysses, x.ring_exposed += n * y.ring_exposed, x.halo += n * y.halo;
  x.tp_allreduce += n * y.tp_allreduce, x.overhead += n * y.overhead, x.lm_head += n * y.lm_head;
  x.pipeline_fill += n * y.pipeline_fill;
  a.flops += n * b.flops;
  a.ulysses_bytes += n * b.ulysses_bytes, a.ring_bytes += n * b.ring_bytes, a.halo_bytes += n * b.halo_bytes;
  a.allreduce_bytes += n * b.allreduce_bytes;
}

}  // namespace

double attention_tile_work(int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t window, int64_t bq,
                           int64_t bk, double row_overhead) {
  if (q1 <= q0 || k1 <= k0) return 0;
  if (bq <= 0 || bk <= 0) {
    // Exact pairs: Σ over queries of the visible keys in [k0, k1), causal, window W.
    double pairs = 0;
    auto visible = [&](int64_t q) {  // keys of query q in [k0, k1)
      int64_t lo = window > 0 ? std::max(k0, q - window + 1) : k0, hi = std::min(k1, q + 1);
      return std::max<int64_t>(0, hi - lo);
    };
    for (int64_t q = q0; q < q1; ++q) pairs += double(visible(q));
    return pairs;
  }
  // Every key visible to every query (keys all before the first query, no window reaching
  // them): a rectangle, tiles of full width except the last.
  if (k1 <= q0 + 1 && (window <= 0 || q1 - window + 1 <= k0))
    return double(q1 - q0) * (double(k1 - k0) + row_overhead);
  double work = 0;
  if (window > 0 && window < kernels::kAttentionWindowBlockMaxW) {
    // Short windows: each query vector (kAttentionWindowVectorQ rows from q0) computes the keys
    // some row of it sees, from the first, whatever the tiles: W + 15 per row in a long run.
    const int64_t vq = kernels::kAttentionWindowVectorQ;
    for (int64_t b0 = q0; b0 < q1; b0 += vq) {
      const int64_t b1 = std::min(b0 + vq, q1);
      const int64_t lo = std::max(k0, b0 - window + 1), hi = std::min(k1, b1);
      if (hi > lo) work += double(b1 - b0) * (double(hi - lo) + row_overhead);
    }
    return work;
  }
  for (int64_t b0 = q0; b0 < q1; b0 += bq) {
    const int64_t b1 = std::min(b0 + bq, q1);
    const int64_t lo = window > 0 ? std::max(k0, b0 - window + 1) : k0;  // first key any row sees
    const int64_t hi = std::min(k1, b1);                                   // one past the last
    if (hi <= lo) continue;
    const int64_t t_lo = (lo - k0) / bk, t_hi = (hi - 1 - k0) / bk;
    double keys = double(t_hi - t_lo + 1) * double(bk);
    keys -= double(std::max<int64_t>(0, k0 + (t_hi + 1) * bk - k1));  // the last tile is narrower
    work += double(b1 - b0) * (keys + row_overhead);
  }
  return work;
}

std::string mesh_name(const Mesh& m) {
  std::ostringstream os;
  const char* sep = "";
  auto put = [&](const char* k, int v) {
    if (v > 1) {
      os << sep << k << v;
      sep = " ";
    }
  };
  put("U", m.ulysses);
  put("R", m.ring);
  put("P", m.pp);
  put("TP", m.tp);
  if (m.size() == 1) os << "1 rank";
  if (m.pp > 1 && m.pp_chunk > 0) os << " chunk " << m.pp_chunk;
  return os.str();
}

double PhaseTimes::total() const {
  return linear + elementwise + attention + ulysses + ring_exposed + halo + tp_allreduce + overhead +
         lm_head + pipeline_fill;
}

FlopCount prefill_flop_count(const ModelConfig& cfg, int64_t tokens) {
  FlopCount f;
  f.linear = linear_flops_per_token_layer(cfg) * double(cfg.num_layers) * double(tokens);
  const double per_pair = attention_flops_per_pair(cfg);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    int64_t w = model::layer_window(cfg, l);
    double a = per_pair * attention_pairs(0, tokens, w);
    (w > 0 ? f.attention_sliding : f.attention_full) += a;
  }
  f.lm_head = lm_head_flops_per_token(cfg);
  return f;
}

WeightBytes weight_bytes(const ModelConfig& c) {
  const double h = double(c.hidden_size), d = double(c.head_dim), H = double(c.num_heads),
               KV = double(c.num_kv_heads), inter = double(c.intermediate_size);
  WeightBytes w;
  double attn = model::attention_weight_params(c, c.num_heads, c.num_kv_heads);
  if (c.qkv_bias) attn += (H + 2 * KV) * d;
  if (c.o_bias) attn += h;
  if (c.sinks) attn += H;
  w.attention_per_layer = bf16_bytes(attn);
  if (c.is_moe()) {
    const double E = double(c.num_experts);
    w.router_per_layer = bf16_bytes(model::router_weight_params(c) + E);  // weight and bias
    const double matrices = model::mlp_weight_params(c, c.intermediate_size);  // gate_up [2·inter, h], down [h, inter]
    const double biases = 2 * inter + h;
    w.expert_bytes = (c.mxfp4_experts ? matrices * kMxfp4BytesPerParam : bf16_bytes(matrices)) + bf16_bytes(biases);
    w.mlp_per_layer = E * w.expert_bytes;
  } else {
    w.mlp_per_layer = bf16_bytes(model::mlp_weight_params(c, c.intermediate_size));
  }
  w.norms_per_layer = 4 * (2 * h + (c.qk_norm ? 2 * d : 0));
  w.embedding = bf16_bytes(double(c.vocab_size) * h);
  w.lm_head = c.tie_word_embeddings ? 0 : bf16_bytes(double(c.vocab_size) * h);
  w.final_norm = 4 * h;
  return w;
}

double elementwise_bytes_per_token(const ModelConfig& cfg, int tp, const std::string& compute_dtype,
                                   bool unfused) {
  SLOPE_CHECK(tp >= 1, "tensor-parallel degree must be at least 1, got ", tp);
  Mesh m;
  m.tp = tp;
  const HeadSplit hs = head_split(cfg, m);
  const double h = double(cfg.hidden_size), d = double(cfg.head_dim), H = double(cfg.num_heads),
               KV = double(cfg.num_kv_heads), inter = double(cfg.intermediate_size);
  const double k = double(cfg.experts_per_token), TP = tp;
  // Fused: 2 norms and 2 residuals over hidden, RoPE over q and k, SwiGLU over the
  // intermediate, in fp32.
  if (!unfused) return 4 * (8 * h + 2 * (H + KV) * d / TP + (cfg.is_moe() ? 3 * k * inter : 3 * inter) / TP);
  // Unfused, as SLOPE's CPU engine runs (fp32 between kernels): input and post norms (read +
  // write hidden), the fused qkv output split into q, k, v, RoPE read + write of q and k, a
  // bf16 copy of every GEMM input (read 4, write 2 bytes), the o_proj sum into the residual,
  // under TP the all-reduced partial added twice, and for MoE the gather of each token's k
  // expert rows, SwiGLU (read 2I, write I) and the weighted scatter-add (read y, read + write h).
  const double Hq_tp = hs.q_tp, K_tp = hs.kv_tp, I_tp = inter / TP;
  const double conv = compute_dtype == "fp32" ? 0.0 : 6.0;  // bytes per GEMM input element
  const double qkv_w = (Hq_tp + 2 * K_tp) * d;
  double bytes = 8 * h + 8 * qkv_w + 8 * (Hq_tp + K_tp) * d + conv * (h + Hq_tp * d) + 4 * h + 8 * h;
  if (tp > 1) bytes += 2 * 12 * h;
  if (cfg.is_moe())
    bytes += conv * (h + k * h + k * I_tp) + 8 * k * h + 12 * k * I_tp + 12 * k * h;
  else
    bytes += conv * (h + I_tp) + 12 * I_tp;
  return bytes;
}

double kv_bytes_per_token_layer(const ModelConfig& c) {
  return model::kv_elements_per_token_layer(c, c.num_kv_heads) * 2.0;
}

std::string mesh_problem(const ModelConfig& cfg, const HardwareProfile& hw, const Mesh& m) {
  // What the engine refuses, in the engine's words: one check for both.
  if (std::string why = model::mesh_problem(m, cfg); !why.empty()) return why;
  const int D = hw.node.devices_per_node;
  if (m.ulysses > kMaxMeshDegree || m.ring > kMaxMeshDegree || m.pp > kMaxMeshDegree || m.tp > kMaxMeshDegree ||
      int64_t(m.ulysses) * m.ring * m.pp * m.tp > kMaxMeshRanks)
    return str_cat("degrees above ", kMaxMeshDegree, " or more than ", kMaxMeshRanks, " ranks are not modelled");
  const int group = m.ulysses * m.tp;
  if (group > D || D % group != 0)
    return str_cat("U·TP = ", group, " must divide the ", D, " devices of a node (Ulysses and TP stay inside a node)");
  return "";
}

Prediction predict(const ModelConfig& cfg, const HardwareProfile& hw, const Mesh& mesh, int64_t tokens,
                   const CostOptions& opt) {
  SLOPE_CHECK(tokens >= 1 && tokens <= kMaxContextTokens, "prompt length must be between 1 and ", kMaxContextTokens,
              " tokens, got ", tokens);
  if (auto p = mesh_problem(cfg, hw, mesh); !p.empty()) fail("mesh ", mesh_name(mesh), " cannot run ", cfg.architecture, ": ", p);
  SLOPE_CHECK(cfg.num_layers > 0 && cfg.hidden_size > 0 && cfg.head_dim > 0 && cfg.num_heads > 0 &&
                  cfg.num_kv_heads > 0 && cfg.intermediate_size > 0 && cfg.vocab_size > 0,
              "model config is incomplete (layers, hidden, heads, head_dim, intermediate, vocab must be positive)");

  const Mesh& m = mesh;
  const HeadSplit hs = head_split(cfg, m);
  const Links lk = links_of(hw, m);
  const WeightBytes wb = weight_bytes(cfg);
  const DeviceSpec& dev = hw.device;
  const double mem_bw = dev.memory_bytes_per_s();
  const double mm_rate = hw.matmul(opt.compute_dtype).flops_per_s();
  const double expert_rate =
      (cfg.mxfp4_experts && dev.matmul.count("mxfp4")) ? hw.matmul("mxfp4").flops_per_s() : mm_rate;
  const EngineSpec eng = opt.use_engine_spec ? hw.engine : EngineSpec{};
  // The profile's engine object says which attention kernel SLOPE runs with bf16 GEMMs (the bf16
  // kernel where the CPU has it, else fp32); fp32 GEMMs always take the fp32 kernel. Its curve
  // was measured with that kernel, so it prices only attention of that dtype.
  const std::string attn_dtype = opt.compute_dtype == "fp32" ? std::string("fp32")
                                 : eng.attention_dtype.empty() ? opt.compute_dtype
                                                               : eng.attention_dtype;
  const bool curve_applies = eng.attention_dtype.empty() || attn_dtype == eng.attention_dtype;
  double attn_rate = hw.attention(attn_dtype).flops_per_s();
  const bool tiles = eng.attention_block_q > 0 && eng.attention_block_k > 0;
  const int64_t bq = tiles ? eng.attention_block_q : 0, bk = tiles ? eng.attention_block_k : 0;
  const double row_ovh = tiles ? eng.attention_row_overhead : 0;
  if (tiles && eng.attention_calibrated_tokens > 0) {
    // The profile's rate counts exact pairs of a causal self-attention of n_cal tokens; the
    // kernel did the tile work of that call in the same time.
    const int64_t n_cal = eng.attention_calibrated_tokens;
    attn_rate *= attention_tile_work(0, n_cal, 0, n_cal, 0, bq, bk, row_ovh) / attention_pairs(0, n_cal, 0);
  }
  // Full layers with a measured curve: the per-tile rate at the number of keys a call streams
  // per KV head, log-interpolated between the curve's points. (Not the footprint keys × KV
  // heads: Ulysses and TP ranks with half the KV heads attend no faster per pair at the same
  // key count; measured U2 at 32K, 81.5 s against 72.9 s predicted from the footprint.)
  std::vector<std::pair<double, double>> curve;  // (log tokens, per-tile FLOP/s)
  for (const auto& [n, gf] : curve_applies ? eng.attention_curve : std::vector<std::pair<int64_t, double>>{}) {
    // The measured call: the last `attention_curve_query_rows` queries (0: all n) against n keys.
    const int64_t rows = eng.attention_curve_query_rows, q0 = (rows > 0 && rows < n) ? n - rows : 0;
    curve.push_back({std::log(double(n)), gf * 1e9 * attention_tile_work(q0, n, 0, n, 0, bq, bk, row_ovh) /
                                              attention_pairs(q0, n, 0)});
  }
  auto full_rate = [&](double keys) {
    if (curve.empty()) return attn_rate;
    const double x = std::log(std::max(1.0, keys));
    if (x <= curve.front().first) return curve.front().second;
    if (x >= curve.back().first) return curve.back().second;
    size_t i = 1;
    while (curve[i].first < x) ++i;
    const double f = (x - curve[i - 1].first) / (curve[i].first - curve[i - 1].first);
    return curve[i - 1].second + f * (curve[i].second - curve[i - 1].second);
  };
  const double wire = eng.wire_bytes > 0 ? eng.wire_bytes : opt.wire_bytes;
  const double msg = eng.message_overhead_us * 1e-6;
  const double kern = dev.kernel_overhead_us * 1e-6;

  const double h = double(cfg.hidden_size), d = double(cfg.head_dim), H = double(cfg.num_heads),
               KV = double(cfg.num_kv_heads), inter = double(cfg.intermediate_size);
  const double E = double(cfg.num_experts), k = double(cfg.experts_per_token);
  const double cp = double(m.ring) * m.ulysses;  // ranks a chunk's tokens are split over
  const double TP = m.tp;
  const double pair_flops = attention_flops_per_pair(cfg);

  // Chunks of the prompt that flow through the pipeline.
  const int64_t asked = m.pipeline_chunk(tokens);  // -1: the engine's default
  const int64_t chunk = (asked <= 0 || asked >= tokens) ? tokens : asked;
  const int64_t n_chunks = (tokens + chunk - 1) / chunk;  // tokens, chunk <= 2^31: no overflow
  SLOPE_CHECK(n_chunks <= kMaxPipelineChunks, "pipeline chunk ", chunk, " splits ", tokens, " tokens into ", n_chunks,
              " chunks; the cost model takes at most ", kMaxPipelineChunks, ": use a chunk of at least ",
              (tokens + kMaxPipelineChunks - 1) / kMaxPipelineChunks, " tokens");

  // Layers of each stage: the engine's split, balanced by FLOPs for this prompt length.
  const std::vector<int> bounds = model::balance_stages(cfg, m.pp, tokens);
  std::vector<std::vector<int64_t>> stage_layers(m.pp);
  for (int s = 0; s < m.pp; ++s)
    for (int l = bounds[s]; l < bounds[s + 1]; ++l) stage_layers[s].push_back(l);

  // Attention work of the busiest rank for the chunk [p, p + c) in key-equivalents per query
  // head (tile work with the engine's tiles, else exact pairs / ranks). Full layers: ring
  // position r holds the zigzag pieces r and 2R-1-r of the chunk (all its Ulysses ranks' rows,
  // gathered), and attends to every piece of this chunk and all earlier keys; sliding layers:
  // each rank's own rows against its keys and the halo.
  auto attention_work = [&](int64_t w, int64_t p, int64_t c) -> double {
    if (!tiles) return attention_pairs(p, p + c, w) / (w <= 0 ? double(m.ring) : cp);
    const int R = m.ring;
    auto piece = [&](int i, int parts) {  // [start, end) of piece i of `parts` of the chunk
      return std::pair<int64_t, int64_t>{p + i * c / parts, p + (i + 1) * c / parts};
    };
    double worst = 0;
    for (int r = 0; r < R; ++r) {
      std::vector<std::pair<int64_t, int64_t>> mine;
      if (R == 1) mine.push_back({p, p + c});
      else mine = {piece(r, 2 * R), piece(2 * R - 1 - r, 2 * R)};
      double work = 0;
      if (w <= 0 && cp == 1) {
        // One rank: the cache is one contiguous run of keys [0, p + c).
        work = attention_tile_work(p, p + c, 0, p + c, 0, bq, bk, row_ovh);
      } else if (w <= 0) {
        // Earlier chunks' keys [0, p) are all visible: p keys per row, one call per earlier
        // piece (2R pieces per chunk, R = 1: one); this chunk's pieces tile by tile.
        const double earlier_calls = double(p / chunk) * (R == 1 ? 1 : 2 * R);
        for (auto [a, b] : mine) {
          work += double(b - a) * (double(p) + earlier_calls * row_ovh);
          if (R == 1) {
            work += attention_tile_work(a, b, p, b, 0, bq, bk, row_ovh);
          } else {
            for (int i = 0; i < 2 * R; ++i) {
              auto [k0, k1] = piece(i, 2 * R);
              work += attention_tile_work(a, b, k0, std::min(k1, b), 0, bq, bk, row_ovh);
            }
          }
        }
      } else {
        // Sliding: Ulysses rank 0 of the position holds the first 1/U of each piece; keys from
        // the window before it (the halo) to its end; one rank reads its cache from 0.
        for (auto [a, b] : mine) {
          const int64_t b_u = a + (b - a) / m.ulysses;
          const int64_t k0 = cp > 1 ? std::max<int64_t>(0, a - w + 1) : 0;
          work += attention_tile_work(a, b_u, k0, b_u, w, bq, bk, row_ovh);
        }
      }
      worst = std::max(worst, work);
    }
    return worst;
  };

  const double ew_per_token = elementwise_bytes_per_token(cfg, m.tp, opt.compute_dtype, eng.unfused_elementwise);
  // Element-wise kernels run at the rate the profile measured for them, else stream at the
  // memory bandwidth.
  const double ew_rate = eng.elementwise_gbs > 0 ? eng.elementwise_gbs * 1e9 : mem_bw;
  const double gemm_rows = double(eng.gemm_rows);
  // A MoE layer's o_proj, router and experts run on blocks of moe_rows (at least gemm_rows).
  const double moe_rows = eng.gemm_rows > 0 && eng.moe_rows > eng.gemm_rows ? double(eng.moe_rows) : gemm_rows;
  const bool zero_fills = eng.zero_fill_gbs > 0;

  // Cost of one layer of window w on one rank for the chunk of queries [p, p + c).
  auto layer_cost = [&](int64_t w, double p, double c, StageCost& sc) {
    const double t = c / cp;  // tokens per rank for token-local work (TP ranks share them)
    // Token-local work runs in blocks of gemm_rows tokens (the engine's --chunk).
    const double blocks = gemm_rows > 0 ? std::ceil(t / gemm_rows) : 1.0;
    // o_proj, the router and the experts of a MoE layer: blocks of moe_rows tokens.
    const double moe_blocks = moe_rows > 0 ? std::ceil(t / moe_rows) : 1.0;
    const double moe_block = moe_rows > 0 ? std::min(t, moe_rows) : t;
    // Linear layers: each GEMM is a roofline of its FLOPs and its weight + activation bytes.
    const double proj_flops = t * 2 * model::attention_weight_params(cfg, cfg.num_heads, cfg.num_kv_heads) / TP;
    const double proj_bytes = blocks * wb.attention_per_layer / TP + t * wire * (2 * h + (2 * H + 2 * KV) * d / TP);
    double lin = roof(proj_flops, mm_rate, proj_bytes, mem_bw);
    double mlp_flops;
    if (cfg.is_moe()) {
      const double router_flops = t * model::router_flops_per_token_layer(cfg);
      lin += roof(router_flops, mm_rate, moe_blocks * wb.router_per_layer + t * wire * (h + E), mem_bw);
      // Experts touched by a block of tokens choosing k of E each (uniform routing):
      // E(1 - (1 - k/E)^t); each touched expert's weights are read once per block.
      const double touched = E * (1 - std::pow(1 - k / E, moe_block));
      mlp_flops = t * k * 2 * model::mlp_weight_params(cfg, cfg.intermediate_size) / TP;
      const double mlp_bytes = moe_blocks * touched * wb.expert_bytes / TP + t * k * wire * (2 * h + 3 * inter / TP);
      lin += roof(mlp_flops, expert_rate, mlp_bytes, mem_bw);
      sc.flops += router_flops;
    } else {
      mlp_flops = t * 2 * model::mlp_weight_params(cfg, cfg.intermediate_size) / TP;
      lin += roof(mlp_flops, mm_rate, blocks * wb.mlp_per_layer / TP + t * wire * (2 * h + 3 * inter / TP), mem_bw);
    }
    sc.flops += proj_flops + mlp_flops;
    sc.t.linear += lin;
    sc.t.elementwise += t * ew_per_token / ew_rate;

    const double attn_flops = attention_pairs(int64_t(p), int64_t(p + c), w) * pair_flops / (cp * TP);
    sc.flops += attn_flops;
    // Time-relevant work (tiles, or exact pairs) of the busiest rank, its heads only.
    // Full layers: a ring position's rows with 1/U of the heads; sliding: a rank's rows.
    const double attn_work_flops = attention_work(w, int64_t(p), int64_t(c)) * pair_flops / TP /
                                   (w <= 0 ? double(m.ulysses) : 1.0);
    double kernels = kKernelsPerLayer + 1;
    if (w <= 0) {
      // The K/V a call streams: all keys so far (a ring step: one rank's share) of my KV heads.
      const double comp = attn_work_flops / full_rate((p + c) / m.ring);
      if (m.ulysses > 1) {
        // Before: q, k, v of my tokens to the ranks owning their heads; after: o back.
        const double bytes = t * d * wire * (m.ulysses - 1) * (2 * hs.q_u + 2 * hs.kv_u);
        sc.ulysses_bytes += bytes;
        sc.t.ulysses += bytes / hw.node.alltoall.bytes_per_s() + 2 * (hw.node.alltoall.latency_s() + msg);
      }
      if (m.ring > 1) {
        // Ring of R steps; step i computes on the K/V block held while block i+1 travels.
        // A block is this rank's share of all keys so far: (p + c)/R tokens, kv_u heads.
        const double block = (p + c) / m.ring * hs.kv_u * d * 2 * wire;
        const double step_comp = comp / m.ring;
        const double step = std::max(step_comp, block / lk.ring_bw) + lk.ring_lat + msg;
        const double ring = step_comp + (m.ring - 1) * step;
        sc.t.attention += comp;
        sc.t.ring_exposed += ring - comp;
        sc.ring_bytes += (m.ring - 1) * block;
        kernels += m.ring;
      } else {
        sc.t.attention += comp;
      }
    } else {
      // Sliding window: local flash attention on my tokens with all my heads; it reads q, k, v
      // once, so short windows are memory-bound.
      const double sl_flops = tiles ? attn_work_flops : attn_flops;
      const double bytes = t * wire * (H + 2 * KV) * d / TP * 2;
      sc.t.attention += roof(sl_flops, attn_rate, bytes, mem_bw);
      if (cp > 1) {
        // Halo: the previous W-1 tokens' K/V from the shard before each of my segments
        // (two segments under zigzag ring sharding).
        const double segs = m.ring > 1 ? 2 : 1;
        const double seg_bytes = double(std::min<int64_t>(w - 1, int64_t(p + c))) * hs.kv_tp * d * 2 * wire;
        const double bw = m.ring > 1 ? lk.ring_bw : hw.node.p2p.bytes_per_s();
        const double lat = (m.ring > 1 ? lk.ring_lat : hw.node.p2p.latency_s()) + msg;
        sc.halo_bytes += segs * seg_bytes;
        sc.t.halo += segs * (lat + seg_bytes / bw);
      }
    }
    if (m.tp > 1) {
      // Two all-reduces of [t, hidden] per layer (after o_proj and after the MLP), per block
      // of gemm_rows tokens (moe_rows in a MoE layer); ring all-reduce moves 2(TP-1)/TP of the
      // buffer at the bus bandwidth.
      const double bytes = t * h * wire * 2 * (TP - 1) / TP;
      const double calls = cfg.is_moe() ? moe_blocks : blocks;
      sc.allreduce_bytes += 2 * bytes;
      sc.t.tp_allreduce += 2 * (bytes / hw.node.allreduce.bytes_per_s() + calls * (hw.node.allreduce.latency_s() + msg));
    }
    sc.t.overhead += kernels * kern;
    // The attention output [t, H_tp, d] fp32 is cleared before each layer's attention.
    if (zero_fills) sc.t.overhead += t * hs.q_tp * d * 4 / mem_bw;
  };

  // Per stage, per chunk costs.
  std::vector<std::vector<StageCost>> cost(m.pp, std::vector<StageCost>(n_chunks));
  for (int s = 0; s < m.pp; ++s) {
    for (int64_t j = 0; j < n_chunks; ++j) {
      const double p = double(j * chunk), c = double(std::min(chunk, tokens - j * chunk));
      StageCost& sc = cost[s][j];
      // Layers with the same window cost the same: evaluate each window once, scale by count.
      std::map<int64_t, int> windows;
      for (int64_t l : stage_layers[s]) ++windows[model::layer_window(cfg, l)];
      for (const auto& [w, count] : windows) {
        StageCost one;
        layer_cost(w, p, c, one);
        add_scaled(sc, one, count);
      }
      if (j == 0 && zero_fills) {
        // Memory the process touches for the first time, before and in chunk 0: the K/V cache
        // of the stage's layers for all of the rank's rows (a K and a V tensor [rows, kv_tp, d]
        // fp32 per layer) and the layer buffers for q and the attention output of a chunk.
        const double kv = 2 * double(stage_layers[s].size()) * double(tokens) / cp * hs.kv_tp * d * 4;
        const double layer_buffers = 2 * c / cp * hs.q_tp * d * 4;
        sc.t.overhead += (kv + layer_buffers) / (eng.zero_fill_gbs * 1e9);
      }
      if (s == m.pp - 1 && j == n_chunks - 1) {
        // lm_head on the last token only (prefill returns the first token's logits), whole, on
        // the tensor rank 0 that holds the last position (the engine does not split the vocabulary).
        const double head_bytes = wb.lm_head > 0 ? wb.lm_head : wb.embedding;
        sc.t.lm_head += roof(lm_head_flops_per_token(cfg), mm_rate, head_bytes, mem_bw) + kern;
        sc.flops += lm_head_flops_per_token(cfg);
      }
    }
  }

  // Activation hop from stage s to s+1 for chunk j: each rank sends its tokens' hidden state.
  auto hop = [&](int s, int64_t j, double* bytes_out) {
    const double c = double(std::min(chunk, tokens - j * chunk));
    const double bytes = c / cp * h * wire / TP;
    if (bytes_out) *bytes_out += bytes;
    const int D = hw.node.devices_per_node, st = m.stage_size();
    const bool crosses = st >= D || ((s + 1) * st) % D == 0;
    return crosses ? lk.pp_net_lat + bytes / lk.pp_net_bw : lk.pp_intra_lat + bytes / lk.pp_intra_bw;
  };

  // Flow shop (chunks in order through stages): finish[s][j] =
  //   max(finish[s-1][j] + hop, finish[s][j-1]) + time[s][j].
  std::vector<double> prev(n_chunks, 0.0), cur(n_chunks, 0.0);
  for (int s = 0; s < m.pp; ++s) {
    for (int64_t j = 0; j < n_chunks; ++j) {
      double ready = s > 0 ? prev[j] + hop(s - 1, j, nullptr) : 0.0;
      double free = j > 0 ? cur[j - 1] : 0.0;
      cur[j] = std::max(ready, free) + cost[s][j].t.total();
    }
    std::swap(prev, cur);
  }
  const double makespan = prev[n_chunks - 1];

  Prediction out;
  out.mesh = m;
  out.tokens = tokens;
  out.chunks = n_chunks;
  out.ttft_s = makespan;

  // The busiest stage sets throughput and gives the breakdown; the rest of the makespan is
  // pipeline fill (bubble and activation hops).
  int busiest = 0;
  double busiest_time = -1;
  for (int s = 0; s < m.pp; ++s) {
    double busy = 0;
    for (const auto& sc : cost[s]) busy += sc.t.total();
    if (busy > busiest_time) busiest_time = busy, busiest = s;
  }
  out.service_s = busiest_time;
  for (const auto& sc : cost[busiest]) {
    PhaseTimes& a = out.phases;
    const PhaseTimes& b = sc.t;
    a.linear += b.linear, a.elementwise += b.elementwise, a.attention += b.attention, a.ulysses += b.ulysses;
    a.ring_exposed += b.ring_exposed, a.halo += b.halo, a.tp_allreduce += b.tp_allreduce;
    a.overhead += b.overhead, a.lm_head += b.lm_head;
    out.flops_per_rank += sc.flops;
    out.ulysses_bytes += sc.ulysses_bytes, out.ring_bytes += sc.ring_bytes, out.halo_bytes += sc.halo_bytes;
    out.allreduce_bytes += sc.allreduce_bytes;
  }
  out.phases.pipeline_fill = std::max(0.0, makespan - busiest_time);
  if (m.pp > 1 && busiest < m.pp - 1)
    for (int64_t j = 0; j < n_chunks; ++j) hop(busiest, j, &out.pipeline_bytes);
  for (int s = 0; s < m.pp; ++s)
    for (const auto& sc : cost[s]) out.flops_total += sc.flops * m.stage_size();
  // lm_head runs once, on one rank, for the last token (it is in every rank's stage cost above).
  out.flops_total -= lm_head_flops_per_token(cfg) * (m.stage_size() - 1);

  // Memory of the fullest rank: per stage, weights + KV + attention workspace + activations.
  const double tokens_rank = double(tokens) / cp;
  const double t_chunk = double(chunk) / cp;
  for (int s = 0; s < m.pp; ++s) {
    MemoryUse mu;
    double full = 0, sliding = 0;
    int64_t max_window = 0;
    for (int64_t l : stage_layers[s]) {
      int64_t w = model::layer_window(cfg, l);
      (w > 0 ? sliding : full) += 1;
      max_window = std::max(max_window, w);
    }
    const double layers = full + sliding;
    mu.weights = layers * (wb.per_layer() - wb.norms_per_layer) / TP + layers * wb.norms_per_layer;
    // As the engine holds them: the embedding whole on every rank of the first stage (the
    // checkpoint's table), lm_head packed whole on tensor rank 0 of the last stage (a copy of
    // the embedding when tied), which is the fullest rank of that stage.
    if (s == 0) mu.weights += wb.embedding;
    if (s == m.pp - 1) mu.weights += (wb.lm_head > 0 ? wb.lm_head : wb.embedding) + wb.final_norm;
    // KV kept: every token of my shard for full layers, only the last W for sliding layers.
    const double kv_tok = model::kv_elements_per_token_layer(cfg, int64_t(hs.kv_tp)) * 2;  // bf16 K and V, my heads
    mu.kv_cache = full * tokens_rank * kv_tok + sliding * std::min(double(max_window), tokens_rank) * kv_tok;
    // Attention workspace for the last chunk of a full layer: K/V gathered by Ulysses
    // (tokens/R, kv_u heads) and the ring's double buffer of one block each.
    if (full > 0) {
      const double gathered = double(tokens) / m.ring * hs.kv_u * d * 2 * wire;
      mu.attention_workspace = (m.ulysses > 1 ? gathered : 0) + (m.ring > 1 ? 2 * gathered : 0);
    }
    // Working set of one layer for one chunk, per token: fp32 residual, norm output and
    // delta; q, k, v before and after the all-to-all; fp32 attention output; the expert
    // (or MLP) intermediate for the k chosen experts in fp32; router logits; two pipeline
    // receive buffers. Plus fp32 logits for the last token.
    const double per_tok = 4 * 3 * h + wire * 2 * (hs.q_tp + 2 * hs.kv_tp) * d + 4 * hs.q_tp * d +
                           4 * (cfg.is_moe() ? k * 3 * inter + E : 3 * inter) / TP + 2 * h * wire;
    mu.activations = t_chunk * per_tok + 4 * double(cfg.vocab_size);
    if (mu.total() > out.memory.total()) out.memory = mu;
  }
  out.memory_capacity = dev.usable_memory_bytes();
  out.fits = out.memory.total() <= out.memory_capacity;
  return out;
}

}  // namespace slope::planner
