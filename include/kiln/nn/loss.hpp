// kiln/nn/loss.hpp — losses as autograd ops that return a scalar variable.
//
// cross_entropy fuses log-softmax and the negative log-likelihood: forward is ONE pass over the
// rows (it saves each row's log-sum-exp), backward ONE pass over the logits:
//   dlogits = (softmax - ((1 - eps) * onehot(label) + eps / C)) * g / B    (g / 1 for sum)
// mse_loss forward is ONE fused reduction of (pred - target)^2, backward ONE elementwise kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/reduce.hpp"

namespace kiln::nn {

struct CrossEntropyOptions {
  double label_smoothing = 0.0;  // eps in [0, 1]: the target is (1 - eps) * onehot + eps / C
  loss_reduction reduction = loss_reduction::mean;
};

// Cross-entropy of logits [B, C] against integer class labels (B of them, each in [0, C)).
// requires: labels points at B host integers (they are copied; the pointer may die afterwards).
// throws: ValueError naming the first row whose label is outside [0, C), or a bad smoothing.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<T, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits, const std::int32_t* labels,
                            CrossEntropyOptions options = {}) {
  const index_t rows = logits.dim(0), cols = logits.dim(1);
  const double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0.0 && eps <= 1.0, ValueError, "cross_entropy: label_smoothing must be in [0, 1], got ", eps);
  KILN_CHECK(rows == 0 || labels != nullptr, ValueError, "cross_entropy: labels is null for ", rows, " rows");
  auto saved_labels = std::make_shared<std::vector<std::int32_t>>(labels, labels + rows);
  for (index_t r = 0; r < rows; ++r) {
    const std::int32_t y = (*saved_labels)[std::size_t(r)];
    KILN_CHECK(y >= 0 && y < cols, ValueError, "cross_entropy: the label of row ", r, " is ", y,
               ", outside [0, ", cols, ") for logits of shape ", logits.shape().str());
  }
  const bool mean = options.reduction == loss_reduction::mean;
  const T scale = mean ? T(1) / T(rows > 0 ? rows : 1) : T(1);
  const T on = T(1.0 - eps), off = T(eps / double(cols > 0 ? cols : 1));
  auto lse = std::make_shared<std::vector<T>>(std::size_t(rows));
  std::vector<T> per_row(std::size_t(rows), T(0));
  const T* X = logits.value().data();
  const std::int32_t* L = saved_labels->data();
  T* LSE = lse->data();
  T* PR = per_row.data();
  const std::size_t bytes = std::size_t(rows * cols) * sizeof(T);
  detail::for_each_row(tape.exec(), rows, cols, kind::loss, "cross_entropy", bytes, [=](index_t r) {
    const T* xr = X + r * cols;
    T m = cols > 0 ? xr[0] : T(0), sx = 0;
    for (index_t c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    T se = 0;
    for (index_t c = 0; c < cols; ++c) {
      se += std::exp(xr[c] - m);
      sx += xr[c];
    }
    const T l = m + std::log(se);
    LSE[r] = l;
    // (1 - eps) * (lse - x_y) + eps * mean_c(lse - x_c)
    PR[r] = on * (l - xr[L[r]]) + T(eps) * (l - sx / T(cols));
  });
  // The rows' sum in row order: deterministic whatever the thread count.
  ag::Var<T, S> out(Tensor<T, S>{});
  T total = 0;
  for (T v : per_row) total += v;
  out.value().data()[0] = total * scale;
  if (!logits.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record([xd = logits.data(), od = out.data(), saved_labels, lse, rows, cols, scale, on, off,
               bytes](Exec& exec) {
    if (!od->grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dx = xd->ensure_grad();
    const T* X = xd->value.data();
    const T* LSE = lse->data();
    const std::int32_t* L = saved_labels->data();
    const T g = od->grad.data()[0] * scale;
    exec.for_each_element(
        rows, cols,
        [=](index_t r, index_t c) {
          const index_t i = r * cols + c;
          const T target = (c == L[r] ? on : T(0)) + off;
          detail::put_grad(dx[i], T(g * (std::exp(X[i] - LSE[r]) - target)), add);
        },
        kind::loss, "cross_entropy_backward", bytes * 2);
    xd->grad_valid = true;
  });
  return out;
}

// Labels in a host tensor of B integers (any rank, row-major).
template <class Exec, class T, class S, index_t B, index_t C, index_t... LD>
ag::Var<T, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                            const Tensor<std::int32_t, host, LD...>& labels, CrossEntropyOptions options = {}) {
  KILN_CHECK(labels.size() == logits.dim(0), ShapeError, "cross_entropy: ", labels.size(),
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
  tape.record([pd = pred.data(), td = target.data(), od = out.data(), n, scale](Exec& exec) {
    if (!od->grad_valid) return;
    const bool dp = pd->requires_grad, dt = td->requires_grad;
    if (!dp && !dt) return;
    const bool add_p = pd->grad_valid, add_t = td->grad_valid;
    T* gp = dp ? pd->ensure_grad() : nullptr;
    T* gt = dt ? td->ensure_grad() : nullptr;
    const T* P = pd->value.data();
    const T* Q = td->value.data();
    const T g2 = T(2) * od->grad.data()[0] * scale;
    exec.for_each_element(
        1, n,
        [=](index_t, index_t i) {
          const T v = g2 * (P[i] - Q[i]);
          if (gp) detail::put_grad(gp[i], v, add_p);
          if (gt) detail::put_grad(gt[i], T(-v), add_t);
        },
        kind::loss, "mse_loss_backward", std::size_t(n) * sizeof(T) * 3);
    if (dp) pd->grad_valid = true;
    if (dt) td->grad_valid = true;
  });
  return out;
}

}  // namespace kiln::nn
