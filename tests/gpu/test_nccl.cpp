// NcclComm under MPI: one rank per GPU (ranks share GPUs round-robin where there are fewer; NCCL
// cannot run two ranks on one GPU, so the multi-rank cases need as many GPUs as ranks). Checks
// all-reduce, a ring of send/recv, all-to-all-v and the watchdog against values computed on the
// host. Skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"
#include "slope/cuda/nccl_comm.h"

namespace slope::cuda {
namespace {

int g_rank = 0, g_size = 1;
bool g_mpi = true;  // false with SLOPE_TEST_NO_MPI=1: one rank, bootstrapped without MPI


// Skips unless every rank has a GPU of its own.
#define REQUIRE_GPU_PER_RANK()                                                                  \
  do {                                                                                          \
    std::string why;                                                                            \
    const int n = device_count(&why);                                                           \
    if (n == 0) GTEST_SKIP() << "no CUDA device: " << why;                                      \
    if (n < g_size) GTEST_SKIP() << g_size << " ranks need " << g_size << " GPUs, found " << n; \
  } while (0)

TEST(NcclComm, AllReduceSendRecvAndAllToAllV) {
  REQUIRE_GPU_PER_RANK();
  std::unique_ptr<NcclComm> owner = g_mpi ? std::make_unique<NcclComm>(MPI_COMM_WORLD, g_rank)
                                          : std::make_unique<NcclComm>(NcclComm::new_id(), 0, 1, 0);
  NcclComm& comm = *owner;
  ASSERT_EQ(comm.rank(), g_rank);
  ASSERT_EQ(comm.size(), g_size);

  // All-reduce: element i of rank r is r + i; the sum is Σ_r r + size·i.
  const size_t n = 1000;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = float(g_rank + int(i));
  auto src = DeviceBuffer::from(mine);
  DeviceBuffer dst(n * 4);
  comm.allreduce(src.as<float>(), dst.as<float>(), n, ElemType::F32, ReduceOp::Sum, nullptr);
  comm.wait(nullptr);
  const auto sum = dst.to_host<float>();
  const float ranks = float(g_size * (g_size - 1) / 2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], ranks + float(g_size) * float(i)) << i;

  // A ring: send to rank+1, receive from rank-1 (one group, so one rank works too).
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  DeviceBuffer got(n * 4);
  comm.all_to_all_v(nullptr, std::vector<size_t>(g_size, 0).data(), std::vector<size_t>(g_size, 0).data(), nullptr,
                    std::vector<size_t>(g_size, 0).data(), std::vector<size_t>(g_size, 0).data(), ElemType::F32,
                    nullptr);  // empty exchange: a no-op
  {
    std::vector<size_t> sc(g_size, 0), rc(g_size, 0), zero(g_size, 0);
    sc[next] = n, rc[prev] = n;
    comm.all_to_all_v(src.as<float>(), sc.data(), zero.data(), got.data(), rc.data(), zero.data(), ElemType::F32,
                      nullptr);
  }
  comm.wait(nullptr);
  const auto ring = got.to_host<float>();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(ring[i], float(prev + int(i))) << i;

  // All-to-all-v: rank r sends p + 1 elements of value 100·r + p to each rank p.
  std::vector<size_t> sc(g_size), sd(g_size), rc(g_size), rd(g_size);
  std::vector<int32_t> out;
  for (int p = 0; p < g_size; ++p) {
    sc[p] = size_t(p + 1), sd[p] = out.size();
    out.insert(out.end(), sc[p], 100 * g_rank + p);
    rc[p] = size_t(g_rank + 1), rd[p] = size_t(p) * (g_rank + 1);
  }
  auto dsend = DeviceBuffer::from(out);
  DeviceBuffer drecv(size_t(g_size) * (g_rank + 1) * 4);
  comm.all_to_all_v(dsend.data(), sc.data(), sd.data(), drecv.data(), rc.data(), rd.data(), ElemType::I32, nullptr);
  comm.wait(nullptr);
  const auto in = drecv.to_host<int32_t>();
  for (int p = 0; p < g_size; ++p)
    for (int j = 0; j <= g_rank; ++j) ASSERT_EQ(in[size_t(p) * (g_rank + 1) + j], 100 * p + g_rank);
}

TEST(NcclComm, WatchdogAbortsAReceiveThatNeverCompletes) {
  REQUIRE_GPU_PER_RANK();
  if (g_size != 1) GTEST_SKIP() << "run with one rank: the unmatched receive is from itself";
  const NcclOptions opt{.timeout = std::chrono::milliseconds(500)};
  std::unique_ptr<NcclComm> owner = g_mpi ? std::make_unique<NcclComm>(MPI_COMM_WORLD, 0, opt)
                                          : std::make_unique<NcclComm>(NcclComm::new_id(), 0, 1, 0, opt);
  NcclComm& comm = *owner;
  DeviceBuffer buf(64);
  try {
    comm.recv(buf.data(), 16, ElemType::F32, 0, nullptr);  // no matching send
  } catch (const Error& e) {
    GTEST_SKIP() << "NCCL rejected the unmatched self-receive at once (" << e.what()
                 << "); the watchdog needs an operation that hangs to be tested";
  }
  try {
    comm.wait(nullptr);
    FAIL() << "an unmatched receive completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within 500 ms"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(comm.aborted());
  EXPECT_THROW(comm.allreduce(buf.data(), buf.data(), 16, ElemType::F32, ReduceOp::Sum, nullptr), Error);
}

}  // namespace
}  // namespace slope::cuda

int main(int argc, char** argv) {
  const char* no_mpi = std::getenv("SLOPE_TEST_NO_MPI");
  slope::cuda::g_mpi = !(no_mpi && std::string(no_mpi) == "1");
  if (slope::cuda::g_mpi) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &slope::cuda::g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &slope::cuda::g_size);
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (slope::cuda::g_mpi) MPI_Finalize();
  return rc;
}
