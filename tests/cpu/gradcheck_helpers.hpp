// tests/cpu/gradcheck_helpers.hpp — what the fp64 gradcheck suites share: seeded inputs and a
// CHECK that prints gradcheck's report (which names the input and element that failed).
#pragma once

#include <kiln/autograd/gradcheck.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <utility>

namespace kiln_gradcheck_test {

// A [rows, cols] input with values in [lo, hi), away from 0 when `away` (for kinks like relu).
inline kiln::GradcheckInput input(kiln::index_t rows, kiln::index_t cols, std::uint64_t seed, double lo = -1.5,
                                  double hi = 1.5, bool away = false) {
  kiln::HostMatrix<double> m(rows, cols);
  kiln::Generator gen(seed);
  for (kiln::index_t i = 0; i < m.size(); ++i) {
    double v = lo + (hi - lo) * double(gen.uniform());
    if (away && std::abs(v) < 0.1) v += v < 0 ? -0.2 : 0.2;
    m.data()[i] = v;
  }
  return kiln::GradcheckInput(std::move(m), true);
}

}  // namespace kiln_gradcheck_test

#define CHECK_GRADCHECK(r)               \
  do {                                   \
    const auto res_ = (r);               \
    CHECK_MESSAGE(res_.ok, res_.report); \
  } while (0)
