// kiln/autograd/erased_expr.hpp — an autograd expression with its leaves' static sizes dropped.
//
// A backward kernel compiled per expression type is compiled again for every static size its
// variables carry: the ReLU of a 256-wide layer and of a 128-wide one are two kernels of the same
// code, and a bias add per width the same. ag::map's backward runs the erased form instead
// (expr/evaluator.hpp does the same for forward kernels): one instantiation per rank and element
// types, whatever the sizes. The sizes were checked when the expression was built.
#pragma once

#include <type_traits>

#include "kiln/autograd/var.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/node.hpp"

namespace kiln::ag::detail {

// A leaf with its sizes dropped: a variable stays a variable (its backward writes the gradient);
// views and scalars as the forward's erased form has them.
template <class E>
struct erased_ag_leaf : kiln::detail::erased_leaf<E> {};
template <class T, class S, class Ext>
struct erased_ag_leaf<VarLeaf<T, S, Ext>> {
  using type = VarLeaf<T, S, kiln::detail::dyn_extents_t<Ext>>;
};

// E with every leaf's sizes dynamic (ranks kept), or void when a node has no erased form.
template <class E>
using erased_expr_t = kiln::detail::map_leaves_t<E, erased_ag_leaf>;

// The erased form's value (requires: erased_expr_t<E> is not void).
template <class E>
erased_expr_t<E> erase_expr(const E& e) {
  using Out = erased_expr_t<E>;
  if constexpr (is_view_v<E>) return Out(e.data(), e.shape(), e.strides());
  else if constexpr (is_scalar_leaf_v<E>) return e;
  else if constexpr (custom_leaf<E>) return Out{erase_expr(e.view), e.owner};  // a VarLeaf
  else if constexpr (requires { e.c; }) return Out(e.f, erase_expr(e.a), erase_expr(e.b), erase_expr(e.c));
  else if constexpr (requires { e.b; }) return Out(e.f, erase_expr(e.a), erase_expr(e.b));
  else if constexpr (requires { e.f; }) return Out(e.f, erase_expr(e.a));
  else return Out(erase_expr(e.a));  // a cast
}

}  // namespace kiln::ag::detail
