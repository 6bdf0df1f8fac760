// kiln/expr/node.hpp — expression nodes: pure data (children by value and a functor).
//
// Nothing is computed when a node is built; `assign` (kiln/expr/assign.hpp) evaluates it.
// Leaves are views and scalars; tensors enter expressions as const views of themselves.
#pragma once

#include <type_traits>
#include <utility>

#include "kiln/core/dtype.hpp"
#include "kiln/core/extents.hpp"
#include "kiln/core/space.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/view.hpp"

namespace kiln {

// Base of every non-leaf node, so operators can recognise kiln expressions.
struct ExprNode {};

// A scalar leaf. It has no memory space: it fits in an expression of either space.
template <class T>
struct Scalar {
  using value_type = T;
  using space = void;
  using extents_type = extents<>;
  T value;
  Shape shape() const { return Shape{}; }
};

// ---- traits --------------------------------------------------------------------------------
template <class X>
inline constexpr bool is_scalar_leaf_v = false;
template <class T>
inline constexpr bool is_scalar_leaf_v<Scalar<T>> = true;

template <class X>
inline constexpr bool is_node_v = std::is_base_of_v<ExprNode, X>;

// Leaf types other than views and scalars (autograd's variables) declare `is_leaf_node`.
template <class X>
concept custom_leaf = requires { X::is_leaf_node; };

template <class X>
inline constexpr bool is_leaf_v = is_view_v<X> || is_scalar_leaf_v<X> || custom_leaf<X>;

// Anything `assign` can evaluate: a node, a view or a scalar leaf.
template <class X>
inline constexpr bool is_expr_v = is_node_v<X> || is_leaf_v<X>;

// What may appear as an operand of a kiln operator: an expression or a tensor.
// Types that become leaves through `to_leaf(x)` found by ADL (autograd variables) say so here.
template <class X>
concept leaf_convertible = requires(const X& x) { to_leaf(x); };

template <class X>
inline constexpr bool is_operand_v = is_expr_v<std::remove_cvref_t<X>> || is_tensor_v<std::remove_cvref_t<X>> ||
                                     leaf_convertible<std::remove_cvref_t<X>>;

// The type an expression computes in (half types compute in float).
template <class E>
using value_t = compute_t<typename E::value_type>;

// The space two operands share; a scalar (void) fits either. Mixing host and cuda is an error
// with a sentence: it is how a model "silently runs on the CPU" in other libraries.
template <class A, class B>
struct common_space {
  static_assert(std::is_void_v<A> || std::is_void_v<B> || std::is_same_v<A, B>,
                "kiln: a host tensor and a cuda tensor meet in one expression; move one of them "
                "first with kiln::to_device(tensor, exec) or kiln::to_host(tensor, exec)");
  using type = std::conditional_t<std::is_void_v<A>, B, A>;
};
template <class A, class B>
using common_space_t = typename common_space<A, B>::type;

// ---- nodes ---------------------------------------------------------------------------------
template <class F, class A>
struct Unary : ExprNode {
  using value_type = value_t<A>;
  using space = typename A::space;
  using extents_type = typename A::extents_type;
  F f;
  A a;
  Unary(F f_, A a_) : f(f_), a(std::move(a_)) {}
  Shape shape() const { return a.shape(); }
};

template <class F, class A, class B>
struct Binary : ExprNode {
  using value_type = std::common_type_t<value_t<A>, value_t<B>>;
  using space = common_space_t<typename A::space, typename B::space>;
  using extents_type = broadcast_extents_t<typename A::extents_type, typename B::extents_type>;
  F f;
  A a;
  B b;
  Binary(F f_, A a_, B b_) : f(f_), a(std::move(a_)), b(std::move(b_)) {}
  Shape shape() const { return broadcast_shapes(a.shape(), b.shape()); }
};

template <class F, class A, class B, class C>
struct Ternary : ExprNode {
  using value_type = std::common_type_t<value_t<A>, value_t<B>, value_t<C>>;
  using space = common_space_t<common_space_t<typename A::space, typename B::space>, typename C::space>;
  using extents_type = broadcast_extents_t<broadcast_extents_t<typename A::extents_type, typename B::extents_type>,
                                           typename C::extents_type>;
  F f;
  A a;
  B b;
  C c;
  Ternary(F f_, A a_, B b_, C c_) : f(f_), a(std::move(a_)), b(std::move(b_)), c(std::move(c_)) {}
  Shape shape() const { return broadcast_shapes(broadcast_shapes(a.shape(), b.shape()), c.shape()); }
};

// Converts to To's type (rounding through it, so cast<f16>(x) really loses f16's precision).
template <class To, class A>
struct Cast : ExprNode {
  using value_type = To;
  using space = typename A::space;
  using extents_type = typename A::extents_type;
  A a;
  explicit Cast(A a_) : a(std::move(a_)) {}
  Shape shape() const { return a.shape(); }
};

// ---- turning operands into leaves ----------------------------------------------------------
template <class X>
decltype(auto) as_expr(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_tensor_v<D>) {
    return typename D::const_view_type(std::as_const(x).view());
  } else if constexpr (leaf_convertible<D>) {
    return to_leaf(x);
  } else {
    return D(std::forward<X>(x));
  }
}
template <class X>
using expr_t = std::remove_cvref_t<decltype(as_expr(std::declval<X>()))>;

// An arithmetic operand becomes a scalar of the other operand's compute type.
template <class Other, class X>
auto as_operand(X&& x) {
  if constexpr (std::is_arithmetic_v<std::remove_cvref_t<X>>) {
    return Scalar<value_t<expr_t<Other>>>{value_t<expr_t<Other>>(x)};
  } else {
    return as_expr(std::forward<X>(x));
  }
}

template <class A, class B>
concept binary_operands =
    (is_operand_v<A> && is_operand_v<B>) || (is_operand_v<A> && std::is_arithmetic_v<std::remove_cvref_t<B>>) ||
    (std::is_arithmetic_v<std::remove_cvref_t<A>> && is_operand_v<B>);

template <class F, class A, class B>
auto make_binary(F f, A&& a, B&& b) {
  if constexpr (std::is_arithmetic_v<std::remove_cvref_t<A>>) {
    auto rb = as_expr(std::forward<B>(b));
    return Binary<F, Scalar<value_t<decltype(rb)>>, decltype(rb)>(f, Scalar<value_t<decltype(rb)>>{value_t<decltype(rb)>(a)}, rb);
  } else {
    auto ra = as_expr(std::forward<A>(a));
    auto rb = as_operand<A>(std::forward<B>(b));
    return Binary<F, decltype(ra), decltype(rb)>(f, ra, rb);
  }
}

template <class F, class A>
auto make_unary(F f, A&& a) {
  auto ra = as_expr(std::forward<A>(a));
  return Unary<F, decltype(ra)>(f, ra);
}

}  // namespace kiln
