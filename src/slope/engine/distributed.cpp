#include "slope/engine/distributed.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "slope/core/error.h"

namespace slope::engine {

void share_logits(PrefillResult& r, parallel::Communicator& comm, int top_k) {
  const std::vector<int> holds = comm.allgather(int(r.has_logits));
  int holder = -1;
  for (int i = 0; i < int(holds.size()); ++i)
    if (holds[i]) {
      SLOPE_CHECK(holder < 0, "ranks ", holder, " and ", i, " both hold the last position");
      holder = i;
    }
  SLOPE_CHECK(holder >= 0, "no rank holds the last position of the prompt");
  int64_t vocab = int64_t(r.logits.size());
  comm.broadcast(&vocab, 1, holder);
  r.logits.resize(vocab);
  comm.broadcast(r.logits.data(), size_t(vocab), holder);
  if (!r.has_logits) {
    r.top_logprobs = top_logprobs(r.logits.data(), vocab, std::max(1, top_k));
    r.first_token = r.top_logprobs[0].token;
  }
}

std::vector<RankReport> gather_reports(const RankReport& mine, parallel::Communicator& comm,
                                       int root) {
  std::vector<uint8_t> buf;
  comm.gatherv_bytes(&mine, sizeof(RankReport), buf, root);
  std::vector<RankReport> out;
  if (comm.rank() != root) return out;
  out.resize(buf.size() / sizeof(RankReport));
  std::memcpy(out.data(), buf.data(), out.size() * sizeof(RankReport));
  return out;
}

void gather_kv(const PrefillResult& r, int first_layer, int64_t kv_head0,
               const model::ModelConfig& cfg, parallel::Communicator& comm, std::vector<Tensor>& k,
               std::vector<Tensor>& v, int root) {
  const int64_t D = cfg.head_dim;
  const int64_t heads = r.k.empty() ? 0 : r.k[0].dim(1);
  const int64_t layers = int64_t(r.k.size());
  const std::vector<int64_t> pos = r.shard.positions();
  const int64_t n = int64_t(pos.size()), row = heads * D;
  // One message per rank: header, positions, then per layer its K rows and V rows.
  const int64_t header[5] = {first_layer, layers, kv_head0, heads, n};
  std::vector<uint8_t> send(sizeof(header) + size_t(n) * sizeof(int64_t) +
                            size_t(layers * 2 * n * row) * sizeof(float));
  uint8_t* p = send.data();
  std::memcpy(p, header, sizeof(header));
  p += sizeof(header);
  std::memcpy(p, pos.data(), size_t(n) * sizeof(int64_t));
  p += size_t(n) * sizeof(int64_t);
  for (int64_t l = 0; l < layers; ++l)
    for (const Tensor* t : {&r.k[l], &r.v[l]}) {
      std::memcpy(p, t->data<float>(), size_t(n * row) * sizeof(float));
      p += size_t(n * row) * sizeof(float);
    }
  std::vector<uint8_t> recv;
  const std::vector<int64_t> counts = comm.gatherv_bytes(send.data(), send.size(), recv, root);
  k.clear();
  v.clear();
  if (comm.rank() != root) return;
  const int64_t N = r.shard.total_tokens, Hkv = cfg.num_kv_heads;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k.emplace_back(Shape{N, Hkv, D}, DType::F32);
    v.emplace_back(Shape{N, Hkv, D}, DType::F32);
  }
  const uint8_t* q = recv.data();
  for (int64_t c : counts) {
    int64_t h[5];
    std::memcpy(h, q, sizeof(h));
    const int64_t rn = h[4], rrow = h[3] * D;
    const int64_t* rpos = reinterpret_cast<const int64_t*>(q + sizeof(h));
    const float* data = reinterpret_cast<const float*>(q + sizeof(h) + size_t(rn) * sizeof(int64_t));
    for (int64_t l = 0; l < h[1]; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        float* dst = (kv ? v[h[0] + l] : k[h[0] + l]).data<float>();
        const float* src = data + (l * 2 + kv) * rn * rrow;
        for (int64_t i = 0; i < rn; ++i)
          std::memcpy(dst + (rpos[i] * Hkv + h[2]) * D, src + i * rrow, size_t(rrow) * sizeof(float));
      }
    q += c;
  }
}

double relative_error(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace slope::engine
