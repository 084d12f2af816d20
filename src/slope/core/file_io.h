// Files a user names on the command line, read and written safely: inputs must be regular
// files (a FIFO would block the open forever, a directory or device is never a model or a
// prompt), and outputs replace only a regular file or create a new one, written under a
// temporary name in the same directory and renamed into place once every write and the close
// succeeded (so a device node such as /dev/null is never replaced and a failed write never
// leaves a truncated file behind).
#pragma once

#include <cstddef>
#include <string>

namespace slope {

// Throws slope::Error unless `path` names an existing regular file (symlinks are followed).
// `what` names the file's role in the message, e.g. "token file" or "config".
void check_regular_input(const std::string& path, const std::string& what);

// Opens `path` read-only without blocking (a FIFO is refused, not waited on) and checks that it
// is a regular file; returns the descriptor, which the caller closes. Throws slope::Error.
int open_regular_input(const std::string& path, const std::string& what);

// The whole content of the regular file `path` (open_regular_input, then every read checked).
std::string read_regular_file(const std::string& path, const std::string& what);

// Throws slope::Error unless `path` can be written as a file: it is absent or a regular file,
// and its directory exists and is writable. Nothing is created.
void check_output_path(const std::string& path, const std::string& what);

// Throws slope::Error unless `dir` can hold output files: it is an existing directory, or absent
// with its nearest existing ancestor a writable directory. Nothing is created.
void check_output_dir(const std::string& dir, const std::string& what);

// A file written under a unique temporary name next to `path` and moved over `path` by
// commit(). The destructor removes the temporary file when commit() was not reached.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);  // all of it, or slope::Error
  // Flushes to disk, closes (checked), re-checks `path` and renames the file into place.
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, what_, tmp_;
  int fd_ = -1;
};

// AtomicFile in one call.
void write_file_atomically(const std::string& path, const void* data, size_t bytes, const std::string& what);

}  // namespace slope
