// kiln/expr/evaluator.hpp — evaluators compute one element of an expression.
//
// Every elementwise kernel walks its destination as a 2-D fold [rows, cols] (all leading
// dimensions are rows). A leaf maps (r, c) to memory through a row and a column stride; a
// stride of 0 is how broadcasting works (scalar, a row vector over rows, a column over columns).
// `flat(i)` is the fast path for when every leaf is contiguous and full-size: the CPU
// executor's loop over it vectorises. Evaluators are trivially copyable, so CUDA kernels take
// them by value.
#pragma once

#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/expr/node.hpp"

namespace kiln {

template <class E>
class Evaluator;

// Leaf strides that reproduce `leaf` broadcast to `dst` in the 2-D fold, or a ShapeError.
struct LeafStrides {
  index_t rs = 0, cs = 0;
  bool flat = false;
};

inline LeafStrides fold_strides(const Shape& leaf, const std::array<index_t, max_rank>& st, bool contiguous,
                               const Shape& dst) {
  KILN_CHECK(leaf.rank <= dst.rank && broadcast_shapes(leaf, dst) == dst, ShapeError, "an operand of shape ",
             leaf.str(), " cannot be broadcast to the destination shape ", dst.str());
  LeafStrides r;
  const int off = dst.rank - leaf.rank;
  // Column (last) dimension: a size-1 leaf dimension repeats, so its stride is 0.
  const index_t lc = leaf.rank > 0 ? leaf[leaf.rank - 1] : 1;
  r.cs = lc == 1 ? 0 : st[std::size_t(leaf.rank - 1)];
  // Leading dimensions collapse into rows: either all of the leaf's are 1 (broadcast over rows)
  // or all equal the destination's and are laid out so that one stride walks them.
  bool all_one = true, all_equal = true;
  for (int i = 0; i + 1 < dst.rank; ++i) {
    const int k = i - off;
    const index_t d = k >= 0 ? leaf[k] : 1;
    all_one = all_one && d == 1;
    all_equal = all_equal && d == dst[i];
  }
  if (all_one) {
    r.rs = 0;
  } else {
    KILN_CHECK(all_equal, ShapeError, "broadcasting shape ", leaf.str(), " to ", dst.str(),
               " needs a stride per leading dimension; kiln's evaluators broadcast only a "
               "scalar, a row over rows or a column over columns");
    index_t expect = -1;
    for (int i = dst.rank - 2; i >= 0; --i) {
      const int k = i - off;
      if (leaf[k] == 1) continue;
      if (expect < 0) {
        r.rs = st[std::size_t(k)];
      } else {
        KILN_CHECK(st[std::size_t(k)] == expect, ShapeError, "the leading dimensions of a view of shape ",
                   leaf.str(), " are not evenly strided; copy it to a contiguous tensor first");
      }
      expect = st[std::size_t(k)] * leaf[k];
    }
  }
  // A rank-0 view broadcast to a larger destination is not flat: p[i] would run past it.
  r.flat = leaf.size() == dst.size() && contiguous;
  return r;
}

template <class T, class S, class Ext>
class Evaluator<View<T, S, Ext>> {
 public:
  using value_type = compute_t<std::remove_const_t<T>>;
  Evaluator(const View<T, S, Ext>& v, const Shape& dst) : p_(v.data()) {
    const LeafStrides l = fold_strides(v.shape(), v.strides(), v.is_contiguous(), dst);
    rs_ = l.rs;
    cs_ = l.cs;
    flat_ = l.flat;
  }
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const { return convert<value_type>(p_[r * rs_ + c * cs_]); }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return convert<value_type>(p_[i]); }
  bool flat_ok() const { return flat_; }

 private:
  const std::remove_const_t<T>* p_;
  index_t rs_, cs_;
  bool flat_;
};

template <class T>
class Evaluator<Scalar<T>> {
 public:
  using value_type = compute_t<T>;
  Evaluator(const Scalar<T>& s, const Shape&) : v_(convert<value_type>(s.value)) {}
  KILN_HOST_DEVICE value_type at(index_t, index_t) const { return v_; }
  KILN_HOST_DEVICE value_type flat(index_t) const { return v_; }
  bool flat_ok() const { return true; }

 private:
  value_type v_;
};

template <class F, class A>
class Evaluator<Unary<F, A>> {
 public:
  using value_type = typename Unary<F, A>::value_type;
  Evaluator(const Unary<F, A>& n, const Shape& dst) : f_(n.f), a_(n.a, dst) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const { return f_(value_type(a_.at(r, c))); }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return f_(value_type(a_.flat(i))); }
  bool flat_ok() const { return a_.flat_ok(); }

 private:
  F f_;
  Evaluator<A> a_;
};

template <class F, class A, class B>
class Evaluator<Binary<F, A, B>> {
 public:
  using value_type = typename Binary<F, A, B>::value_type;
  Evaluator(const Binary<F, A, B>& n, const Shape& dst) : f_(n.f), a_(n.a, dst), b_(n.b, dst) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const {
    return f_(value_type(a_.at(r, c)), value_type(b_.at(r, c)));
  }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return f_(value_type(a_.flat(i)), value_type(b_.flat(i))); }
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok(); }

 private:
  F f_;
  Evaluator<A> a_;
  Evaluator<B> b_;
};

template <class F, class A, class B, class C>
class Evaluator<Ternary<F, A, B, C>> {
 public:
  using value_type = typename Ternary<F, A, B, C>::value_type;
  Evaluator(const Ternary<F, A, B, C>& n, const Shape& dst) : f_(n.f), a_(n.a, dst), b_(n.b, dst), c_(n.c, dst) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const {
    return f_(value_type(a_.at(r, c)), value_type(b_.at(r, c)), value_type(c_.at(r, c)));
  }
  KILN_HOST_DEVICE value_type flat(index_t i) const {
    return f_(value_type(a_.flat(i)), value_type(b_.flat(i)), value_type(c_.flat(i)));
  }
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok() && c_.flat_ok(); }

 private:
  F f_;
  Evaluator<A> a_;
  Evaluator<B> b_;
  Evaluator<C> c_;
};

template <class To, class A>
class Evaluator<Cast<To, A>> {
 public:
  using value_type = compute_t<To>;
  Evaluator(const Cast<To, A>& n, const Shape& dst) : a_(n.a, dst) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const { return round(a_.at(r, c)); }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return round(a_.flat(i)); }
  bool flat_ok() const { return a_.flat_ok(); }

 private:
  template <class V>
  KILN_HOST_DEVICE static value_type round(V v) {
    return convert<value_type>(convert<To>(v));
  }
  Evaluator<A> a_;
};

}  // namespace kiln
