// Shared by the fuzz targets: the parsers under test read files, so each input is written to a
// file private to this process first; every slope::Error is an accepted outcome (bad input,
// reported), anything else (a crash, a sanitizer report, another exception) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace slope::fuzz {

// A directory of this process's own, created once and reused for every input: in /dev/shm
// when there is one (memory; no disk writes per input), else the temp directory.
inline const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    std::error_code ec;
    const auto root = std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                                    : std::filesystem::temp_directory_path();
    const auto d = root / ("slope_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  static const bool cleanup = (std::atexit([] {
                                 std::error_code ec;
                                 std::filesystem::remove_all(dir, ec);
                               }),
                               true);
  (void)cleanup;
  return dir;
}

// Writes data[size] to work_dir()/name (a new file each time) and returns the path.
inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (work_dir() / name).string();
  ::unlink(path.c_str());  // a fresh file, not a truncated one (ext4 flushes those on close)
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();  // the harness itself failed: not a finding about SLOPE
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace slope::fuzz
