#include "slope/core/sys.h"

#include <omp.h>

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
int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(n); }

}  // namespace slope
