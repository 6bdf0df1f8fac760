// kiln/core/tensor.hpp — an owning tensor; its memory space is part of its type.
//
// Tensors are move-only (copies are explicit with clone()) so a training step never copies a
// parameter by accident. Expressions read tensors through views.
#pragma once

#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/core/dtype.hpp"
#include "kiln/core/extents.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/view.hpp"

namespace kiln {

template <class T, class Space, index_t... Dims>
class Tensor {
  static_assert(is_space_v<Space>, "the second argument of kiln::Tensor is a memory space: kiln::host or kiln::cuda");

 public:
  using value_type = T;
  using space = Space;
  using extents_type = extents<Dims...>;
  using view_type = View<T, Space, extents_type>;
  using const_view_type = View<const T, Space, extents_type>;
  static constexpr int rank = extents_type::rank;

  // Static sizes filled in, dynamic ones zero (nothing allocated unless all are static).
  Tensor() : shape_(extents_type::default_shape()) { allocate(); }

  template <class... I>
    requires(sizeof...(I) == sizeof...(Dims) && sizeof...(I) > 0 && (std::is_integral_v<I> && ...))
  explicit Tensor(I... dims) : shape_(extents_type::make_shape({index_t(dims)...})) {
    allocate();
  }

  explicit Tensor(const Shape& shape) : shape_(checked(shape)) { allocate(); }

  Tensor(Tensor&& o) noexcept : data_(std::exchange(o.data_, nullptr)), shape_(o.shape_) {
    o.shape_ = extents_type::default_shape();
    o.shape_.dims.fill(0);
    o.shape_.rank = rank;
  }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      shape_ = o.shape_;
      o.shape_.dims.fill(0);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { release(); }

  // Changes the shape; reallocates only when the element count changes. Contents are unspecified.
  void resize(const Shape& shape) {
    Shape s = checked(shape);
    if (s.size() != shape_.size() || data_ == nullptr) {
      release();
      shape_ = s;
      allocate();
    } else {
      shape_ = s;
    }
  }

  // Frees the elements and keeps the shape: data() is null afterwards (resize allocates again).
  // For a value nothing reads again whose shape still matters — an autograd result kept only so
  // its gradient can be sized and passed on (nn::Residual's projection output).
  void free_elements() noexcept { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  index_t dim(int i) const { return shape_[i]; }
  index_t size() const { return shape_.size(); }
  std::size_t bytes() const { return std::size_t(size()) * sizeof(T); }

  view_type view() { return view_type(data_, shape_); }
  const_view_type view() const { return const_view_type(data_, shape_); }
  operator view_type() { return view(); }
  operator const_view_type() const { return view(); }

  // Host-side element access (tests, small loops).
  template <class... I>
    requires(sizeof...(I) == sizeof...(Dims) && std::is_same_v<Space, host>)
  T& operator()(I... idx) { return view()(idx...); }
  template <class... I>
    requires(sizeof...(I) == sizeof...(Dims) && std::is_same_v<Space, host>)
  const T& operator()(I... idx) const { return view()(idx...); }

 private:
  static Shape checked(const Shape& s) {
    KILN_CHECK(s.rank == rank, ShapeError, "a rank-", rank, " tensor cannot take shape ", s.str());
    std::array<index_t, sizeof...(Dims)> d{};
    for (int i = 0; i < rank; ++i) d[std::size_t(i)] = s[i];
    return extents_type::make_shape(d);
  }
  void allocate() { data_ = static_cast<T*>(memory_traits<Space>::allocate(bytes())); }
  void release() noexcept {
    if (data_ == nullptr) return;  // empty or moved from: no size to compute
    memory_traits<Space>::deallocate(data_, bytes());
    data_ = nullptr;
  }

  T* data_ = nullptr;
  Shape shape_{};
};

template <class X>
inline constexpr bool is_tensor_v = false;
template <class T, class S, index_t... D>
inline constexpr bool is_tensor_v<Tensor<T, S, D...>> = true;

// Common aliases: a dynamic-sized host matrix and vector.
template <class T>
using HostMatrix = Tensor<T, host, dyn, dyn>;
template <class T>
using HostVector = Tensor<T, host, dyn>;

// A deep copy within host memory (device copies live in the CUDA backend).
template <class T, index_t... D>
Tensor<T, host, D...> clone(const Tensor<T, host, D...>& t) {
  Tensor<T, host, D...> r(t.shape());
  if (t.size()) std::memcpy(r.data(), t.data(), t.bytes());
  return r;
}

}  // namespace kiln
