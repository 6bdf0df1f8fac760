// tests/cpu/gradcheck_helpers.hpp — what the fp64 gradcheck suites share: seeded inputs, a CHECK
// that prints gradcheck's report (which names the input and element that failed), and the
// comparison of two fp64 runs that differ only in summation order.
#pragma once

#include <kiln/autograd/gradcheck.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// Two fp64 computations of the same values that differ only in summation order: every
// |a - b| <= tol x the largest |a|. (A value near zero is a sum of terms of the largest's size, so
// its own magnitude is not the scale of its rounding.)
inline void check_same_up_to_order(const std::vector<double>& a, const std::vector<double>& b, double tol,
                                   const std::string& what) {
  REQUIRE(a.size() == b.size());
  double scale = 0, worst = 0;
  for (double v : a) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  INFO(what, ": worst difference ", worst, " against a largest value of ", scale);
  CHECK(scale > 0);
  CHECK(worst <= tol * scale);
}

}  // namespace kiln_gradcheck_test

#define CHECK_GRADCHECK(r)               \
  do {                                   \
    const auto res_ = (r);               \
    CHECK_MESSAGE(res_.ok, res_.report); \
  } while (0)
