// kiln/expr/assign.hpp — `assign(dst, expr, exec)`: evaluates an expression into a tensor.
//
// Under stance::fused (the default) an elementwise expression runs as ONE kernel. In-place
// updates (`x = x * 2 + y`) are allowed because each element is read before it is written at
// the same index; any other overlap between the destination and an operand would read data
// already overwritten, and is an AliasError.
#pragma once

#include <algorithm>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/lower.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln {

namespace detail {

// A view as the alias checks see it: its elements' address, size, shape and strides. The checks
// are compiled once, not once per pair of view types.
struct AliasOperand {
  const void* data;
  std::size_t element_bytes;
  const Shape& shape;
  const std::array<index_t, max_rank>& strides;
  template <class V>
  static AliasOperand of(const V& v) {
    return {v.data(), sizeof(typename V::value_type), v.shape(), v.strides()};
  }
  // The byte range [lo, hi) the view can touch.
  std::pair<const char*, const char*> byte_range() const {
    if (shape.size() == 0) return {nullptr, nullptr};
    index_t lo = 0, hi = 0;
    for (int i = 0; i < shape.rank; ++i) {
      const index_t ext = (shape[i] - 1) * strides[std::size_t(i)];
      (ext < 0 ? lo : hi) += ext;
    }
    auto base = static_cast<const char*>(data);
    const auto bytes = index_t(element_bytes);
    return {base + lo * bytes, base + (hi + 1) * bytes};
  }
};

[[gnu::noinline]] inline void check_alias_operands(const AliasOperand& dst, const AliasOperand& leaf) {
  const auto [dl, dh] = dst.byte_range();
  const auto [ll, lh] = leaf.byte_range();
  if (dl == nullptr || ll == nullptr || lh <= dl || dh <= ll) return;
  const bool same_walk = leaf.data == dst.data && leaf.element_bytes == dst.element_bytes &&
                         leaf.shape == dst.shape && leaf.strides == dst.strides;
  KILN_CHECK(same_walk, AliasError, "the destination (shape ", dst.shape.str(), ") overlaps an operand of shape ",
             leaf.shape.str(), " that it does not match element for element; evaluating in place would read values "
             "already overwritten: assign into a separate tensor");
}

// An overlap the kernel cannot survive: dst touches leaf's elements other than element for
// element (an in-place update reads each element before writing it, so it is fine).
template <class D, class V>
void check_alias(const D& dst, const V& leaf) {
  check_alias_operands(AliasOperand::of(dst), AliasOperand::of(leaf));
}

[[gnu::noinline]] inline void check_no_overlap_operands(const AliasOperand& dst, const AliasOperand& leaf) {
  const auto [dl, dh] = dst.byte_range();
  const auto [ll, lh] = leaf.byte_range();
  KILN_CHECK(dl == nullptr || ll == nullptr || lh <= dl || dh <= ll, AliasError, "the destination (shape ",
             dst.shape.str(), ") of a reduction overlaps its operand of shape ", leaf.shape.str(),
             "; rows written first would be read again: reduce into a separate tensor");
}

// For kernels that write an element before they have read every input element at other
// positions (reductions over the last axis write row r, then read row r + 1): any overlap.
template <class D, class V>
void check_no_overlap(const D& dst, const V& leaf) {
  check_no_overlap_operands(AliasOperand::of(dst), AliasOperand::of(leaf));
}

template <class X>
auto as_dst_view(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_tensor_v<D>) {
    static_assert(!std::is_const_v<std::remove_reference_t<X>>, "kiln: the destination of an assignment is const");
    return x.view();
  } else {
    static_assert(is_view_v<D>, "kiln: the destination of an assignment must be a Tensor or a View");
    static_assert(!std::is_const_v<typename D::element_type>,
                  "kiln: the destination of an assignment is a view of const elements");
    return x;
  }
}

}  // namespace detail

template <class Stance = stance::fused, class Dst, class Src, class Exec>
void assign(Dst&& dst, Src&& src, Exec& exec) {
  static_assert(stance::is_stance_v<Stance>, "kiln: assign's template argument must be a stance (kiln::stance::fused or kiln::stance::force_eager)");
  auto d = detail::as_dst_view(dst);
  using D = decltype(d);
  auto e = [&] {
    if constexpr (std::is_arithmetic_v<std::remove_cvref_t<Src>>) {
      return Scalar<compute_t<typename D::value_type>>{compute_t<typename D::value_type>(src)};
    } else {
      return as_expr(std::forward<Src>(src));
    }
  }();
  using E = decltype(e);
  static_assert(std::is_same_v<typename D::space, typename Exec::space>,
                "kiln: the executor runs in a different memory space than the destination tensor");
  // An expression in another memory space than the destination fails inside common_space, whose
  // static_assert names the fix; with the destination in the executor's space (checked above),
  // nothing else can differ.
  (void)sizeof(common_space<typename D::space, typename E::space>);
  using Checked = broadcast_extents_t<typename D::extents_type, typename E::extents_type>;
  (void)sizeof(Checked);

  TempList<typename Exec::space> temps;
  if constexpr (is_boundary_v<E>) {
    KILN_CHECK(e.shape() == d.shape(), ShapeError, "cannot assign a result of shape ", e.shape().str(),
               " to a tensor of shape ", d.shape().str());
    e.template evaluate_into<Stance>(d, exec);
  } else {
    auto l = lower_children<Stance>(e, exec, temps);
    KILN_CHECK(broadcast_shapes(l.shape(), d.shape()) == d.shape(), ShapeError, "cannot assign an expression of shape ",
               l.shape().str(), " to a tensor of shape ", d.shape().str());
    for_each_view(l, [&](const auto& leaf) { detail::check_alias(d, leaf); });
    exec.elementwise(d, Evaluator<decltype(l)>(l, d.shape()), describe_launch(l, exec));
  }
}

}  // namespace kiln
