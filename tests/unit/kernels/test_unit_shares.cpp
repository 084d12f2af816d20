// UnitShares (kernels/cpu/unit_shares.h), the schedule of the attention kernels' window units:
// every unit is taken exactly once, each thread runs its own share in order, and threads that
// finish early take the rest of a slow thread's share.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "slope/kernels/cpu/unit_shares.h"

namespace {

using slope::kernels::cpu::UnitShares;

struct Taken {
  std::vector<std::atomic<int>> count;
  std::vector<std::atomic<int>> by;
  explicit Taken(int64_t n) : count(static_cast<size_t>(n)), by(static_cast<size_t>(n)) {}
};

// Runs `nt` threads over units [0, n) as the kernels do (UnitShares::run: its own share, then
// stealing). Thread `slow` (if >= 0) sleeps `nap` per unit of its own; returns what each thread
// took, in order.
std::vector<std::vector<int64_t>> run(UnitShares& shares, int nt, int64_t n, Taken& taken, int slow = -1,
                                      std::chrono::microseconds nap = {}) {
  std::vector<std::vector<int64_t>> order(static_cast<size_t>(nt));
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int tid = 0; tid < nt; ++tid)
    threads.emplace_back([&, tid] {
      shares.set(tid, nt, n);
      ready.fetch_add(1);
      while (ready.load() < nt) std::this_thread::yield();  // the region's barrier
      auto take = [&](int64_t t) {
        ASSERT_GE(t, 0);
        ASSERT_LT(t, n);
        taken.count[static_cast<size_t>(t)].fetch_add(1);
        taken.by[static_cast<size_t>(t)].store(tid);
        order[static_cast<size_t>(tid)].push_back(t);
      };
      const int64_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
      shares.run(tid, [&](int64_t t, int64_t next) {
        // The next unit named is the share's next, and only while the share lasts.
        if (next >= 0) {
          EXPECT_EQ(next, t + 1);
          EXPECT_TRUE(lo <= t && next < hi);
        }
        take(t);
        if (tid == slow && lo <= t && t < hi) std::this_thread::sleep_for(nap);
      });
    });
  for (std::thread& t : threads) t.join();
  return order;
}

TEST(UnitShares, EveryUnitOnceAndOwnSharesInOrder) {
  for (int nt : {1, 2, 3, 5}) {
    for (int64_t n : {0, 1, 2, 7, 64, 1000}) {
      UnitShares shares(nt + 1);  // more room than threads, as omp_get_max_threads may give
      Taken taken(n);
      const auto order = run(shares, nt, n, taken);
      for (int64_t t = 0; t < n; ++t) EXPECT_EQ(taken.count[static_cast<size_t>(t)].load(), 1) << nt << " threads, unit " << t;
      // A thread's own units come first and in order: the first of them is its share's start,
      // each the one after the one before, until it steals (from some other share's back).
      for (int tid = 0; tid < nt; ++tid) {
        const auto& o = order[static_cast<size_t>(tid)];
        const int64_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
        size_t i = 0;
        for (int64_t t = lo; i < o.size() && t < hi && o[i] == t; ++t) ++i;
        for (; i < o.size(); ++i) EXPECT_TRUE(o[i] < lo || o[i] >= hi) << "thread " << tid << " stole its own unit " << o[i];
      }
    }
  }
}

TEST(UnitShares, OthersFinishASlowThreadsShare) {
  const int nt = 3;
  const int64_t n = 300;
  UnitShares shares(nt);
  Taken taken(n);
  // Thread 0 takes 20 ms a unit; the others are done with their shares at once and take the
  // rest of thread 0's from its back.
  run(shares, nt, n, taken, 0, std::chrono::microseconds(20000));
  int64_t by_slow = 0;
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(taken.count[static_cast<size_t>(t)].load(), 1) << "unit " << t;
    by_slow += taken.by[static_cast<size_t>(t)].load() == 0;
  }
  // Thread 0's share is 100 units; the others ran most of them (it may run none, where they
  // start first; the bound is far from what a loaded machine gives: each of its units takes 20 ms).
  EXPECT_LT(by_slow, 50);
}

}  // namespace
