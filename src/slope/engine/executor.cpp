#include "slope/engine/executor.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "slope/core/error.h"
#include "slope/core/finite.h"
#include "slope/core/sys.h"

namespace slope::engine {
namespace {

// One prompt's state on this rank across its chunks.
struct PromptState {
  PrefillResult result;
  int64_t rows_done = 0;            // rows of this prompt's KV cache filled so far
  std::vector<int64_t> chunk_rows;  // this rank's row count per chunk
  std::vector<ops::SequenceShard> chunk_shards;
};

ops::SequenceShard concat(const std::vector<ops::SequenceShard>& parts, int64_t total,
                            size_t count) {
  ops::SequenceShard s;
  s.total_tokens = total;
  for (size_t i = 0; i < count; ++i)
    for (const ops::Segment& seg : parts[i].segments)
      if (seg.length > 0) s.segments.push_back(seg);
  return s;
}

// Where non-finite values first appeared, as one number that orders by place, then prompt:
// (place) · prompts + prompt, with place 0 = embedding, 1 + l = layer l, num_layers + 1 =
// final norm and lm_head. kAllFinite when none did.
constexpr int64_t kAllFinite = std::numeric_limits<int64_t>::max();

[[noreturn]] void fail_nonfinite(int64_t code, int64_t prompts, int64_t num_layers) {
  const int64_t place = code / prompts, prompt = code % prompts;
  const std::string of_prompt = prompts > 1 ? str_cat(" (prompt ", prompt, ")") : "";
  const std::string check =
      "; `slope run --check-weights` scans every weight at load and names the tensor holding NaN or Inf";
  if (place == 0)
    throw RequestError(str_cat("the prefill produced non-finite values (NaN or Inf), first in the embedding",
                               of_prompt, ": model.embed_tokens.weight is likely corrupt", check));
  if (place <= num_layers)
    throw RequestError(str_cat("the prefill produced non-finite values (NaN or Inf), first in layer ", place - 1,
                               of_prompt, " (its output or K/V): the weights of model.layers.", place - 1,
                               " are likely corrupt, or its activations overflowed", check));
  throw RequestError(str_cat("the prefill produced non-finite logits (NaN or Inf) from finite hidden states",
                             of_prompt, ": model.norm.weight or lm_head.weight is likely corrupt", check));
}

}  // namespace

std::vector<PrefillResult> run_prefill(const model::Model& model,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       int64_t chunk_tokens, const StagePlan& plan,
                                       ops::AttentionRunner& runner, const PrefillOptions& opts,
                                       Ledger* pipeline) {
  const model::ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, D = c.head_dim, Hkv = model.slice().kv_heads;
  const bool first_stage = plan.stage == 0, last_stage = plan.stage == plan.num_stages - 1;
  const ops::Backend& ops = model.ops();
  Ledger unused;
  Ledger& pt = pipeline ? *pipeline : unused;

  // Lay out every prompt's chunks and this rank's rows of each, and size the KV caches.
  std::vector<PromptState> st(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t n = int64_t(prompts[b].size());
    const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : n;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const ops::Segment seg{c0, std::min(chunk, n - c0)};
      ops::SequenceShard rows = plan.rows_of_chunk ? plan.rows_of_chunk(seg, n)
                                                     : ops::SequenceShard{n, {seg}};
      st[b].chunk_rows.push_back(rows.local_tokens());
      st[b].chunk_shards.push_back(std::move(rows));
    }
    st[b].result.shard = concat(st[b].chunk_shards, n, st[b].chunk_shards.size());
    const int64_t rows = st[b].result.shard.local_tokens();
    const int layers = model.last_layer() - model.first_layer();
    // The KV cache holds every chunk of the prompt: it is needed by later chunks even when the
    // caller does not keep it.
    for (int l = 0; l < layers; ++l) {
      st[b].result.k.push_back(ops.alloc({rows, Hkv, D}, DType::F32));
      st[b].result.v.push_back(ops.alloc({rows, Hkv, D}, DType::F32));
    }
  }

  model::LayerBuffers layer_buffers;
  model::LayerContext base_ctx = model.layer_context(opts.chunk_tokens, nullptr);
  base_ctx.moe_chunk = opts.moe_chunk_tokens;
  base_ctx.buffers = opts.buffers ? opts.buffers : &layer_buffers;
  struct PendingSend {
    Tensor buffer;
    parallel::Request request;
  };
  std::deque<PendingSend> sends;
  const int64_t n_prompts = int64_t(prompts.size());
  int64_t nonfinite = kAllFinite;  // the first place a non-finite value appeared (see above)
  auto found_nonfinite = [&](int64_t place, size_t b) {
    nonfinite = std::min(nonfinite, place * n_prompts + int64_t(b));
  };
  for (size_t b = 0; b < prompts.size(); ++b) {
    PromptState& ps = st[b];
    PrefillResult& r = ps.result;
    const double t0 = now_seconds();
    model::LayerContext ctx = base_ctx;
    ctx.ledger = &r.ledger;
    ctx.tp_allreduce = plan.tp_allreduce;
    for (size_t ci = 0; ci < ps.chunk_shards.size(); ++ci) {
      const ops::SequenceShard& rows = ps.chunk_shards[ci];
      const int64_t m = rows.local_tokens();
      Tensor h = ops.alloc({m, H}, DType::F32);  // [m, H] this chunk's residual stream on this rank
      if (first_stage) {
        auto timed = r.ledger.time(Phase::Embed);
        std::vector<int32_t> ids;
        ids.reserve(m);
        for (int64_t p : rows.positions()) ids.push_back(prompts[b][p]);
        model.embed(ids.data(), m, h.data<float>());
        if (!ops.all_finite(h.data<float>(), m * H)) found_nonfinite(0, b);
      } else if (m > 0) {
        auto timed = pt.time(Phase::PipeRecvWait);
        plan.pipe->irecv(h.data<float>(), size_t(m * H), plan.prev_rank, parallel::Tag::Pipeline).wait();
        pt.count_received(m * H * int64_t(sizeof(float)));
      }
      const ops::SequenceShard kv_shard = concat(ps.chunk_shards, rows.total_tokens, ci + 1);
      for (int l = model.first_layer(); l < model.last_layer(); ++l) {
        const int li = l - model.first_layer();
        model::decoder_layer_forward(ctx, l, model.layer(l), h.data<float>(), rows, runner,
                                     r.k[li].data<float>(), r.v[li].data<float>(), ps.rows_done,
                                     kv_shard);
        // This chunk's output and the K/V rows it wrote: one pass each.
        const int64_t kv0 = ps.rows_done * Hkv * D, kvn = m * Hkv * D;
        if (!ops.all_finite(h.data<float>(), m * H) || !ops.all_finite(r.k[li].data<float>() + kv0, kvn) ||
            !ops.all_finite(r.v[li].data<float>() + kv0, kvn))
          found_nonfinite(1 + l, b);
        if (opts.on_progress) {
          PrefillProgress pg;
          pg.prompt = int(b);
          pg.prompts = int(prompts.size());
          pg.tokens = int64_t(prompts[b].size());
          const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : pg.tokens;
          pg.tokens_done = std::min(pg.tokens, int64_t(ci + 1) * chunk);
          pg.layer = li + 1;
          pg.layers = model.last_layer() - model.first_layer();
          opts.on_progress(pg);
        }
      }
      ps.rows_done += m;
      if (!last_stage) {
        if (m > 0) {
          pt.count_sent(m * H * int64_t(sizeof(float)));
          parallel::Request req = plan.pipe->isend(h.data<float>(), size_t(m * H), plan.next_rank,
                                                   parallel::Tag::Pipeline);
          sends.push_back({std::move(h), std::move(req)});
        }
        while (!sends.empty() && sends.front().request.test()) sends.pop_front();
        continue;
      }
      const int64_t last = rows.local_index(rows.total_tokens - 1);
      if (last >= 0 && plan.may_report_logits) {
        auto timed = r.ledger.time(Phase::LmHead);
        r.has_logits = true;
        r.logits.resize(c.vocab_size);
        model.logits(h.data<float>() + last * H, r.logits.data());
        if (!all_finite(r.logits.data(), c.vocab_size)) found_nonfinite(1 + c.num_layers, b);
        r.top_logprobs = top_logprobs(r.logits.data(), c.vocab_size, std::max(1, opts.top_k));
        r.first_token = r.top_logprobs[0].token;
      }
    }
    r.seconds = now_seconds() - t0;
    if (!opts.keep_kv) {
      r.k.clear();
      r.v.clear();
    }
  }
  {
    auto timed = pt.time(Phase::PipeSendWait);
    for (PendingSend& s : sends) s.request.wait();
  }

  // Every rank learns the first place any rank saw a non-finite value, and all fail alike.
  if (plan.world && plan.world->size() > 1) {
    int64_t neg = -nonfinite;  // the minimum as a maximum
    plan.world->allreduce(&neg, 1, parallel::ReduceOp::Max);
    nonfinite = -neg;
  }
  if (nonfinite != kAllFinite) fail_nonfinite(nonfinite, n_prompts, c.num_layers);

  std::vector<PrefillResult> out;
  for (PromptState& ps : st) out.push_back(std::move(ps.result));
  return out;
}

}  // namespace slope::engine
