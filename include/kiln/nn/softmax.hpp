// kiln/nn/softmax.hpp — softmax and log-softmax over the last axis, as autograd ops.
//
// Each row is one unit of work: forward is ONE kernel (max, sum of exponentials, outputs per
// row, numerically stable by subtracting the row's max) and backward is ONE kernel that needs
// only the saved output:
//   log_softmax: dx = g - softmax * sum(g)          softmax: dx = y * (g - sum(g * y))
#pragma once

#include <cmath>

#include "kiln/nn/module.hpp"

namespace kiln::nn {

namespace detail {
template <bool Log, class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> softmax_op(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  using V = ag::Var<T, S, D...>;
  const Shape s = x.shape();
  const index_t rows = s.rows(), cols = s.cols();
  V out{typename V::tensor_type(s)};
  const T* X = x.value().data();
  T* Y = out.value().data();
  const std::size_t bytes = std::size_t(s.size()) * sizeof(T) * 2;
  for_each_row(tape.exec(), rows, cols, kind::norm, Log ? "log_softmax" : "softmax", bytes, [=](index_t r) {
    const T* xr = X + r * cols;
    T* yr = Y + r * cols;
    T m = cols > 0 ? xr[0] : T(0);
    for (index_t c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    T sum = 0;
    for (index_t c = 0; c < cols; ++c) sum += std::exp(xr[c] - m);
    if constexpr (Log) {
      const T lse = m + std::log(sum);
      for (index_t c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
    } else {
      const T inv = T(1) / sum;
      for (index_t c = 0; c < cols; ++c) yr[c] = std::exp(xr[c] - m) * inv;
    }
  });
  if (!x.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record([xd = x.data(), od = out.data(), rows, cols, bytes](Exec& exec) {
    if (!od->grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dx = xd->ensure_grad();
    const T* g = od->grad.data();
    const T* y = od->value.data();
    for_each_row(exec, rows, cols, kind::norm, Log ? "log_softmax_backward" : "softmax_backward", bytes * 2,
                 [=](index_t r) {
                   const T* gr = g + r * cols;
                   const T* yr = y + r * cols;
                   T* dr = dx + r * cols;
                   T dot = 0;
                   if constexpr (Log) {
                     for (index_t c = 0; c < cols; ++c) dot += gr[c];
                     for (index_t c = 0; c < cols; ++c) put_grad(dr[c], T(gr[c] - std::exp(yr[c]) * dot), add);
                   } else {
                     for (index_t c = 0; c < cols; ++c) dot += gr[c] * yr[c];
                     for (index_t c = 0; c < cols; ++c) put_grad(dr[c], T(yr[c] * (gr[c] - dot)), add);
                   }
                 });
    xd->grad_valid = true;
  });
  return out;
}
}  // namespace detail

// log(softmax(x)) over the last axis; the result has x's type and shape.
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> log_softmax(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return detail::softmax_op<true>(tape, x);
}

// exp(x - max) / sum(exp(x - max)) over the last axis; the result has x's type and shape.
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> softmax(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return detail::softmax_op<false>(tape, x);
}

}  // namespace kiln::nn
