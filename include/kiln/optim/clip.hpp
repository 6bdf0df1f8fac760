// kiln/optim/clip.hpp — gradient norm and clipping over a whole ParamTable, as
// torch.nn.utils.clip_grad_norm_.
//
// The norm treats all gradients as one vector (the norm of the per-tensor norms, which is the
// same thing). It is one fused reduction: fixed blocks of the flat index space, each summed
// pairwise in double, then merged in a fixed tree, so the result does not depend on the thread
// count. Clipping then scales every gradient in one more pass, and only when it changes them.
// Parameters without a gradient (ParamSlot::has_grad false) are left out of both, as
// clip_grad_norm_ filters out .grad None: their stale buffers neither count nor get scaled.
//
//   const double norm = kiln::optim::clip_grad_norm(table, 1.0, exec);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::optim {

namespace detail {

// Pairwise sum of f(x[i]) over [0, n) in double: eight lanes at the leaves so the loop
// vectorises, rounding error growing like log(n).
template <class F>
double pairwise_sum(const float* x, index_t n, F f) {
  if (n <= 256) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    index_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) lane[j] += f(double(x[i + j]));
    for (; i < n; ++i) lane[0] += f(double(x[i]));
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  const index_t mid = (n / 2 + 7) / 8 * 8;
  return pairwise_sum(x, mid, f) + pairwise_sum(x + mid, n - mid, f);
}

// Largest |x[i]|; NaN wins, as torch's max does. Branch-free (NaN tracked on the side) so the
// loop vectorises; |x| and the max are exact in float.
inline double max_abs(const float* x, index_t n) {
  float m = 0.0f;
  bool nan = false;
  for (index_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;
    nan = nan || a != a;
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : double(m);
}

inline double merge_tree(const std::vector<double>& p, std::size_t b, std::size_t e, bool is_max) {
  if (e - b == 1) return p[b];
  const std::size_t mid = b + (e - b) / 2;
  const double l = merge_tree(p, b, mid, is_max), r = merge_tree(p, mid, e, is_max);
  if (!is_max) return l + r;
  return std::isnan(l) || l > r ? l : r;
}

inline void check_norm_type(double norm_type, const char* fn) {
  KILN_CHECK(norm_type > 0.0, ValueError, fn, ": norm_type must be > 0 (or infinity), got ", norm_type);
}

}  // namespace detail

// The norm_type-norm of all gradients in the table (of the parameters that have one), as one
// reduction launch; 0 when none has.
// requires: norm_type > 0; std::numeric_limits<double>::infinity() gives the max-abs norm.
inline double grad_norm(const ParamTable& table, CpuExecutor& exec, double norm_type = 2.0) {
  detail::check_norm_type(norm_type, "grad_norm");
  const index_t n = table.total_size();
  const index_t work = size_with_gradient(table);
  exec.stats().count(kind::reduce, "grad_norm", work, std::size_t(work) * sizeof(float));
  if (work == 0) return 0.0;
  const bool is_max = std::isinf(norm_type);
  const index_t block = CpuExecutor::reduce_block;
  const index_t blocks = (n + block - 1) / block;
  std::vector<double> partial(std::size_t(blocks), 0.0);
  exec.parallel_for(blocks, std::max<index_t>(1, CpuExecutor::grain / block), [&](index_t bb, index_t be) {
    for (index_t k = bb; k < be; ++k) {
      double acc = 0.0;
      table.for_each_span(k * block, std::min(n, (k + 1) * block),
                          [&](const ParamSlot& s, index_t lb, index_t le, index_t) {
                            if (!s.has_gradient()) return;
                            const float* g = s.grad + lb;
                            const index_t len = le - lb;
                            if (is_max) {
                              const double m = detail::max_abs(g, len);
                              acc = std::isnan(acc) || acc > m ? acc : m;
                            } else if (norm_type == 2.0) {
                              acc += detail::pairwise_sum(g, len, [](double x) { return x * x; });
                            } else if (norm_type == 1.0) {
                              acc += detail::pairwise_sum(g, len, [](double x) { return std::fabs(x); });
                            } else {
                              acc += detail::pairwise_sum(g, len, [&](double x) { return std::pow(std::fabs(x), norm_type); });
                            }
                          });
      partial[std::size_t(k)] = acc;
    }
  });
  const double total = detail::merge_tree(partial, 0, partial.size(), is_max);
  if (is_max) return total;
  if (norm_type == 2.0) return std::sqrt(total);
  if (norm_type == 1.0) return total;
  return std::pow(total, 1.0 / norm_type);
}

// Scales all gradients so their norm is at most max_norm, as torch.nn.utils.clip_grad_norm_:
// coef = max_norm / (norm + 1e-6); grads *= coef when coef < 1. Returns the norm before clipping.
// Launches: one reduction, plus one elementwise pass when it clips.
// requires: max_norm >= 0 (infinity never clips); norm_type > 0 or infinity.
// error_if_nonfinite: throw NumericError when the norm is NaN or infinite (the grads untouched).
inline double clip_grad_norm(const ParamTable& table, double max_norm, CpuExecutor& exec, double norm_type = 2.0,
                             bool error_if_nonfinite = false) {
  KILN_CHECK(max_norm >= 0.0, ValueError, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  detail::check_norm_type(norm_type, "clip_grad_norm");
  const double norm = grad_norm(table, exec, norm_type);
  KILN_CHECK(!error_if_nonfinite || std::isfinite(norm), NumericError, "clip_grad_norm: the total ", norm_type,
             "-norm of the gradients is ", norm, "; they hold NaN or infinity");
  // Like torch, a NaN norm gives a NaN coefficient and NaN gradients: the failure stays visible.
  const double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0) && !std::isnan(coef)) return norm;
  const float c = float(coef);
  const index_t n = table.total_size();
  const index_t work = size_with_gradient(table);
  exec.stats().count(kind::elementwise, "clip_grad_norm", work, std::size_t(work) * sizeof(float) * 2);
  exec.parallel_for(n, CpuExecutor::grain, [&](index_t b, index_t e) {
    table.for_each_span(b, e, [&](const ParamSlot& s, index_t lb, index_t le, index_t) {
      if (!s.has_gradient()) return;
      float* KILN_RESTRICT g = s.grad;
      for (index_t i = lb; i < le; ++i) g[i] = g[i] * c;
    });
  });
  return norm;
}

}  // namespace kiln::optim
