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

#include "kiln/autograd/diff.hpp"
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
template <class Exec, class E>
auto one_node(Tape<Exec>& tape, const E& e);

// Under a force_eager tape, the node with each non-leaf child first made a variable of its own
// (one kernel forward, one backward each): the expression becomes one node over leaves.
template <class Exec, class E>
auto eager_child(Tape<Exec>& tape, const E& e) {
  if constexpr (is_leaf_v<E>) return e;
  else return to_leaf(map_expr(tape, one_node(tape, e)));
}
template <class Exec, class E>
auto one_node(Tape<Exec>& tape, const E& e) {
  if constexpr (is_leaf_v<E>) {
    return e;
  } else if constexpr (requires { e.c; }) {
    auto a = eager_child(tape, e.a);
    auto b = eager_child(tape, e.b);
    auto c = eager_child(tape, e.c);
    return Ternary<decltype(e.f), decltype(a), decltype(b), decltype(c)>(e.f, a, b, c);
  } else if constexpr (requires { e.b; }) {
    auto a = eager_child(tape, e.a);
    auto b = eager_child(tape, e.b);
    return Binary<decltype(e.f), decltype(a), decltype(b)>(e.f, a, b);
  } else if constexpr (requires { e.f; }) {
    auto a = eager_child(tape, e.a);
    return Unary<decltype(e.f), decltype(a)>(e.f, a);
  } else if constexpr (is_leaf_v<decltype(e.a)>) {  // Cast<To, leaf>: one node
    return e;
  } else {  // Cast<To, node>: the rounding is the store of that node's kernel, not a node of its own
    auto a = one_node(tape, e.a);
    return Cast<typename E::value_type, decltype(a)>(a);
  }
}
}  // namespace detail

// ONE kernel forward and ONE derived kernel backward for the whole expression (force_eager
// tape: one of each per node).
template <class Exec, class X>
auto map(Tape<Exec>& tape, X&& x) {
  auto e = as_expr(std::forward<X>(x));
  static_assert(!detail::has_boundary<decltype(e)>(),
                "kiln: ag::map takes an elementwise expression; compute products and reductions with "
                "ag::matmul / ag::sum first");
  if (tape.force_eager()) return detail::map_expr(tape, detail::one_node(tape, e));
  return detail::map_expr(tape, e);
}

namespace detail {
template <class Exec, class E>
auto map_expr(Tape<Exec>& tape, const E& e) {
  using T = typename E::value_type;
  using Out = var_t<T, typename Exec::space, typename E::extents_type>;
  Out out(typename Out::tensor_type(e.shape()));
  assign(out.value(), e, tape.exec());

  bool needs_grad = false;
  std::vector<std::shared_ptr<VarNode>> inputs;
  detail::for_each_var(e, [&](const std::shared_ptr<VarNode>& n) {
    needs_grad = needs_grad || n->requires_grad;
    inputs.push_back(n);
  });
  if (!needs_grad || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, std::move(inputs), [e](Exec& exec, auto& od) {
    if (!od.grad_valid) return;  // nothing flowed back into this result
    const Shape s = od.value.shape();
    BackwardPlan<Exec> plan{exec, {}, {}, {}, {}};
    MapBackwardKernel<E, T> k{Diff<E>(e, s, plan), od.grad.data(), s.cols()};
    exec.for_each_element(s.rows(), s.cols(), k, kind::elementwise,
                          exec.stats().recording() ? "backward" + describe_launch(e, exec).substr(5) : "backward",
                          std::size_t(s.size()) * sizeof(T) * 2);
    plan.finish();
  });
  return out;
}
}  // namespace detail

}  // namespace kiln::ag
