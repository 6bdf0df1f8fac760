// kiln/autograd/gradcheck.hpp — compare a function's analytic gradients with central
// differences, in fp64 on the CPU. For tests of new ops and for users checking their own.
//
//   auto r = kiln::gradcheck([](auto& tape, auto& in) { return ag::map(tape, tanh(in[0] * in[1])); },
//                            {a, b});   // a, b: ag::Var<double, host, dyn, dyn>
//   CHECK_MESSAGE(r.ok, r.report);
//
// A non-scalar output y is reduced to L = sum_i r_i * y_i with a fixed random projection r
// (uniform in [-1, 1), seeded), so every output element contributes. Each input element x_j is
// checked: |analytic - numeric| <= atol + rtol * |numeric|, numeric = (L(x+h) - L(x-h)) / 2h.
//
// Tolerances: central differences in fp64 at h = 1e-6 are good to about 1e-9 on losses of order
// one (h² truncation, 1e-16 / h rounding), so the defaults (atol 1e-7, rtol 1e-5) are 100 times
// that: a gradient 0.01% off fails. PyTorch's gradcheck defaults (atol 1e-5, rtol 1e-3) would
// let a 0.1% error pass; loosen per call only for a reason (a large loss, a kink nearby).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/map.hpp"
#include "kiln/autograd/reduce.hpp"
#include "kiln/autograd/tape.hpp"
#include "kiln/autograd/var.hpp"
#include "kiln/backend/cpu/executor.hpp"
#include "kiln/core/random.hpp"
#include "kiln/expr/elementwise.hpp"  // the + and * its code writes on variables

namespace kiln {

struct GradcheckOptions {
  double h = 1e-6;      // central-difference step
  double atol = 1e-7;   // absolute tolerance
  double rtol = 1e-5;   // relative tolerance (of the numeric gradient)
  std::uint64_t seed = 0x6b696c6e;  // of the projection that reduces a non-scalar output
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_err = 0.0;  // max |analytic - numeric|
  double max_rel_err = 0.0;  // max |analytic - numeric| / max(|numeric|, atol)
  std::string report;        // the worst element (input index, element, both values) and a summary
};

// A variable gradcheck perturbs: anything with value / grad pointers, a size and its node
// (kiln::nn::Parameter<double>, for a layer's weights).
template <class P>
concept gradcheck_parameter = requires(const P& p) {
  { p.value } -> std::convertible_to<double*>;
  { p.grad } -> std::convertible_to<const double*>;
  { p.size } -> std::convertible_to<index_t>;
  { p.node } -> std::convertible_to<ag::VarNode*>;
};

namespace detail {

struct GradTarget {
  double* value;
  index_t size;
  Shape shape;
  ag::VarNode* node;
  std::function<const double*()> grad;
  std::string label;
};

// L = sum(out * r), recorded on the tape when it records.
template <class Exec, index_t... D>
ag::Var<double, host> project(ag::Tape<Exec>& tape, const ag::Var<double, host, D...>& out,
                              const Tensor<double, host, D...>& r) {
  return ag::sum(tape, ag::map(tape, out * r));
}

template <class Out, class Fn, class Inputs>
GradcheckResult gradcheck_var(Fn& fn, Inputs& inputs, std::vector<GradTarget>& targets, const GradcheckOptions& opt) {
  CpuExecutor exec(1);
  using R = typename Out::tensor_type;

  R proj;
  auto evaluate = [&]() -> double {  // L(x), nothing recorded
    ag::NoGrad no_grad;
    ag::Tape<CpuExecutor> tape(exec);
    Out out = fn(tape, inputs);
    const double* y = out.value().data();
    const double* r = proj.data();
    double sum = 0.0;
    for (index_t i = 0, n = out.value().size(); i < n; ++i) sum += y[i] * r[i];
    return sum;
  };

  // Analytic gradients.
  for (auto& t : targets) t.node->grad_valid = false;
  ag::Tape<CpuExecutor> tape(exec);
  Out out = fn(tape, inputs);
  proj = R(out.shape());
  Generator gen(opt.seed);
  for (index_t i = 0, n = proj.size(); i < n; ++i) proj.data()[i] = double(gen.uniform(-1.0f, 1.0f));
  std::vector<std::vector<double>> analytic(targets.size());
  if (out.requires_grad()) {
    auto loss = project(tape, out, proj);
    tape.backward(loss);
  }
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto& a = analytic[k];
    a.assign(std::size_t(targets[k].size), 0.0);
    if (targets[k].node->grad_valid) std::copy_n(targets[k].grad(), targets[k].size, a.begin());
  }

  GradcheckResult res;
  double worst_ratio = -1.0;
  std::size_t bad = 0, total = 0;
  std::ostringstream worst;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    GradTarget& t = targets[k];
    for (index_t j = 0; j < t.size; ++j) {
      const double x0 = t.value[j];
      t.value[j] = x0 + opt.h;
      const double lp = evaluate();
      t.value[j] = x0 - opt.h;
      const double lm = evaluate();
      t.value[j] = x0;
      const double num = (lp - lm) / (2.0 * opt.h);
      const double ana = analytic[k][std::size_t(j)];
      const double err = std::abs(ana - num);
      const double allowed = opt.atol + opt.rtol * std::abs(num);
      const double ratio = std::isfinite(err) ? err / allowed : HUGE_VAL;
      ++total;
      if (!(err <= allowed)) ++bad;
      res.max_abs_err = std::max(res.max_abs_err, std::isfinite(err) ? err : HUGE_VAL);
      res.max_rel_err = std::max(res.max_rel_err, std::isfinite(err) ? err / std::max(std::abs(num), opt.atol) : HUGE_VAL);
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst.str("");
        worst.precision(10);
        worst << t.label << " element " << j;
        if (t.shape.rank >= 2) worst << " (row " << j / t.shape.cols() << ", col " << j % t.shape.cols() << ")";
        worst << " of " << t.shape.str() << ": analytic " << ana << ", numeric " << num << ", |diff| " << err
              << (err <= allowed ? " <= " : " > ") << "atol + rtol * |numeric| = " << allowed;
      }
    }
  }
  res.ok = bad == 0;
  std::ostringstream rep;
  rep << "gradcheck " << (res.ok ? "passed" : "FAILED") << ": " << bad << " of " << total
      << " elements out of tolerance (h " << opt.h << ", atol " << opt.atol << ", rtol " << opt.rtol
      << "); max abs err " << res.max_abs_err << ", max rel err " << res.max_rel_err;
  if (total > 0) rep << "; worst: " << worst.str();
  res.report = rep.str();
  return res;
}

template <class Fn, class Inputs>
GradcheckResult gradcheck_impl(Fn& fn, Inputs& inputs, std::vector<GradTarget>& targets,
                               const GradcheckOptions& opt) {
  using Out = std::remove_cvref_t<decltype(fn(std::declval<ag::Tape<CpuExecutor>&>(), inputs))>;
  static_assert(ag::is_var_v<Out>,
                "kiln::gradcheck: the function must return a kiln::ag::Var (of double, on the host) computed "
                "from its inputs on the tape it is given");
  if constexpr (ag::is_var_v<Out>) return gradcheck_var<Out>(fn, inputs, targets, opt);
  else return {};
}

}  // namespace detail

using GradcheckInput = ag::Var<double, host, dyn, dyn>;

// Checks fn(tape, inputs) -> Var<double, host, ...> against every element of every input, and
// of every extra parameter (e.g. a layer's weights from parameters()). Every input is made to
// require a gradient. The inputs' values are restored afterwards.
template <class Fn, class Params>
  requires gradcheck_parameter<typename Params::value_type>
GradcheckResult gradcheck(Fn&& fn, std::vector<GradcheckInput> inputs, const Params& params,
                          GradcheckOptions options = {}) {
  std::vector<detail::GradTarget> targets;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    auto d = inputs[k].data();
    d->requires_grad = true;
    d->ensure_grad();
    targets.push_back({d->value.data(), d->value.size(), d->value.shape(), d.get(), [d] { return d->grad.data(); },
                       "input " + std::to_string(k)});
  }
  std::size_t k = 0;
  for (const auto& p : params) {
    p.node->requires_grad = true;
    const double* g = p.grad;
    targets.push_back({p.value, p.size, Shape{p.size}, p.node, [g] { return g; }, "parameter " + std::to_string(k++)});
  }
  return detail::gradcheck_impl(fn, inputs, targets, options);
}

template <class Fn>
GradcheckResult gradcheck(Fn&& fn, std::vector<GradcheckInput> inputs, GradcheckOptions options = {}) {
  struct None {
    double* value;
    index_t size;
    ag::VarNode* node;
    double* grad;
  };
  return gradcheck(std::forward<Fn>(fn), std::move(inputs), std::vector<None>{}, options);
}

// The same from input values: each becomes a variable that requires a gradient.
template <class Fn>
GradcheckResult gradcheck(Fn&& fn, std::vector<HostMatrix<double>>&& values, GradcheckOptions options = {}) {
  std::vector<GradcheckInput> inputs;
  for (auto& v : values) inputs.emplace_back(std::move(v), true);
  return gradcheck(std::forward<Fn>(fn), std::move(inputs), options);
}

}  // namespace kiln
