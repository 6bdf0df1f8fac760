// kiln/nn/softmax.hpp — softmax and log-softmax over the last axis, as autograd ops.
//
// Each row is one unit of work: forward is ONE kernel (max, sum of exponentials, outputs per
// row, numerically stable by subtracting the row's max) and backward is ONE kernel that needs
// only the saved output:
//   log_softmax: dx = g - softmax * sum(g)          softmax: dx = y * (g - sum(g * y))
// The kernels are functors, so they run on every executor: one work item per row on the CPU,
// and on CUDA `row(team, r)`, a warp or a block per row with coalesced loads and tree reductions
// (kiln/backend/cuda/rowwise.cuh; launch_lines picks it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <type_traits>

#include "kiln/expr/math.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

namespace detail {

// The row's largest element (0 for an empty row), as a left-to-right scan finds it (up to the
// sign of a zero, which no result sees). Four running maxima: independent chains that GCC
// keeps in registers; with one chain it kept the maximum in memory (softmax ~40% slower).
template <class T>
KILN_HOST_DEVICE T row_max(const T* xr, index_t cols) {
  if (cols <= 0) return T(0);
  T m[4] = {xr[0], xr[0], xr[0], xr[0]};
  index_t c = 1;
  for (; c + 4 <= cols; c += 4)
    for (int k = 0; k < 4; ++k) m[k] = xr[c + k] > m[k] ? xr[c + k] : m[k];
  for (; c < cols; ++c) m[0] = xr[c] > m[0] ? xr[c] : m[0];
  const T a = m[1] > m[0] ? m[1] : m[0], b = m[3] > m[2] ? m[3] : m[2];
  return b > a ? b : a;
}

// x in T (bf16 / f16 under mixed precision); y, and all arithmetic, in C = compute_t<T>.
template <bool Log, class T>
struct SoftmaxRows {
  using C = compute_t<T>;
  const T* x;
  C* y;
  index_t cols;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const T* xr = x + r * cols;
    C* yr = y + r * cols;
    C m;
    if constexpr (std::is_same_v<T, C>) {
      m = row_max(xr, cols);
    } else {
      m = cols > 0 ? convert<C>(xr[0]) : C(0);
      for (index_t c = 1; c < cols; ++c) m = convert<C>(xr[c]) > m ? convert<C>(xr[c]) : m;
    }
    C sum = 0;
    for (index_t c = 0; c < cols; ++c) sum += math::exp(convert<C>(xr[c]) - m);
    if constexpr (Log) {
      const C lse = m + math::log(sum);
      for (index_t c = 0; c < cols; ++c) yr[c] = convert<C>(xr[c]) - lse;
    } else {
      const C inv = C(1) / sum;
      for (index_t c = 0; c < cols; ++c) yr[c] = math::exp(convert<C>(xr[c]) - m) * inv;
    }
  }
  // The same row on a team of threads: member t.rank() takes elements rank, rank + size, ...
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const T* xr = x + r * cols;
    C* yr = y + r * cols;
    C m = -std::numeric_limits<C>::infinity();
    for (index_t c = t.rank(); c < cols; c += t.size()) m = convert<C>(xr[c]) > m ? convert<C>(xr[c]) : m;
    m = t.max(m);
    C sum = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) sum += math::exp(convert<C>(xr[c]) - m);
    sum = t.sum(sum);
    if constexpr (Log) {
      const C lse = m + math::log(sum);
      for (index_t c = t.rank(); c < cols; c += t.size()) yr[c] = convert<C>(xr[c]) - lse;
    } else {
      const C inv = C(1) / sum;
      for (index_t c = t.rank(); c < cols; c += t.size()) yr[c] = math::exp(convert<C>(xr[c]) - m) * inv;
    }
  }
};

template <bool Log, class T>
struct SoftmaxBackwardRows {
  using C = compute_t<T>;
  T* dx;
  const C* g;
  const C* y;
  index_t cols;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const C* gr = g + r * cols;
    const C* yr = y + r * cols;
    T* dr = dx + r * cols;
    C dot = 0;
    if constexpr (Log) {
      for (index_t c = 0; c < cols; ++c) dot += gr[c];
      for (index_t c = 0; c < cols; ++c) put_grad(dr[c], C(gr[c] - math::exp(yr[c]) * dot), add);
    } else {
      for (index_t c = 0; c < cols; ++c) dot += gr[c] * yr[c];
      for (index_t c = 0; c < cols; ++c) put_grad(dr[c], C(yr[c] * (gr[c] - dot)), add);
    }
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const C* gr = g + r * cols;
    const C* yr = y + r * cols;
    T* dr = dx + r * cols;
    C dot = 0;
    if constexpr (Log) {
      for (index_t c = t.rank(); c < cols; c += t.size()) dot += gr[c];
      dot = t.sum(dot);
      for (index_t c = t.rank(); c < cols; c += t.size()) put_grad(dr[c], C(gr[c] - math::exp(yr[c]) * dot), add);
    } else {
      for (index_t c = t.rank(); c < cols; c += t.size()) dot += gr[c] * yr[c];
      dot = t.sum(dot);
      for (index_t c = t.rank(); c < cols; c += t.size()) put_grad(dr[c], C(yr[c] * (gr[c] - dot)), add);
    }
  }
};

// The host instances kiln::kernels compiles once (KILN_CPU_LINES in nn/module.hpp).
#define KILN_SOFTMAX_KERNELS(EXTERN, T)                   \
  KILN_CPU_LINES(EXTERN, false, SoftmaxRows<true, T>)     \
  KILN_CPU_LINES(EXTERN, false, SoftmaxRows<false, T>)    \
  KILN_CPU_LINES(EXTERN, false, SoftmaxBackwardRows<true, T>) \
  KILN_CPU_LINES(EXTERN, false, SoftmaxBackwardRows<false, T>)
#if KILN_EXTERN_KERNELS
KILN_SOFTMAX_KERNELS(extern, float)
KILN_SOFTMAX_KERNELS(extern, double)
KILN_SOFTMAX_KERNELS(extern, bf16)  // mixed precision: half inputs, float outputs
KILN_SOFTMAX_KERNELS(extern, f16)
#endif

// softmax_op's body on x's node, its shape at run time: the rows into out_values (x's shape, in
// compute_t<T>) and the backward recorded on `out` (the result's node). Compiled once per
// executor, element type and Log, whatever the sizes (for the CPU in kiln::kernels).
template <bool Log, class Exec, class T>
void softmax_into(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x, const T* x_values, const Shape& s,
                  compute_t<T>* out_values, ag::VarNode& out) {
  const index_t rows = s.rows(), cols = s.cols();
  const std::size_t bytes = std::size_t(s.size()) * sizeof(T) * 2;
  launch_lines<false>(tape.exec(), rows, cols, SoftmaxRows<Log, T>{x_values, out_values, cols},
                      Log ? "log_softmax" : "softmax", bytes);
  if (!x->requires_grad || !tape.recording()) return;
  out.requires_grad = true;
  ag::VarNode* od = &out;  // raw: the step is owned by out, so out outlives it
  tape.record_node(out, {x}, [x, od, rows, cols, bytes](Exec& exec) {
    if (!od->grad_valid || !x->requires_grad) return;
    const bool add = x->grad_valid;
    T* dx = static_cast<T*>(x->ensure_grad_data());
    launch_lines<false>(exec, rows, cols,
                        SoftmaxBackwardRows<Log, T>{dx, static_cast<const compute_t<T>*>(od->grad_data()),
                                                    static_cast<const compute_t<T>*>(od->value_data()), cols, add},
                        Log ? "log_softmax_backward" : "softmax_backward", bytes * 2);
    x->grad_valid = true;
  });
}
#define KILN_CPU_SOFTMAX(EXTERN, T)                                                                          \
  EXTERN template void softmax_into<true, ::kiln::CpuExecutor, T>(                                          \
      ag::Tape<::kiln::CpuExecutor>&, const std::shared_ptr<ag::VarNode>&, const T*, const Shape&, compute_t<T>*, \
      ag::VarNode&);                                                                                         \
  EXTERN template void softmax_into<false, ::kiln::CpuExecutor, T>(                                         \
      ag::Tape<::kiln::CpuExecutor>&, const std::shared_ptr<ag::VarNode>&, const T*, const Shape&, compute_t<T>*, \
      ag::VarNode&);
#if KILN_EXTERN_KERNELS
KILN_CPU_SOFTMAX(extern, float)
KILN_CPU_SOFTMAX(extern, double)
KILN_CPU_SOFTMAX(extern, bf16)
KILN_CPU_SOFTMAX(extern, f16)
#endif

template <bool Log, class Exec, class T, class S, index_t... D>
ag::Var<compute_t<T>, S, D...> softmax_op(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  using V = ag::Var<compute_t<T>, S, D...>;
  V out{typename V::tensor_type(x.shape())};
  softmax_into<Log, Exec, T>(tape, x.data(), x.value().data(), x.shape(), out.value().data(), *out.data());
  return out;
}
}  // namespace detail

// log(softmax(x)) over the last axis; the result has x's shape and x's type (float for a bf16 /
// f16 x: softmax runs in float under mixed precision, as PyTorch's autocast runs it).
template <class Exec, class T, class S, index_t... D>
ag::Var<compute_t<T>, S, D...> log_softmax(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return detail::softmax_op<true>(tape, x);
}

// exp(x - max) / sum(exp(x - max)) over the last axis; shape and type as log_softmax.
template <class Exec, class T, class S, index_t... D>
ag::Var<compute_t<T>, S, D...> softmax(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return detail::softmax_op<false>(tape, x);
}

}  // namespace kiln::nn
