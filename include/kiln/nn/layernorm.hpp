// kiln/nn/layernorm.hpp — layer normalisation over the last axis, as an autograd op and a layer.
//
// Forward is ONE kernel over rows (two-pass mean and biased variance, then
// y = (x - mean) * rstd * weight + bias) that saves mean and rstd per row. Backward is ONE
// kernel over rows for dx,
//   xhat = (x - mean) * rstd,  gw = g * weight,
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
// and ONE kernel over columns for dweight = sum_rows(g * xhat) and dbias = sum_rows(g).
// The kernels are functors, so they run on every executor: on the CPU one work item per row, and
// one per column for the affine gradients; on CUDA a warp or a block per row (`row(team, r)`) and
// tiled, deterministic column sums (`terms` / `finish`; kiln/backend/cuda/rowwise.cuh). The saved
// mean / rstd live in the executor's space.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

namespace detail {

// Row r: mean[r], rstd[r] and y's row. w and b are both null (weight 1, bias 0) or both set.
// X is the activations' type (x, y), T the parameters' and statistics' and the arithmetic's: the
// same, or under mixed precision X = bf16 / f16 with float T (each element widened on reading,
// rounded once on writing).
template <class X, class T = X>
struct LayerNormRows {
  const X* x;
  const T* w;
  const T* b;
  X* y;
  T* mean;
  T* rstd;
  index_t cols;
  T eps;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const X* xr = x + r * cols;
    T sum = 0;
    for (index_t c = 0; c < cols; ++c) sum += convert<T>(xr[c]);
    const T mu = sum / T(cols);
    T var = 0;
    for (index_t c = 0; c < cols; ++c) var += (convert<T>(xr[c]) - mu) * (convert<T>(xr[c]) - mu);
    const T rs = T(1) / math::sqrt(var / T(cols) + eps);
    mean[r] = mu;
    rstd[r] = rs;
    X* yr = y + r * cols;
    if (w) {
      for (index_t c = 0; c < cols; ++c) yr[c] = convert<X>((convert<T>(xr[c]) - mu) * rs * w[c] + b[c]);
    } else {  // + 0 as with a zero bias: -0 becomes +0
      for (index_t c = 0; c < cols; ++c) yr[c] = convert<X>((convert<T>(xr[c]) - mu) * rs + T(0));
    }
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const X* xr = x + r * cols;
    T sum = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) sum += convert<T>(xr[c]);
    const T mu = t.sum(sum) / T(cols);
    T var = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) var += (convert<T>(xr[c]) - mu) * (convert<T>(xr[c]) - mu);
    const T rs = T(1) / math::sqrt(t.sum(var) / T(cols) + eps);
    if (t.rank() == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
    X* yr = y + r * cols;
    if (w) {
      for (index_t c = t.rank(); c < cols; c += t.size()) yr[c] = convert<X>((convert<T>(xr[c]) - mu) * rs * w[c] + b[c]);
    } else {
      for (index_t c = t.rank(); c < cols; c += t.size()) yr[c] = convert<X>((convert<T>(xr[c]) - mu) * rs + T(0));
    }
  }
};

// dx's row r; w null means weight 1 (X and T as LayerNormRows').
template <class X, class T = X>
struct LayerNormBackwardRows {
  X* dx;
  const X* x;
  const T* w;
  const X* g;
  const T* mean;
  const T* rstd;
  index_t cols;
  bool add;
  KILN_HOST_DEVICE T gw_at(const X* gr, index_t c) const {
    return w ? T(convert<T>(gr[c]) * w[c]) : convert<T>(gr[c]);
  }
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const X* xr = x + r * cols;
    const X* gr = g + r * cols;
    const T mu = mean[r], rs = rstd[r];
    T a = 0, b = 0;
    for (index_t c = 0; c < cols; ++c) {
      const T gw = gw_at(gr, c);
      a += gw;
      b += gw * (convert<T>(xr[c]) - mu) * rs;
    }
    a /= T(cols);
    b /= T(cols);
    X* dr = dx + r * cols;
    for (index_t c = 0; c < cols; ++c) {
      const T xhat = (convert<T>(xr[c]) - mu) * rs;
      put_grad(dr[c], T(rs * (gw_at(gr, c) - a - xhat * b)), add);
    }
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const X* xr = x + r * cols;
    const X* gr = g + r * cols;
    const T mu = mean[r], rs = rstd[r];
    T a = 0, b = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) {
      const T gw = gw_at(gr, c);
      a += gw;
      b += gw * (convert<T>(xr[c]) - mu) * rs;
    }
    a = t.sum(a) / T(cols);
    b = t.sum(b) / T(cols);
    X* dr = dx + r * cols;
    for (index_t c = t.rank(); c < cols; c += t.size()) {
      const T xhat = (convert<T>(xr[c]) - mu) * rs;
      put_grad(dr[c], T(rs * (gw_at(gr, c) - a - xhat * b)), add);
    }
  }
};

// Column c of dweight and dbias (either may be null), summed in row order on the CPU and in a
// fixed tile order on CUDA: deterministic on every executor whatever its thread count.
template <class X, class T = X>
struct LayerNormAffineBackward {
  T* gw;
  T* gb;
  const X* x;
  const X* g;
  const T* mean;
  const T* rstd;
  index_t rows, cols;
  bool add_w, add_b;
  KILN_HOST_DEVICE void operator()(index_t, index_t c) const {
    T sw = 0, sb = 0;
    for (index_t r = 0; r < rows; ++r) {
      const T gv = convert<T>(g[r * cols + c]);
      sw += gv * (convert<T>(x[r * cols + c]) - mean[r]) * rstd[r];
      sb += gv;
    }
    if (gw) put_grad(gw[c], sw, add_w);
    if (gb) put_grad(gb[c], sb, add_b);
  }
  // As column sums in tiles (CUDA): the two terms at (r, c), and column c's two sums.
  using sum_type = T;
  static constexpr int sums = 2;
  KILN_HOST_DEVICE void terms(index_t r, index_t c, T (&v)[2]) const {
    const T gv = convert<T>(g[r * cols + c]);
    v[0] = gv * (convert<T>(x[r * cols + c]) - mean[r]) * rstd[r];
    v[1] = gv;
  }
  KILN_HOST_DEVICE void finish(index_t c, const T (&s)[2]) const {
    if (gw) put_grad(gw[c], s[0], add_w);
    if (gb) put_grad(gb[c], s[1], add_b);
  }
};

// layer_norm with weight and bias nodes wd, bd (both null: no affine part, nothing learned).
// The host instances kiln::kernels compiles once (KILN_CPU_LINES in nn/module.hpp).
#define KILN_LAYER_NORM_KERNELS(EXTERN, T)                   \
  KILN_CPU_LINES(EXTERN, false, LayerNormRows<T>)            \
  KILN_CPU_LINES(EXTERN, false, LayerNormBackwardRows<T>)    \
  KILN_CPU_LINES(EXTERN, true, LayerNormAffineBackward<T>)
#if KILN_EXTERN_KERNELS
KILN_LAYER_NORM_KERNELS(extern, float)
KILN_LAYER_NORM_KERNELS(extern, double)
#endif

// X: the activations' type; P: the parameters', statistics' and arithmetic's (float under mixed
// precision, else X).
template <class P, class Exec, class X, class S, index_t... D, class WD, class BD>
ag::Var<X, S, D...> layer_norm_impl(ag::Tape<Exec>& tape, const ag::Var<X, S, D...>& x, std::shared_ptr<WD> wd,
                                    std::shared_ptr<BD> bd, double eps) {
  using T = P;
  static_assert(std::is_same_v<S, typename Exec::space>,
                "kiln::nn::layer_norm: the input must live in the executor's memory space");
  KILN_CHECK(eps > 0.0, ValueError, "layer_norm: eps must be > 0, got ", eps);
  using V = ag::Var<X, S, D...>;
  const Shape s = x.shape();
  const index_t rows = s.rows(), cols = s.cols();
  V out{typename V::tensor_type(s)};
  // mean[rows], then rstd[rows], kept for backward.
  auto stats = std::make_shared<Tensor<T, typename Exec::space, dyn>>(Shape{2 * rows});
  T* M = stats->data();
  const std::size_t bytes = std::size_t(s.size()) * sizeof(X) * 2;
  launch_lines<false>(tape.exec(), rows, cols,
                           LayerNormRows<X, T>{x.value().data(), wd ? wd->value.data() : nullptr,
                                            bd ? bd->value.data() : nullptr, out.value().data(), M, M + rows, cols,
                                            T(eps)},
                           "layer_norm", bytes);
  const bool any = x.requires_grad() || (wd && wd->requires_grad) || (bd && bd->requires_grad);
  if (!any || !tape.recording()) return out;
  out.set_requires_grad(true);
  std::vector<std::shared_ptr<ag::VarNode>> inputs{x.data()};
  if (wd) inputs.push_back(wd);
  if (bd) inputs.push_back(bd);
  tape.record(out, std::move(inputs), [xd = x.data(), wd, bd, stats, rows, cols, bytes](Exec& exec, auto& od) {
    if (!od.grad_valid) return;
    const X* Xs = xd->value.data();
    const X* G = od.grad.data();
    const T* M = stats->data();
    const T* R = M + rows;
    if (xd->requires_grad) {
      const bool add = xd->grad_valid;
      X* dx = xd->ensure_grad();
      launch_lines<false>(exec, rows, cols,
                               LayerNormBackwardRows<X, T>{dx, Xs, wd ? wd->value.data() : nullptr, G, M, R, cols, add},
                               "layer_norm_backward", bytes * 2);
      xd->grad_valid = true;
    }
    const bool dw = wd && wd->requires_grad, db = bd && bd->requires_grad;
    if (dw || db) {
      const bool add_w = dw && wd->grad_valid, add_b = db && bd->grad_valid;
      T* gw = dw ? wd->ensure_grad() : nullptr;
      T* gb = db ? bd->ensure_grad() : nullptr;
      launch_lines<true>(exec, cols, rows,
                              LayerNormAffineBackward<X, T>{gw, gb, Xs, G, M, R, rows, cols, add_w, add_b},
                              "layer_norm_backward_affine", bytes);
      if (dw) wd->grad_valid = true;
      if (db) bd->grad_valid = true;
    }
  });
  return out;
}

}  // namespace detail

// x [..., N] normalised per row, scaled by weight [N] and shifted by bias [N] (any ranks whose
// sizes are N). Gradients flow to each of x, weight and bias that requires one. Under mixed
// precision x (and so y and x's gradient) is bf16 / f16 while weight and bias stay float: the
// statistics and the arithmetic are float.
template <class Exec, class X, class T, class S, index_t... D, index_t... W, index_t... Bd>
  requires(std::is_same_v<X, T> || std::is_same_v<X, bf16> || std::is_same_v<X, f16>)
ag::Var<X, S, D...> layer_norm(ag::Tape<Exec>& tape, const ag::Var<X, S, D...>& x, const ag::Var<T, S, W...>& weight,
                               const ag::Var<T, S, Bd...>& bias, double eps = 1e-5) {
  const Shape s = x.shape();
  const index_t cols = s.cols();
  KILN_CHECK(weight.value().size() == cols && bias.value().size() == cols, ShapeError, "layer_norm: x has shape ",
             s.str(), ", so weight and bias need ", cols, " elements; got weight ", weight.shape().str(), " and bias ",
             bias.shape().str());
  return detail::layer_norm_impl<T>(tape, x, weight.data(), bias.data(), eps);
}

// Without an affine part: weight 1, bias 0 (neither learned, nothing allocated for them).
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> layer_norm(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, double eps = 1e-5) {
  using P = compute_t<T>;
  using None = std::shared_ptr<typename ag::Var<P, S, dyn>::data_type>;
  return detail::layer_norm_impl<P>(tape, x, None(), None(), eps);
}

// LayerNorm over the last N features with a learned weight (ones) and bias (zeros), as PyTorch.
// Space is where the parameters live (kiln::host or kiln::cuda; for kiln::cuda include
// kiln/nn/cuda.cuh): they are filled on the host and moved there, as Linear's are.
template <index_t N, class T = float, class Space = host>
class LayerNorm {
 public:
  static constexpr index_t in_features = N;
  static constexpr index_t out_features = N;
  using value_type = T;
  using space = Space;
  // The same layer with its parameters in another space (Sequential<...>::on<S> uses it).
  template <class S>
  using on = LayerNorm<N, T, S>;

  explicit LayerNorm(double eps = 1e-5) : weight_(filled(T(1)), true), bias_(filled(T(0)), true), eps_(eps) {}
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
  const ag::Var<T, Space, N>& weight() const { return weight_; }
  const ag::Var<T, Space, N>& bias() const { return bias_; }
  double eps() const { return eps_; }
  static std::string describe() { return "LayerNorm<" + std::to_string(N) + ">"; }
  // One row kernel forward; backward one row kernel for dx when the input needs it and one column
  // kernel for the affine gradients unless both are frozen (nn/freeze.hpp).
  static constexpr Launches launches(const LaunchContext& c) {
    return {1, index_t(c.input_grad) + index_t(c.weight_grad || c.bias_grad)};
  }
  static constexpr index_t parameter_tensors = 2;
  // Runs on bf16 / f16 activations with float parameters (train::Step's mixed precisions).
  static constexpr bool mixed_precision = true;

 private:
  static Tensor<T, Space, N> filled(T v) {
    Tensor<T, host, N> t;
    std::fill(t.data(), t.data() + N, v);
    return space_ops<Space>::from_host(std::move(t));
  }

  ag::Var<T, Space, N> weight_;
  ag::Var<T, Space, N> bias_;
  double eps_;
};

}  // namespace kiln::nn
