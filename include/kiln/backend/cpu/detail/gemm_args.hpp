// kiln/backend/cpu/detail/gemm_args.hpp — element types and argument checks of kiln::cpu::gemm.
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_args.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cpu::detail {

template <class T>
inline constexpr bool gemm_unsupported_v = false;

// acc: the type alpha, beta and C have, and the one the products are summed in.
template <class T>
struct gemm_types {
  static_assert(gemm_unsupported_v<T>,
                "kiln::cpu::gemm multiplies float, double, kiln::f16 or kiln::bf16 matrices "
                "(f16 and bf16 sum and write float): convert the inputs to one of these");
  using acc = float;  // keeps the follow-on errors quiet; the static_assert has said it all
};
template <>
struct gemm_types<float> {
  using acc = float;
};
template <>
struct gemm_types<double> {
  using acc = double;
};
template <>
struct gemm_types<f16> {
  using acc = float;
};
template <>
struct gemm_types<bf16> {
  using acc = float;
};

inline const char* yes_no(bool t) { return t ? "yes" : "no"; }

// Throws ShapeError for negative sizes and leading dimensions shorter than the stored rows, and
// ValueError for null pointers to non-empty matrices or a negative thread count.
inline void check_gemm_args(const char* fn, bool ta, bool tb, index_t m, index_t n, index_t k,
                            const void* a, index_t lda, const void* b, index_t ldb, const void* c,
                            index_t ldc, int threads) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, ShapeError, fn,
             ": sizes must not be negative, got m = ", m, ", n = ", n, ", k = ", k);
  // Row-major: a matrix stored as R x L needs ld >= L (ld is not read when L == 0).
  const index_t a_len = ta ? m : k, b_len = tb ? k : n;
  KILN_CHECK(lda >= a_len, ShapeError, fn, ": lda = ", lda, " is too small: with ta = ", yes_no(ta),
             " A is stored as ", ta ? k : m, " x ", a_len, " (", ta ? "k x m" : "m x k",
             ", m = ", m, ", k = ", k, "), so lda must be >= ", a_len);
  KILN_CHECK(ldb >= b_len, ShapeError, fn, ": ldb = ", ldb, " is too small: with tb = ", yes_no(tb),
             " B is stored as ", tb ? n : k, " x ", b_len, " (", tb ? "n x k" : "k x n",
             ", k = ", k, ", n = ", n, "), so ldb must be >= ", b_len);
  KILN_CHECK(ldc >= n, ShapeError, fn, ": ldc = ", ldc, " is too small: C is m x n = ", m, " x ", n,
             ", so ldc must be >= ", n);
  KILN_CHECK(a || m * k == 0, ValueError, fn, ": A is null but op(A) is ", m, " x ", k);
  KILN_CHECK(b || k * n == 0, ValueError, fn, ": B is null but op(B) is ", k, " x ", n);
  KILN_CHECK(c || m * n == 0, ValueError, fn, ": C is null but is ", m, " x ", n);
  KILN_CHECK(threads >= 0, ValueError, fn, ": threads = ", threads,
             " must be >= 0 (0 = all OpenMP threads)");
}

}  // namespace kiln::cpu::detail
