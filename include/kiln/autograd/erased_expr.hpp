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

// E with every leaf's sizes dynamic (ranks kept), or void when a node has no erased form.
template <class E>
struct erased_expr {
  using type = void;
};
template <class E>
using erased_expr_t = typename erased_expr<E>::type;

template <class T, class S, class Ext>
struct erased_expr<VarLeaf<T, S, Ext>> {
  using type = VarLeaf<T, S, kiln::detail::dyn_extents_t<Ext>>;
};
template <class T, class S, class Ext>
struct erased_expr<View<T, S, Ext>> {
  using type = View<const std::remove_const_t<T>, S, kiln::detail::dyn_extents_t<Ext>>;
};
template <class T>
struct erased_expr<Scalar<T>> {
  using type = Scalar<T>;
};
template <class F, class A>
struct erased_expr<Unary<F, A>> {
  using type = std::conditional_t<std::is_void_v<erased_expr_t<A>>, void, Unary<F, erased_expr_t<A>>>;
};
template <class F, class A, class B>
struct erased_expr<Binary<F, A, B>> {
  using type = std::conditional_t<std::is_void_v<erased_expr_t<A>> || std::is_void_v<erased_expr_t<B>>, void,
                                  Binary<F, erased_expr_t<A>, erased_expr_t<B>>>;
};
template <class F, class A, class B, class C>
struct erased_expr<Ternary<F, A, B, C>> {
  using type = std::conditional_t<
      std::is_void_v<erased_expr_t<A>> || std::is_void_v<erased_expr_t<B>> || std::is_void_v<erased_expr_t<C>>, void,
      Ternary<F, erased_expr_t<A>, erased_expr_t<B>, erased_expr_t<C>>>;
};
template <class To, class A>
struct erased_expr<Cast<To, A>> {
  using type = std::conditional_t<std::is_void_v<erased_expr_t<A>>, void, Cast<To, erased_expr_t<A>>>;
};

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
