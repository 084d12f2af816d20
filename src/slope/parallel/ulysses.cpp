#include "slope/parallel/ulysses.h"

#include <cstring>

#include "slope/core/error.h"
#include "slope/core/sys.h"

namespace slope::parallel {

HeadSlice ulysses_heads(int u, int U, int64_t num_q_heads, int64_t num_kv_heads) {
  SLOPE_CHECK(num_q_heads % U == 0, "Ulysses degree ", U, " does not divide ", num_q_heads,
              " query heads");
  const int64_t per = num_q_heads / U, group = num_q_heads / num_kv_heads;
  HeadSlice h;
  h.q0 = u * per;
  h.nq = per;
  h.kv0 = h.q0 / group;
  h.nkv = (h.q0 + per - 1) / group + 1 - h.kv0;
  return h;
}

namespace {

// Per-peer counts (floats) of an all-to-all and their running displacements, as alltoallv
// takes them: send_count(j) floats go to rank j, recv_count(j) come from it.
struct AlltoallPlan {
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  int64_t send_total = 0, recv_total = 0;
};

template <typename SendCount, typename RecvCount>
AlltoallPlan plan_alltoall(int U, SendCount send_count, RecvCount recv_count) {
  AlltoallPlan p;
  p.send_counts.resize(U);
  p.send_displs.resize(U);
  p.recv_counts.resize(U);
  p.recv_displs.resize(U);
  for (int j = 0; j < U; ++j) {
    p.send_counts[j] = send_count(j);
    p.send_displs[j] = p.send_total;
    p.send_total += p.send_counts[j];
    p.recv_counts[j] = recv_count(j);
    p.recv_displs[j] = p.recv_total;
    p.recv_total += p.recv_counts[j];
  }
  return p;
}

// Packs the send buffer of a head scatter: for each rank j at send[displs[j]], my q rows with
// j's query heads [q_rows, nq_j, D], then my k and v rows with j's KV heads [kv_rows, nkv_j, D].
void pack_heads(const ops::Backend& ops, const std::vector<HeadSlice>& heads, const std::vector<int64_t>& displs,
                const float* q, int64_t q_rows, const float* k, const float* v, int64_t kv_rows, int64_t Hq,
                int64_t Hkv, int64_t D, float* send) {
  for (size_t j = 0; j < heads.size(); ++j) {
    const HeadSlice& h = heads[j];
    float* dst = send + displs[j];
    ops.copy_columns(q, q_rows, Hq * D, h.q0 * D, h.nq * D, dst);
    dst += q_rows * h.nq * D;
    for (const float* src : {k, v}) {
      ops.copy_columns(src, kv_rows, Hkv * D, h.kv0 * D, h.nkv * D, dst);
      dst += kv_rows * h.nkv * D;
    }
  }
}

// out [rows, Hq, D]: the columns of heads [h.q0, h.q0 + h.nq) <- src [rows, h.nq, D].
void unpack_heads(const ops::Backend& ops, const HeadSlice& h, const float* src, int64_t rows, int64_t Hq,
                  int64_t D, float* out) {
  ops.copy_columns(src, rows, h.nq * D, 0, h.nq * D, out + h.q0 * D, /*dst_stride=*/Hq * D);
}

}  // namespace

UlyssesExchange::UlyssesExchange(DataPlane& comm, const ZigzagLayout& layout, int ring_rank,
                                 const kernels::AttentionShape& shape, UlyssesBuffers& buffers)
    : comm_(comm),
      layout_(layout),
      ring_rank_(ring_rank),
      shape_(shape),
      send_(buffers.send),
      recv_(buffers.recv),
      ops_(buffers.send.backend()) {
  const int U = comm.size();
  SLOPE_CHECK(U == layout.shape().ulysses, "Ulysses group of ", U, " ranks for a mesh with U=",
              layout.shape().ulysses);
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads;
  SLOPE_CHECK(Hq % U == 0 && (Hkv % U == 0 || U % Hkv == 0), "--ulysses ", U,
              " cannot split ", Hq, " query / ", Hkv, " KV heads; valid --ulysses: ",
              [&] {
                std::string s;
                for (int x : valid_ulysses_degrees(Hq, Hkv)) s += (s.empty() ? "" : ", ") + std::to_string(x);
                return s;
              }());
  rows_.assign(U, 0);
  for (int j = 0; j < U; ++j) {
    heads_.push_back(ulysses_heads(j, U, Hq, Hkv));
    for (int s = 0; s < int(layout.ring_segments(ring_rank).size()); ++s)
      rows_[j] += layout.piece(ring_rank, s, j).length;
    group_rows_ += rows_[j];
  }
}

int64_t UlyssesExchange::group_row(int s, int j) const {
  int64_t row = 0;
  for (int s2 = 0; s2 < s; ++s2) row += layout_.ring_segments(ring_rank_)[s2].length;
  for (int j2 = 0; j2 < j; ++j2) row += layout_.piece(ring_rank_, s, j2).length;
  return row;
}

void UlyssesExchange::scatter_heads(const float* q, const float* k, const float* v, ops::DeviceBuffer& q_g,
                                    ops::DeviceBuffer& k_g, ops::DeviceBuffer& v_g, CpStats& stats) {
  const int U = comm_.size(), me = comm_.rank();
  const int64_t D = shape_.head_dim, Hq = shape_.num_q_heads, Hkv = shape_.num_kv_heads;
  const int64_t my_rows = rows_[me];
  const HeadSlice& mine = heads_[me];
  auto timed = stats.ledger.time(Phase::AttnCompute);

  // Send block for rank j: [my_rows, nq_j, D] q | [my_rows, nkv_j, D] k | same for v.
  auto [sc, sd, rc, rd, stotal, rtotal] =
      plan_alltoall(U, [&](int j) { return my_rows * (heads_[j].nq + 2 * heads_[j].nkv) * D; },
                    [&](int j) { return rows_[j] * (mine.nq + 2 * mine.nkv) * D; });
  send_.resize(size_t(stotal));
  recv_.resize(size_t(rtotal));
  pack_heads(ops_, heads_, sd, q, my_rows, k, v, my_rows, Hq, Hkv, D, send_.data());
  timed.stop();

  {
    auto comm = stats.ledger.time(Phase::AttnComm);
    comm_.alltoallv(send_.data(), sc, sd, recv_.data(), rc, rd);
  }

  // Unpack: rank j's rows are its piece of ring segment 0, then of segment 1.
  auto unpacking = stats.ledger.time(Phase::AttnCompute);
  q_g.resize(size_t(group_rows_ * mine.nq * D));
  k_g.resize(size_t(group_rows_ * mine.nkv * D));
  v_g.resize(size_t(group_rows_ * mine.nkv * D));
  for (int j = 0; j < U; ++j) {
    const float* src = recv_.data() + rd[j];
    const int64_t qn = rows_[j] * mine.nq * D, kn = rows_[j] * mine.nkv * D;
    int64_t i0 = 0;  // row within rank j's buffer
    for (int s = 0; s < int(layout_.ring_segments(ring_rank_).size()); ++s) {
      const int64_t len = layout_.piece(ring_rank_, s, j).length, g = group_row(s, j);
      ops_.copy(q_g.data() + g * mine.nq * D, src + i0 * mine.nq * D, len * mine.nq * D);
      ops_.copy(k_g.data() + g * mine.nkv * D, src + qn + i0 * mine.nkv * D, len * mine.nkv * D);
      ops_.copy(v_g.data() + g * mine.nkv * D, src + qn + kn + i0 * mine.nkv * D, len * mine.nkv * D);
      i0 += len;
    }
  }
}

void UlyssesExchange::gather_heads(const float* out_g, float* out, CpStats& stats) {
  const int U = comm_.size(), me = comm_.rank();
  const int64_t D = shape_.head_dim, Hq = shape_.num_q_heads;
  const HeadSlice& mine = heads_[me];
  auto timed = stats.ledger.time(Phase::AttnCompute);

  // To rank j: its rows (its pieces, in its buffer order) of my heads: [rows_j, nq, D].
  auto [sc, sd, rc, rd, stotal, rtotal] =
      plan_alltoall(U, [&](int j) { return rows_[j] * mine.nq * D; },
                    [&](int j) { return rows_[me] * heads_[j].nq * D; });
  send_.resize(size_t(stotal));
  recv_.resize(size_t(rtotal));
  for (int j = 0; j < U; ++j) {
    float* dst = send_.data() + sd[j];
    for (int s = 0; s < int(layout_.ring_segments(ring_rank_).size()); ++s) {
      const int64_t len = layout_.piece(ring_rank_, s, j).length, g = group_row(s, j);
      ops_.copy(dst, out_g + g * mine.nq * D, len * mine.nq * D);
      dst += len * mine.nq * D;
    }
  }
  timed.stop();

  {
    auto comm = stats.ledger.time(Phase::AttnComm);
    comm_.alltoallv(send_.data(), sc, sd, recv_.data(), rc, rd);
  }

  auto unpacking = stats.ledger.time(Phase::AttnCompute);
  for (int j = 0; j < U; ++j) unpack_heads(ops_, heads_[j], recv_.data() + rd[j], rows_[me], Hq, D, out);
}

UlyssesRows::UlyssesRows(DataPlane& comm, const kernels::AttentionShape& shape, UlyssesBuffers& buffers)
    : comm_(comm), shape_(shape), send_(buffers.send), recv_(buffers.recv), ops_(buffers.send.backend()) {
  const int U = comm.size();
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads;
  SLOPE_CHECK(Hq % U == 0 && (Hkv % U == 0 || U % Hkv == 0), "--ulysses ", U, " cannot split ",
              Hq, " query / ", Hkv, " KV heads");
  for (int j = 0; j < U; ++j) heads_.push_back(ulysses_heads(j, U, Hq, Hkv));
}

void UlyssesRows::scatter_heads(const float* q, const std::vector<int64_t>& q_rows, const float* k,
                                const float* v, const std::vector<int64_t>& kv_rows, float* q_g,
                                float* k_g, float* v_g, CpStats& stats) {
  const int U = comm_.size(), me = comm_.rank();
  const int64_t D = shape_.head_dim, Hq = shape_.num_q_heads, Hkv = shape_.num_kv_heads;
  const HeadSlice& mine = heads_[me];
  auto timed = stats.ledger.time(Phase::AttnCompute);

  // Send block for rank j: [q_rows[me], nq_j, D] q | [kv_rows[me], nkv_j, D] k | same for v.
  auto [sc, sd, rc, rd, stotal, rtotal] =
      plan_alltoall(U, [&](int j) { return (q_rows[me] * heads_[j].nq + 2 * kv_rows[me] * heads_[j].nkv) * D; },
                    [&](int j) { return (q_rows[j] * mine.nq + 2 * kv_rows[j] * mine.nkv) * D; });
  send_.resize(size_t(stotal));
  recv_.resize(size_t(rtotal));
  pack_heads(ops_, heads_, sd, q, q_rows[me], k, v, kv_rows[me], Hq, Hkv, D, send_.data());
  timed.stop();

  {
    auto comm = stats.ledger.time(Phase::AttnComm);
    comm_.alltoallv(send_.data(), sc, sd, recv_.data(), rc, rd);
  }

  // Unpack: rank j's rows go after ranks 0..j-1's.
  auto unpacking = stats.ledger.time(Phase::AttnCompute);
  int64_t qr = 0, kr = 0;
  for (int j = 0; j < U; ++j) {
    const float* src = recv_.data() + rd[j];
    const int64_t qn = q_rows[j] * mine.nq * D, kn = kv_rows[j] * mine.nkv * D;
    ops_.copy(q_g + qr * mine.nq * D, src, qn);
    ops_.copy(k_g + kr * mine.nkv * D, src + qn, kn);
    ops_.copy(v_g + kr * mine.nkv * D, src + qn + kn, kn);
    qr += q_rows[j];
    kr += kv_rows[j];
  }
}

void UlyssesRows::gather_heads(const float* out_g, const std::vector<int64_t>& q_rows, float* out,
                               CpStats& stats) {
  const int U = comm_.size(), me = comm_.rank();
  const int64_t D = shape_.head_dim, Hq = shape_.num_q_heads;
  const HeadSlice& mine = heads_[me];
  // To rank j: its rows of my heads, [q_rows[j], nq, D], contiguous in out_g; from rank j: my
  // rows of its heads. The send side needs no packing.
  auto [sc, sd, rc, rd, stotal, rtotal] =
      plan_alltoall(U, [&](int j) { return q_rows[j] * mine.nq * D; },
                    [&](int j) { return q_rows[me] * heads_[j].nq * D; });
  recv_.resize(size_t(rtotal));
  {
    auto comm = stats.ledger.time(Phase::AttnComm);
    comm_.alltoallv(out_g, sc, sd, recv_.data(), rc, rd);
  }

  auto unpacking = stats.ledger.time(Phase::AttnCompute);
  for (int j = 0; j < U; ++j) unpack_heads(ops_, heads_[j], recv_.data() + rd[j], q_rows[me], Hq, D, out);
}

}  // namespace slope::parallel
