// kiln/expr/reduce_ops.hpp — reduction operators shared by the CPU and CUDA executors.
//
// An operator gives init / combine (fold one element, with its index) / merge (join two partial
// results, left before right) / finish (the result from the accumulator and the count). merge
// keeps the lower index on ties, so argmax is the FIRST maximum whatever the partitioning.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::red {

struct Sum {
  static constexpr const char* name = "sum";
  template <class T> using acc_t = T;
  template <class T> using result_t = T;
  template <class T> KILN_HOST_DEVICE static T init() { return T(0); }
  template <class T> KILN_HOST_DEVICE static T combine(T acc, T v, index_t) { return acc + v; }
  template <class T> KILN_HOST_DEVICE static T merge(T a, T b) { return a + b; }
  template <class T> KILN_HOST_DEVICE static T finish(T acc, index_t) { return acc; }
};

struct Mean : Sum {
  static constexpr const char* name = "mean";
  template <class T> KILN_HOST_DEVICE static T finish(T acc, index_t n) { return n ? acc / T(n) : std::numeric_limits<T>::quiet_NaN(); }
};

// max / min propagate NaN, as PyTorch does.
struct Max {
  static constexpr const char* name = "max";
  template <class T> using acc_t = T;
  template <class T> using result_t = T;
  template <class T> KILN_HOST_DEVICE static T init() { return -std::numeric_limits<T>::infinity(); }
  template <class T> KILN_HOST_DEVICE static T combine(T acc, T v, index_t) { return merge(acc, v); }
  template <class T> KILN_HOST_DEVICE static T merge(T a, T b) { return (a != a || a >= b) ? a : b; }
  template <class T> KILN_HOST_DEVICE static T finish(T acc, index_t) { return acc; }
};
struct Min {
  static constexpr const char* name = "min";
  template <class T> using acc_t = T;
  template <class T> using result_t = T;
  template <class T> KILN_HOST_DEVICE static T init() { return std::numeric_limits<T>::infinity(); }
  template <class T> KILN_HOST_DEVICE static T combine(T acc, T v, index_t) { return merge(acc, v); }
  template <class T> KILN_HOST_DEVICE static T merge(T a, T b) { return (a != a || a <= b) ? a : b; }
  template <class T> KILN_HOST_DEVICE static T finish(T acc, index_t) { return acc; }
};

template <class T>
struct ValueIndex {
  T v;
  index_t i;
};

// argmax / argmin: the index (within the reduced range) of the first extreme value.
template <bool Greatest>
struct ArgExtreme {
  static constexpr const char* name = Greatest ? "argmax" : "argmin";
  template <class T> using acc_t = ValueIndex<T>;
  template <class T> using result_t = std::int64_t;
  template <class T> KILN_HOST_DEVICE static ValueIndex<T> init() {
    return {Greatest ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity(), index_t(-1)};
  }
  template <class T> KILN_HOST_DEVICE static ValueIndex<T> combine(ValueIndex<T> acc, T v, index_t i) {
    return merge(acc, ValueIndex<T>{v, i});
  }
  template <class T> KILN_HOST_DEVICE static ValueIndex<T> merge(ValueIndex<T> a, ValueIndex<T> b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    // The first NaN wins, as in PyTorch. Both sides can hold one: the pairwise leaves merge
    // interleaved lanes, so the left accumulator does not always hold the lower indices.
    if (a.v != a.v && b.v != b.v) return b.i < a.i ? b : a;
    if (a.v != a.v) return a;
    if (b.v != b.v) return b;
    const bool b_better = Greatest ? b.v > a.v : b.v < a.v;
    if (b_better || (b.v == a.v && b.i < a.i)) return b;
    return a;
  }
  template <class T> KILN_HOST_DEVICE static std::int64_t finish(ValueIndex<T> acc, index_t) { return acc.i < 0 ? 0 : acc.i; }
};
using ArgMax = ArgExtreme<true>;
using ArgMin = ArgExtreme<false>;

// Stores a finished reduction v into slot, or adds it to what slot holds (accumulate: a gradient's
// later contribution), the sum taken in R's compute type.
template <class R, class V>
KILN_HOST_DEVICE void store(R& slot, const V& v, bool accumulate) {
  if constexpr (std::is_arithmetic_v<V>) {
    if (accumulate) {
      slot = convert<R>(compute_t<R>(convert<compute_t<R>>(slot) + compute_t<R>(v)));
      return;
    }
  }
  slot = R(v);
}

}  // namespace kiln::red
