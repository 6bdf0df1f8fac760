// kiln/ops/reduce.hpp — sum, mean, max, min, argmax, argmin over all elements or the last axis.
//
// The reduction's input is an expression: its elementwise map is fused into the reduction, so
// `sum(square(x))` reads x once and writes one number.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/expr/assign.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/lower.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/expr/reduce_ops.hpp"

namespace kiln {

// Where to reduce: every element, or the last axis (dropped, or kept with size 1).
enum class reduce_over { all, last_axis, last_axis_keepdim };

namespace detail {
template <class E, reduce_over Over>
struct reduced_extents;
template <index_t... D>
struct reduced_extents<extents<D...>, reduce_over::all> {
  using type = extents<>;
};
template <index_t... D>
struct reduced_extents<extents<D...>, reduce_over::last_axis> {
  static constexpr std::array<index_t, sizeof...(D)> d{D...};
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> extents<d[I]...>;
  using type = decltype(make(std::make_index_sequence<sizeof...(D) - 1>{}));
};
template <index_t... D>
struct reduced_extents<extents<D...>, reduce_over::last_axis_keepdim> {
  static constexpr std::array<index_t, sizeof...(D)> d{D...};
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> extents<(I + 1 == sizeof...(D) ? 1 : d[I])...>;
  using type = decltype(make(std::make_index_sequence<sizeof...(D)>{}));
};
}  // namespace detail

template <class Op, class A, reduce_over Over>
struct Reduce : BoundaryNode {
  static_assert(Over == reduce_over::all || A::extents_type::rank >= 1,
                "kiln: reducing over the last axis needs an operand of rank >= 1");
  using value_type = typename Op::template result_t<value_t<A>>;
  using space = typename A::space;
  using extents_type = typename detail::reduced_extents<typename A::extents_type, Over>::type;
  A a;
  explicit Reduce(A a_) : a(std::move(a_)) {}

  Shape shape() const {
    const Shape in = a.shape();
    if constexpr (Over == reduce_over::all) {
      return Shape{};
    } else {
      Shape s = in;
      if constexpr (Over == reduce_over::last_axis) s.rank -= 1;
      else s[s.rank - 1] = 1;
      return s;
    }
  }

  template <class Stance, class Dst, class Exec>
  void evaluate_into(const Dst& dst, Exec& exec) const {
    KILN_CHECK(dst.is_contiguous(), ShapeError, "a reduction writes a contiguous destination, got shape ",
               dst.shape().str());
    TempList<typename Exec::space> temps;
    auto l = lower<Stance>(a, exec, temps);
    // A whole reduction writes after it has read everything; a per-row one does not.
    if constexpr (Over != reduce_over::all)
      for_each_view(l, [&](const auto& leaf) { detail::check_no_overlap(dst, leaf); });
    const Shape in = l.shape();
    Evaluator<decltype(l)> ev(l, in);
    exec.template reduce<Op>(dst.data(), ev, in.rows(), in.cols(), Over != reduce_over::all);
  }
};

#define KILN_REDUCTION(fname, OpType)                                                   \
  template <reduce_over Over = reduce_over::all, class A>                              \
    requires is_operand_v<A>                                                           \
  auto fname(A&& a) {                                                                  \
    auto ra = as_expr(std::forward<A>(a));                                             \
    return Reduce<OpType, decltype(ra), Over>(ra);                                     \
  }
KILN_REDUCTION(sum, red::Sum)
KILN_REDUCTION(mean, red::Mean)
KILN_REDUCTION(max, red::Max)
KILN_REDUCTION(min, red::Min)
KILN_REDUCTION(argmax, red::ArgMax)
KILN_REDUCTION(argmin, red::ArgMin)
#undef KILN_REDUCTION

}  // namespace kiln
