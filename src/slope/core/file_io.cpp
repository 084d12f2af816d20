#include "slope/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "slope/core/error.h"

namespace slope {
namespace fs = std::filesystem;
namespace {

std::string sys_error() { return std::strerror(errno); }

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void not_regular_input(const std::string& path, const std::string& what, mode_t m) {
  fail(what, " ", path, " is ", kind_of(m), "; only regular files are accepted", S_ISDIR(m) ? "" : " (copy the data to a file)");
}

// The directory a file `path` is created in ("." for a bare name).
std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void check_regular_input(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("cannot read ", what, " ", path, " (", sys_error(), "); check the path and permissions");
  if (!S_ISREG(st.st_mode)) not_regular_input(path, what, st.st_mode);
}

int open_regular_input(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It has no
  // effect on regular files, which are all that get past the fstat below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", what, " ", path, " (", sys_error(), "); check the path and permissions");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = sys_error();
    ::close(fd);
    fail("cannot stat ", what, " ", path, " (", err, ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular_input(path, what, st.st_mode);
  }
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  const int fd = open_regular_input(path, what);
  std::string out;
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = sys_error();
      ::close(fd);
      fail("reading ", what, " ", path, " failed (", err, ")");
    }
    if (n == 0) break;
    out.append(buf.data(), size_t(n));
  }
  ::close(fd);
  return out;
}

void check_output_path(const std::string& path, const std::string& what) {
  SLOPE_CHECK(!path.empty(), what, " is an empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    SLOPE_CHECK(S_ISREG(st.st_mode), what, " ", path, " exists and is ", kind_of(st.st_mode),
                "; only a regular file or a new path is written (refusing to replace it); choose another path");
  } else if (errno != ENOENT) {
    fail("cannot use ", what, " ", path, " (", sys_error(), ")");
  }
  const std::string dir = parent_of(path);
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0)
    fail("cannot write ", what, " ", path, ": directory ", dir, " does not exist (", sys_error(), "); create it first");
  SLOPE_CHECK(S_ISDIR(ds.st_mode), "cannot write ", what, " ", path, ": ", dir, " is ", kind_of(ds.st_mode),
              ", not a directory");
  SLOPE_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "cannot write ", what, " ", path, ": directory ", dir,
              " is not writable (", sys_error(), ")");
}

void check_output_dir(const std::string& dir, const std::string& what) {
  SLOPE_CHECK(!dir.empty(), what, " is an empty path");
  // The nearest existing ancestor (the directory itself if it exists) must be a writable directory.
  fs::path p = fs::path(dir);
  for (;;) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      SLOPE_CHECK(S_ISDIR(st.st_mode), what, " ", dir, ": ", p.string(), " exists and is ", kind_of(st.st_mode),
                  ", not a directory; choose another path");
      SLOPE_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, what, " ", dir, ": directory ", p.string(),
                  " is not writable (", sys_error(), ")");
      return;
    }
    if (errno != ENOENT) fail("cannot use ", what, " ", dir, ": ", p.string(), " (", sys_error(), ")");
    fs::path up = p.parent_path();
    if (up.empty() || up == p) up = ".";
    if (up == p) fail("cannot use ", what, " ", dir, ": no existing ancestor directory");
    p = up;
  }
}

AtomicFile::AtomicFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  check_output_path(path, what);
  // mkstemp: a new name that nobody else holds, created with O_EXCL, in the target's directory so
  // the final rename never crosses file systems.
  std::string tmpl = path + ".tmp.XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) fail("cannot write ", what, " ", path, " (creating a temporary file: ", sys_error(), ")");
  tmp_ = name.data();
  ::fchmod(fd_, 0644);  // mkstemp creates 0600; outputs are ordinary readable files
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  SLOPE_CHECK(fd_ >= 0, what_, " ", path_, " is already written");
  const auto* b = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, b, std::min<size_t>(bytes, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing ", what_, " ", tmp_, " failed (", w < 0 ? sys_error() : "no progress", "); is the disk full?");
    b += w;
    bytes -= size_t(w);
  }
}

void AtomicFile::commit() {
  SLOPE_CHECK(fd_ >= 0, what_, " ", path_, " is already written");
  // A write error can be reported only by fsync or close (NFS, quotas): both are checked.
  const bool synced = ::fsync(fd_) == 0;
  const std::string sync_err = synced ? "" : sys_error();
  const bool closed = ::close(fd_) == 0;
  const std::string close_err = closed ? "" : sys_error();
  fd_ = -1;
  if (!synced || !closed) {
    ::unlink(tmp_.c_str());
    fail("writing ", what_, " ", tmp_, " failed at ", synced ? "close" : "fsync", " (", synced ? close_err : sync_err,
         "); is the disk full?");
  }
  try {
    check_output_path(path_, what_);  // it may have changed since the constructor looked
  } catch (...) {
    ::unlink(tmp_.c_str());
    throw;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string err = sys_error();
    ::unlink(tmp_.c_str());
    fail("cannot move ", tmp_, " to ", path_, " (", err, ")");
  }
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes, const std::string& what) {
  AtomicFile f(path, what);
  f.write(data, bytes);
  f.commit();
}

}  // namespace slope
