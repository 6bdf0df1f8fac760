// kiln/core/finite.hpp — where the first NaN or infinity of a buffer is, in any memory space
// (anomaly mode, kiln/autograd/anomaly.hpp). A device buffer is copied to the host first: the
// cost anomaly mode documents.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/memory.hpp"

namespace kiln {

// The index of the first non-finite value of the n values at p (in space S), or -1.
template <class T, class S>
index_t first_nonfinite(const T* p, index_t n) {
  if constexpr (std::is_integral_v<T>) {
    return -1;
  } else {
    if (p == nullptr || n <= 0) return -1;
    std::vector<T> copy;
    const T* h = p;
    if constexpr (!std::is_same_v<S, host>) {
      copy.resize(std::size_t(n));
      memory_traits<S>::copy_to_host(copy.data(), p, std::size_t(n) * sizeof(T));
      h = copy.data();
    }
    for (index_t i = 0; i < n; ++i)
      if (!std::isfinite(convert<double>(h[i]))) return i;
    return -1;
  }
}

}  // namespace kiln
