// kiln/nn/loss.hpp — losses as autograd ops that return a scalar variable.
//
// cross_entropy fuses log-softmax and the negative log-likelihood: forward is ONE pass over the
// rows (it saves each row's log-sum-exp), backward ONE pass over the logits:
//   dlogits = (softmax - ((1 - eps) * onehot(label) + eps / C)) * g / B    (g / 1 for sum)
// mse_loss forward is ONE fused reduction of (pred - target)^2, backward ONE elementwise kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/reduce.hpp"

namespace kiln::nn {

struct CrossEntropyOptions {
  double label_smoothing = 0.0;  // eps in [0, 1]: the target is (1 - eps) * onehot + eps / C
  loss_reduction reduction = loss_reduction::mean;
};

namespace detail {

// cross_entropy's kernels, as functors so that they run on every executor.
// Row r: its log-sum-exp (saved for backward) and its loss
//   (1 - eps) * (lse - x_y) + eps * mean_c(lse - x_c);
// a label outside [0, C) (only possible on a device, where labels are not checked) gives NaN.
template <class T>
struct CrossEntropyRows {
  const T* x;
  const std::int32_t* labels;
  T* lse;
  T* per_row;
  index_t cols;
  T on, eps;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const T* xr = x + r * cols;
    T m = cols > 0 ? xr[0] : T(0), sx = 0;
    for (index_t c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    T se = 0;
    for (index_t c = 0; c < cols; ++c) {
      se += math::exp(xr[c] - m);
      sx += xr[c];
    }
    const T l = m + math::log(se);
    lse[r] = l;
    const std::int32_t y = labels[r];
    if (y < 0 || y >= cols) {
      per_row[r] = std::numeric_limits<T>::quiet_NaN();
      return;
    }
    per_row[r] = on * (l - xr[y]) + eps * (l - sx / T(cols));
  }
};

// out[0] = scale * (the rows' losses summed in row order): deterministic on every executor.
template <class T>
struct CrossEntropySum {
  const T* per_row;
  T* out;
  index_t rows;
  T scale;
  KILN_HOST_DEVICE void operator()(index_t, index_t) const {
    T total = 0;
    for (index_t r = 0; r < rows; ++r) total += per_row[r];
    out[0] = total * scale;
  }
};

template <class T>
struct CrossEntropyBackward {
  T* dx;
  const T* x;
  const T* lse;
  const std::int32_t* labels;
  const T* g;  // the loss's gradient (one element, in the executor's space)
  index_t cols;
  T scale, on, off;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const index_t i = r * cols + c;
    const T target = (c == labels[r] ? on : T(0)) + off;
    put_grad(dx[i], T(g[0] * scale * (math::exp(x[i] - lse[r]) - target)), add);
  }
};

// mse_loss's backward: v = 2 g scale (p - t) into dp, -v into dt (either may be null).
template <class T>
struct MseBackward {
  T* gp;
  T* gt;
  const T* p;
  const T* t;
  const T* g;  // the loss's gradient (one element, in the executor's space)
  T scale;
  bool add_p, add_t;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    const T v = T(2) * g[0] * scale * (p[i] - t[i]);
    if (gp) put_grad(gp[i], v, add_p);
    if (gt) put_grad(gt[i], T(-v), add_t);
  }
};

template <class I>
struct CopyLabels {
  const I* src;
  I* dst;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const { dst[r] = src[r]; }
};

}  // namespace detail

// Cross-entropy of logits [B, C] against integer class labels (B of them, each in [0, C)).
// Forward is ONE row kernel (exec.for_each_element(B, 1, ...)); the rows' mean or sum is taken
// in row order, inline on the host and as one single-thread kernel on a device.
// requires: labels points at B integers in the executor's space: host memory for the
//   CpuExecutor (copied and checked here; the pointer may die afterwards), DEVICE memory for
//   the CudaExecutor (copied by a kernel on the executor's stream, so it must stay valid until
//   that stream reaches the copy; not checked on the host: a label outside [0, C) makes its
//   row's loss, and so the loss, NaN).
// throws: ValueError naming the first row whose label is outside [0, C) (host), or a bad
//   smoothing.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<T, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits, const std::int32_t* labels,
                            CrossEntropyOptions options = {}) {
  const index_t rows = logits.dim(0), cols = logits.dim(1);
  const double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0.0 && eps <= 1.0, ValueError, "cross_entropy: label_smoothing must be in [0, 1], got ", eps);
  KILN_CHECK(rows == 0 || labels != nullptr, ValueError, "cross_entropy: labels is null for ", rows, " rows");
  using Labels = Tensor<std::int32_t, S, dyn>;
  auto saved_labels = std::make_shared<Labels>(Shape{rows});
  if constexpr (std::is_same_v<S, host>) {
    std::int32_t* dst = saved_labels->data();
    for (index_t r = 0; r < rows; ++r) {
      const std::int32_t y = labels[r];
      KILN_CHECK(y >= 0 && y < cols, ValueError, "cross_entropy: the label of row ", r, " is ", y,
                 ", outside [0, ", cols, ") for logits of shape ", logits.shape().str());
      dst[r] = y;
    }
  } else {
    tape.exec().for_each_element(rows, 1, detail::CopyLabels<std::int32_t>{labels, saved_labels->data()}, kind::copy,
                                 "cross_entropy_labels", std::size_t(rows) * sizeof(std::int32_t) * 2);
  }
  const bool mean = options.reduction == loss_reduction::mean;
  const T scale = mean ? T(1) / T(rows > 0 ? rows : 1) : T(1);
  const T on = T(1.0 - eps), off = T(eps / double(cols > 0 ? cols : 1));
  // [0, rows): each row's log-sum-exp (kept for backward); [rows, 2 rows): each row's loss.
  auto lse = std::make_shared<Tensor<T, S, dyn>>(Shape{2 * rows});
  T* LSE = lse->data();
  const std::size_t bytes = std::size_t(rows * cols) * sizeof(T);
  tape.exec().for_each_element(
      rows, 1, detail::CrossEntropyRows<T>{logits.value().data(), saved_labels->data(), LSE, LSE + rows, cols, on, T(eps)},
      kind::loss, "cross_entropy", bytes);
  ag::Var<T, S> out(Tensor<T, S>{});
  const detail::CrossEntropySum<T> total{LSE + rows, out.value().data(), rows, scale};
  if constexpr (std::is_same_v<S, host>) total(0, 0);
  else tape.exec().for_each_element(1, 1, total, kind::loss, "cross_entropy_sum", std::size_t(rows) * sizeof(T));
  if (!logits.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {logits.data()},
              [xd = logits.data(), saved_labels, lse, rows, cols, scale, on, off, bytes](Exec& exec, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dx = xd->ensure_grad();
    exec.for_each_element(rows, cols,
                          detail::CrossEntropyBackward<T>{dx, xd->value.data(), lse->data(), saved_labels->data(),
                                                          od.grad.data(), cols, scale, on, off, add},
                          kind::loss, "cross_entropy_backward", bytes * 2);
    xd->grad_valid = true;
  });
  return out;
}

// Labels in a tensor of B integers (any rank, row-major) in the logits' space.
template <class Exec, class T, class S, index_t B, index_t C, class LS, index_t... LD>
ag::Var<T, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                            const Tensor<std::int32_t, LS, LD...>& labels, CrossEntropyOptions options = {}) {
  static_assert(std::is_same_v<LS, S>, "kiln::nn::cross_entropy: the labels must be in the logits' memory space");
  KILN_CHECK(labels.size() == logits.dim(0), ShapeError, "cross_entropy: ", labels.size(),
             " labels for logits of shape ", logits.shape().str(), "; need one label per row");
  return cross_entropy(tape, logits, labels.data(), options);
}

// Labels as a span of B integers in the executor's space — a data::Batch's `labels`, a
// std::vector (host), or a device span on CUDA. The span's size is checked against the rows.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<T, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                            std::span<const std::int32_t> labels, CrossEntropyOptions options = {}) {
  KILN_CHECK(index_t(labels.size()) == logits.dim(0), ShapeError, "cross_entropy: ", labels.size(),
             " labels for logits of shape ", logits.shape().str(), "; need one label per row");
  return cross_entropy(tape, logits, labels.data(), options);
}

// Mean (or sum) of (pred - target)^2 over all elements; target may require a gradient too.
template <class Exec, class T, class S, index_t... D, index_t... E>
ag::Var<T, S> mse_loss(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& pred, const ag::Var<T, S, E...>& target,
                       loss_reduction reduction = loss_reduction::mean) {
  KILN_CHECK(pred.shape() == target.shape(), ShapeError, "mse_loss: pred has shape ", pred.shape().str(),
             " but target has shape ", target.shape().str());
  const index_t n = pred.value().size();
  const bool mean = reduction == loss_reduction::mean;
  const T scale = mean ? T(1) / T(n > 0 ? n : 1) : T(1);
  using Flat = View<const T, S, extents<dyn>>;
  const Flat p(pred.value().data(), Shape{n}), t(target.value().data(), Shape{n});
  ag::Var<T, S> out(Tensor<T, S>{});
  // One pairwise reduction with the square fused in (kind reduce, deterministic).
  if (mean) assign(out.value(), kiln::mean(square(p - t)), tape.exec());
  else assign(out.value(), kiln::sum(square(p - t)), tape.exec());
  if (!(pred.requires_grad() || target.requires_grad()) || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {pred.data(), target.data()}, [pd = pred.data(), td = target.data(), n, scale](Exec& exec, auto& od) {
    if (!od.grad_valid) return;
    const bool dp = pd->requires_grad, dt = td->requires_grad;
    if (!dp && !dt) return;
    const bool add_p = pd->grad_valid, add_t = td->grad_valid;
    T* gp = dp ? pd->ensure_grad() : nullptr;
    T* gt = dt ? td->ensure_grad() : nullptr;
    exec.for_each_element(
        1, n, detail::MseBackward<T>{gp, gt, pd->value.data(), td->value.data(), od.grad.data(), scale, add_p, add_t},
        kind::loss, "mse_loss_backward", std::size_t(n) * sizeof(T) * 3);
    if (dp) pd->grad_valid = true;
    if (dt) td->grad_valid = true;
  });
  return out;
}

}  // namespace kiln::nn
