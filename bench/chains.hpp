// bench/chains.hpp — the k-op elementwise chains both fusion benchmarks time (CPU and CUDA), so
// the two measure the same expressions. k = 5 is ((x·a + b) max 0)·c − d; scalars keep values
// O(1) for any k.
#pragma once

#include <kiln.hpp>

namespace kiln_bench {

template <int K, class X>
auto chain(const X& x) {
  const float a = 1.5f, b = -0.25f, c = 3.0f, d = 0.5f, e = 0.125f, f = 0.75f, g = 2.0f;
  if constexpr (K == 1) return x * a;
  else if constexpr (K == 2) return x * a + b;
  else if constexpr (K == 3) return kiln::maximum(x * a + b, 0.0f);
  else if constexpr (K == 4) return kiln::maximum(x * a + b, 0.0f) * c;
  else if constexpr (K == 5) return kiln::maximum(x * a + b, 0.0f) * c - d;
  else if constexpr (K == 6) return kiln::maximum(x * a + b, 0.0f) * c - d + e;
  else if constexpr (K == 7) return (kiln::maximum(x * a + b, 0.0f) * c - d + e) * f;
  else return kiln::minimum((kiln::maximum(x * a + b, 0.0f) * c - d + e) * f, g);
}

}  // namespace kiln_bench
