// The ledger: scopes add their wall time to their phase once, spans and bytes add up, and
// ledgers sum phase by phase.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "slope/core/ledger.h"

using namespace slope;

TEST(Ledger, ScopeAddsItsWallTimeToItsPhaseOnce) {
  Ledger l;
  const double t0 = now_seconds();
  {
    auto t = l.time(Phase::Mlp);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // after stop: not counted
  }                                                              // destruction adds nothing more
  const double wall = now_seconds() - t0;
  EXPECT_GE(l.seconds(Phase::Mlp), 0.019);
  EXPECT_LT(l.seconds(Phase::Mlp), wall - 0.015);
  EXPECT_EQ(l.seconds(Phase::Attention), 0);
}

TEST(Ledger, SpansBytesAndSumsAddUp) {
  Ledger a, b;
  a.add(Phase::AttnComm, 1.5);
  a.add(Phase::AttnComm, 0.5);
  a.add(Phase::Embed, 0.25);
  a.count_sent(10);
  b.add(Phase::AttnComm, 1);
  b.count_sent(5);
  b.count_received(7);
  EXPECT_DOUBLE_EQ(a.sum(Phase::AttnComm, Phase::Embed), 2.25);
  a += b;
  EXPECT_DOUBLE_EQ(a.seconds(Phase::AttnComm), 3);
  EXPECT_EQ(a.bytes_sent(), 15);
  EXPECT_EQ(a.bytes_received(), 7);
  a.reset();
  EXPECT_EQ(a.seconds(Phase::AttnComm), 0);
  EXPECT_EQ(a.bytes_sent(), 0);
}

TEST(Ledger, EveryPhaseHasAName) {
  for (int p = 0; p < int(Phase::Count); ++p) EXPECT_NE(phase_name(Phase(p)), "?") << p;
}
