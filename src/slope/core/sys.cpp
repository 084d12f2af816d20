#include "slope/core/sys.h"

#include <malloc.h>
#include <cstdio>
#include <omp.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace slope {
namespace {
int64_t status_kib(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return 0;
}
}  // namespace

int64_t peak_rss_bytes() { return status_kib("VmHWM:") * 1024; }
int64_t current_rss_bytes() { return status_kib("VmRSS:") * 1024; }
void return_large_frees_to_system() { mallopt(M_MMAP_THRESHOLD, 256 << 10); }  // a fixed threshold: no raising
int64_t l3_cache_bytes() {
  FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  if (!f) return 0;
  long v = 0;
  char unit = 0;
  const bool ok = std::fscanf(f, "%ld%c", &v, &unit) == 2 && v > 0;
  std::fclose(f);
  return ok ? int64_t{v} * (unit == 'M' ? 1 << 20 : 1 << 10) : 0;
}
int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(n); }

#ifndef SLOPE_VERSION
#define SLOPE_VERSION "unknown"
#endif
#ifndef SLOPE_GIT_COMMIT
#define SLOPE_GIT_COMMIT "unknown"
#endif
std::string version_string() { return std::string(SLOPE_VERSION) + " (commit " + SLOPE_GIT_COMMIT + ")"; }

std::vector<std::string> data_dirs() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs{"."};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path prefix = exe.parent_path().parent_path();
    dirs.push_back((prefix / "share" / "slope").lexically_normal().string());
    const fs::path checkout = prefix.parent_path();  // build/<preset>/slope
    if (fs::exists(checkout / "CMakeLists.txt", ec) && fs::exists(checkout / "profiles", ec))
      dirs.push_back(checkout.lexically_normal().string());
  }
  return dirs;
}

std::string find_data_path(const std::string& relative) {
  std::error_code ec;
  for (const std::string& d : data_dirs()) {
    const std::filesystem::path p = std::filesystem::path(d) / relative;
    if (std::filesystem::exists(p, ec)) return p.string();
  }
  return "";
}

}  // namespace slope
