// Ulysses all-to-all: "my tokens, all heads" <-> "my group's tokens, my heads".
//
// Heads: Ulysses rank u of U owns query heads [u·Hq/U, (u+1)·Hq/U). With GQA (query head h
// reads KV head ⌊h / G⌋, G = Hq/Hkv) it receives exactly the KV heads those need:
//   [⌊u·(Hq/U) / G⌋, ⌊((u+1)·(Hq/U) - 1) / G⌋ + 1).
// When U <= Hkv (U | Hkv) that is Hkv/U heads; when U > Hkv (Hkv | U) it is one KV head, the
// same one on U/Hkv ranks (replication: each of those ranks receives it, no rank receives a
// head it doesn't read). Either way local query head h' maps to local KV head ⌊h'/G'⌋ with
// G' = (Hq/U)/(local KV heads), so the kernel's GQA rule still holds on the local slice.
//
// Tokens: the group's tokens are the ring shard (zigzag, shard.h); after the exchange they are
// in ring-shard order, i.e. for each ring segment, the pieces of Ulysses ranks 0..U-1.
#pragma once

#include <cstdint>
#include <vector>

#include "slope/parallel/block_attention.h"
#include "slope/parallel/data_plane.h"
#include "slope/parallel/shard.h"

namespace slope::parallel {

struct HeadSlice {
  int64_t q0 = 0, nq = 0;    // query heads [q0, q0 + nq)
  int64_t kv0 = 0, nkv = 0;  // KV heads [kv0, kv0 + nkv)
};
HeadSlice ulysses_heads(int u, int U, int64_t num_q_heads, int64_t num_kv_heads);

// Staging buffers of the all-to-alls, owned by the caller and kept across layers and prefills:
// grown to the largest exchange, never shrunk, so that no layer call takes fresh pages.
// They live on the backend's device, and the exchanges' packing runs there.
struct UlyssesBuffers {
  explicit UlyssesBuffers(const ops::Backend& ops = ops::cpu()) : send(ops), recv(ops) {}
  ops::DeviceBuffer send, recv;
};

class UlyssesExchange {
 public:
  // comm: the Ulysses group (size U, rank u); layout: the zigzag layout of this prompt;
  // ring_rank: the group's ring rank.
  UlyssesExchange(DataPlane& comm, const ZigzagLayout& layout, int ring_rank,
                  const kernels::AttentionShape& shape, UlyssesBuffers& buffers);

  const HeadSlice& my_heads() const { return heads_[comm_.rank()]; }
  int64_t group_rows() const { return group_rows_; }

  // q [my_rows, Hq, D], k/v [my_rows, Hkv, D] ->
  // q_g [group_rows, nq, D], k_g/v_g [group_rows, nkv, D] (resized).
  void scatter_heads(const float* q, const float* k, const float* v, ops::DeviceBuffer& q_g,
                     ops::DeviceBuffer& k_g, ops::DeviceBuffer& v_g, CpStats& stats);
  // out_g [group_rows, nq, D] -> out [my_rows, Hq, D].
  void gather_heads(const float* out_g, float* out, CpStats& stats);

 private:
  // First row (in group / ring-shard order) of rank j's rows within ring segment s.
  int64_t group_row(int s, int j) const;

  DataPlane& comm_;
  const ZigzagLayout& layout_;
  int ring_rank_;
  kernels::AttentionShape shape_;
  std::vector<HeadSlice> heads_;
  std::vector<int64_t> rows_;  // rows held by each Ulysses rank
  int64_t group_rows_ = 0;
  ops::DeviceBuffer& send_;
  ops::DeviceBuffer& recv_;
  const ops::Backend& ops_;
};

// The same exchange for any rows (chunked prefill): rank j contributes q_rows[j] query rows and
// kv_rows[j] K/V rows (counts known to every rank of the group); the group's rows are rank 0's,
// then rank 1's, and so on. K/V rows and query rows are counted separately so that a caller
// can send only the K/V rows a peer does not have yet.
class UlyssesRows {
 public:
  UlyssesRows(DataPlane& comm, const kernels::AttentionShape& shape, UlyssesBuffers& buffers);

  const HeadSlice& my_heads() const { return heads_[comm_.rank()]; }

  // q [q_rows[me], Hq, D], k/v [kv_rows[me], Hkv, D] ->
  // q_g [Σ q_rows, nq, D], k_g/v_g [Σ kv_rows, nkv, D] (caller-sized buffers).
  void scatter_heads(const float* q, const std::vector<int64_t>& q_rows, const float* k,
                     const float* v, const std::vector<int64_t>& kv_rows, float* q_g, float* k_g,
                     float* v_g, CpStats& stats);
  // out_g [Σ q_rows, nq, D] -> out [q_rows[me], Hq, D].
  void gather_heads(const float* out_g, const std::vector<int64_t>& q_rows, float* out,
                    CpStats& stats);

 private:
  DataPlane& comm_;
  kernels::AttentionShape shape_;
  std::vector<HeadSlice> heads_;
  ops::DeviceBuffer& send_;
  ops::DeviceBuffer& recv_;
  const ops::Backend& ops_;
};

}  // namespace slope::parallel
