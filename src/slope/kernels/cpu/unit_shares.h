// Work units [0, n) of a parallel region split into one contiguous share per thread. Each thread
// takes the units of its own share from the front; a thread whose share is done takes units one
// at a time from the back of the share with the most left. Where the units cost about the same,
// every thread runs its own share, in order, and so reads what it packed itself (the attention
// kernels' window units, in shares of rows, read the keys of their own rows); where a thread
// falls behind (the host slowing one core), the others finish its share, as a dynamic schedule
// would. Internal to kernels/cpu.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace slope::kernels::cpu {

class UnitShares {
 public:
  // Room for `threads` shares, all empty until set().
  explicit UnitShares(int threads) : shares_(static_cast<size_t>(threads)) {}

  // Thread `tid` of `nt` (nt <= threads) takes the share [n·tid/nt, n·(tid+1)/nt) of units [0, n),
  // n < 2^32. Each thread of the region sets its own before a barrier, and only then do any take
  // units.
  void set(int tid, int nt, int64_t n) {
    shares_[static_cast<size_t>(tid)].range.store(pack(n * tid / nt, n * (tid + 1) / nt));
  }

  // The next unit of thread tid's own share, or -1 when it is done.
  int64_t own(int tid) {
    std::atomic<uint64_t>& r = shares_[static_cast<size_t>(tid)].range;
    uint64_t x = r.load();
    while (front(x) < back(x))
      if (r.compare_exchange_weak(x, pack(front(x) + 1, back(x)))) return front(x);
    return -1;
  }

  // Runs thread tid's units: its own share, then others' units from their backs, as
  // unit(t, next): `next` is the unit this thread runs next where it is known (its own share's
  // next, taken before t runs, so that unit can prefetch for it), else -1.
  template <typename F>
  void run(int tid, F&& unit) {
    for (int64_t t = own(tid), next; t >= 0; t = next) {
      next = own(tid);
      unit(t, next);
    }
    for (int64_t t = steal(); t >= 0; t = steal()) unit(t, int64_t{-1});
  }

  // The last unit of the share with the most units left, or -1 when every share is done.
  int64_t steal() {
    for (;;) {
      Share* most = nullptr;
      uint64_t x = 0;
      for (Share& s : shares_) {
        const uint64_t y = s.range.load();
        if (back(y) - front(y) > back(x) - front(x)) most = &s, x = y;
      }
      if (!most) return -1;
      if (most->range.compare_exchange_weak(x, pack(front(x), back(x) - 1))) return back(x) - 1;
    }
  }

 private:
  // [front, back) in one word, so that the owner (at the front) and a thief (at the back) never
  // both take the last unit.
  static uint64_t pack(int64_t f, int64_t b) { return uint64_t(f) << 32 | uint64_t(b); }
  static int64_t front(uint64_t x) { return static_cast<int64_t>(x >> 32); }
  static int64_t back(uint64_t x) { return static_cast<int64_t>(x & 0xffffffffu); }

  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};
  };
  std::vector<Share> shares_;
};

}  // namespace slope::kernels::cpu
