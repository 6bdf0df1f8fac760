// kiln/core/extents.hpp — static and dynamic extents (mdspan-style) and run-time shapes.
//
// Feature sizes are usually static (template arguments) and the batch is dynamic, as in
// `extents<dyn, 400>`. The run-time `Shape` carries the actual sizes of every dimension.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <string>
#include <utility>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln {

// Marks a dimension whose size is known only at run time.
inline constexpr index_t dyn = -1;

// Tensors have rank 0 (a scalar) to 4.
inline constexpr int max_rank = 4;

// The run-time sizes of a tensor or expression.
struct Shape {
  int rank = 0;
  std::array<index_t, max_rank> dims{};

  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<index_t> d) {
    KILN_CHECK(d.size() <= std::size_t(max_rank), ShapeError, "kiln supports rank <= ", max_rank,
               ", got rank ", d.size());
    for (index_t v : d) dims[std::size_t(rank++)] = v;
  }

  constexpr index_t operator[](int i) const { return dims[std::size_t(i)]; }
  constexpr index_t& operator[](int i) { return dims[std::size_t(i)]; }

  constexpr index_t size() const {
    index_t n = 1;
    // rank <= max_rank always; saying so keeps GCC's -Wmaybe-uninitialized from imagining dims[4]
    // where a tensor's destructor computes its size.
    for (int i = 0; i < rank && i < max_rank; ++i) n *= dims[std::size_t(i)];
    return n;
  }
  // The 2-D fold every elementwise kernel iterates over: all leading dims are rows.
  constexpr index_t cols() const { return rank == 0 ? 1 : dims[std::size_t(rank - 1)]; }
  // The product of the leading dimensions (also when the last one is 0: rows of length zero
  // are still rows, and a reduction over the last axis writes one result for each).
  constexpr index_t rows() const {
    index_t r = 1;
    for (int i = 0; i + 1 < rank; ++i) r *= dims[std::size_t(i)];
    return r;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.dims[std::size_t(i)] != b.dims[std::size_t(i)]) return false;
    return true;
  }

  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) {
      if (i) s += ", ";
      s += std::to_string(dims[std::size_t(i)]);
    }
    return s + "]";
  }
};

inline std::ostream& operator<<(std::ostream& out, const Shape& s) { return out << s.str(); }

// NumPy's broadcasting rule (right-aligned; a size-1 dim stretches). Throws naming both shapes.
inline Shape broadcast_shapes(const Shape& a, const Shape& b) {
  Shape r;
  r.rank = a.rank > b.rank ? a.rank : b.rank;
  for (int i = 0; i < r.rank; ++i) {
    const int ia = a.rank - r.rank + i, ib = b.rank - r.rank + i;
    const index_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    KILN_CHECK(da == db || da == 1 || db == 1, ShapeError, "shapes ", a.str(), " and ", b.str(),
               " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

// Static extents: each entry is a size or `dyn`.
template <index_t... Dims>
struct extents {
  static constexpr int rank = int(sizeof...(Dims));
  static_assert(rank <= max_rank, "kiln tensors have rank 0 to 4");
  static_assert(((Dims == dyn || Dims >= 0) && ...),
                "an extent must be a non-negative size or kiln::dyn");
  static constexpr std::array<index_t, sizeof...(Dims)> static_dims{Dims...};
  static constexpr bool all_static = ((Dims != dyn) && ...);

  // Checks run-time sizes against the static ones; returns them as a Shape.
  static Shape make_shape(std::array<index_t, sizeof...(Dims)> dims) {
    Shape s;
    s.rank = rank;
    for (int i = 0; i < rank; ++i) {
      const index_t want = static_dims[std::size_t(i)], got = dims[std::size_t(i)];
      KILN_CHECK(got >= 0, ShapeError, "dimension ", i, " has negative size ", got);
      KILN_CHECK(want == dyn || want == got, ShapeError, "dimension ", i, " is static ", want,
                 " but the run-time size is ", got);
      s[i] = got;
    }
    return s;
  }
  // The default shape: static sizes filled in, dynamic ones zero.
  static Shape default_shape() {
    std::array<index_t, sizeof...(Dims)> d{};
    for (int i = 0; i < rank; ++i) d[std::size_t(i)] = static_dims[std::size_t(i)] == dyn ? 0 : static_dims[std::size_t(i)];
    return make_shape(d);
  }
};

namespace detail {

template <class E, std::size_t... I>
constexpr auto extents_from(std::index_sequence<I...>) {
  return extents<E::value[I]...>{};
}
template <std::array A>
struct array_holder {
  static constexpr auto value = A;
};

template <class A, class B>
struct broadcast_static_dims {
  static constexpr int rank = A::rank > B::rank ? A::rank : B::rank;
  static constexpr index_t at(const auto& d, int r, int i) {
    const int k = r - rank + i;
    return k >= 0 ? d[std::size_t(k)] : 1;
  }
  static constexpr bool compatible() {
    for (int i = 0; i < rank; ++i) {
      const index_t a = at(A::static_dims, A::rank, i), b = at(B::static_dims, B::rank, i);
      if (a != dyn && b != dyn && a != b && a != 1 && b != 1) return false;
    }
    return true;
  }
  static constexpr std::array<index_t, std::size_t(rank)> dims() {
    std::array<index_t, std::size_t(rank)> r{};
    for (int i = 0; i < rank; ++i) {
      const index_t a = at(A::static_dims, A::rank, i), b = at(B::static_dims, B::rank, i);
      if (a == dyn && b == dyn) r[std::size_t(i)] = dyn;
      else if (a == dyn) r[std::size_t(i)] = b == 1 ? dyn : b;
      else if (b == dyn) r[std::size_t(i)] = a == 1 ? dyn : a;
      else r[std::size_t(i)] = a == 1 ? b : a;
    }
    return r;
  }
};

}  // namespace detail

// The static extents of `a op b`. Two static sizes that differ (neither 1) are a compile error;
// the instantiation in the compiler's message shows both extents.
template <class A, class B>
struct broadcast_extents {
  static_assert(detail::broadcast_static_dims<A, B>::compatible(),
                "kiln: the operands' static extents differ and neither is 1, so they cannot be "
                "broadcast together (both extents are named in this instantiation)");
  using type = decltype(detail::extents_from<detail::array_holder<detail::broadcast_static_dims<A, B>::dims()>>(
      std::make_index_sequence<std::size_t(detail::broadcast_static_dims<A, B>::rank)>{}));
};
template <class A, class B>
using broadcast_extents_t = typename broadcast_extents<A, B>::type;

template <class E>
inline constexpr bool is_extents_v = false;
template <index_t... D>
inline constexpr bool is_extents_v<extents<D...>> = true;

}  // namespace kiln
