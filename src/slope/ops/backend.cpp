// The Backend ops with a default composed of the other ops.
#include "slope/ops/backend.h"

#include <algorithm>

namespace slope::ops {

void Backend::rmsnorm_linear(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                             kernels::NormOrder order, DType act_dtype, const Linear& lin, float* normed,
                             bool /*keep_normed*/, float* y, bool accumulate) const {
  rmsnorm(x, w, normed, rows, dim, eps, order, act_dtype);
  lin.forward(normed, rows, y, accumulate);
}

void Backend::split_qkv_rope(const kernels::Rope& rope, const float* qkv, int64_t n, int64_t Hq,
                             int64_t Hkv, const int64_t* pos, float* q, float* k, float* v) const {
  const int64_t D = rope.head_dim(), qw = Hq * D, kw = Hkv * D, width = qw + 2 * kw;
  copy_columns(qkv, n, width, 0, qw, q);
  copy_columns(qkv, n, width, qw, kw, k);
  copy_columns(qkv, n, width, qw + kw, kw, v);
  this->rope(rope, q, n, Hq, pos);
  this->rope(rope, k, n, Hkv, pos);
}

void Backend::moe_experts(const std::vector<Linear>& gate_up, const std::vector<Linear>& down,
                          const ExpertRouting& g, const float* x, int64_t H, int64_t I, float alpha,
                          float limit, float* h) const {
  const int64_t E = int64_t(g.offsets.size()) - 1;
  const int64_t* token = g.token.data<int64_t>();
  const float* weight = g.weight.data<float>();
  const int64_t max_rows = g.max_rows();
  if (max_rows == 0) return;
  Tensor xin = alloc({max_rows, H}, DType::F32), gu = alloc({max_rows, 2 * I}, DType::F32),
         act = alloc({max_rows, I}, DType::F32), y = alloc({max_rows, H}, DType::F32);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.offsets[e], rows = g.offsets[e + 1] - r0;
    if (rows == 0) continue;
    gather_rows(x, token + r0, rows, H, xin.data<float>());
    gate_up[e].forward(xin.data<float>(), rows, gu.data<float>());
    swiglu_oai(gu.data<float>(), rows, I, alpha, limit, act.data<float>());
    down[e].forward(act.data<float>(), rows, y.data<float>());
    scatter_add_rows(y.data<float>(), token + r0, weight + r0, rows, H, h);
  }
}

}  // namespace slope::ops
