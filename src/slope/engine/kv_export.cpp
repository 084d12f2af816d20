#include "slope/engine/kv_export.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "slope/core/checksum.h"
#include "slope/core/error.h"
#include "slope/core/file_io.h"
#include "slope/core/half.h"

namespace slope::engine {
namespace fs = std::filesystem;
namespace {

// Metadata keys that must be equal in every shard of one prefill: its identity and the shape
// of a row. ("model", the directory name, may differ between nodes holding the same files.)
const char* const kIdentityKeys[] = {"prefill_id", "model_hash", "tokens_hash", "compute_dtype", "kv_dtype",
                                     "architecture", "total_tokens", "num_layers", "num_kv_heads", "head_dim",
                                     "world_size"};
const char* const kChecksumPrefix = "checksum.";

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

uint64_t tensor_checksum(const Tensor& t) { return t.nbytes() ? fnv1a64(t.raw(), t.nbytes()) : kFnv1a64Offset; }

// FNV-1a 64 of the token ids as 4-byte little-endian integers.
std::string tokens_hash(const std::vector<int32_t>& tokens) {
  uint64_t h = kFnv1a64Offset;
  for (int32_t t : tokens) {
    const uint32_t u = uint32_t(t);
    const unsigned char b[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
    h = fnv1a64(b, 4, h);
  }
  return hex64(h);
}

// FNV-1a 64 of every metadata entry except "metadata_checksum" itself, as key NUL value NUL in
// key order (safetensors metadata is an unordered JSON object; the map sorts it).
std::string metadata_checksum(const std::map<std::string, std::string>& meta) {
  uint64_t h = kFnv1a64Offset;
  for (const auto& [k, v] : meta) {
    if (k == "metadata_checksum") continue;
    h = fnv1a64(k.data(), k.size() + 1, h);  // with the terminating NUL
    h = fnv1a64(v.data(), v.size() + 1, h);
  }
  return hex64(h);
}

// Adds checksums of `tensors` and of the metadata itself to `meta`.
void add_checksums(std::map<std::string, std::string>& meta, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  for (const auto& [name, t] : tensors) meta[kChecksumPrefix + name] = hex64(tensor_checksum(t));
  meta["metadata_checksum"] = metadata_checksum(meta);
}

const std::string& meta_of(const model::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  SLOPE_CHECK(it != f.metadata().end(), f.path(), " is not a SLOPE KV shard of format version ", kKvFormatVersion,
              " (no '", key, "' metadata)");
  return it->second;
}

int64_t meta_int(const model::SafetensorsFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const std::string& s = meta_of(f, key);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  SLOPE_CHECK(ec == std::errc() && end == s.data() + s.size() && v >= lo && v <= hi, f.path(), ": metadata '", key,
              "' is '", s, "', expected an integer in [", lo, ", ", hi, "]; the file is corrupt");
  return v;
}

std::string layer_list(const std::set<int>& layers) {
  std::ostringstream os;
  for (int l : layers) os << (l == *layers.begin() ? "" : ",") << l;
  return layers.empty() ? "none" : os.str();
}

}  // namespace

std::string kv_shard_path(const std::string& dir, int rank, int world_size) {
  return dir + "/kv.rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) +
         ".safetensors";
}

void check_kv_out(const std::string& dir, int rank, int world_size, size_t num_prompts) {
  check_output_dir(dir, "--kv-out");
  for (size_t b = 0; b < num_prompts; ++b) {
    const std::string sub = num_prompts == 1 ? dir : str_cat(dir, "/prompt", b);
    if (num_prompts > 1) check_output_dir(sub, "--kv-out");
    const std::string file = kv_shard_path(sub, rank, world_size);
    std::error_code ec;
    if (fs::exists(fs::status(sub, ec))) check_output_path(file, "--kv-out file");
  }
}

std::string model_fingerprint(const std::string& model_dir) {
  std::error_code ec;
  const std::string config = fs::is_directory(model_dir, ec) ? (fs::path(model_dir) / "config.json").string() : model_dir;
  uint64_t h = fnv1a64(read_regular_file(config, "config"));
  const model::WeightStore weights(model_dir);
  constexpr size_t kSample = size_t(64) << 10;
  for (const model::SafetensorsFile* f : weights.files()) {
    const std::string_view header = f->header();
    h = fnv1a64(header.data(), header.size(), h);
    const uint64_t n = f->data_size();
    h = fnv1a64(&n, sizeof n, h);
    const size_t head = std::min(kSample, f->data_size());
    h = fnv1a64(f->data(), head, h);
    h = fnv1a64(f->data() + f->data_size() - head, head, h);
  }
  return hex64(h);
}

std::string shared_prefill_id(parallel::Communicator& world) {
  uint64_t id = 0;
  if (world.rank() == 0) {
    std::random_device rd;  // /dev/urandom on Linux
    id = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }
  world.broadcast(&id, 1, 0);
  return hex64(id);
}

void write_kv_shard(const std::string& path, const PrefillResult& result, const std::vector<int32_t>& tokens,
                    const model::ModelConfig& cfg, int first_layer, const KvWriteOptions& opts) {
  SLOPE_CHECK(!result.k.empty(), "no KV cache was kept for this prefill");
  SLOPE_CHECK(int64_t(tokens.size()) == result.shard.total_tokens, "KV shard for ", path, ": ", tokens.size(),
              " token ids for a prefill of ", result.shard.total_tokens, " tokens");
  SLOPE_CHECK(!opts.prefill_id.empty() && !opts.model_hash.empty() && !opts.compute_dtype.empty(),
              "KV shard for ", path, ": the prefill identity (prefill id, model hash, compute dtype) is not set");
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
      {"model_hash", opts.model_hash},
      {"prefill_id", opts.prefill_id},
      {"tokens_hash", tokens_hash(tokens)},
      {"compute_dtype", opts.compute_dtype},
      {"kv_dtype", std::string(dtype_name(opts.dtype))},
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
  add_checksums(meta, tensors);
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) fail("cannot create --kv-out directory ", parent.string(), " (", ec.message(), ")");
  model::write_safetensors(path, tensors, meta);
}

std::unique_ptr<model::SafetensorsFile> open_kv_shard(const std::string& path) {
  auto f = std::make_unique<model::SafetensorsFile>(path);
  auto it = f->metadata().find("format");
  SLOPE_CHECK(it != f->metadata().end() && it->second == "slope-kv", path,
              " is not a SLOPE KV shard (no 'format': 'slope-kv' metadata)");
  const std::string& version = meta_of(*f, "format_version");
  SLOPE_CHECK(version == kKvFormatVersion, path, " has KV format version ", version, "; this slope reads version ",
              kKvFormatVersion, " (re-run the prefill with this slope to write it again)");
  SLOPE_CHECK(meta_of(*f, "metadata_checksum") == metadata_checksum(f->metadata()), path,
              ": the metadata checksum does not match (the header was modified or corrupted); write the file again");
  const std::vector<std::string> names = f->names();
  for (const std::string& name : names) {
    auto c = f->metadata().find(kChecksumPrefix + name);
    SLOPE_CHECK(c != f->metadata().end(), path, ": tensor '", name, "' has no checksum; the file is corrupt");
    SLOPE_CHECK(c->second == hex64(tensor_checksum(f->get(name))), path, ": tensor '", name,
                "' fails its checksum (stored ", c->second, ", computed ", hex64(tensor_checksum(f->get(name))),
                "): its bytes are corrupted; copy or write the file again");
  }
  for (const auto& [key, value] : f->metadata())
    if (key.rfind(kChecksumPrefix, 0) == 0)
      SLOPE_CHECK(f->contains(key.substr(std::strlen(kChecksumPrefix))), path, ": metadata '", key,
                  "' names a tensor the file does not hold; the file is corrupt");
  return f;
}

void check_same_prefill(const model::SafetensorsFile& a, const model::SafetensorsFile& b) {
  std::string diff;
  for (const char* key : kIdentityKeys)
    if (meta_of(a, key) != meta_of(b, key))
      diff += str_cat(diff.empty() ? "" : ", ", key, " ", meta_of(a, key), " vs ", meta_of(b, key));
  if (diff.empty()) return;
  fail(a.path(), " and ", b.path(), " come from different prefills (", diff,
       "); pass the shards of one run only (stale files of an earlier run in the same --kv-out directory? "
       "remove them or write each run to its own directory)");
}

std::pair<int, int> parse_layer_range(const std::string& text) {
  int a = 0, b = 0;
  const char* s = text.data();
  const char* e = s + text.size();
  auto [p, ec] = std::from_chars(s, e, a);
  bool ok = ec == std::errc() && p != s;
  if (ok && p == e) {
    b = a;
  } else if (ok && *p == '-') {
    auto [q, ec2] = std::from_chars(p + 1, e, b);
    ok = ec2 == std::errc() && q == e && q != p + 1;
  } else {
    ok = false;
  }
  SLOPE_CHECK(ok && a >= 0 && b >= a, "--layers '", text, "' is not a layer range; expected FIRST-LAST (inclusive, e.g. 0-1) or one layer");
  return {a, b};
}

void merge_kv_shards(const std::vector<std::string>& inputs, const std::string& output, const KvMergeOptions& opts) {
  SLOPE_CHECK(!inputs.empty(), "kv-merge needs at least one shard file");
  check_output_path(output, "kv-merge --out");  // before reading what may be gigabytes
  std::vector<std::unique_ptr<model::SafetensorsFile>> files;
  for (const auto& in : inputs) files.push_back(open_kv_shard(in));
  for (size_t i = 1; i < files.size(); ++i) check_same_prefill(*files[0], *files[i]);

  const model::SafetensorsFile& f0 = *files[0];
  const int64_t N = meta_int(f0, "total_tokens", 1, int64_t(1) << 40);
  const int num_layers = int(meta_int(f0, "num_layers", 1, 1 << 20));
  const int64_t Hkv = meta_int(f0, "num_kv_heads", 1, 1 << 20);
  // Layers may be split across files (pipeline stages) as well as tokens (context parallel).
  std::set<int> held;
  std::map<int, std::string> window_of;  // layer -> its window, from the files that hold it
  for (size_t i = 0; i < files.size(); ++i) {
    const int first = int(meta_int(*files[i], "first_layer", 0, num_layers - 1));
    const int count = int(meta_int(*files[i], "layer_count", 1, num_layers - first));
    std::stringstream ws(meta_of(*files[i], "layer_windows"));
    std::string w;
    for (int l = first; l < first + count; ++l) {
      held.insert(l);
      if (std::getline(ws, w, ',')) window_of[l] = w;
    }
  }
  // The layers to write: all of the model's unless a subset was asked for explicitly.
  std::set<int> layers;
  if (opts.layers) {
    const auto [lo, hi] = *opts.layers;
    SLOPE_CHECK(hi < num_layers, "--layers ", lo, "-", hi, " is outside the model's ", num_layers, " layers (0-",
                num_layers - 1, ")");
    for (int l = lo; l <= hi; ++l) layers.insert(l);
  } else {
    for (int l = 0; l < num_layers; ++l) layers.insert(l);
  }
  std::set<int> missing;
  std::set_difference(layers.begin(), layers.end(), held.begin(), held.end(), std::inserter(missing, missing.end()));
  SLOPE_CHECK(missing.empty(), "the shards hold layers ", layer_list(held), " of the model's ", num_layers,
              "; layers ", layer_list(missing), " are in no shard. Pass the files of every pipeline stage",
              opts.layers ? "" : ", or --layers FIRST-LAST to merge only a subset of the layers on purpose");

  std::vector<std::pair<std::string, Tensor>> out;
  Tensor allpos({N}, DType::I64);
  for (int64_t i = 0; i < N; ++i) allpos.data<int64_t>()[i] = i;
  out.emplace_back("positions", allpos);
  for (int layer : layers) {
    for (const char* kv : {"k", "v"}) {
      const std::string name = layer_name(layer, kv);
      Tensor merged;
      std::vector<int32_t> owner;  // [N, Hkv]: 1 + the file that provided (position, head), 0 = none
      for (size_t i = 0; i < files.size(); ++i) {
        const model::SafetensorsFile& f = *files[i];
        if (!f.contains(name)) continue;
        Tensor t = f.get(name);
        Tensor pos = f.get("positions");
        const int64_t h0 = meta_int(f, "kv_head0", 0, Hkv - 1);
        SLOPE_CHECK(pos.dtype() == DType::I64 && pos.rank() == 1, f.path(), ": 'positions' is ", dtype_name(pos.dtype()),
                    " ", shape_str(pos.shape()), ", expected I64 [rows]");
        SLOPE_CHECK(t.rank() == 3 && t.dim(0) == pos.numel(), f.path(), ": ", name, " rows do not match its positions");
        SLOPE_CHECK(h0 + t.dim(1) <= Hkv, f.path(), ": ", name, " heads [", h0, ", ", h0 + t.dim(1),
                    ") outside the model's ", Hkv, " KV heads");
        if (merged.empty()) {
          merged = Tensor({N, Hkv, t.dim(2)}, t.dtype());
          owner.assign(size_t(N * Hkv), 0);
        }
        SLOPE_CHECK(t.dtype() == merged.dtype() && t.dim(2) == merged.dim(2), f.path(), ": ", name,
                    " has a different dtype or head size than in other shards");
        const size_t es = dtype_size(t.dtype()), head = size_t(t.dim(2)) * es;
        for (int64_t r = 0; r < pos.numel(); ++r) {
          const int64_t p = pos.data<int64_t>()[r];
          SLOPE_CHECK(p >= 0 && p < N, f.path(), ": position ", p, " outside [0, ", N, ")");
          for (int64_t h = 0; h < t.dim(1); ++h) {
            int32_t& o = owner[size_t(p * Hkv + h0 + h)];
            SLOPE_CHECK(o == 0, "position ", p, " head ", h0 + h, " of ", name, " is in both ", files[size_t(o - 1)]->path(),
                        " and ", f.path(), "; each rank's file must be passed once");
            o = int32_t(i + 1);
            std::memcpy(static_cast<char*>(merged.raw()) + size_t(p * Hkv + h0 + h) * head,
                        static_cast<const char*>(t.raw()) + size_t(r * t.dim(1) + h) * head, head);
          }
        }
      }
      for (int64_t p = 0; p < N; ++p)
        for (int64_t h = 0; h < Hkv; ++h)
          SLOPE_CHECK(!owner.empty() && owner[size_t(p * Hkv + h)], "position ", p, " head ", h, " of ", name,
                      " is in no shard; pass every rank's file (the run had ", meta_of(f0, "world_size"), " ranks)");
      out.emplace_back(name, merged);
    }
  }
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : f0.metadata())
    if (k.rfind(kChecksumPrefix, 0) != 0) meta[k] = v;
  meta["rank"] = "0";
  meta["world_size"] = "1";
  meta["merged_from_world_size"] = meta_of(f0, "world_size");
  meta["first_layer"] = std::to_string(*layers.begin());
  meta["layer_count"] = std::to_string(layers.size());
  meta["kv_head0"] = "0";
  std::string windows;
  for (int l : layers) windows += (windows.empty() ? "" : ",") + window_of[l];
  meta["layer_windows"] = windows;
  add_checksums(meta, out);
  model::write_safetensors(output, out, meta);
}

}  // namespace slope::engine
