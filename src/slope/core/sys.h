// Process and machine facts: wall clock, peak resident memory, thread count, cache size.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

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

// For long-lived processes (a server's instances and its front): allocations of at least
// 256 KiB are mapped and unmapped on their own, so their memory goes back to the system when
// freed. glibc's default raises that threshold after each such free (up to 32 MiB), after which
// a prefill's activations of a mix of prompt lengths come from the heap, which fragments and
// grows for as long as the process lives. Costs a page fault per 4 KiB of each big allocation.
void return_large_frees_to_system();

// The L3 cache's size in bytes as sysfs gives it for CPU 0, 0 if unknown. (glibc's
// sysconf(_SC_LEVEL3_CACHE_SIZE) read 320 MiB for the 32 MiB L3 of a 2-vCPU Zen 4 guest.)
int64_t l3_cache_bytes();

// OpenMP threads used by kernels.
int num_threads();
void set_num_threads(int n);

// The version, e.g. "0.1.0 (commit 6a6704a)"; the commit is the one the binary was built from.
std::string version_string();

// Where shipped data (configs/, profiles/) is looked up, in order: the current directory, the
// installed share folder next to the binary (PREFIX/bin/slope -> PREFIX/share/slope), and the
// source tree a build folder sits in (build/release/slope -> the checkout).
std::vector<std::string> data_dirs();
// The first DIR/relative of data_dirs() that exists, or "" if none does.
std::string find_data_path(const std::string& relative);

}  // namespace slope
