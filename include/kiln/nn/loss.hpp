// kiln/nn/loss.hpp — losses as autograd ops that return a scalar variable.
//
// cross_entropy fuses log-softmax and the negative log-likelihood: forward is ONE pass over the
// rows (it saves each row's log-sum-exp; on CUDA a warp or a block per row) and, on a device, ONE
// block reduction of the rows' losses; backward ONE pass over the logits:
//   dlogits = (softmax - ((1 - eps) * onehot(label) + eps / C)) * g / B    (g / 1 for sum)
// mse_loss forward is ONE fused reduction of (pred - target)^2, backward ONE elementwise kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/config.hpp"  // KILN_FORCE_EAGER_FORMS
#include "kiln/core/tensor.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/softmax.hpp"
#include "kiln/ops/reduce.hpp"

namespace kiln::nn {

struct CrossEntropyOptions {
  double label_smoothing = 0.0;  // eps in [0, 1]: the target is (1 - eps) * onehot + eps / C
  loss_reduction reduction = loss_reduction::mean;
};

namespace detail {

// cross_entropy's kernels, as functors so that they run on every executor. The logits are T
// (bf16 / f16 under mixed precision); everything is computed and kept in C = compute_t<T>.
// Row r: its log-sum-exp (saved for backward) and its loss
//   (1 - eps) * (lse - x_y) + eps * mean_c(lse - x_c);
// a label outside [0, C) (only possible on a device, where labels are not checked) gives NaN.
template <class T>
struct CrossEntropyRows {
  using C = compute_t<T>;
  const T* x;
  const std::int32_t* labels;
  C* lse;
  C* per_row;
  index_t cols;
  C on, eps;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const T* xr = x + r * cols;
    C m = cols > 0 ? convert<C>(xr[0]) : C(0), sx = 0;
    for (index_t c = 1; c < cols; ++c) m = convert<C>(xr[c]) > m ? convert<C>(xr[c]) : m;
    C se = 0;
    for (index_t c = 0; c < cols; ++c) {
      se += math::exp(convert<C>(xr[c]) - m);
      sx += convert<C>(xr[c]);
    }
    const C l = m + math::log(se);
    lse[r] = l;
    const std::int32_t y = labels[r];
    if (y < 0 || y >= cols) {
      per_row[r] = std::numeric_limits<C>::quiet_NaN();
      return;
    }
    per_row[r] = on * (l - convert<C>(xr[y])) + smoothing(l, sx);
  }
  // The label-smoothing term, only when there is smoothing: a logit masked with -inf makes
  // l - mean(x) infinite, and 0 * inf would turn an ordinary row into NaN (PyTorch gives the row's
  // loss there).
  KILN_HOST_DEVICE C smoothing(C l, C sx) const { return eps != C(0) ? eps * (l - sx / C(cols)) : C(0); }
  // The same row on a team of threads (CUDA: kiln/backend/cuda/rowwise.cuh).
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const T* xr = x + r * cols;
    C m = -std::numeric_limits<C>::infinity(), sx = 0, se = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) m = convert<C>(xr[c]) > m ? convert<C>(xr[c]) : m;
    m = cols > 0 ? t.max(m) : C(0);
    for (index_t c = t.rank(); c < cols; c += t.size()) {
      se += math::exp(convert<C>(xr[c]) - m);
      sx += convert<C>(xr[c]);
    }
    se = t.sum(se);
    sx = t.sum(sx);
    if (t.rank() != 0) return;
    const C l = m + math::log(se);
    lse[r] = l;
    const std::int32_t y = labels[r];
    per_row[r] = y < 0 || y >= cols ? std::numeric_limits<C>::quiet_NaN()
                                    : on * (l - convert<C>(xr[y])) + smoothing(l, sx);
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
  // One team sums all rows (CUDA: a block reduction in a fixed order, deterministic too).
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t) const {
    T total = 0;
    for (index_t r = t.rank(); r < rows; r += t.size()) total += per_row[r];
    total = t.sum(total);
    if (t.rank() == 0) out[0] = total * scale;
  }
};

template <class T>
struct CrossEntropyBackward {
  using C = compute_t<T>;
  T* dx;
  const T* x;
  const C* lse;
  const std::int32_t* labels;
  const C* g;  // the loss's gradient (one element, in the executor's space)
  index_t cols;
  C scale, on, off;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const index_t i = r * cols + c;
    const C target = (c == labels[r] ? on : C(0)) + off;
    put_grad(dx[i], C(g[0] * scale * (math::exp(convert<C>(x[i]) - lse[r]) - target)), add);
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

// nll_loss's kernels: row r's loss from log-probabilities, and the gradient of the log-probabilities.
template <class T>
struct NllRows {
  const T* logp;
  const std::int32_t* labels;
  T* per_row;
  index_t cols;
  T on, eps;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    const T* lr = logp + r * cols;
    const std::int32_t y = labels[r];
    if (y < 0 || y >= cols) {
      per_row[r] = std::numeric_limits<T>::quiet_NaN();
      return;
    }
    T sum = 0;
    for (index_t c = 0; c < cols; ++c) sum += lr[c];
    per_row[r] = -(on * lr[y]) - (eps != T(0) ? eps * (sum / T(cols)) : T(0));  // as cross_entropy: no 0 * -inf
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    const T* lr = logp + r * cols;
    T sum = 0;
    for (index_t c = t.rank(); c < cols; c += t.size()) sum += lr[c];
    sum = t.sum(sum);
    if (t.rank() != 0) return;
    const std::int32_t y = labels[r];
    per_row[r] = y < 0 || y >= cols ? std::numeric_limits<T>::quiet_NaN()
                                    : -(on * lr[y]) - (eps != T(0) ? eps * (sum / T(cols)) : T(0));
  }
};
template <class T>
struct NllBackward {
  T* dx;
  const std::int32_t* labels;
  const T* g;
  index_t cols;
  T scale, on, off;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const T target = (c == labels[r] ? on : T(0)) + off;
    put_grad(dx[r * cols + c], T(-g[0] * scale * target), add);
  }
};

// A row kernel of kind::loss: for_each_element(rows, 1) on the host, as it always ran there (the
// CPU is the reference), and a warp or a block per row on an executor with cooperative kernels.
template <class Exec, class F>
void loss_rows(Exec& exec, index_t rows, index_t cols, const F& f, const char* name, std::size_t bytes) {
  if constexpr (std::is_same_v<typename Exec::space, host>) launch_elements(exec, rows, 1, f, kind::loss, name, bytes);
  else launch_lines<false>(exec, rows, cols, f, name, bytes, kind::loss);
}

// The host instances kiln::kernels compiles once (KILN_CPU_ELEMENTS in nn/module.hpp).
// Cross-entropy also from bf16 / f16 logits (mixed precision: its loss and nll_loss's are float).
#define KILN_CROSS_ENTROPY_KERNELS(EXTERN, T)          \
  KILN_CPU_ELEMENTS(EXTERN, CrossEntropyRows<T>)      \
  KILN_CPU_ELEMENTS(EXTERN, CrossEntropyBackward<T>)
#define KILN_LOSS_KERNELS(EXTERN, T)        \
  KILN_CROSS_ENTROPY_KERNELS(EXTERN, T)     \
  KILN_CPU_ELEMENTS(EXTERN, NllRows<T>)     \
  KILN_CPU_ELEMENTS(EXTERN, NllBackward<T>)
#if KILN_EXTERN_KERNELS
KILN_LOSS_KERNELS(extern, float)
KILN_LOSS_KERNELS(extern, double)
KILN_CROSS_ENTROPY_KERNELS(extern, bf16)
KILN_CROSS_ENTROPY_KERNELS(extern, f16)
#endif

template <class I>
struct CopyLabels {
  const I* src;
  I* dst;
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const { dst[r] = src[r]; }
};

// The labels of `rows` rows kept for backward, in the executor's space: copied and checked to be
// in [0, cols) on the host, copied by a kernel on a device (not checked there: a bad label makes
// its row's loss NaN).
template <class Exec, class S>
std::shared_ptr<Tensor<std::int32_t, S, dyn>> saved_labels(Exec& exec, const std::int32_t* labels, index_t rows,
                                                           index_t cols, const char* op, const Shape& shape) {
  KILN_CHECK(rows == 0 || labels != nullptr, ValueError, op, ": labels is null for ", rows, " rows");
  auto saved = std::make_shared<Tensor<std::int32_t, S, dyn>>(Shape{rows});
  if constexpr (std::is_same_v<S, host>) {
    // One launch, so that a replayed step (mode::reduce_overhead) copies and checks each batch's labels.
    std::int32_t* dst = saved->data();
    exec.launch("labels", [labels, dst, rows, cols, op, shape](std::string_view) {
      for (index_t r = 0; r < rows; ++r) {
        const std::int32_t y = labels[r];
        KILN_CHECK(y >= 0 && y < cols, ValueError, op, ": the label of row ", r, " is ", y, ", outside [0, ", cols,
                   ") for ", op == std::string_view("nll_loss") ? "log-probabilities" : "logits", " of shape ",
                   shape.str());
        dst[r] = y;
      }
    });
  } else {
    exec.for_each_element(rows, 1, CopyLabels<std::int32_t>{labels, saved->data()}, kind::copy,
                          std::string(op) + "_labels", std::size_t(rows) * sizeof(std::int32_t) * 2);
  }
  return saved;
}

}  // namespace detail

// The negative log-likelihood of log-probabilities [B, C] (log_softmax's output) against integer
// labels, with cross_entropy's options: forward ONE row kernel (and the rows' sum, as
// cross_entropy), backward ONE kernel. cross_entropy on a force_eager tape is
// nll_loss(log_softmax(logits)), as an unfused framework runs it.
namespace detail {
// nll_loss's body on the log-probabilities' node, their shape at run time: compiled once per
// executor and element type (for the CPU in kiln::kernels).
template <class Exec, class T, class S>
ag::Var<T, S> nll_loss_fused(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x, const T* x_values,
                             const Shape& shape, const std::int32_t* labels, CrossEntropyOptions options) {
  const index_t rows = shape[0], cols = shape[1];
  const double eps = options.label_smoothing;
  auto saved = detail::saved_labels<Exec, S>(tape.exec(), labels, rows, cols, "nll_loss", shape);
  const bool mean = options.reduction == loss_reduction::mean;
  // The mean over no rows is 0 / 0 = NaN, as PyTorch's (the sum is 0).
  const T scale = mean ? (rows > 0 ? T(1) / T(rows) : std::numeric_limits<T>::quiet_NaN()) : T(1);
  const T on = T(1.0 - eps), off = T(eps / double(cols > 0 ? cols : 1));
  auto per_row = std::make_shared<Tensor<T, S, dyn>>(Shape{rows});
  const std::size_t bytes = std::size_t(rows * cols) * sizeof(T);
  detail::loss_rows(tape.exec(), rows, cols,
                    detail::NllRows<T>{x_values, saved->data(), per_row->data(), cols, on, T(eps)}, "nll_loss", bytes);
  ag::Var<T, S> out(Tensor<T, S>{});
  const detail::CrossEntropySum<T> total{per_row->data(), out.value().data(), rows, scale};
  if constexpr (std::is_same_v<S, host>) tape.exec().launch("nll_loss_sum", [total](std::string_view) { total(0, 0); });
  else detail::launch_lines<false>(tape.exec(), 1, rows, total, "nll_loss_sum", std::size_t(rows) * sizeof(T), kind::loss);
  if (!x->requires_grad || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {x}, [x, saved, rows, cols, scale, on, off, bytes](Exec& exec, auto& od) {
    if (!od.grad_valid || !x->requires_grad) return;
    const bool add = x->grad_valid;
    T* dx = static_cast<T*>(x->ensure_grad_data());
    detail::launch_elements(exec, rows, cols,
                            detail::NllBackward<T>{dx, saved->data(), od.grad.data(), cols, scale, on, off, add},
                            kind::loss, "nll_loss_backward", bytes * 2);
    x->grad_valid = true;
  });
  return out;
}
#define KILN_CPU_NLL_LOSS(EXTERN, T)                                                                          \
  EXTERN template ag::Var<T, host> nll_loss_fused<::kiln::CpuExecutor, T, host>(                             \
      ag::Tape<::kiln::CpuExecutor>&, const std::shared_ptr<ag::VarNode>&, const T*, const Shape&,             \
      const std::int32_t*, CrossEntropyOptions);
#if KILN_EXTERN_KERNELS
KILN_CPU_NLL_LOSS(extern, float)
KILN_CPU_NLL_LOSS(extern, double)
#endif
}  // namespace detail

// The negative log-likelihood of log-probabilities [B, C] (log_softmax's output) against integer
// labels, with cross_entropy's options: forward ONE row kernel (and the rows' sum, as
// cross_entropy), backward ONE kernel. cross_entropy on a force_eager tape is
// nll_loss(log_softmax(logits)), as an unfused framework runs it.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<T, S> nll_loss(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logp, const std::int32_t* labels,
                       CrossEntropyOptions options = {}) {
  const double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0.0 && eps <= 1.0, ValueError, "nll_loss: label_smoothing must be in [0, 1], got ", eps);
  return detail::nll_loss_fused<Exec, T, S>(tape, logp.data(), logp.value().data(), logp.shape(), labels, options);
}

namespace detail {
// stance::force_eager's form of cross_entropy: nll_loss(log_softmax(logits)), one kernel each way
// each, as an unfused framework runs it. Defined in kiln/nn/loss_eager.hpp (KILN_WEAK,
// KILN_FORCE_EAGER_FORMS).
template <class Exec, class T, class S>
KILN_WEAK ag::Var<compute_t<T>, S> cross_entropy_eager(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x,
                                                       const T* x_values, const Shape& shape,
                                                       const std::int32_t* labels, CrossEntropyOptions options);

// cross_entropy's fused body on the logits' node, their sizes at run time: compiled once per
// executor and element type (for the CPU executor in kiln::kernels, src/kernels/rows.cpp).
template <class Exec, class T, class S>
ag::Var<compute_t<T>, S> cross_entropy_fused(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x,
                                             const T* x_values, const Shape& shape, const std::int32_t* labels,
                                             CrossEntropyOptions options);
#define KILN_CPU_CROSS_ENTROPY(EXTERN, T)                                                                  \
  EXTERN template ag::Var<compute_t<T>, host> cross_entropy_fused<::kiln::CpuExecutor, T, host>(          \
      ag::Tape<::kiln::CpuExecutor>&, const std::shared_ptr<ag::VarNode>&, const T*, const Shape&,          \
      const std::int32_t*, CrossEntropyOptions);                                                            \
  EXTERN template ag::Var<compute_t<T>, host> cross_entropy_eager<::kiln::CpuExecutor, T, host>(          \
      ag::Tape<::kiln::CpuExecutor>&, const std::shared_ptr<ag::VarNode>&, const T*, const Shape&,          \
      const std::int32_t*, CrossEntropyOptions);
#if KILN_EXTERN_KERNELS
KILN_CPU_CROSS_ENTROPY(extern, float)
KILN_CPU_CROSS_ENTROPY(extern, double)
KILN_CPU_CROSS_ENTROPY(extern, bf16)
KILN_CPU_CROSS_ENTROPY(extern, f16)
#endif
}  // namespace detail

// Cross-entropy of logits [B, C] against integer class labels (B of them, each in [0, C)).
// Forward is ONE row kernel (a work item per row on the host, a warp or a block per row on a
// device); the rows' mean or sum is taken inline on the host in row order and as ONE block
// reduction on a device (a fixed tree order: deterministic too).
// requires: labels points at B integers in the executor's space: host memory for the
//   CpuExecutor (copied and checked here; the pointer may die afterwards), DEVICE memory for
//   the CudaExecutor (copied by a kernel on the executor's stream, so it must stay valid until
//   that stream reaches the copy; not checked on the host: a label outside [0, C) makes its
//   row's loss, and so the loss, NaN).
// throws: ValueError naming the first row whose label is outside [0, C) (host), or a bad
//   smoothing.
// Logits in bf16 / f16 (mixed precision): read as they are, everything else — the log-sum-exp,
// the loss (the result is a float variable) — in float; the logits' gradient is stored in their type.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<compute_t<T>, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                                       const std::int32_t* labels, CrossEntropyOptions options = {}) {
  const double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0.0 && eps <= 1.0, ValueError, "cross_entropy: label_smoothing must be in [0, 1], got ", eps);
  if (tape.force_eager())
    return kiln::ag::detail::run_eager_form(&detail::cross_entropy_eager<Exec, T, S>, "nn::cross_entropy", tape,
                                            logits.data(), logits.value().data(), logits.shape(), labels, options);
  return detail::cross_entropy_fused<Exec, T, S>(tape, logits.data(), logits.value().data(), logits.shape(), labels,
                                                 options);
}

namespace detail {
template <class Exec, class T, class S>
ag::Var<compute_t<T>, S> cross_entropy_fused(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x,
                                             const T* x_values, const Shape& shape, const std::int32_t* labels,
                                             CrossEntropyOptions options) {
  using F = compute_t<T>;
  const index_t rows = shape[0], cols = shape[1];
  const double eps = options.label_smoothing;
  auto saved_labels = detail::saved_labels<Exec, S>(tape.exec(), labels, rows, cols, "cross_entropy", shape);
  const bool mean = options.reduction == loss_reduction::mean;
  // The mean over no rows is 0 / 0 = NaN, as PyTorch's and mse_loss's (the sum is 0).
  const F scale = mean ? (rows > 0 ? F(1) / F(rows) : std::numeric_limits<F>::quiet_NaN()) : F(1);
  const F on = F(1.0 - eps), off = F(eps / double(cols > 0 ? cols : 1));
  // [0, rows): each row's log-sum-exp (kept for backward); [rows, 2 rows): each row's loss.
  auto lse = std::make_shared<Tensor<F, S, dyn>>(Shape{2 * rows});
  F* LSE = lse->data();
  const std::size_t bytes = std::size_t(rows * cols) * sizeof(T);
  detail::loss_rows(tape.exec(), rows, cols,
                    detail::CrossEntropyRows<T>{x_values, saved_labels->data(), LSE, LSE + rows, cols, on, F(eps)},
                    "cross_entropy", bytes);
  ag::Var<F, S> out(Tensor<F, S>{});
  const detail::CrossEntropySum<F> total{LSE + rows, out.value().data(), rows, scale};
  if constexpr (std::is_same_v<S, host>) tape.exec().launch("cross_entropy_sum", [total](std::string_view) { total(0, 0); });
  else detail::launch_lines<false>(tape.exec(), 1, rows, total, "cross_entropy_sum", std::size_t(rows) * sizeof(F), kind::loss);
  if (!x->requires_grad || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {x}, [x, saved_labels, lse, rows, cols, scale, on, off, bytes](Exec& exec, auto& od) {
    if (!od.grad_valid || !x->requires_grad) return;
    const bool add = x->grad_valid;
    T* dx = static_cast<T*>(x->ensure_grad_data());
    detail::launch_elements(exec, rows, cols,
                            detail::CrossEntropyBackward<T>{dx, static_cast<const T*>(x->value_data()), lse->data(),
                                                            saved_labels->data(), od.grad.data(), cols, scale, on, off,
                                                            add},
                            kind::loss, "cross_entropy_backward", bytes * 2);
    x->grad_valid = true;
  });
  return out;
}
}  // namespace detail

// A sequence model's logits [B, T, C] against B * T labels (row b * T + t is position t of
// sample b): the same op over B * T rows — F.cross_entropy(logits.view(-1, C), y.view(-1)).
template <class Exec, class T, class S, index_t B, index_t L, index_t C>
ag::Var<compute_t<T>, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, L, C>& logits,
                                       const std::int32_t* labels, CrossEntropyOptions options = {}) {
  const double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0.0 && eps <= 1.0, ValueError, "cross_entropy: label_smoothing must be in [0, 1], got ", eps);
  const Shape rows{logits.shape().rows(), logits.shape().cols()};  // the op's view: B * T rows of C
  if (tape.force_eager())
    return kiln::ag::detail::run_eager_form(&detail::cross_entropy_eager<Exec, T, S>, "nn::cross_entropy", tape,
                                            logits.data(), logits.value().data(), rows, labels, options);
  return detail::cross_entropy_fused<Exec, T, S>(tape, logits.data(), logits.value().data(), rows, labels, options);
}

// Labels in a tensor of B integers (any rank, row-major) in the logits' space.
template <class Exec, class T, class S, index_t B, index_t C, class LS, index_t... LD>
ag::Var<compute_t<T>, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                            const Tensor<std::int32_t, LS, LD...>& labels, CrossEntropyOptions options = {}) {
  static_assert(std::is_same_v<LS, S>, "kiln::nn::cross_entropy: the labels must be in the logits' memory space");
  KILN_CHECK(labels.size() == logits.dim(0), ShapeError, "cross_entropy: ", labels.size(),
             " labels for logits of shape ", logits.shape().str(), "; need one label per row");
  return cross_entropy(tape, logits, labels.data(), options);
}

// Labels as a span of B integers in the executor's space — a data::Batch's `labels`, a
// std::vector (host), or a device span on CUDA. The span's size is checked against the rows.
template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<compute_t<T>, S> cross_entropy(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
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

#if KILN_FORCE_EAGER_FORMS
#include "kiln/nn/loss_eager.hpp"
#endif
