// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw bytes. Files are memory-mapped; tensors are views into the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slope/core/file_io.h"
#include "slope/core/tensor.h"

namespace slope::model {

// One memory-mapped .safetensors file. Every malformed input (short file, bad header length,
// bad JSON, padding other than spaces, unknown dtype, offsets outside the data, shape/size
// mismatch, tensors that do not tile the data region exactly) throws slope::Error naming the
// file, the tensor and what is wrong. A path that is not a regular file (a FIFO, a device) is
// refused before it is read.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  // A read-only view into the mapping (kept alive by the returned tensor).
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The JSON header as stored (with its space padding), and the data region after it.
  std::string_view header() const { return header_; }
  const uint8_t* data() const { return data_; }
  size_t data_size() const { return data_size_; }
  // Drops this process's resident pages of the file (madvise MADV_DONTNEED on the read-only
  // mapping): they leave its RSS and stay in the page cache, and a later read of a view faults
  // them back in with the same bytes. For a loader that has copied what it needs out.
  void release_pages() const;

 private:
  struct Entry { DType dtype; Shape shape; size_t begin, end; };
  std::string path_;
  std::shared_ptr<void> mapping_;  // unmaps on release
  size_t mapping_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the byte buffer after the header
  size_t data_size_ = 0;
  std::string_view header_;  // into the mapping
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// All weights of a HF model directory: model.safetensors, or shards listed in
// model.safetensors.index.json ("weight_map": {name: file}).
class WeightStore {
 public:
  explicit WeightStore(const std::string& model_dir);

  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;
  // Throws slope::Error "missing tensor NAME in DIR" if absent.
  Tensor get(const std::string& name) const;
  // As get(), and checks the shape: "tensor NAME has shape [..], expected [..]".
  Tensor get(const std::string& name, const Shape& expected) const;
  // The files, in the order they were opened (the index's order, or the one file).
  std::vector<const SafetensorsFile*> files() const;
  // SafetensorsFile::release_pages of every file.
  void release_pages() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> index_;  // tensor name -> file
};

// Name, dtype and shape of one tensor, as listed in a safetensors header.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

// Streams a .safetensors file whose tensor list is known up front: the header is written at
// construction, then each tensor's bytes with append() in the order of `specs` (one sequential
// write; only one tensor need be in memory at a time). finish() checks that every tensor was
// appended and moves the file into place (it is written under a temporary name next to PATH
// until then, so an interrupted write never leaves a truncated PATH). PATH must be absent or a
// regular file: a device node, FIFO or directory there is refused, never replaced. Throws
// slope::Error on any I/O failure or a tensor that does not match its spec.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the temporary file if finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void append(const Tensor& t);  // the next tensor in spec order
  void finish();

 private:
  std::string path_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
  std::unique_ptr<AtomicFile> file_;  // null once finished
};

// Writes tensors (any supported dtype) to a .safetensors file, in the given order, with
// optional string metadata. Throws slope::Error if the file cannot be written.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace slope::model
