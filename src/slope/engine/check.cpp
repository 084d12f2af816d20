// The comparison behind `slope run --check` (check.h).
#include "slope/engine/check.h"

#include <algorithm>
#include <cmath>

#include "slope/core/error.h"
#include "slope/engine/distributed.h"

namespace slope::engine {
namespace {

// Rows of a [rows, ...] tensor whose largest error, relative to the reference's largest
// element (relative_error's norm), is past tol; `worst` gets the largest such error.
int64_t rows_past(const Tensor& got, const Tensor& ref, double tol, double& worst) {
  SLOPE_CHECK(got.shape() == ref.shape() && got.dtype() == DType::F32 && ref.dtype() == DType::F32,
              "--check: a layer's K/V of the mesh and of one rank differ in shape or type");
  const int64_t n = ref.numel(), rows = ref.shape().empty() ? 0 : ref.shape()[0], per = rows > 0 ? n / rows : 0;
  const float *a = got.data<float>(), *b = ref.data<float>();
  double den = 0;
  for (int64_t i = 0; i < n; ++i) den = std::max(den, std::fabs(double(b[i])));
  int64_t over = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0;
    for (int64_t i = r * per; i < (r + 1) * per; ++i) num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    const double e = den > 0 ? num / den : num;
    worst = std::max(worst, e);
    over += e > tol;
  }
  return over;
}

}  // namespace

CheckTolerance check_tolerance(kernels::ComputeType ct) {
  return ct == kernels::ComputeType::BF16 ? CheckTolerance{3e-2, 1.5e-1, 0.01} : CheckTolerance{1e-4, 1e-4, 0.0};
}

CheckResult compare_with_one_rank(const std::vector<float>& logits, int32_t first_token,
                                  const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                                  const std::vector<float>& one_logits, int32_t one_first_token,
                                  const std::vector<Tensor>& one_k, const std::vector<Tensor>& one_v,
                                  CheckTolerance tol) {
  SLOPE_CHECK(logits.size() == one_logits.size() && k.size() >= one_k.size() && v.size() >= one_v.size() &&
                  one_k.size() == one_v.size(),
              "--check: the mesh and one rank returned different numbers of logits or layers");
  CheckResult c;
  c.logits_rel_err = relative_error(logits.data(), one_logits.data(), int64_t(one_logits.size()));
  const int64_t rows = one_k.empty() || one_k[0].shape().empty() ? 0 : one_k[0].shape()[0];
  c.kv_rows_allowed =
      tol.kv_rows_fraction > 0 ? std::max<int64_t>(1, int64_t(tol.kv_rows_fraction * double(rows))) : 0;
  for (size_t l = 0; l < one_k.size(); ++l) {
    c.kv_rows_over = std::max(c.kv_rows_over, rows_past(k[l], one_k[l], tol.kv, c.kv_rel_err));
    c.kv_rows_over = std::max(c.kv_rows_over, rows_past(v[l], one_v[l], tol.kv, c.kv_rel_err));
  }
  c.same_first_token = first_token == one_first_token;
  c.pass = c.same_first_token && c.logits_rel_err <= tol.logits && c.kv_rows_over <= c.kv_rows_allowed;
  return c;
}

}  // namespace slope::engine
