// kiln/autograd/map.hpp — ag::map(tape, expr): a fused elementwise op on variables.
//
// Forward is ONE kernel (the expression assigned to a new variable); backward is ONE kernel
// derived from the same expression type (kiln/autograd/diff.hpp) that writes every input's
// gradient, plus one reduction per input that was broadcast (a bias, a scalar).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <type_traits>

#include "kiln/config.hpp"  // KILN_FORCE_EAGER_FORMS
#include "kiln/autograd/diff.hpp"
#include "kiln/autograd/erased_expr.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/autograd/tape.hpp"
#include "kiln/expr/assign.hpp"

namespace kiln::ag {

namespace detail {
template <class E>
constexpr bool has_boundary() {
  if constexpr (is_boundary_v<E>) return true;
  else if constexpr (is_leaf_v<E>) return false;
  else if constexpr (requires { std::declval<E>().c; })
    return has_boundary<decltype(E::a)>() || has_boundary<decltype(E::b)>() || has_boundary<decltype(E::c)>();
  else if constexpr (requires { std::declval<E>().b; })
    return has_boundary<decltype(E::a)>() || has_boundary<decltype(E::b)>();
  else return has_boundary<decltype(E::a)>();
}

template <class E, class F>
void for_each_var(const E& e, F&& f) {
  if constexpr (custom_leaf<E>) {
    f(e.owner);
  } else if constexpr (is_leaf_v<E>) {
  } else {
    for_each_var(e.a, f);
    if constexpr (requires { e.b; }) for_each_var(e.b, f);
    if constexpr (requires { e.c; }) for_each_var(e.c, f);
  }
}

template <class Exec, class E>
auto map_expr(Tape<Exec>& tape, const E& e);

// ag::map's backward step: ONE kernel over the output that writes every input's gradient.
template <class Exec, class E>
struct MapBackwardStep {
  using T = typename E::value_type;
  E e;
  VarNode* out;  // the result; it owns this step
  Shape shape;   // the result's
  void operator()(Exec& exec) const {
    if (!out->grad_valid) return;  // nothing flowed back into this result
    BackwardPlan<Exec> plan{exec, {}, {}, {}, {}};
    MapBackwardKernel<E, T> k{Diff<E>(e, shape, plan), static_cast<const T*>(out->ensure_grad_data()), shape.cols()};
    k.flat = k.diff.flat_ok();
    exec.for_each_element(k.flat ? 1 : shape.rows(), k.flat ? shape.size() : shape.cols(), k, kind::elementwise,
                          exec.stats().recording() ? "backward" + describe_launch(e, exec).substr(5) : "backward",
                          std::size_t(shape.size()) * sizeof(T) * 2);
    plan.finish();
  }
};

// stance::force_eager's form of ag::map: the expression split into one node per kernel, each
// non-leaf child a variable of its own (defined in
// kiln/autograd/map_eager.hpp; KILN_WEAK, KILN_FORCE_EAGER_FORMS).
template <class Exec, class E>
KILN_WEAK var_t<typename E::value_type, typename Exec::space, typename E::extents_type> map_eager(Tape<Exec>& tape,
                                                                                                  const E& e);
}  // namespace detail

// ONE kernel forward and ONE derived kernel backward for the whole expression (force_eager
// tape: one of each per node).
template <class Exec, class X>
auto map(Tape<Exec>& tape, X&& x) {
  auto e = as_expr(std::forward<X>(x));
  static_assert(!detail::has_boundary<decltype(e)>(),
                "kiln: ag::map takes an elementwise expression; compute products and reductions with "
                "ag::matmul / ag::sum first");
  if (tape.force_eager()) return detail::run_eager_form(&detail::map_eager<Exec, decltype(e)>, "ag::map", tape, e);
  return detail::map_expr(tape, e);
}

namespace detail {
// map_expr's body: e's kernel into out_values (e's shape), and its backward recorded on `node`
// (the result's: it owns the step). Called with the erased form of an expression, it is compiled
// once per rank and element types, whatever the sizes.
template <class Exec, class E>
void map_into(Tape<Exec>& tape, const E& e, VarNode& node, typename E::value_type* out_values) {
  using Out = View<typename E::value_type, typename Exec::space, kiln::detail::dyn_extents_t<typename E::extents_type>>;
  assign(Out(out_values, e.shape()), e, tape.exec());
  bool needs_grad = false;
  std::vector<std::shared_ptr<VarNode>> inputs;
  detail::for_each_var(e, [&](const std::shared_ptr<VarNode>& n) {
    needs_grad = needs_grad || n->requires_grad;
    inputs.push_back(n);
  });
  if (!needs_grad || !tape.recording()) return;
  node.requires_grad = true;
  tape.record_node(node, std::move(inputs), MapBackwardStep<Exec, E>{e, &node, e.shape()});
}

template <class Exec, class E>
auto map_expr(Tape<Exec>& tape, const E& e) {
  using Out = var_t<typename E::value_type, typename Exec::space, typename E::extents_type>;
  Out out(typename Out::tensor_type(e.shape()));
  if constexpr (std::is_void_v<erased_expr_t<E>>) map_into(tape, e, *out.data(), out.value().data());
  else map_into(tape, erase_expr(e), *out.data(), out.value().data());
  return out;
}
}  // namespace detail

}  // namespace kiln::ag

#if KILN_FORCE_EAGER_FORMS
#include "kiln/autograd/map_eager.hpp"
#endif
