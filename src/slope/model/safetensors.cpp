#include "slope/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/core/file_io.h"

namespace slope::model {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The safetensors reference implementation refuses headers above 100 MB; a real header is a
// few hundred KB even for models with tens of thousands of tensors.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* const kCorruptHint =
    "the file is corrupt, truncated or not a safetensors file; re-download or re-convert it";

template <typename... Args>
[[noreturn]] void file_error(const std::string& path, const Args&... args) {
  fail("safetensors file ", path, ": ", args...);
}

template <typename... Args>
[[noreturn]] void tensor_error(const std::string& path, const std::string& name, const Args&... args) {
  fail("safetensors file ", path, ": tensor '", name, "': ", args...);
}

std::string sys_error() { return std::strerror(errno); }

// Reads a non-negative JSON integer that fits in int64; anything else is reported as `what`.
bool as_count(const json& j, int64_t& out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    out = int64_t(v);
    return true;
  }
  if (j.is_number_integer()) {
    out = j.get<int64_t>();
    return out >= 0;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // A FIFO or device in place of the file is refused before anything waits on it.
  const int fd = open_regular_input(path, "safetensors file");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = sys_error();
    ::close(fd);
    file_error(path, "cannot stat (", err, ")");
  }
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    file_error(path, "file is ", file_size, " bytes, shorter than the 8-byte header length; ",
               kCorruptHint);
  }
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string map_err = base == MAP_FAILED ? sys_error() : "";
  ::close(fd);  // the mapping stays valid without the descriptor
  if (base == MAP_FAILED) file_error(path, "cannot mmap ", file_size, " bytes (", map_err, ")");
  mapping_ = std::shared_ptr<void>(base, [file_size](void* p) { ::munmap(p, file_size); });
  mapping_size_ = size_t(file_size);
  const auto* bytes = static_cast<const uint8_t*>(base);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];  // little-endian u64
  if (header_len > file_size - 8)
    file_error(path, "header length ", header_len, " runs past the end of the file (",
               file_size, " bytes); ", kCorruptHint);
  if (header_len > kMaxHeaderBytes)
    file_error(path, "header length ", header_len, " is larger than the ", kMaxHeaderBytes,
               "-byte limit; ", kCorruptHint);
  if (header_len < 2) file_error(path, "header of ", header_len, " bytes cannot hold a JSON object; ", kCorruptHint);
  data_ = bytes + 8 + header_len;
  data_size_ = size_t(file_size - 8 - header_len);

  // The header is a JSON object, starting with '{' and padded after its closing '}' with spaces
  // (0x20) only. Checking this, and below that the tensors tile the data region, catches a
  // header length that is off by a few bytes: the JSON would still parse, but every tensor
  // would be read shifted.
  const char* hbegin = reinterpret_cast<const char*>(bytes + 8);
  header_ = std::string_view(hbegin, size_t(header_len));
  size_t json_end = size_t(header_len);
  while (json_end > 0 && hbegin[json_end - 1] == ' ') --json_end;
  json header = json::parse(hbegin, hbegin + json_end, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded())
    file_error(path, "header is not valid JSON (header length ", header_len, "); ", kCorruptHint);
  if (!header.is_object())
    file_error(path, "header is JSON ", header.type_name(), ", expected an object {name: {dtype, shape, data_offsets}}; ",
               kCorruptHint);
  // JSON allows other whitespace around the object; the format does not.
  if (hbegin[0] != '{' || hbegin[json_end - 1] != '}')
    file_error(path, "header does not ", hbegin[0] != '{' ? "begin with '{'" : "end with '}' followed only by spaces",
               " (header length ", header_len, "); ", kCorruptHint);

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (e.is_null()) continue;
      if (!e.is_object()) file_error(path, "__metadata__ is JSON ", e.type_name(), ", expected an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m->is_string())
          file_error(path, "__metadata__ entry '", m.key(), "' is JSON ", m->type_name(),
                     ", expected a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (!e.is_object())
      tensor_error(path, name, "entry is JSON ", e.type_name(),
                   ", expected an object {dtype, shape, data_offsets}; ", kCorruptHint);
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!e.contains(key)) tensor_error(path, name, "entry has no '", key, "' field; ", kCorruptHint);

    Entry entry{};
    const json& jd = e["dtype"];
    if (!jd.is_string()) tensor_error(path, name, "'dtype' is JSON ", jd.type_name(), ", expected a string");
    const std::string dtype_str = jd.get<std::string>();
    try {
      entry.dtype = parse_dtype(dtype_str);
    } catch (const Error& err) {
      tensor_error(path, name, "dtype '", dtype_str,
                   "' is not supported (supported: F32, BF16, F16, U8, I32, I64); convert the "
                   "checkpoint to one of these");
    }

    const json& js = e["shape"];
    if (!js.is_array()) tensor_error(path, name, "'shape' is JSON ", js.type_name(), ", expected an array of integers");
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < js.size(); ++d) {
      int64_t dim = 0;
      if (!as_count(js[d], dim))
        tensor_error(path, name, "shape dimension ", d, " is ", js[d].dump(),
                     ", expected a non-negative integer; ", kCorruptHint);
      entry.shape.push_back(dim);
      overflow |= __builtin_mul_overflow(numel, uint64_t(dim), &numel);
    }

    const json& jo = e["data_offsets"];
    int64_t begin = 0, end = 0;
    if (!jo.is_array() || jo.size() != 2 || !as_count(jo[0], begin) || !as_count(jo[1], end))
      tensor_error(path, name, "'data_offsets' is ", jo.dump(),
                   ", expected [begin, end] with non-negative integers; ", kCorruptHint);
    if (end < begin)
      tensor_error(path, name, "data_offsets [", begin, ", ", end, "] end before they begin; ", kCorruptHint);
    if (uint64_t(end) > data_size_)
      tensor_error(path, name, "data_offsets [", begin, ", ", end, "] lie outside the data region of ",
                   data_size_, " bytes (the file may be truncated); ", kCorruptHint);
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, uint64_t(dtype_size(entry.dtype)), &nbytes);
    if (overflow || nbytes != uint64_t(end - begin))
      tensor_error(path, name, "byte size ", end - begin, " (data_offsets [", begin, ", ", end,
                   "]) does not match shape ", shape_str(entry.shape), " of ", dtype_str,
                   overflow ? " (element count overflows)" : str_cat(" (", nbytes, " bytes)"), "; ",
                   kCorruptHint);
    entry.begin = size_t(begin);
    entry.end = size_t(end);
    entries_.emplace(name, std::move(entry));
  }

  // The tensors must tile the data region exactly, as the format requires: sorted by offset,
  // each begins where the previous one ended, the first at 0 and the last at the file's end. A
  // gap, an overlap or trailing bytes mean the header and the data disagree.
  std::vector<std::pair<const std::string*, const Entry*>> ranges;
  for (const auto& [name, e] : entries_) ranges.emplace_back(&name, &e);
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  size_t expected = 0;
  const std::string* prev_name = nullptr;
  for (const auto& [name, e] : ranges) {
    if (e->begin < expected)
      tensor_error(path, *name, "data_offsets [", e->begin, ", ", e->end, "] overlap tensor '", *prev_name,
                   "', which ends at ", expected, "; ", kCorruptHint);
    if (e->begin > expected)
      tensor_error(path, *name, "data_offsets [", e->begin, ", ", e->end, "] leave a gap of ", e->begin - expected,
                   " bytes after ", prev_name ? "tensor '" + *prev_name + "'" : std::string("the header"),
                   " (tensors must tile the data region; is the header length off?); ", kCorruptHint);
    expected = e->end;
    prev_name = name;
  }
  if (expected != data_size_)
    file_error(path, "the tensors end at byte ", expected, " of a data region of ", data_size_,
               " bytes (header length ", header_len, "); tensors must tile the data region exactly, so the header "
               "length or the data is wrong; ", kCorruptHint);
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return entries_.count(name) > 0; }

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    fail("safetensors file ", path_, " has no tensor '", name, "'");
  const Entry& e = it->second;
  const uint8_t* p = data_ + e.begin;
  // Hugging Face writers align every tensor to its element size (8-byte padded header, tensors
  // sorted by alignment). Other writers may not; a misaligned view would make typed loads
  // undefined, so such a tensor is copied into aligned memory instead.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) {
    Tensor copy(e.shape, e.dtype);
    std::memcpy(copy.raw(), p, e.end - e.begin);
    return copy;
  }
  return Tensor::view(const_cast<uint8_t*>(p), e.shape, e.dtype, mapping_);
}

// ---------------------------------------------------------------------------------------------
// WeightStore

WeightStore::WeightStore(const std::string& model_dir) : dir_(model_dir) {
  std::error_code ec;
  if (!fs::exists(model_dir, ec))
    fail("model directory ", model_dir, " does not exist; pass the directory holding config.json and *.safetensors");
  // A single .safetensors file may be given directly.
  if (fs::is_regular_file(model_dir, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(model_dir));
    for (const auto& n : files_[0]->names()) index_[n] = 0;
    return;
  }
  if (!fs::is_directory(model_dir, ec))
    fail("model path ", model_dir, " is neither a directory nor a regular file (a FIFO or a device is not accepted)");

  const fs::path dir(model_dir);
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  if (fs::exists(index_path, ec)) {
    json idx = json::parse(read_regular_file(index_path.string(), "safetensors index"), nullptr, false);
    if (idx.is_discarded() || !idx.is_object())
      fail("index ", index_path.string(), " is not a valid JSON object; re-download it");
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("index ", index_path.string(), " has no 'weight_map' object {tensor name: shard file}; re-download it");
    std::map<std::string, size_t> file_ids;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string())
        fail("index ", index_path.string(), ": weight_map entry for tensor '", it.key(),
             "' is JSON ", it->type_name(), ", expected a shard file name");
      const std::string shard = it->get<std::string>();
      auto f = file_ids.find(shard);
      if (f == file_ids.end()) {
        const fs::path shard_path = dir / shard;
        if (!fs::exists(shard_path, ec))
          fail("shard ", shard, " listed in ", index_path.string(), " (for tensor '", it.key(),
               "') is missing from ", model_dir, "; download every shard of the checkpoint");
        files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
        f = file_ids.emplace(shard, files_.size() - 1).first;
      }
      if (!files_[f->second]->contains(it.key()))
        fail("index ", index_path.string(), " lists tensor '", it.key(), "' in shard ", shard,
             ", which does not contain it; the index and shards are from different checkpoints");
      index_[it.key()] = f->second;
    }
    if (files_.empty()) fail("index ", index_path.string(), " lists no tensors");
  } else if (fs::exists(single_path, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (const auto& n : files_[0]->names()) index_[n] = 0;
  } else {
    fail("no model.safetensors or model.safetensors.index.json in ", model_dir,
         "; expected a Hugging Face model directory (safetensors weights; .bin/.pth checkpoints "
         "must be converted first)");
  }
}

bool WeightStore::contains(const std::string& name) const { return index_.count(name) > 0; }

void SafetensorsFile::release_pages() const {
  // Advice only: where the kernel refuses it, the pages stay resident and nothing else changes.
  ::madvise(mapping_.get(), mapping_size_, MADV_DONTNEED);
}

void WeightStore::release_pages() const {
  for (const auto& f : files_) f->release_pages();
}

std::vector<const SafetensorsFile*> WeightStore::files() const {
  std::vector<const SafetensorsFile*> out;
  for (const auto& f : files_) out.push_back(f.get());
  return out;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

Tensor WeightStore::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail("missing tensor ", name, " in ", dir_,
         "; the checkpoint does not match config.json (wrong architecture or an incomplete download)");
  return files_[it->second]->get(name);
}

Tensor WeightStore::get(const std::string& name, const Shape& expected) const {
  Tensor t = get(name);
  if (t.shape() != expected)
    fail("tensor ", name, " has shape ", shape_str(t.shape()), ", expected ", shape_str(expected),
         " (in ", dir_, "); the checkpoint does not match config.json");
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writing

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), specs_(std::move(specs)) {
  // Header: {"__metadata__": {...}, name: {dtype, shape, data_offsets}, ...} in spec order, with
  // the tensors packed back to back (safetensors rejects gaps).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorSpec& s : specs_) {
    SLOPE_CHECK(!s.name.empty() && s.name != "__metadata__", "cannot write a tensor named '", s.name, "' to ", path);
    SLOPE_CHECK(seen.insert(s.name).second, "tensor '", s.name, "' is listed twice for ", path);
    for (int64_t d : s.shape) SLOPE_CHECK(d >= 0, "tensor '", s.name, "' has a negative dimension ", shape_str(s.shape));
    const uint64_t nbytes = uint64_t(shape_numel(s.shape)) * dtype_size(s.dtype);
    header[s.name] = {{"dtype", std::string(dtype_name(s.dtype))},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the Hugging Face writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  file_ = std::make_unique<AtomicFile>(path, "safetensors file");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  file_->write(len, 8);
  file_->write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::append(const Tensor& t) {
  SLOPE_CHECK(file_, "safetensors writer for ", path_, " is already finished");
  SLOPE_CHECK(next_ < specs_.size(), "more tensors appended to ", path_, " than the ", specs_.size(), " declared");
  const TensorSpec& s = specs_[next_];
  SLOPE_CHECK(t.dtype() == s.dtype && t.shape() == s.shape, "tensor '", s.name, "' appended to ", path_,
              " is ", dtype_name(t.dtype()), " ", shape_str(t.shape()), ", declared as ",
              dtype_name(s.dtype), " ", shape_str(s.shape));
  if (t.nbytes() > 0) {
    SLOPE_CHECK(t.raw() != nullptr, "tensor '", s.name, "' has no data");
    file_->write(t.raw(), t.nbytes());
  }
  ++next_;
}

void SafetensorsWriter::finish() {
  SLOPE_CHECK(file_, "safetensors writer for ", path_, " is already finished");
  SLOPE_CHECK(next_ == specs_.size(), "only ", next_, " of ", specs_.size(), " tensors were written to ", path_);
  std::unique_ptr<AtomicFile> f = std::move(file_);
  f->commit();
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) specs.push_back({name, t.dtype(), t.shape()});
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& kv : tensors) w.append(kv.second);
  w.finish();
}

}  // namespace slope::model
