// kiln/expr/evaluator.hpp — evaluators compute one element of an expression.
//
// Every elementwise kernel walks its destination as a 2-D fold [rows, cols] (all leading
// dimensions are rows). A leaf maps (r, c) to memory through a row and a column stride; a
// stride of 0 is how broadcasting works (scalar, a row vector over rows, a column over columns).
// `flat(i)` is the fast path for when every leaf is contiguous and full-size: the CPU
// executor's loop over it vectorises. `flat_packet<V>(i)` is the same path V elements at a time
// (the CUDA executor's 16-byte loads): i is a multiple of V, and every leaf pointer is aligned
// as `aligned(bytes)` checked on the host. `flat_tile<N>(i, out)` (host) is the same path N
// elements at a time, one node at a time: each node applies its functor to a whole tile its
// children wrote, so a chain of costly functors (`costly_ops`, see fn::costly_v) runs as
// independent vector loops — one long dependent chain per element leaves a CPU waiting on
// latency (measured: sigmoid(tanh(exp(x))) 1.5 ns per element fused per element, 0.8 tiled).
// Evaluators are trivially copyable, so CUDA kernels take them by value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/expr/functors.hpp"
#include "kiln/expr/node.hpp"

namespace kiln {

template <class E>
class Evaluator;

namespace detail {
// A packet is aligned to its own size up to 16 bytes, so a 16-byte packet is one vector access.
template <class T, int V>
constexpr std::size_t packet_alignment() {
  constexpr std::size_t b = sizeof(T) * std::size_t(V);
  if constexpr ((b & (b - 1)) != 0 || b < alignof(T)) return alignof(T);
  else return b < 16 ? b : 16;
}
}  // namespace detail

// An operand's values for the tile at i: its own memory when it is a leaf that holds them,
// otherwise computed into buf (host only: Evaluator::flat_tile).
template <int N, class Ev>
KILN_HOST_DEVICE const typename Ev::value_type* tile_of(const Ev& ev, index_t i, typename Ev::value_type* buf) {
  if constexpr (requires { ev.tile_data(i); }) {
    return ev.tile_data(i);
  } else {
    ev.template flat_tile<N>(i, buf);
    return buf;
  }
}

// V consecutive elements as one value: what flat_packet returns and vector loads read.
template <class T, int V>
struct alignas(detail::packet_alignment<T, V>()) Packet {
  static_assert(V >= 1, "kiln::Packet<T, V> needs V >= 1 lanes");
  T v[V];
};

namespace detail {
// Loads the packet at p, which is aligned to alignof(P). In device code a 16-byte packet is ONE
// 128-bit load (an 8-byte one a 64-bit load) whatever its element type: the built-in vector
// types guarantee the instruction, which a struct of eight halves alone does not.
template <class P, class T>
KILN_HOST_DEVICE P load_packet(const T* p) {
  P r;
#if KILN_DEVICE_PASS
  if constexpr (sizeof(P) == 16 && alignof(P) == 16) {
    const ::uint4 u = *reinterpret_cast<const ::uint4*>(p);
    std::memcpy(&r, &u, sizeof r);
  } else if constexpr (sizeof(P) == 8 && alignof(P) == 8) {
    const ::uint2 u = *reinterpret_cast<const ::uint2*>(p);
    std::memcpy(&r, &u, sizeof r);
  } else {
    r = *reinterpret_cast<const P*>(p);
  }
#else
  std::memcpy(&r, p, sizeof r);
#endif
  return r;
}

// Stores a packet to q (aligned to alignof(P)), one vector store in device code like load_packet.
template <class P, class T>
KILN_HOST_DEVICE void store_packet(T* q, const P& x) {
#if KILN_DEVICE_PASS
  if constexpr (sizeof(P) == 16 && alignof(P) == 16) {
    ::uint4 u;
    std::memcpy(&u, &x, sizeof u);
    *reinterpret_cast<::uint4*>(q) = u;
  } else if constexpr (sizeof(P) == 8 && alignof(P) == 8) {
    ::uint2 u;
    std::memcpy(&u, &x, sizeof u);
    *reinterpret_cast<::uint2*>(q) = u;
  } else {
    *reinterpret_cast<P*>(q) = x;
  }
#else
  std::memcpy(q, &x, sizeof x);
#endif
}

inline bool is_aligned(const void* p, std::size_t bytes) {
  return bytes <= 1 || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
}  // namespace detail

// Leaf strides that reproduce `leaf` broadcast to `dst` in the 2-D fold, or a ShapeError.
struct LeafStrides {
  index_t rs = 0, cs = 0;
  bool flat = false;
  // Leading dimensions one stride cannot walk (a transposed rank-3 view): their sizes and
  // strides, innermost first, and how many there are (0 when rs walks the rows).
  int nlead = 0;
  std::array<index_t, max_rank - 1> lead_dims{}, lead_strides{};
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
    // Dimensions the leaf lacks (k < 0) are 1 in dst here, like size-1 ones: they add no stride.
    index_t expect = -1;
    bool even = true;
    for (int i = dst.rank - 2; i >= 0; --i) {
      const int k = i - off;
      if (k < 0 || leaf[k] == 1) continue;
      if (expect < 0) r.rs = st[std::size_t(k)];
      else even = even && st[std::size_t(k)] == expect;
      expect = st[std::size_t(k)] * leaf[k];
    }
    if (!even) {  // decompose the row index per leading dimension instead
      for (int i = dst.rank - 2; i >= 0; --i) {
        const int k = i - off;
        if (k < 0 || leaf[k] == 1) continue;
        r.lead_dims[std::size_t(r.nlead)] = leaf[k];
        r.lead_strides[std::size_t(r.nlead)] = st[std::size_t(k)];
        ++r.nlead;
      }
    }
  }
  // A rank-0 view broadcast to a larger destination is not flat: p[i] would run past it.
  r.flat = leaf.size() == dst.size() && contiguous;
  return r;
}

template <class T, class S, class Ext>
class Evaluator<View<T, S, Ext>> {
  template <class E>
  friend class Evaluator;

 public:
  using value_type = compute_t<std::remove_const_t<T>>;
  // The same leaf under other static extents of the same rank class (<= 2 or more): they read
  // memory the same way, so code that takes the canonical one (detail::canonical_leaf_t) is
  // compiled once for every static size.
  template <class T2, class E2>
    requires(std::is_same_v<std::remove_const_t<T2>, std::remove_const_t<T>> && ((E2::rank <= 2) == (Ext::rank <= 2)))
  explicit Evaluator(const Evaluator<View<T2, S, E2>>& o)
      : p_(o.p_), rs_(o.rs_), cs_(o.cs_), flat_(o.flat_), nlead_(o.nlead_) {
    for (int i = 0; i < max_rank - 1; ++i) {
      lead_dims_[i] = o.lead_dims_[i];
      lead_strides_[i] = o.lead_strides_[i];
    }
  }
  Evaluator(const View<T, S, Ext>& v, const Shape& dst) : p_(v.data()) {
    const LeafStrides l = fold_strides(v.shape(), v.strides(), v.is_contiguous(), dst);
    rs_ = l.rs;
    cs_ = l.cs;
    flat_ = l.flat;
    nlead_ = l.nlead;
    for (int i = 0; i < max_rank - 1; ++i) {  // unused dimensions: size 1, stride 0
      lead_dims_[i] = i < l.nlead ? l.lead_dims[std::size_t(i)] : 1;
      lead_strides_[i] = i < l.nlead ? l.lead_strides[std::size_t(i)] : 0;
    }
  }
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const {
    return convert<value_type>(p_[row_offset(r) + c * cs_]);
  }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return convert<value_type>(p_[i]); }
  // Requires flat_ok(), i % V == 0 and aligned(alignof(Packet<element, V>)).
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t i) const {
    using Stored = std::remove_const_t<T>;
    const auto raw = detail::load_packet<Packet<Stored, V>>(p_ + i);
    if constexpr (std::is_same_v<Stored, value_type>) {
      return raw;
    } else {
      Packet<value_type, V> r;
      for (int k = 0; k < V; ++k) r.v[k] = convert<value_type>(raw.v[k]);
      return r;
    }
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t i, value_type* out) const {
    for (int j = 0; j < N; ++j) out[j] = convert<value_type>(p_[i + j]);
  }
  // A tile read in place (no copy) when memory holds the computed type.
  KILN_HOST_DEVICE const value_type* tile_data(index_t i) const
    requires std::is_same_v<std::remove_const_t<T>, value_type>
  {
    return p_ + i;
  }
  static constexpr int costly_ops = 0;
  bool flat_ok() const { return flat_; }
  bool aligned(std::size_t bytes) const { return detail::is_aligned(p_, bytes); }

 private:
  // Views of rank <= 2 always fold to one row stride (so their kernels keep a branch-free,
  // vectorisable column loop); only rank 3 and 4 can need the per-dimension decomposition,
  // which is loop-free so the compiler can hoist it out of the column loop.
  KILN_HOST_DEVICE index_t row_offset(index_t r) const {
    if constexpr (Ext::rank <= 2) {
      return r * rs_;
    } else {
      if (nlead_ == 0) return r * rs_;
      const index_t q = r / lead_dims_[0];
      return (r - q * lead_dims_[0]) * lead_strides_[0] + (q % lead_dims_[1]) * lead_strides_[1] +
             (q / lead_dims_[1]) * lead_strides_[2];
    }
  }
  const std::remove_const_t<T>* p_;
  index_t rs_, cs_;
  bool flat_;
  int nlead_;
  index_t lead_dims_[max_rank - 1], lead_strides_[max_rank - 1];  // plain arrays: device code reads them
};

namespace detail {
// The leaf evaluator a view's (or a variable's) evaluator reads like, with its static sizes
// erased: extents<dyn, dyn> for rank <= 2, extents<dyn, dyn, dyn> above; void for any other
// evaluator.
template <class T, class S, class Ext>
auto canonical_leaf_of(const Evaluator<View<T, S, Ext>>*)
    -> Evaluator<View<const std::remove_const_t<T>, S, std::conditional_t<(Ext::rank <= 2), extents<dyn, dyn>, extents<dyn, dyn, dyn>>>>;
void canonical_leaf_of(const void*);
template <class Ev>
using canonical_leaf_t = decltype(canonical_leaf_of(static_cast<const Ev*>(nullptr)));
}  // namespace detail

template <class T>
class Evaluator<Scalar<T>> {
 public:
  using value_type = compute_t<T>;
  Evaluator(const Scalar<T>& s, const Shape&) : v_(convert<value_type>(s.value)) {}
  KILN_HOST_DEVICE value_type at(index_t, index_t) const { return v_; }
  KILN_HOST_DEVICE value_type flat(index_t) const { return v_; }
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t) const {
    Packet<value_type, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = v_;
    return r;
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t, value_type* out) const {
    for (int j = 0; j < N; ++j) out[j] = v_;
  }
  static constexpr int costly_ops = 0;
  bool flat_ok() const { return true; }
  bool aligned(std::size_t) const { return true; }

 private:
  value_type v_;
};

template <class F, class A>
class Evaluator<Unary<F, A>> {
  template <class E>
  friend class Evaluator;

 public:
  using value_type = typename Unary<F, A>::value_type;
  Evaluator(const Unary<F, A>& n, const Shape& dst) : f_(n.f), a_(n.a, dst) {}
  // From the evaluator of the same expression over other leaf types (detail::erased_node_t).
  template <class A2>
  explicit Evaluator(const Evaluator<Unary<F, A2>>& o) : f_(o.f_), a_(o.a_) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const { return f_(value_type(a_.at(r, c))); }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return f_(value_type(a_.flat(i))); }
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t i) const {
    const auto a = a_.template flat_packet<V>(i);
    Packet<value_type, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = f_(value_type(a.v[k]));
    return r;
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t i, value_type* out) const {
    typename Evaluator<A>::value_type abuf[N];
    const auto* a = tile_of<N>(a_, i, abuf);
    for (int j = 0; j < N; ++j) out[j] = f_(value_type(a[j]));
  }
  static constexpr int costly_ops = int(fn::costly_v<F>) + Evaluator<A>::costly_ops;
  bool flat_ok() const { return a_.flat_ok(); }
  bool aligned(std::size_t bytes) const { return a_.aligned(bytes); }

 private:
  F f_;
  Evaluator<A> a_;
};

template <class F, class A, class B>
class Evaluator<Binary<F, A, B>> {
  template <class E>
  friend class Evaluator;

 public:
  using value_type = typename Binary<F, A, B>::value_type;
  Evaluator(const Binary<F, A, B>& n, const Shape& dst) : f_(n.f), a_(n.a, dst), b_(n.b, dst) {}
  template <class A2, class B2>
  explicit Evaluator(const Evaluator<Binary<F, A2, B2>>& o) : f_(o.f_), a_(o.a_), b_(o.b_) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const {
    return f_(value_type(a_.at(r, c)), value_type(b_.at(r, c)));
  }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return f_(value_type(a_.flat(i)), value_type(b_.flat(i))); }
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t i) const {
    const auto a = a_.template flat_packet<V>(i);
    const auto b = b_.template flat_packet<V>(i);
    Packet<value_type, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = f_(value_type(a.v[k]), value_type(b.v[k]));
    return r;
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t i, value_type* out) const {
    typename Evaluator<A>::value_type abuf[N];
    typename Evaluator<B>::value_type bbuf[N];
    const auto* a = tile_of<N>(a_, i, abuf);
    const auto* b = tile_of<N>(b_, i, bbuf);
    for (int j = 0; j < N; ++j) out[j] = f_(value_type(a[j]), value_type(b[j]));
  }
  static constexpr int costly_ops = int(fn::costly_v<F>) + Evaluator<A>::costly_ops + Evaluator<B>::costly_ops;
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok(); }
  bool aligned(std::size_t bytes) const { return a_.aligned(bytes) && b_.aligned(bytes); }

 private:
  F f_;
  Evaluator<A> a_;
  Evaluator<B> b_;
};

template <class F, class A, class B, class C>
class Evaluator<Ternary<F, A, B, C>> {
  template <class E>
  friend class Evaluator;

 public:
  using value_type = typename Ternary<F, A, B, C>::value_type;
  Evaluator(const Ternary<F, A, B, C>& n, const Shape& dst) : f_(n.f), a_(n.a, dst), b_(n.b, dst), c_(n.c, dst) {}
  template <class A2, class B2, class C2>
  explicit Evaluator(const Evaluator<Ternary<F, A2, B2, C2>>& o) : f_(o.f_), a_(o.a_), b_(o.b_), c_(o.c_) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const {
    return f_(value_type(a_.at(r, c)), value_type(b_.at(r, c)), value_type(c_.at(r, c)));
  }
  KILN_HOST_DEVICE value_type flat(index_t i) const {
    return f_(value_type(a_.flat(i)), value_type(b_.flat(i)), value_type(c_.flat(i)));
  }
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t i) const {
    const auto a = a_.template flat_packet<V>(i);
    const auto b = b_.template flat_packet<V>(i);
    const auto c = c_.template flat_packet<V>(i);
    Packet<value_type, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = f_(value_type(a.v[k]), value_type(b.v[k]), value_type(c.v[k]));
    return r;
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t i, value_type* out) const {
    typename Evaluator<A>::value_type abuf[N];
    typename Evaluator<B>::value_type bbuf[N];
    typename Evaluator<C>::value_type cbuf[N];
    const auto* a = tile_of<N>(a_, i, abuf);
    const auto* b = tile_of<N>(b_, i, bbuf);
    const auto* c = tile_of<N>(c_, i, cbuf);
    for (int j = 0; j < N; ++j) out[j] = f_(value_type(a[j]), value_type(b[j]), value_type(c[j]));
  }
  static constexpr int costly_ops =
      int(fn::costly_v<F>) + Evaluator<A>::costly_ops + Evaluator<B>::costly_ops + Evaluator<C>::costly_ops;
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok() && c_.flat_ok(); }
  bool aligned(std::size_t bytes) const { return a_.aligned(bytes) && b_.aligned(bytes) && c_.aligned(bytes); }

 private:
  F f_;
  Evaluator<A> a_;
  Evaluator<B> b_;
  Evaluator<C> c_;
};

template <class To, class A>
class Evaluator<Cast<To, A>> {
  template <class E>
  friend class Evaluator;

 public:
  using value_type = compute_t<To>;
  Evaluator(const Cast<To, A>& n, const Shape& dst) : a_(n.a, dst) {}
  template <class A2>
  explicit Evaluator(const Evaluator<Cast<To, A2>>& o) : a_(o.a_) {}
  KILN_HOST_DEVICE value_type at(index_t r, index_t c) const { return round(a_.at(r, c)); }
  KILN_HOST_DEVICE value_type flat(index_t i) const { return round(a_.flat(i)); }
  template <int V>
  KILN_HOST_DEVICE Packet<value_type, V> flat_packet(index_t i) const {
    const auto a = a_.template flat_packet<V>(i);
    Packet<value_type, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = round(a.v[k]);
    return r;
  }
  template <int N>
  KILN_HOST_DEVICE void flat_tile(index_t i, value_type* out) const {
    typename Evaluator<A>::value_type abuf[N];
    const auto* a = tile_of<N>(a_, i, abuf);
    for (int j = 0; j < N; ++j) out[j] = round(a[j]);
  }
  static constexpr int costly_ops = Evaluator<A>::costly_ops;
  bool flat_ok() const { return a_.flat_ok(); }
  bool aligned(std::size_t bytes) const { return a_.aligned(bytes); }

 private:
  template <class V>
  KILN_HOST_DEVICE static value_type round(V v) {
    return convert<value_type>(convert<To>(v));
  }
  Evaluator<A> a_;
};

// ---- the same expression with its static sizes erased ------------------------------------------
// A kernel compiled per expression type is compiled again for each static size its leaves carry
// (a bias add over 128 features and over 256 is two kernels of identical code). An executor
// evaluates an expression whose nodes all have an erased form (views, variables, scalars, unary,
// binary and ternary nodes, casts) through the evaluator of that form instead: the same code, one
// instantiation per rank, whatever the sizes.
namespace detail {
template <int R>
struct dyn_extents_of;
template <>
struct dyn_extents_of<0> {
  using type = extents<>;
};
template <>
struct dyn_extents_of<1> {
  using type = extents<dyn>;
};
template <>
struct dyn_extents_of<2> {
  using type = extents<dyn, dyn>;
};
template <>
struct dyn_extents_of<3> {
  using type = extents<dyn, dyn, dyn>;
};
template <>
struct dyn_extents_of<4> {
  using type = extents<dyn, dyn, dyn, dyn>;
};
// Ext with every size dynamic, its rank kept.
template <class Ext>
using dyn_extents_t = typename dyn_extents_of<Ext::rank>::type;

// E with each leaf L replaced by Leaf<L>::type and its nodes kept, or void when a leaf (or a node
// that is not elementwise) has no replacement (Leaf<X>::type is void). The erased forms: here,
// and ag::map's backward in autograd/erased_expr.hpp.
template <class E, template <class> class Leaf>
struct map_leaves {
  using type = typename Leaf<E>::type;
};
template <class E, template <class> class Leaf>
using map_leaves_t = typename map_leaves<E, Leaf>::type;
template <class F, class A, template <class> class Leaf>
struct map_leaves<Unary<F, A>, Leaf> {
  using type = std::conditional_t<std::is_void_v<map_leaves_t<A, Leaf>>, void, Unary<F, map_leaves_t<A, Leaf>>>;
};
template <class F, class A, class B, template <class> class Leaf>
struct map_leaves<Binary<F, A, B>, Leaf> {
  using type = std::conditional_t<std::is_void_v<map_leaves_t<A, Leaf>> || std::is_void_v<map_leaves_t<B, Leaf>>,
                                  void, Binary<F, map_leaves_t<A, Leaf>, map_leaves_t<B, Leaf>>>;
};
template <class F, class A, class B, class C, template <class> class Leaf>
struct map_leaves<Ternary<F, A, B, C>, Leaf> {
  using type = std::conditional_t<std::is_void_v<map_leaves_t<A, Leaf>> || std::is_void_v<map_leaves_t<B, Leaf>> ||
                                      std::is_void_v<map_leaves_t<C, Leaf>>,
                                  void, Ternary<F, map_leaves_t<A, Leaf>, map_leaves_t<B, Leaf>, map_leaves_t<C, Leaf>>>;
};
template <class To, class A, template <class> class Leaf>
struct map_leaves<Cast<To, A>, Leaf> {
  using type = std::conditional_t<std::is_void_v<map_leaves_t<A, Leaf>>, void, Cast<To, map_leaves_t<A, Leaf>>>;
};

// A leaf with its sizes erased (views and scalars; autograd/var.hpp adds variables), else void.
template <class E>
struct erased_leaf {
  using type = void;
};
template <class T, class S, class Ext>
struct erased_leaf<View<T, S, Ext>> {
  using type = View<const std::remove_const_t<T>, S, dyn_extents_t<Ext>>;
};
template <class T>
struct erased_leaf<Scalar<T>> {
  using type = Scalar<T>;
};
// E with its leaves' sizes erased, or void when a node has no erased form.
template <class E>
using erased_node_t = map_leaves_t<E, erased_leaf>;

// The evaluator of Ev's erased expression (void when there is none).
template <class Ev>
struct erased_evaluator {
  using type = void;
};
template <class E>
struct erased_evaluator<Evaluator<E>> {
  using type = std::conditional_t<std::is_void_v<erased_node_t<E>>, void, Evaluator<erased_node_t<E>>>;
};
template <class Ev>
using erased_evaluator_t = typename erased_evaluator<Ev>::type;

// Whether an executor's elementwise(dst, ev) should run as the erased form (dst with Ext's sizes
// dropped, erased_evaluator_t<Ev>): there is one, and it differs from what was given.
template <class Ev, class Ext>
inline constexpr bool runs_erased_v =
    !std::is_void_v<erased_evaluator_t<Ev>> &&
    !(std::is_same_v<erased_evaluator_t<Ev>, Ev> && std::is_same_v<dyn_extents_t<Ext>, Ext>);
}  // namespace detail

}  // namespace kiln
