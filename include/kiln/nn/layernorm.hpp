// kiln/nn/layernorm.hpp — layer normalisation over the last axis, as an autograd op and a layer.
//
// Forward is ONE kernel over rows (two-pass mean and biased variance, then
// y = (x - mean) * rstd * weight + bias) that saves mean and rstd per row. Backward is ONE
// kernel over rows for dx,
//   xhat = (x - mean) * rstd,  gw = g * weight,
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
// and ONE kernel over columns for dweight = sum_rows(g * xhat) and dbias = sum_rows(g).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

// x [..., N] normalised per row, scaled by weight [N] and shifted by bias [N] (any ranks whose
// sizes are N). Gradients flow to each of x, weight and bias that requires one.
template <class Exec, class T, class S, index_t... D, index_t... W, index_t... Bd>
ag::Var<T, S, D...> layer_norm(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, const ag::Var<T, S, W...>& weight,
                               const ag::Var<T, S, Bd...>& bias, double eps = 1e-5) {
  using V = ag::Var<T, S, D...>;
  const Shape s = x.shape();
  const index_t rows = s.rows(), cols = s.cols();
  KILN_CHECK(weight.value().size() == cols && bias.value().size() == cols, ShapeError, "layer_norm: x has shape ",
             s.str(), ", so weight and bias need ", cols, " elements; got weight ", weight.shape().str(), " and bias ",
             bias.shape().str());
  KILN_CHECK(eps > 0.0, ValueError, "layer_norm: eps must be > 0, got ", eps);
  V out{typename V::tensor_type(s)};
  auto stats = std::make_shared<std::vector<T>>(std::size_t(2 * rows));  // mean[rows], rstd[rows]
  const T* X = x.value().data();
  const T* Wt = weight.value().data();
  const T* Bs = bias.value().data();
  T* Y = out.value().data();
  T* M = stats->data();
  T* R = M + rows;
  const T e = T(eps);
  const std::size_t bytes = std::size_t(s.size()) * sizeof(T) * 2;
  detail::for_each_row(tape.exec(), rows, cols, kind::norm, "layer_norm", bytes, [=](index_t r) {
    const T* xr = X + r * cols;
    T sum = 0;
    for (index_t c = 0; c < cols; ++c) sum += xr[c];
    const T mean = sum / T(cols);
    T var = 0;
    for (index_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const T rstd = T(1) / std::sqrt(var / T(cols) + e);
    M[r] = mean;
    R[r] = rstd;
    T* yr = Y + r * cols;
    for (index_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mean) * rstd * Wt[c] + Bs[c];
  });
  const bool any = x.requires_grad() || weight.requires_grad() || bias.requires_grad();
  if (!any || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record([xd = x.data(), wd = weight.data(), bd = bias.data(), od = out.data(), stats, rows, cols,
               bytes](Exec& exec) {
    if (!od->grad_valid) return;
    const T* X = xd->value.data();
    const T* Wt = wd->value.data();
    const T* G = od->grad.data();
    const T* M = stats->data();
    const T* R = M + rows;
    if (xd->requires_grad) {
      const bool add = xd->grad_valid;
      T* dx = xd->ensure_grad();
      detail::for_each_row(exec, rows, cols, kind::norm, "layer_norm_backward", bytes * 2, [=](index_t r) {
        const T* xr = X + r * cols;
        const T* gr = G + r * cols;
        const T mean = M[r], rstd = R[r];
        T a = 0, b = 0;
        for (index_t c = 0; c < cols; ++c) {
          const T gw = gr[c] * Wt[c];
          a += gw;
          b += gw * (xr[c] - mean) * rstd;
        }
        a /= T(cols);
        b /= T(cols);
        T* dr = dx + r * cols;
        for (index_t c = 0; c < cols; ++c) {
          const T xhat = (xr[c] - mean) * rstd;
          detail::put_grad(dr[c], T(rstd * (gr[c] * Wt[c] - a - xhat * b)), add);
        }
      });
      xd->grad_valid = true;
    }
    const bool dw = wd->requires_grad, db = bd->requires_grad;
    if (dw || db) {
      const bool add_w = wd->grad_valid, add_b = bd->grad_valid;
      T* gw = dw ? wd->ensure_grad() : nullptr;
      T* gb = db ? bd->ensure_grad() : nullptr;
      // Column sums in row order: deterministic whatever the thread count.
      detail::for_each_col(exec, rows, cols, kind::norm, "layer_norm_backward_affine", bytes, [=](index_t c) {
        T sw = 0, sb = 0;
        for (index_t r = 0; r < rows; ++r) {
          const T g = G[r * cols + c];
          sw += g * (X[r * cols + c] - M[r]) * R[r];
          sb += g;
        }
        if (gw) detail::put_grad(gw[c], sw, add_w);
        if (gb) detail::put_grad(gb[c], sb, add_b);
      });
      if (dw) wd->grad_valid = true;
      if (db) bd->grad_valid = true;
    }
  });
  return out;
}

// Without an affine part: weight 1, bias 0 (neither learned).
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> layer_norm(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, double eps = 1e-5) {
  const index_t n = x.shape().cols();
  Tensor<T, S, dyn> w(n), b(n);
  std::fill(w.data(), w.data() + n, T(1));
  std::fill(b.data(), b.data() + n, T(0));
  return layer_norm(tape, x, ag::Var<T, S, dyn>(std::move(w)), ag::Var<T, S, dyn>(std::move(b)), eps);
}

// LayerNorm over the last N features with a learned weight (ones) and bias (zeros), as PyTorch.
template <index_t N, class T = float>
class LayerNorm {
 public:
  static constexpr index_t in_features = N;
  static constexpr index_t out_features = N;
  using value_type = T;

  explicit LayerNorm(double eps = 1e-5) : eps_(eps) {
    weight_.set_requires_grad(true);
    bias_.set_requires_grad(true);
    std::fill(weight_.value().data(), weight_.value().data() + N, T(1));
    std::fill(bias_.value().data(), bias_.value().data() + N, T(0));
  }
  explicit LayerNorm(Generator&) : LayerNorm() {}

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) const {
    return layer_norm(tape, x, weight_, bias_, eps_);
  }
  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
    f(bias_);
  }
  const ag::Var<T, host, N>& weight() const { return weight_; }
  const ag::Var<T, host, N>& bias() const { return bias_; }
  double eps() const { return eps_; }

 private:
  ag::Var<T, host, N> weight_;
  ag::Var<T, host, N> bias_;
  double eps_;
};

}  // namespace kiln::nn
