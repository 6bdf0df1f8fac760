// kiln/ops/matmul.hpp — matmul(a, b): a fusion boundary computed by the executor's GEMM
// (kiln's blocked kernel or a CBLAS on the CPU, cuBLASLt on CUDA).
//
// Operands are 2-D and may be transposed views: a view with unit stride in either dimension is
// passed to GEMM as a (possibly transposed) row-major matrix without a copy. An operand that is
// an expression is computed into a scratch buffer first.
#pragma once

#include <type_traits>

#include "kiln/expr/lower.hpp"
#include "kiln/expr/node.hpp"

namespace kiln {

// A 2-D view as GEMM sees it: row-major (trans = false) or its transpose, with a leading dim.
struct GemmOperand {
  bool trans = false;
  index_t ld = 1;
};

template <class V>
GemmOperand gemm_operand(const V& v, const char* which) {
  const index_t r = v.dim(0), c = v.dim(1);
  if (v.stride(1) == 1 || c == 1) return {false, std::max<index_t>(v.stride(0), std::max<index_t>(c, 1))};
  if (v.stride(0) == 1 || r == 1) return {true, std::max<index_t>(v.stride(1), std::max<index_t>(r, 1))};
  throw ShapeError(detail::concat("matmul: operand ", which, " of shape ", v.shape().str(), " has strides [",
                                  v.stride(0), ", ", v.stride(1),
                                  "]; GEMM needs unit stride in one dimension (copy it first)"));
}

template <class A, class B>
struct MatMul : BoundaryNode {
  static_assert(A::extents_type::rank == 2 && B::extents_type::rank == 2, "kiln: matmul takes two matrices (rank 2)");
  static_assert(A::extents_type::static_dims[1] == dyn || B::extents_type::static_dims[0] == dyn ||
                    A::extents_type::static_dims[1] == B::extents_type::static_dims[0],
                "kiln: matmul(a, b) needs a's columns to equal b's rows (both sizes are in this instantiation)");
  using value_type = std::common_type_t<value_t<A>, value_t<B>>;
  using space = common_space_t<typename A::space, typename B::space>;
  using extents_type = extents<A::extents_type::static_dims[0], B::extents_type::static_dims[1]>;
  A a;
  B b;
  MatMul(A a_, B b_) : a(std::move(a_)), b(std::move(b_)) {}

  Shape shape() const {
    const Shape sa = a.shape(), sb = b.shape();
    KILN_CHECK(sa[1] == sb[0], ShapeError, "matmul: inner sizes differ: a is ", sa.str(), ", b is ", sb.str());
    return Shape{sa[0], sb[1]};
  }

  // dst = alpha * a·b + beta * dst.
  template <class Stance, class Dst, class Exec>
  void evaluate_into(const Dst& dst, Exec& exec, float alpha = 1.f, float beta = 0.f) const {
    const Shape s = shape();
    KILN_CHECK(dst.shape() == s, ShapeError, "matmul: the result has shape ", s.str(), " but the destination is ",
               dst.shape().str());
    TempList<typename Exec::space> temps;
    auto la = as_view<Stance>(a, exec, temps);
    auto lb = as_view<Stance>(b, exec, temps);
    const GemmOperand oa = gemm_operand(la, "a"), ob = gemm_operand(lb, "b"), oc = gemm_operand(dst, "destination");
    KILN_CHECK(!oc.trans || s[0] <= 1 || s[1] <= 1, ShapeError, "matmul: the destination must be row-major");
    exec.gemm(oa.trans, ob.trans, s[0], s[1], sa_cols(), alpha, la.data(), oa.ld, lb.data(), ob.ld, beta, dst.data(),
              oc.ld);
  }

 private:
  index_t sa_cols() const { return a.shape()[1]; }
  template <class Stance, class E, class Exec>
  static auto as_view(const E& e, Exec& exec, TempList<typename Exec::space>& temps) {
    if constexpr (is_view_v<E>) return e;
    else return materialize<Stance>(e, exec, temps);
  }
};

template <class A, class B>
  requires(is_operand_v<A> && is_operand_v<B>)
auto matmul(A&& a, B&& b) {
  auto ra = as_expr(std::forward<A>(a));
  auto rb = as_expr(std::forward<B>(b));
  return MatMul<decltype(ra), decltype(rb)>(ra, rb);
}

}  // namespace kiln
