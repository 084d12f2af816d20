// Process facts: wall clock, peak resident memory, thread count.
#pragma once

#include <chrono>
#include <cstdint>

namespace slope {

// Seconds on a monotonic clock.
inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
int64_t peak_rss_bytes();
// Current resident set size in bytes (VmRSS), 0 if unknown.
int64_t current_rss_bytes();

// OpenMP threads used by kernels.
int num_threads();
void set_num_threads(int n);

}  // namespace slope
