#include "slope/engine/kv_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/model/safetensors.h"

namespace slope::engine {
namespace {

Tensor convert(const Tensor& t, DType dtype) {
  if (dtype == DType::F32) return t.dtype() == DType::F32 ? t : t.to_f32();
  SLOPE_CHECK(dtype == DType::BF16, "KV dtype must be F32 or BF16");
  Tensor f = t.to_f32();
  Tensor out(t.shape(), DType::BF16);
  const float* s = f.data<float>();
  uint16_t* d = out.data<uint16_t>();
  for (int64_t i = 0; i < f.numel(); ++i) d[i] = f32_to_bf16(s[i]);
  return out;
}

std::string layer_name(int layer, const char* kv) {
  return "layers." + std::to_string(layer) + "." + kv;
}

}  // namespace

std::string kv_shard_path(const std::string& dir, int rank, int world_size) {
  return dir + "/kv.rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) +
         ".safetensors";
}

void write_kv_shard(const std::string& path, const PrefillResult& result,
                    const model::ModelConfig& cfg, int first_layer, const KvWriteOptions& opts) {
  SLOPE_CHECK(!result.k.empty(), "no KV cache was kept for this prefill");
  const std::vector<int64_t> pos = result.shard.positions();
  std::vector<std::pair<std::string, Tensor>> tensors;
  Tensor p({int64_t(pos.size())}, DType::I64);
  std::copy(pos.begin(), pos.end(), p.data<int64_t>());
  tensors.emplace_back("positions", p);
  std::string windows;
  for (size_t i = 0; i < result.k.size(); ++i) {
    const int layer = first_layer + int(i);
    tensors.emplace_back(layer_name(layer, "k"), convert(result.k[i], opts.dtype));
    tensors.emplace_back(layer_name(layer, "v"), convert(result.v[i], opts.dtype));
    windows += (i ? "," : "") + std::to_string(cfg.layer_window.at(layer));
  }
  std::map<std::string, std::string> meta = {
      {"format", "slope-kv"},
      {"format_version", kKvFormatVersion},
      {"model", opts.model_name},
      {"architecture", cfg.architecture},
      {"total_tokens", std::to_string(result.shard.total_tokens)},
      {"num_layers", std::to_string(cfg.num_layers)},
      {"first_layer", std::to_string(first_layer)},
      {"layer_count", std::to_string(result.k.size())},
      {"num_kv_heads", std::to_string(cfg.num_kv_heads)},
      {"kv_head0", std::to_string(opts.kv_head0)},
      {"head_dim", std::to_string(cfg.head_dim)},
      {"layer_windows", windows},
      {"rank", std::to_string(opts.rank)},
      {"world_size", std::to_string(opts.world_size)},
  };
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  model::write_safetensors(path, tensors, meta);
}

void merge_kv_shards(const std::vector<std::string>& inputs, const std::string& output) {
  SLOPE_CHECK(!inputs.empty(), "kv-merge needs at least one shard file");
  std::vector<std::unique_ptr<model::SafetensorsFile>> files;
  for (const auto& in : inputs) files.push_back(std::make_unique<model::SafetensorsFile>(in));
  auto meta_of = [&](size_t i, const std::string& key) {
    auto it = files[i]->metadata().find(key);
    SLOPE_CHECK(it != files[i]->metadata().end(), inputs[i], " is not a SLOPE KV shard (no '", key,
                "' metadata)");
    return it->second;
  };
  for (size_t i = 0; i < files.size(); ++i) {
    SLOPE_CHECK(meta_of(i, "format") == "slope-kv", inputs[i], " is not a SLOPE KV shard");
    SLOPE_CHECK(meta_of(i, "format_version") == kKvFormatVersion, inputs[i], " has KV format version ",
                meta_of(i, "format_version"), "; this slope reads version ", kKvFormatVersion);
    for (const char* key : {"total_tokens", "model", "num_kv_heads", "head_dim"})
      SLOPE_CHECK(meta_of(i, key) == meta_of(0, key), inputs[i], " and ", inputs[0],
                  " disagree on '", key, "': they are not shards of one prefill");
  }
  const int64_t N = std::stoll(meta_of(0, "total_tokens"));
  // Layers may be split across files (pipeline stages) as well as tokens (context parallel).
  std::set<int> layers;
  std::map<int, std::string> window_of;  // layer -> its window, from the files that hold it
  for (size_t i = 0; i < files.size(); ++i) {
    const int first = std::stoi(meta_of(i, "first_layer")), count = std::stoi(meta_of(i, "layer_count"));
    std::stringstream ws(meta_of(i, "layer_windows"));
    std::string w;
    for (int l = first; l < first + count; ++l) {
      layers.insert(l);
      if (std::getline(ws, w, ',')) window_of[l] = w;
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor allpos({N}, DType::I64);
  for (int64_t i = 0; i < N; ++i) allpos.data<int64_t>()[i] = i;
  out.emplace_back("positions", allpos);
  const int64_t Hkv = std::stoll(meta_of(0, "num_kv_heads"));
  for (int layer : layers) {
    for (const char* kv : {"k", "v"}) {
      const std::string name = layer_name(layer, kv);
      Tensor merged;
      std::vector<char> seen;  // [N, Hkv]: which (position, head) some shard provided
      for (size_t i = 0; i < files.size(); ++i) {
        if (!files[i]->contains(name)) continue;
        Tensor t = files[i]->get(name);
        Tensor pos = files[i]->get("positions");
        const int64_t h0 = files[i]->metadata().count("kv_head0") ? std::stoll(meta_of(i, "kv_head0")) : 0;
        SLOPE_CHECK(t.rank() == 3 && t.dim(0) == pos.numel(), inputs[i], ": ", name,
                    " rows do not match its positions");
        SLOPE_CHECK(h0 >= 0 && h0 + t.dim(1) <= Hkv, inputs[i], ": ", name, " heads [", h0, ", ",
                    h0 + t.dim(1), ") outside the model's ", Hkv, " KV heads");
        if (merged.empty()) {
          merged = Tensor({N, Hkv, t.dim(2)}, t.dtype());
          seen.assign(size_t(N * Hkv), 0);
        }
        SLOPE_CHECK(t.dtype() == merged.dtype() && t.dim(2) == merged.dim(2), inputs[i], ": ", name,
                    " has a different dtype or head size than in other shards");
        const size_t es = dtype_size(t.dtype()), head = size_t(t.dim(2)) * es;
        for (int64_t r = 0; r < pos.numel(); ++r) {
          const int64_t p = pos.data<int64_t>()[r];
          SLOPE_CHECK(p >= 0 && p < N, inputs[i], ": position ", p, " outside [0, ", N, ")");
          for (int64_t h = 0; h < t.dim(1); ++h) {
            char& s = seen[size_t(p * Hkv + h0 + h)];
            SLOPE_CHECK(!s, "position ", p, " head ", h0 + h, " of ", name, " appears in more than one shard");
            s = 1;
            std::memcpy(static_cast<char*>(merged.raw()) + size_t(p * Hkv + h0 + h) * head,
                        static_cast<const char*>(t.raw()) + size_t(r * t.dim(1) + h) * head, head);
          }
        }
      }
      for (int64_t p = 0; p < N; ++p)
        for (int64_t h = 0; h < Hkv; ++h)
          SLOPE_CHECK(!seen.empty() && seen[size_t(p * Hkv + h)], "position ", p, " head ", h, " of ", name,
                      " is in no shard; pass every rank's file");
      out.emplace_back(name, merged);
    }
  }
  std::map<std::string, std::string> meta = files[0]->metadata();
  meta["rank"] = "0";
  meta["world_size"] = "1";
  meta["first_layer"] = std::to_string(*layers.begin());
  meta["layer_count"] = std::to_string(layers.size());
  meta["kv_head0"] = "0";
  std::string windows;
  for (int l : layers) windows += (windows.empty() ? "" : ",") + window_of[l];
  meta["layer_windows"] = windows;
  model::write_safetensors(output, out, meta);
}

}  // namespace slope::engine
