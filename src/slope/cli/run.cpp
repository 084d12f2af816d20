// `slope run`: prefill one prompt on one rank or, under mpirun, on a context-parallel mesh.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "slope/cli/commands.h"
#include "slope/cli/tokens.h"
#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/engine/kv_export.h"
#include "slope/engine/prefill.h"
#include "slope/model/model.h"

namespace slope::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  std::string tokens_file;
  int64_t random_tokens = 0;
  uint64_t seed = 0;
  std::string dtype = "f32";
  int threads = 0;
  int64_t chunk = 1024;
  int top_k = 5;
  std::string logits_out;
  std::string kv_out;
  std::string kv_dtype = "f32";
  bool json = false;
};

kernels::ComputeType parse_compute(const std::string& s) {
  if (s == "f32") return kernels::ComputeType::F32;
  if (s == "bf16") return kernels::ComputeType::BF16;
  fail("--dtype must be f32 or bf16, got '", s, "'");
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  std::ofstream f(path, std::ios::binary);
  SLOPE_CHECK(f, "cannot write --logits-out file '", path, "'");
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  SLOPE_CHECK(f.good(), "writing '", path, "' failed");
}

nlohmann::json phases_json(const model::PhaseTimes& t) {
  return {{"embed_ms", t.embed * 1e3},          {"norm_qkv_rope_ms", t.norm_qkv_rope * 1e3},
          {"attention_ms", t.attention * 1e3},  {"o_proj_ms", t.o_proj * 1e3},
          {"mlp_ms", t.mlp * 1e3},              {"lm_head_ms", t.lm_head * 1e3}};
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunArgs a;
  CLI::App app{"Prefill one prompt: first token, top logprobs, last-position logits, KV cache"};
  app.add_option("--model", a.model_dir, "HF model directory (config.json + safetensors)")->required();
  auto* tok = app.add_option("--tokens", a.tokens_file, "file of token ids (whitespace/comma separated)");
  auto* rnd = app.add_option("--random-tokens", a.random_tokens, "use N random token ids instead");
  tok->excludes(rnd);
  app.add_option("--seed", a.seed, "seed for --random-tokens");
  app.add_option("--dtype", a.dtype, "compute type: f32 or bf16 (bf16 weights/activations, f32 accumulation)");
  app.add_option("--threads", a.threads, "OpenMP threads per rank (default: all cores / ranks)");
  app.add_option("--chunk", a.chunk, "tokens per chunk of the token-local work");
  app.add_option("--top-k", a.top_k, "top logprobs to report");
  app.add_option("--logits-out", a.logits_out, "write the last position's logits (float32, little endian)");
  app.add_option("--kv-out", a.kv_out, "write the KV cache of every layer (safetensors) into DIR");
  app.add_option("--kv-dtype", a.kv_dtype, "KV file dtype: f32 or bf16");
  app.add_flag("--json", a.json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  SLOPE_CHECK(!a.tokens_file.empty() || a.random_tokens != 0,
              "give the prompt with --tokens FILE or --random-tokens N");
  SLOPE_CHECK(a.chunk > 0, "--chunk must be positive");
  SLOPE_CHECK(a.top_k > 0, "--top-k must be positive");
  SLOPE_CHECK(a.kv_dtype == "f32" || a.kv_dtype == "bf16", "--kv-dtype must be f32 or bf16");
  if (a.threads > 0) set_num_threads(a.threads);

  model::LoadOptions lo;
  lo.compute = parse_compute(a.dtype);
  const double t_load = now_seconds();
  auto model = model::Model::load(a.model_dir, lo);
  const double load_s = now_seconds() - t_load;
  const model::ModelConfig& cfg = model->config();

  std::vector<int32_t> tokens = a.tokens_file.empty()
                                    ? random_tokens(a.random_tokens, cfg.vocab_size, a.seed)
                                    : read_token_file(a.tokens_file);
  model->validate_tokens(tokens);
  const int64_t n = int64_t(tokens.size());

  model::LocalAttention runner;
  engine::PrefillOptions po;
  po.chunk_tokens = a.chunk;
  po.top_k = a.top_k;
  po.keep_kv = !a.kv_out.empty();
  engine::PrefillResult r = engine::prefill(*model, tokens, model::SequenceShard::whole(n), runner, po);

  if (!a.logits_out.empty()) write_logits(a.logits_out, r.logits);
  if (!a.kv_out.empty()) {
    engine::KvWriteOptions ko;
    ko.dtype = a.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
    ko.model_name = a.model_dir;
    engine::write_kv_shard(engine::kv_shard_path(a.kv_out, 0, 1), r, cfg, 0, ko);
  }

  const double flops = engine::prefill_flops(cfg, n);
  if (a.json) {
    nlohmann::json j;
    j["first_token"] = r.first_token;
    j["top_logprobs"] = nlohmann::json::array();
    for (const auto& t : r.top_logprobs) j["top_logprobs"].push_back({{"token", t.token}, {"logprob", t.logprob}});
    j["num_tokens"] = n;
    j["ttft_ms"] = r.seconds * 1e3;
    j["load_ms"] = load_s * 1e3;
    j["phases"] = phases_json(r.times);
    j["peak_memory_bytes"] = peak_rss_bytes();
    j["weight_bytes"] = model->weight_bytes();
    j["gflop"] = flops / 1e9;
    j["gflops_per_s"] = flops / r.seconds / 1e9;
    j["tokens_per_s"] = double(n) / r.seconds;
    j["dtype"] = a.dtype;
    j["threads"] = num_threads();
    j["ranks"] = 1;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "model        " << a.model_dir << " (" << cfg.architecture << ", " << cfg.num_layers
              << " layers)\n"
              << "tokens       " << n << "\n"
              << "first token  " << r.first_token << "\n"
              << "top logprobs";
    for (const auto& t : r.top_logprobs) std::cout << " " << t.token << ":" << t.logprob;
    std::cout << "\nTTFT         " << r.seconds * 1e3 << " ms (" << double(n) / r.seconds
              << " tokens/s, " << flops / r.seconds / 1e9 << " GFLOP/s)\n"
              << "peak memory  " << double(peak_rss_bytes()) / 1e9 << " GB\n";
  }
  return 0;
}

}  // namespace slope::cli
