// kiln/autograd/map_eager.hpp — stance::force_eager's form of ag::map (kiln/force_eager.hpp):
// the expression split into one node per kernel, each non-leaf child a variable of its own.
// Included by kiln/autograd/map.hpp unless KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include "kiln/autograd/map.hpp"

namespace kiln::ag::detail {

template <class Exec, class E>
auto one_node(Tape<Exec>& tape, const E& e);

// The node with each non-leaf child first made a variable of its own (one kernel forward, one
// backward each): the expression becomes one node over leaves.
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

template <class Exec, class E>
var_t<typename E::value_type, typename Exec::space, typename E::extents_type> map_eager(Tape<Exec>& tape,
                                                                                        const E& e) {
  return map_expr(tape, one_node(tape, e));
}

}  // namespace kiln::ag::detail
