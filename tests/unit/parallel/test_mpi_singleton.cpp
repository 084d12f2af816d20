// The MPI layer started without mpirun: a singleton world of size 1. Checks the communicator's
// operations on one rank, its timeout (a receive nobody sends), and CP attention on a 1×1 mesh.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "slope/core/error.h"
#include "slope/parallel/cp_attention.h"
#include "slope/parallel/mpi_comm.h"

using namespace slope;
using namespace slope::parallel;

namespace {
// MPI can be initialised once per process: all tests share one runtime.
MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}
}  // namespace

TEST(MpiSingleton, WorldOfOne) {
  auto world = runtime().world();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->name(), "world");
  auto sub = world->split(0, 0, "sub");
  EXPECT_EQ(sub->size(), 1);
  world->barrier();
}

TEST(MpiSingleton, CollectivesOnOneRank) {
  auto world = runtime().world();
  std::vector<float> send{1, 2, 3}, recv(3);
  world->alltoallv(send.data(), {3}, {0}, recv.data(), {3}, {0});
  EXPECT_EQ(recv, send);
  double x[2] = {1.5, -2};
  world->allreduce(x, 2, ReduceOp::Max);
  EXPECT_EQ(x[0], 1.5);
  int64_t n = 7;
  world->allreduce(&n, 1, ReduceOp::Sum);
  EXPECT_EQ(n, 7);
  std::vector<uint8_t> all;
  const char msg[] = "abc";
  EXPECT_EQ(world->allgatherv_bytes(msg, 3, all), std::vector<int64_t>{3});
  EXPECT_EQ(std::string(all.begin(), all.end()), "abc");
  EXPECT_EQ(world->gatherv_bytes(msg, 2, all, 0), std::vector<int64_t>{2});
  EXPECT_EQ(std::string(all.begin(), all.end()), "ab");
  EXPECT_EQ(world->allgather<int>(42), std::vector<int>{42});
  float b = 3;
  world->broadcast(&b, 1, 0);
  EXPECT_EQ(b, 3);
}

TEST(MpiSingleton, SendToSelf) {
  auto world = runtime().world();
  std::vector<float> a{1, 2, 3, 4}, b(4);
  Request r = world->irecv(b.data(), 4, 0, Tag::Test);
  Request s = world->isend(a.data(), 4, 0, Tag::Test);
  s.wait();
  r.wait();
  EXPECT_EQ(a, b);
  EXPECT_EQ(world->stats().bytes_sent, 0);  // to itself: not counted as traffic
}

TEST(MpiSingleton, WaitTimesOutWithAMessageInsteadOfHanging) {
  auto world = runtime().world(/*timeout_seconds=*/0.2);
  float x = 0;
  Request r = world->irecv(&x, 1, 0, Tag::RingKV);
  try {
    r.wait();
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 0.2 s waiting for ring K/V block from rank 0"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("a peer may have died"), std::string::npos) << m;
  }
  // Complete the dangling receive so the request can be released cleanly.
  float y = 5;
  world->isend(&y, 1, 0, Tag::RingKV).wait();
  world->set_timeout(5);
  r.wait();
  EXPECT_EQ(x, 5);
}

TEST(MpiSingleton, MeshOfOneMatchesLocalAttention) {
  auto world = runtime().world();
  Mesh mesh(*world, {});
  // A context-parallel mesh is ring x ulysses only: stages and tensor groups are built around it.
  EXPECT_THROW(Mesh(*world, {.tp = 2}), Error);
  EXPECT_THROW(Mesh(*world, {.pp = 2}), Error);
  EXPECT_EQ(mesh.ring_rank(), 0);
  EXPECT_EQ(mesh.ulysses_rank(), 0);
  ContextParallelAttention cp(mesh);
  const int64_t n = 37, H = 4, D = 8;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> q(n * H * D), k(n * H * D), v(n * H * D), sinks(H);
  for (auto* vec : {&q, &k, &v, &sinks})
    for (float& x : *vec) x = d(rng);
  for (int64_t window : {0, 5}) {
    ops::LayerAttention spec;
    spec.shape = {H, H, D};
    spec.mask.window = window;
    spec.scale = 0.35f;
    spec.sinks = sinks.data();
    const ops::SequenceShard whole = ops::SequenceShard::whole(n);
    const ops::SequenceShard shard = my_shard(mesh, n);
    std::vector<float> ref(q.size()), out(q.size());
    ops::LocalAttention().attend(spec, q.data(), whole, k.data(), v.data(), whole, ref.data());
    cp.attend(spec, q.data(), shard, k.data(), v.data(), shard, out.data());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
    // Keys that miss some earlier position (here 0) are refused with a message.
    ops::SequenceShard wrong{n, {{1, n - 1}}};
    EXPECT_THROW(cp.attend(spec, q.data(), wrong, k.data(), v.data(), wrong, out.data()), Error);
  }
  EXPECT_EQ(cp.stats().layers, 2);
}
