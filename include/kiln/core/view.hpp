// kiln/core/view.hpp — a non-owning, possibly strided window on a tensor's memory.
//
// Views are trivially copyable so kernels can take them by value. Strides are in elements.
#pragma once

#include <array>
#include <type_traits>
#include <utility>

#include "kiln/config.hpp"
#include "kiln/core/extents.hpp"
#include "kiln/core/space.hpp"

namespace kiln {

template <class T, class Space, class Ext>
class View {
 public:
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  using space = Space;
  using extents_type = Ext;
  static constexpr int rank = Ext::rank;

  View() = default;
  // A contiguous row-major view of `shape` at `data`.
  View(T* data, const Shape& shape) : data_(data), shape_(shape) {
    check_rank(shape);
    index_t s = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides_[std::size_t(i)] = s;
      s *= shape[i];
    }
  }
  View(T* data, const Shape& shape, const std::array<index_t, max_rank>& strides)
      : data_(data), shape_(shape), strides_(strides) {
    check_rank(shape);
  }

  // A view of non-const elements converts to a view of const ones.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  View(const View<U, Space, Ext>& v) : data_(v.data()), shape_(v.shape()), strides_(v.strides()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  index_t dim(int i) const { return shape_[i]; }
  index_t size() const { return shape_.size(); }
  const std::array<index_t, max_rank>& strides() const { return strides_; }
  index_t stride(int i) const { return strides_[std::size_t(i)]; }

  bool is_contiguous() const {
    index_t s = 1;
    for (int i = rank - 1; i >= 0; --i) {
      if (shape_[i] != 1 && strides_[std::size_t(i)] != s) return false;
      s *= shape_[i];
    }
    return true;
  }

  // Element access for host code (tests, small loops); kernels use evaluators.
  template <class... I>
    requires(sizeof...(I) == std::size_t(Ext::rank))
  T& operator()(I... idx) const {
    const std::array<index_t, sizeof...(I)> ix{index_t(idx)...};
    index_t off = 0;
    for (std::size_t d = 0; d < ix.size(); ++d) off += ix[d] * strides_[d];
    return data_[off];
  }

 private:
  static void check_rank(const Shape& s) {
    KILN_CHECK(s.rank == rank, ShapeError, "a rank-", rank, " view cannot have shape ", s.str());
  }
  T* data_ = nullptr;
  Shape shape_{};
  std::array<index_t, max_rank> strides_{};
};

template <class V>
inline constexpr bool is_view_v = false;
template <class T, class S, class E>
inline constexpr bool is_view_v<View<T, S, E>> = true;

namespace detail {
template <class E, class I>
struct swap_last_two;
template <index_t... D, std::size_t... I>
struct swap_last_two<extents<D...>, std::index_sequence<I...>> {
  static constexpr std::array<index_t, sizeof...(D)> d{D...};
  static constexpr std::size_t r = sizeof...(D);
  static constexpr std::size_t from(std::size_t i) { return i == r - 2 ? r - 1 : (i == r - 1 ? r - 2 : i); }
  using type = extents<d[from(I)]...>;
};
}  // namespace detail

// The transpose of the last two dimensions (no copy): a non-contiguous view.
template <class T, class S, index_t... D>
  requires(sizeof...(D) >= 2)
auto transpose(const View<T, S, extents<D...>>& v) {
  constexpr int r = int(sizeof...(D));
  using E = typename detail::swap_last_two<extents<D...>, std::make_index_sequence<sizeof...(D)>>::type;
  Shape s = v.shape();
  auto st = v.strides();
  std::swap(s[r - 2], s[r - 1]);
  std::swap(st[std::size_t(r - 2)], st[std::size_t(r - 1)]);
  return View<T, S, E>(v.data(), s, st);
}

// Columns [begin, end) of a matrix view: keeps the row stride, so the result is strided.
template <class T, class S, index_t R, index_t C>
View<T, S, extents<R, dyn>> columns(const View<T, S, extents<R, C>>& v, index_t begin, index_t end) {
  KILN_CHECK(0 <= begin && begin <= end && end <= v.dim(1), ShapeError, "columns [", begin, ", ", end,
             ") out of range for shape ", v.shape().str());
  Shape s{v.dim(0), end - begin};
  return View<T, S, extents<R, dyn>>(v.data() + begin * v.stride(1), s, v.strides());
}

// Rows [begin, end) of a view (first dimension).
template <class T, class S, index_t R, index_t... Rest>
View<T, S, extents<dyn, Rest...>> rows(const View<T, S, extents<R, Rest...>>& v, index_t begin, index_t end) {
  KILN_CHECK(0 <= begin && begin <= end && end <= v.dim(0), ShapeError, "rows [", begin, ", ", end,
             ") out of range for shape ", v.shape().str());
  Shape s = v.shape();
  s[0] = end - begin;
  return View<T, S, extents<dyn, Rest...>>(v.data() + begin * v.stride(0), s, v.strides());
}

}  // namespace kiln
