// kiln/expr/lower.hpp — fusion boundaries: nodes that cannot run inside an elementwise kernel
// (GEMM, reductions, ...) are computed into scratch buffers first and then read as leaves.
//
// Under stance::force_eager every elementwise node is materialised too, one kernel each, which
// is the baseline fused results and launch counts are compared against.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/temp_pool.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln {

// Base of nodes that are evaluated by their own routine, not by an Evaluator. Such a node
// provides `evaluate_into<Stance>(dst_view, exec)`.
struct BoundaryNode : ExprNode {};

template <class X>
inline constexpr bool is_boundary_v = std::is_base_of_v<BoundaryNode, X>;

// Scratch buffers that must outlive one assignment.
template <class Space>
using TempList = std::vector<typename TempPool<Space>::Buffer>;

template <class Stance, class E, class Exec>
auto lower(const E& e, Exec& exec, TempList<typename Exec::space>& temps);

// Computes `node` into a fresh scratch buffer and returns a const view of it.
template <class Stance, class E, class Exec>
auto materialize(const E& node, Exec& exec, TempList<typename Exec::space>& temps) {
  using T = typename E::value_type;
  using S = typename Exec::space;
  const Shape shape = node.shape();
  auto buf = exec.temps().take(std::size_t(shape.size()) * sizeof(T));
  View<T, S, typename E::extents_type> v(static_cast<T*>(buf.get()), shape);
  temps.push_back(std::move(buf));
  if constexpr (is_boundary_v<E>) {
    node.template evaluate_into<Stance>(v, exec);
  } else {
    exec.elementwise(v, Evaluator<E>(node, shape), describe_launch(node, exec));
  }
  return View<const T, S, typename E::extents_type>(v);
}

// The node with its children lowered; the node itself is kept (it becomes the kernel's root).
template <class Stance, class E, class Exec>
auto lower_children(const E& e, Exec& exec, TempList<typename Exec::space>& temps) {
  if constexpr (is_leaf_v<E>) {
    return e;
  } else if constexpr (requires { e.c; }) {
    auto a = lower<Stance>(e.a, exec, temps);
    auto b = lower<Stance>(e.b, exec, temps);
    auto c = lower<Stance>(e.c, exec, temps);
    return Ternary<std::remove_cvref_t<decltype(e.f)>, decltype(a), decltype(b), decltype(c)>(e.f, a, b, c);
  } else if constexpr (requires { e.b; }) {
    auto a = lower<Stance>(e.a, exec, temps);
    auto b = lower<Stance>(e.b, exec, temps);
    return Binary<std::remove_cvref_t<decltype(e.f)>, decltype(a), decltype(b)>(e.f, a, b);
  } else if constexpr (requires { e.f; }) {
    auto a = lower<Stance>(e.a, exec, temps);
    return Unary<std::remove_cvref_t<decltype(e.f)>, decltype(a)>(e.f, a);
  } else {
    auto a = lower<Stance>(e.a, exec, temps);
    return Cast<typename E::value_type, decltype(a)>(a);
  }
}

template <class Stance, class E, class Exec>
auto lower(const E& e, Exec& exec, TempList<typename Exec::space>& temps) {
  if constexpr (is_leaf_v<E>) {
    return e;
  } else if constexpr (is_boundary_v<E>) {
    return materialize<Stance>(e, exec, temps);
  } else if constexpr (std::is_same_v<Stance, stance::force_eager>) {
    return materialize<Stance>(lower_children<Stance>(e, exec, temps), exec, temps);
  } else {
    return lower_children<Stance>(e, exec, temps);
  }
}

// Calls f(view) for every view leaf of an (already lowered) expression.
template <class E, class F>
void for_each_view(const E& e, F&& f) {
  if constexpr (is_view_v<E>) {
    f(e);
  } else if constexpr (custom_leaf<E>) {
    f(e.view);
  } else if constexpr (is_scalar_leaf_v<E>) {
  } else {
    for_each_view(e.a, f);
    if constexpr (requires { e.b; }) for_each_view(e.b, f);
    if constexpr (requires { e.c; }) for_each_view(e.c, f);
  }
}

// "fused[mul,add,max]": the functors a kernel runs, in evaluation order.
template <class E>
void describe_ops(const E& e, std::string& out) {
  if constexpr (is_leaf_v<E>) {
  } else {
    describe_ops(e.a, out);
    if constexpr (requires { e.b; }) describe_ops(e.b, out);
    if constexpr (requires { e.c; }) describe_ops(e.c, out);
    if (!out.empty() && out.back() != '[') out += ',';
    if constexpr (requires { e.f; }) out += std::remove_cvref_t<decltype(e.f)>::name;
    else out += "cast";
  }
}

// The launch name, built only when the executor records launches (it costs an allocation).
template <class E, class Exec>
std::string describe_launch(const E& e, const Exec& exec) {
  if (!exec.stats().recording()) return "elementwise";
  std::string s = "fused[";
  describe_ops(e, s);
  return s + "]";
}

}  // namespace kiln
